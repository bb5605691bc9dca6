//! An SVG flame graph, drawn by inferno from the folded stacks: width is
//! bytes, the root is the process; searchable in a browser.
use anyhow::{Context as _, Result};

use super::{folded, Report};
use crate::error::UserError;

pub fn render(report: &Report) -> Result<String> {
    let folded = folded::render(report);
    if folded.is_empty() {
        return Err(UserError::new("no stacks to draw: the report is empty").into());
    }
    let mut options = inferno::flamegraph::Options::default();
    options.title = title(report);
    options.subtitle = Some(format!(
        "{} allocations, {} bytes{}",
        super::text::thousands(report.count),
        super::text::thousands(report.bytes),
        if report.exact {
            ", exact"
        } else {
            ", estimated from samples"
        }
    ));
    options.count_name = "bytes".to_string();
    options.name_type = "Function:".to_string();
    let mut svg = Vec::new();
    inferno::flamegraph::from_lines(&mut options, folded.lines(), &mut svg)
        .context("drawing the flame graph")?;
    String::from_utf8(svg).context("the flame graph is not UTF-8")
}

/// "memprof alloc: workload, sh — bytes allocated".
fn title(report: &Report) -> String {
    let mut commands: Vec<&str> = report
        .processes
        .iter()
        .map(|p| p.command.as_str())
        .collect();
    commands.dedup();
    commands.truncate(3);
    format!(
        "memprof {}: {} — bytes allocated",
        report.mode,
        commands.join(", ")
    )
}
