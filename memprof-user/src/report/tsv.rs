//! Tab-separated: one line per stack, `count bytes frame0 frame1 ...`,
//! innermost frame first, for awk, cut and spreadsheets.
use std::fmt::Write as _;

use super::Report;

pub fn render(report: &Report) -> String {
    let mut out = String::new();
    for process in &report.processes {
        for stack in &process.stacks {
            let _ = write!(out, "{}\t{}", stack.count, stack.bytes);
            for frame in &stack.frames {
                let _ = write!(out, "\t{}", frame.label().replace('\t', " "));
            }
            out.push('\n');
        }
    }
    out
}
