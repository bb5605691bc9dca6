//! `memprof monitor` on a terminal: a view like top's, redrawn every
//! interval, of the processes and call sites allocating most, with each
//! process's rate since the last view.
use std::{collections::HashMap, fmt::Write as _};

use super::{
    model::Report,
    text::{human_bytes, thousands},
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
        let _ =
            writeln!(
            out,
            "memprof monitor  {:.0} s  {} process{}  {} allocated{}  {serving}  (Ctrl-C to stop)\n",
            report.duration_secs,
            report.processes.len(),
            if report.processes.len() == 1 { "" } else { "es" },
            human_bytes(report.bytes),
            if report.exact { "" } else { " (estimates)" },
        );
        let _ = writeln!(
            out,
            "{:>8}  {:<16} {:>12} {:>12} {:>12} {:>12}",
            "PID", "COMMAND", "ALLOCATED", "RATE/s", "CALLS", "LIVE"
        );
        let mut processes: Vec<_> = report.processes.iter().collect();
        processes.sort_by_key(|p| std::cmp::Reverse(p.bytes));
        let mut now = HashMap::new();
        for process in processes.iter().take(ROWS) {
            let key = (process.pid, process.command.clone());
            let rate = match self.before.get(&key) {
                Some(&(bytes, secs)) if report.duration_secs > secs => {
                    process.bytes.saturating_sub(bytes) as f64 / (report.duration_secs - secs)
                }
                _ => 0.0,
            };
            now.insert(key, (process.bytes, report.duration_secs));
            let _ = writeln!(
                out,
                "{:>8}  {:<16} {:>12} {:>12} {:>12} {:>12}",
                process.pid,
                truncate(&process.command, 16),
                human_bytes(process.bytes),
                format!("{}/s", human_bytes(rate as u64)),
                thousands(process.count),
                process
                    .live
                    .as_ref()
                    .map_or("-".to_string(), |live| human_bytes(live.live_bytes)),
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

fn truncate(text: &str, width: usize) -> String {
    text.chars().take(width).collect()
}
