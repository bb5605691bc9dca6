//! An SVG flame graph, drawn by inferno from the folded stacks: width is
//! bytes, the root is the process; searchable in a browser.
use anyhow::{Context as _, Result};

use super::{folded, Report};
use crate::human::error::UserError;

pub fn render(report: &Report) -> Result<String> {
    let folded = folded::render(report);
    if folded.is_empty() {
        return Err(UserError::new(if report.is_live() {
            "no stacks to draw: nothing is still allocated"
        } else {
            "no stacks to draw: the report is empty"
        })
        .into());
    }
    let mut options = inferno::flamegraph::Options::default();
    options.title = title(report);
    let live_bytes: Option<u64> = report
        .processes
        .iter()
        .map(|p| p.live.as_ref().map(|l| l.live_bytes))
        .sum();
    options.subtitle = Some(format!(
        "{}{} allocations, {} bytes{}",
        live_bytes.map_or(String::new(), |live| format!(
            "{} bytes still allocated; ",
            crate::human::numbers::thousands(live)
        )),
        crate::human::numbers::thousands(report.count),
        crate::human::numbers::thousands(report.bytes),
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
        "memprof {}: {} — {}",
        report.mode,
        commands.join(", "),
        if report.is_live() {
            "bytes still allocated"
        } else {
            "bytes allocated"
        }
    )
}
