//! Folded stacks: `root;outer;...;inner bytes`, one line per stack, the
//! input of flamegraph.pl, inferno and speedscope. The root is the process.
//! Bytes allocated; in live mode, bytes still live (stacks holding none
//! are left out).
use std::fmt::Write as _;

use super::Report;

pub fn render(report: &Report) -> String {
    let mut out = String::new();
    for process in &report.processes {
        let root = clean(&format!("{} ({})", command(process), process.pid));
        for stack in &process.stacks {
            let bytes = stack.rank_bytes();
            if stack.live.is_some() && bytes == 0 {
                continue;
            }
            let _ = write!(out, "{root}");
            for frame in stack.frames.iter().rev() {
                let _ = write!(out, ";{}", clean(&frame.label()));
            }
            let _ = writeln!(out, " {bytes}");
        }
    }
    out
}

fn command(process: &super::model::ProcessReport) -> &str {
    if process.command.is_empty() {
        "?"
    } else {
        &process.command
    }
}

/// Frame names may not hold the separators of the format.
fn clean(name: &str) -> String {
    name.replace(';', ":").replace(['\n', '\r'], " ")
}
