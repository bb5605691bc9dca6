//! `memprof monitor` on a terminal: a view like top's, redrawn every
//! interval, of the processes and call sites allocating most, with each
//! process's rate since the last view (over its last span for one whose
//! figures are scaled estimates).
use std::{collections::HashMap, fmt::Write as _};

use crate::{
    human::numbers::{how_many, human_bytes, thousands},
    report::model::{ProcessReport, Report},
};

/// What the last view showed: each process's bytes, to draw rates.
#[derive(Default)]
pub struct View {
    before: HashMap<(u32, String), (u64, f64)>,
}

/// Processes and call sites shown.
const ROWS: usize = 10;

impl View {
    /// The screen for `report` (cut to the top call sites by caller):
    /// cleared, then redrawn.
    pub fn render(&mut self, report: &Report, serving: &str) -> String {
        let mut out = String::from("\x1b[H\x1b[2J");
        let _ = writeln!(
            out,
            "memprof monitor  {:.0} s  {}  {} allocated{}  {serving}  (Ctrl-C to stop)\n",
            report.duration_secs,
            how_many(report.processes.len() as u64, "process", "processes"),
            human_bytes(report.bytes),
            if report.exact { "" } else { " (estimates)" },
        );
        let _ = writeln!(
            out,
            "{:>8}  {:<16} {:>12} {:>12} {:>12} {:>12}  NOTE",
            "PID", "COMMAND", "ALLOCATED", "RATE/s", "CALLS", "LIVE"
        );
        let mut processes: Vec<_> = report.processes.iter().collect();
        processes.sort_by_key(|p| std::cmp::Reverse(p.bytes));
        let mut now = HashMap::new();
        for process in processes.iter().take(ROWS) {
            let key = (process.pid, process.command.clone());
            let rate = rate(
                process,
                self.before.get(&key).copied(),
                report.duration_secs,
            );
            now.insert(key, (process.bytes, report.duration_secs));
            let _ = writeln!(
                out,
                "{:>8}  {:<16} {:>12} {:>12} {:>12} {:>12}  {}",
                process.pid,
                truncate(&process.command, 16),
                human_bytes(process.bytes),
                format!("{}/s", human_bytes(rate as u64)),
                thousands(process.count),
                process
                    .live
                    .as_ref()
                    .map_or("-".to_string(), |live| human_bytes(live.live_bytes)),
                note(process),
            );
        }
        self.before = now;
        let mut sites: Vec<_> = report
            .processes
            .iter()
            .flat_map(|p| p.stacks.iter().map(move |s| (p, s)))
            .collect();
        sites.sort_by_key(|(_, stack)| std::cmp::Reverse(stack.bytes));
        let _ = writeln!(out, "\n{:>12}  {:<10} CALL SITE", "ALLOCATED", "ALLOCATOR");
        for (process, stack) in sites.into_iter().take(ROWS) {
            let place = stack.frames.first().map_or(String::new(), |frame| {
                match (&frame.file, frame.line) {
                    (Some(file), Some(line)) => format!(
                        "{} ({}:{line})",
                        frame.label(),
                        file.rsplit('/').next().unwrap_or(file)
                    ),
                    _ => frame.label(),
                }
            });
            let _ = writeln!(
                out,
                "{:>12}  {:<10} {place}  [{} {}]",
                human_bytes(stack.bytes),
                truncate(&stack.allocator, 10),
                process.pid,
                process.command
            );
        }
        out
    }
}

/// What the budget says of a process's figures and cost.
fn note(process: &crate::report::model::ProcessReport) -> String {
    let mut notes = Vec::new();
    if process.over_budget {
        notes.push("over budget");
    }
    if process.partial {
        notes.push("partial");
    } else if process.counted.is_some() {
        notes.push("estimate");
    }
    notes.join(", ")
}

fn truncate(text: &str, width: usize) -> String {
    text.chars().take(width).collect()
}

/// A process's rate, in bytes per second: since the last view (`before`,
/// its bytes and time then); over its last span while its figures are
/// scaled, as they grow only at a span's end (since the last view said
/// 0 B/s most of the time, then a burst).
fn rate(process: &ProcessReport, before: Option<(u64, f64)>, secs: f64) -> f64 {
    if let Some(rate) = process.span_rate {
        return rate;
    }
    match before {
        Some((bytes, then)) if secs > then => {
            process.bytes.saturating_sub(bytes) as f64 / (secs - then)
        }
        _ => 0.0,
    }
}
