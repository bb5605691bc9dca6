//! A Markdown table per process, to paste into an issue or a review.
use std::fmt::Write as _;

use super::{
    model::FrameReport,
    text::{filters_line, recording_line},
    Report,
};
use crate::human::numbers::{how_many, human_bytes, thousands};

pub fn render(report: &Report) -> String {
    let mut out = String::new();
    let _ = writeln!(
        out,
        "**memprof**: {} in {} ({})\n",
        human_bytes(report.bytes),
        how_many(report.count, "allocation", "allocations"),
        if report.exact { "exact" } else { "estimated" }
    );
    for line in report
        .recording
        .iter()
        .map(recording_line)
        .chain(report.filters.iter().map(filters_line))
    {
        let _ = writeln!(out, "{line}\n");
    }
    for process in &report.processes {
        let _ = writeln!(
            out,
            "### pid {} `{}`: {} in {}\n",
            process.pid,
            process.command,
            human_bytes(process.bytes),
            how_many(process.count, "allocation", "allocations")
        );
        if let Some(live) = &process.live {
            let _ = writeln!(
                out,
                "{} in {} still allocated{}; peak {} ({})\n",
                human_bytes(live.live_bytes),
                how_many(live.live_count, "block", "blocks"),
                if process.exited { " at exit" } else { "" },
                human_bytes(live.peak_live_bytes),
                if live.peak_exact { "exact" } else { "polled" },
            );
        }
        let live = report.is_live();
        let _ = writeln!(
            out,
            "| # |{} bytes | calls | avg | function | call site | stack |",
            if live {
                " live bytes | live blocks | oldest | temporary |"
            } else {
                ""
            }
        );
        let _ = writeln!(
            out,
            "|---:|{}---:|---:|---:|---|---|---|",
            if live { "---:|---:|---:|---:|" } else { "" }
        );
        for (rank, stack) in process.stacks.iter().enumerate() {
            let first = stack.frames.first();
            let path: Vec<String> = stack.frames.iter().map(|f| f.label()).collect();
            let live_cells = stack.live.map_or(String::new(), |live| {
                format!(
                    " {} | {} | {} | {} |",
                    human_bytes(live.live_bytes),
                    thousands(live.live_count),
                    live.oldest_age_secs
                        .map_or("-".to_string(), super::text::human_age),
                    thousands(live.temporary_count),
                )
            });
            let _ = writeln!(
                out,
                "| {} |{live_cells} {} | {} | {} | {} | {} | {} |",
                rank + 1,
                human_bytes(stack.bytes),
                thousands(stack.count),
                human_bytes(stack.bytes.checked_div(stack.count).unwrap_or(0)),
                escape(&stack.allocated()),
                first.map(|f| site(f)).unwrap_or_default(),
                escape(&path.join(" ← ")),
            );
        }
        out.push('\n');
    }
    out
}

fn site(frame: &FrameReport) -> String {
    let name = escape(&frame.label());
    match (&frame.file, frame.line) {
        (Some(file), Some(line)) => {
            format!(
                "`{name}` {}:{line}",
                file.rsplit('/').next().unwrap_or(file)
            )
        }
        _ => format!("`{name}`"),
    }
}

/// Table cells may not hold a pipe.
fn escape(text: &str) -> String {
    text.replace('|', "\\|")
}
