//! The human-readable report: plain when piped; on a terminal, cut to its
//! width and coloured (unless NO_COLOR is set).
use std::io::IsTerminal as _;

use anstyle::{AnsiColor, Style};
use memprof_common::lost::LostCause;

use super::model::{
    FiltersReport, FrameReport, HiddenReport, LiveProcessReport, LiveStackReport, ProcessReport,
    RecordingReport, Report, SeriesPoint, StackReport,
};
use crate::human::numbers::{how_many, human_bytes, thousands};

/// How the report will be shown.
#[derive(Clone, Copy, Debug, Default)]
pub struct Terminal {
    pub color: bool,
    /// Lines longer than this are cut, when set.
    pub width: Option<usize>,
}

impl Terminal {
    /// Stdout as it is: a terminal gets colour and its width; a pipe or a
    /// file gets plain, whole lines.
    pub fn of_stdout() -> Terminal {
        if !std::io::stdout().is_terminal() {
            return Terminal::default();
        }
        Terminal {
            color: std::env::var_os("NO_COLOR").is_none_or(|v| v.is_empty()),
            width: terminal_size::terminal_size().map(|(width, _)| width.0 as usize),
        }
    }
}

/// What a line is, for its colour.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Kind {
    Title,
    Process,
    Plain,
    Stack,
    Frame,
    Faint,
    Warning,
}

impl Kind {
    fn style(self) -> Style {
        match self {
            Kind::Title => Style::new().bold(),
            Kind::Process => Style::new().bold().fg_color(Some(AnsiColor::Cyan.into())),
            Kind::Stack => Style::new().bold().fg_color(Some(AnsiColor::Yellow.into())),
            Kind::Faint => Style::new().dimmed(),
            Kind::Warning => Style::new().fg_color(Some(AnsiColor::Red.into())),
            Kind::Plain | Kind::Frame => Style::new(),
        }
    }
}

/// The report's lines, each with its kind.
#[derive(Default)]
struct Lines(Vec<(Kind, String)>);

impl Lines {
    fn push(&mut self, kind: Kind, line: String) {
        self.0.push((kind, line));
    }

    fn blank(&mut self) {
        self.0.push((Kind::Plain, String::new()));
    }

    fn finish(self, terminal: Terminal) -> String {
        let mut out = String::new();
        for (kind, line) in self.0 {
            let line = match terminal.width {
                Some(width) if line.chars().count() > width => {
                    let mut cut: String = line.chars().take(width.saturating_sub(1)).collect();
                    cut.push('…');
                    cut
                }
                _ => line,
            };
            if terminal.color && kind.style() != Style::new() && !line.is_empty() {
                let style = kind.style();
                out.push_str(&format!("{style}{line}{style:#}"));
            } else {
                out.push_str(&line);
            }
            out.push('\n');
        }
        out
    }
}

/// Plain text, as for a pipe or a file.
pub fn render(report: &Report) -> String {
    render_for(report, Terminal::default())
}

pub fn render_for(report: &Report, terminal: Terminal) -> String {
    let mut out = Lines::default();
    let live_total: Option<(u64, u64)> = report
        .processes
        .iter()
        .map(|p| p.live.as_ref().map(|l| (l.live_bytes, l.live_count)))
        .try_fold((0, 0), |(b, c), live| live.map(|(lb, lc)| (b + lb, c + lc)));
    out.push(
        Kind::Title,
        format!(
            "memprof: {}{} in {}, {}, {:.2} s ({})",
            match live_total.filter(|_| report.is_live()) {
                Some((bytes, count)) => format!(
                    "{} in {} still allocated, of ",
                    human_bytes(bytes),
                    how_many(count, "block", "blocks")
                ),
                None => String::new(),
            },
            human_bytes(report.bytes),
            how_many(report.count, "allocation", "allocations"),
            how_many(report.processes.len() as u64, "process", "processes"),
            report.duration_secs,
            match report.sample_bytes {
                // --usdt: the programs' own samples.
                None if !report.exact => {
                    "estimates from the programs' own samples (USDT)".to_string()
                }
                // --while, --delay...: only some calls were recorded.
                None if report.recording.is_some() =>
                    "exact counts of the calls recorded".to_string(),
                None => "exact counts, every call recorded".to_string(),
                Some(mean) => format!(
                    "estimates from samples, one per {} allocated on average",
                    human_bytes(mean)
                ),
            },
        ),
    );
    if let Some(recording) = &report.recording {
        out.push(Kind::Warning, recording_line(recording));
    }
    if let Some(totals) = report.budget.as_ref().and_then(|b| b.totals.as_ref()) {
        out.push(Kind::Plain, budget_totals_line(totals));
    }
    if let Some(filters) = &report.filters {
        out.push(Kind::Warning, filters_line(filters));
    }
    for process in &report.processes {
        render_process(&mut out, process, report);
    }
    render_lost(&mut out, report);
    out.finish(terminal)
}

/// Under `monitor`'s budget: how much of the totals is counted, estimated
/// and partial.
fn budget_totals_line(totals: &crate::report::model::BudgetTotals) -> String {
    let part = |figures: &crate::report::model::KindTotals, what: &str| {
        format!(
            "{} {what} ({}, {})",
            figures.processes,
            human_bytes(figures.bytes),
            how_many(figures.count, "allocation", "allocations"),
        )
    };
    format!(
        "Of these: {}; {}; {}.",
        part(&totals.counted, "counted in full"),
        part(&totals.estimated, "estimated from windows"),
        part(&totals.partial, "partial, counted in part only"),
    )
}

fn render_process(out: &mut Lines, process: &ProcessReport, report: &Report) {
    let group_by = report.group_by.as_str();
    out.blank();
    let name = if process.cmdline.is_empty() {
        process.command.clone()
    } else {
        process.cmdline.join(" ")
    };
    out.push(
        Kind::Process,
        format!(
            "pid {}  {}{}{}",
            process.pid,
            name,
            if process.exe.is_empty() {
                String::new()
            } else {
                format!("  ({})", process.exe)
            },
            if process.exited { "  [exited]" } else { "" },
        ),
    );
    if process.partial {
        out.push(
            Kind::Warning,
            "  partial: memprof's probes were out for part of its life and too little was seen to estimate the rest; these figures are what was counted".to_string(),
        );
    }
    if process.over_budget {
        out.push(
            Kind::Warning,
            "  over budget: its probes cost it more than --max-overhead even at the shortest duty cycle".to_string(),
        );
    }
    let unit = match group_by {
        "caller" => ("caller", "callers"),
        "type" => ("type", "types"),
        _ => ("stack", "stacks"),
    };
    match &process.live {
        Some(live) => render_live_process(out, process, live, report, unit),
        None => out.push(
            Kind::Plain,
            format!(
                "  {} in {} from {}; {} shown, {}",
                human_bytes(process.bytes),
                how_many(process.count, "allocation", "allocations"),
                how_many(process.total_stacks as u64, unit.0, unit.1),
                process.stacks.len(),
                order_of(report, "largest first"),
            ),
        ),
    }
    if let Some(hidden) = process.hidden.filter(|h| h.hidden_stacks > 0) {
        out.push(
            Kind::Plain,
            format!("  filters hid {}", hidden_amount(&hidden)),
        );
    }
    if !process.series.is_empty() {
        render_series(out, &process.series);
    }
    for (rank, stack) in process.stacks.iter().enumerate() {
        render_stack(out, rank + 1, stack);
    }
    if let Some(live) = &process.live {
        render_peak(out, live);
    }
}

/// How the stacks are ordered (`--sort`); `default` when not given.
fn order_of<'a>(report: &'a Report, default: &'a str) -> &'a str {
    match report.cut.as_ref().and_then(|cut| cut.sort.as_deref()) {
        Some("bytes") => "largest first",
        Some("calls") => "most calls first",
        Some("live") => "most live bytes first",
        Some("temporary") => "most temporary blocks first",
        Some("average") => "largest average first",
        _ => default,
    }
}

/// The heading of a process in live mode: what it holds, its peak, and
/// what could not be attributed.
fn render_live_process(
    out: &mut Lines,
    process: &ProcessReport,
    live: &LiveProcessReport,
    report: &Report,
    unit: (&str, &str),
) {
    let when = if process.exited { "at exit" } else { "now" };
    let min_age = report
        .live
        .as_ref()
        .and_then(|settings| settings.min_age_secs)
        .map_or(String::new(), |age| {
            format!(", at least {} old", human_age(age))
        });
    out.push(
        Kind::Plain,
        format!(
            "  still allocated {when}{min_age}: {} in {}{}; {} of its {} shown, {}",
            human_bytes(live.live_bytes),
            how_many(live.live_count, "block", "blocks"),
            if process.exited && live.live_count > 0 {
                " (leaks)"
            } else {
                ""
            },
            process.stacks.len(),
            unit.1,
            order_of(report, "most live bytes first"),
        ),
    );
    let peak = if live.peak_exact {
        format!(
            "  peak: {} at {:.2} s, at most {} at once ({})",
            human_bytes(live.peak_live_bytes),
            live.peak_secs,
            how_many(live.peak_live_count, "block", "blocks"),
            // Sampled: the estimates' peak, taken at every sample.
            if report.exact {
                "exact"
            } else {
                "of the estimates"
            },
        )
    } else {
        let poll = report
            .live
            .as_ref()
            .map_or(0.1, |settings| settings.peak_poll_secs);
        format!(
            "  peak: {} in {} at {:.2} s (heap polled every {:.2} s or less: a shorter peak can be missed)",
            human_bytes(live.peak_live_bytes),
            how_many(live.peak_live_count, "block", "blocks"),
            live.peak_secs,
            poll,
        )
    };
    out.push(Kind::Plain, peak);
    if live.mapped_peak_bytes > 0 {
        out.push(
            Kind::Plain,
            format!(
                "  direct mappings (mmap, mremap, brk; not in the peak above): {} mapped now, at most {} at {:.2} s (exact)",
                human_bytes(live.mapped_live_bytes),
                human_bytes(live.mapped_peak_bytes),
                live.mapped_peak_secs,
            ),
        );
    }
    out.push(
        Kind::Plain,
        format!(
            "  allocated in all: {} in {} from {}",
            human_bytes(process.bytes),
            how_many(process.count, "allocation", "allocations"),
            how_many(process.total_stacks as u64, unit.0, unit.1),
        ),
    );
    if live.unknown_frees > 0 {
        out.push(
            Kind::Faint,
            format!(
                "  {} of blocks memprof never saw allocated (before it attached, or untracked): counted, not attributed",
                how_many(live.unknown_frees, "free", "frees")
            ),
        );
    }
    if live.internal_frees > 0 {
        out.push(
            Kind::Faint,
            format!(
                "  {} by the C library of its own blocks (its per-thread caches, at thread exit): not the program's",
                how_many(live.internal_frees, "free", "frees")
            ),
        );
    }
    if live.untracked_count > 0 {
        out.push(
            Kind::Warning,
            format!(
                "  {} untracked: live figures are too low (why: lost events, below)",
                how_many(live.untracked_count, "block", "blocks")
            ),
        );
    }
}

/// The stacks that held most at the peak, one line each.
fn render_peak(out: &mut Lines, live: &LiveProcessReport) {
    if live.peak_stacks.is_empty() {
        return;
    }
    out.blank();
    let heading = if live.peak_exact {
        format!(
            "  at the peak ({} at {:.2} s), held by (sites captured at {:.2} s holding {}, {}):",
            human_bytes(live.peak_live_bytes),
            live.peak_secs,
            live.peak_stacks_secs,
            human_bytes(live.peak_stacks_bytes),
            share_of_peak(live),
        )
    } else {
        format!(
            "  at the peak ({} at {:.2} s), held by:",
            human_bytes(live.peak_live_bytes),
            live.peak_secs
        )
    };
    out.push(Kind::Plain, heading);
    for stack in live.peak_stacks.iter().take(5) {
        let held = stack.live.unwrap_or_default();
        let first = stack.frames.first();
        out.push(
            Kind::Plain,
            format!(
                "    {:>10} in {:>8} {:<6}  {}  {}",
                human_bytes(held.live_bytes),
                thousands(held.live_count),
                if held.live_count == 1 {
                    "block"
                } else {
                    "blocks"
                },
                first.map(|f| function_label(f)).unwrap_or_default(),
                first.map(|f| location_label(f)).unwrap_or_default(),
            ),
        );
    }
}

/// "99.8% of the peak": how much of the exact peak the captured sites held.
fn share_of_peak(live: &LiveProcessReport) -> String {
    if live.peak_live_bytes == 0 {
        return "the whole peak".to_string();
    }
    let share = live.peak_stacks_bytes as f64 * 100.0 / live.peak_live_bytes as f64;
    format!("{share:.1}% of the peak")
}

/// The --interval series as a small table.
fn render_series(out: &mut Lines, series: &[SeriesPoint]) {
    out.blank();
    let live = series.iter().any(|p| p.live_bytes.is_some());
    out.push(
        Kind::Faint,
        format!(
            "  {:>10}  {:>12}  {:>14}{}",
            "time",
            "allocated",
            "calls",
            if live {
                format!("  {:>12}", "live")
            } else {
                String::new()
            }
        ),
    );
    for point in series {
        out.push(
            Kind::Plain,
            format!(
                "  {:>8.1} s  {:>12}  {:>14}{}",
                point.secs,
                human_bytes(point.bytes),
                thousands(point.count),
                point
                    .live_bytes
                    .map_or(String::new(), |live| format!("  {:>12}", human_bytes(live)))
            ),
        );
    }
}

fn render_stack(out: &mut Lines, rank: usize, stack: &StackReport) {
    out.blank();
    let average = stack.bytes.checked_div(stack.count).unwrap_or(0);
    let mut heading = match stack.live {
        Some(live) => live_stack_heading(rank, stack, &live),
        None => format!(
            "  #{rank:<3} {:>10}  {:>14} B  {:>10} {:<5}  avg {:>10}  {}",
            human_bytes(stack.bytes),
            thousands(stack.bytes),
            thousands(stack.count),
            if stack.count == 1 { "call" } else { "calls" },
            human_bytes(average),
            stack.allocated(),
        ),
    };
    if let Some(samples) = stack.samples {
        heading.push_str(&format!("  ({})", how_many(samples, "sample", "samples")));
    }
    out.push(Kind::Stack, heading);
    let width = stack
        .frames
        .iter()
        .map(|f| function_label(f).len())
        .max()
        .unwrap_or(0)
        .min(60);
    for frame in &stack.frames {
        out.push(
            Kind::Frame,
            format!(
                "        {:<width$}  {}",
                function_label(frame),
                location_label(frame)
            ),
        );
    }
    if stack.partial {
        out.push(
            Kind::Faint,
            "        [deeper frames not recorded: see lost events]".to_string(),
        );
    }
}

/// "#1  5.9 KiB live in 3 blocks, oldest 0.30 s | 10.3 KiB in 10 calls, 7 temporary  realloc".
fn live_stack_heading(rank: usize, stack: &StackReport, live: &LiveStackReport) -> String {
    let mut heading = format!(
        "  #{rank:<3} {:>10} live in {:>8} {:<7} oldest {:>8}  | {:>10} in {:>8} {:<6} {} temporary",
        human_bytes(live.live_bytes),
        thousands(live.live_count),
        if live.live_count == 1 { "block," } else { "blocks," },
        live.oldest_age_secs.map_or("-".to_string(), human_age),
        human_bytes(stack.bytes),
        thousands(stack.count),
        if stack.count == 1 { "call," } else { "calls," },
        thousands(live.temporary_count),
    );
    if live.untracked_count > 0 {
        heading.push_str(&format!(", {} untracked", thousands(live.untracked_count)));
    }
    heading.push_str(&format!("  {}", stack.allocated()));
    heading
}

/// "0.30 s", "4.0 min", "2.5 h".
pub fn human_age(secs: f64) -> String {
    if secs < 120.0 {
        format!("{secs:.2} s")
    } else if secs < 7200.0 {
        format!("{:.1} min", secs / 60.0)
    } else {
        format!("{:.1} h", secs / 3600.0)
    }
}

fn function_label(frame: &FrameReport) -> String {
    let name = frame.function.clone().unwrap_or_else(|| "??".to_string());
    if frame.inlined {
        format!("{name} (inlined)")
    } else {
        name
    }
}

/// "file.c:12", else "libfoo.so+0x1234" (offset in the file), else the
/// raw address.
fn location_label(frame: &FrameReport) -> String {
    match (&frame.file, frame.line, &frame.module) {
        (Some(file), Some(line), _) => format!("{}:{line}", short_path(file)),
        (Some(file), None, _) => short_path(file).to_string(),
        (None, _, Some(module)) => match &frame.module_offset {
            Some(offset) => format!("{}+{offset}", short_path(module)),
            None => format!("{} {}", short_path(module), frame.address),
        },
        (None, _, None) => frame.address.clone(),
    }
}

fn short_path(path: &str) -> &str {
    path.rsplit('/').next().unwrap_or(path)
}

/// What each lost-event cause means, and what to do about it.
const LOST_CAUSES: [(&str, &str); LostCause::COUNT as usize] = [
    ("map_full", "not counted at all; raise --max-stacks"),
    ("stack_collision", "counted, direct caller only; raise --stack-map-size"),
    (
        "stack_error",
        "counted, direct caller only: the frame-pointer walk failed (code without frame pointers, such as glibc)",
    ),
    ("read_fault", "counted, caller unknown"),
    ("notice_dropped", "process announced late, symbolized from a later snapshot"),
    (
        "live_table_full",
        "counted in the totals, not tracked as live (untracked); raise --max-live",
    ),
    (
        "missed_free",
        "a block's free was not seen; it was released when its address was handed out again",
    ),
    (
        "thread_table_full",
        "a thread's state was unavailable: an allocation counted but not tracked, or a free not matched",
    ),
    (
        "heap_untracked",
        "a process's exact heap figures could not be kept (over 16,384 processes): its peak is not exact",
    ),
    (
        "unwind_no_info",
        "counted, stack partial (--unwind dwarf): no unwind table for an address (library tables not loaded yet, code without CFI, or code in no file: a JIT's)",
    ),
    (
        "unwind_unsupported",
        "counted, stack partial (--unwind dwarf): a frame the tables cannot unwind (signal trampoline, hand-written assembly)",
    ),
    (
        "unwind_read_fault",
        "counted, stack partial (--unwind dwarf): a stack word could not be read",
    ),
    (
        "unwind_too_deep",
        "counted, stack partial: more than 128 frames above the caller",
    ),
    (
        "unwind_table_full",
        "a library's unwind tables did not fit (raise --unwind-rows), or a process mapped more than 256 executable files",
    ),
    (
        "probe_dispatch",
        "not counted: a probe fired where memprof had no site (a bug: please report it)",
    ),
    (
        "process_table_full",
        "not counted: the process started when --max-processes were profiled already",
    ),
    (
        "stack_evicted",
        "counted with the caller only: its stack was evicted (ended processes') as the site took it",
    ),
    (
        "no_return_probe",
        "counted in the totals, not tracked as live: a forked child allocated before it had return probes",
    ),
    (
        "fork_unheld",
        "processes forked by a traced one that did not wait for their probes (a job-control shell's jobs: milliseconds), or could not get them: their calls until then went unseen",
    ),
    (
        "exec_count_dropped",
        "images exec'd over whose whole count could not be kept: their last period's calls are not in their totals",
    ),
    (
        "probed_late",
        "allocator libraries a running process loaded, probed for it only after it ran on: its calls in between (milliseconds) went unseen",
    ),
];

fn render_lost(out: &mut Lines, report: &Report) {
    out.blank();
    for unprobed in &report.unprobed {
        out.push(
            Kind::Warning,
            format!("not profiled: {}: {}", unprobed.program, unprobed.reason),
        );
    }
    for partial in &report.partly_probed {
        out.push(
            Kind::Warning,
            format!("profiled in part: {}: {}", partial.program, partial.reason),
        );
    }
    for unsymbolized in &report.unsymbolized {
        out.push(
            Kind::Warning,
            format!(
                "not symbolized: {}: {}",
                unsymbolized.module, unsymbolized.reason
            ),
        );
    }
    let lost: Vec<(&String, &u64)> = report.lost.iter().filter(|(_, &n)| n > 0).collect();
    if lost.is_empty() {
        out.push(Kind::Plain, "lost events: none".to_string());
        return;
    }
    out.push(Kind::Warning, "lost events:".to_string());
    for (cause, n) in lost {
        let meaning = LOST_CAUSES
            .iter()
            .find(|(name, _)| name == cause)
            .map_or("", |(_, meaning)| meaning);
        out.push(
            Kind::Plain,
            format!("  {cause} {}: {meaning}", thousands(*n)),
        );
    }
}

/// "filters: --focus 'parse' --skip-frames 1; hid 3 stacks: 1.0 MiB in 12 allocations".
pub fn filters_line(filters: &FiltersReport) -> String {
    let mut applied: Vec<String> = Vec::new();
    applied.extend(filters.focus.iter().map(|p| format!("--focus '{p}'")));
    applied.extend(filters.ignore.iter().map(|p| format!("--ignore '{p}'")));
    if filters.skip_frames > 0 {
        applied.push(format!("--skip-frames {}", filters.skip_frames));
    }
    let hid = if filters.focus.is_empty() && filters.ignore.is_empty() {
        String::new()
    } else {
        format!("; hid {}", hidden_amount(&filters.hidden))
    };
    format!("filters: {}{hid}", applied.join(" "))
}

/// "recorded only inside parse_input, 0.25-1.30 s, 2.00-3.10 s".
pub fn recording_line(recording: &RecordingReport) -> String {
    let mut parts = Vec::new();
    if !recording.while_functions.is_empty() {
        parts.push(format!(
            "only inside {}",
            recording.while_functions.join(" or ")
        ));
    }
    let windows: Vec<String> = recording
        .windows
        .iter()
        .map(|[from, to]| format!("{from:.2}-{to:.2} s"))
        .collect();
    parts.push(match windows.len() {
        0 => "nothing (recording never started)".to_string(),
        _ => windows.join(", "),
    });
    format!("recorded {}", parts.join(", "))
}

/// "3 stacks: 1.0 MiB in 12 allocations".
fn hidden_amount(hidden: &HiddenReport) -> String {
    format!(
        "{}: {} in {}",
        how_many(hidden.hidden_stacks, "stack", "stacks"),
        human_bytes(hidden.hidden_bytes),
        how_many(hidden.hidden_count, "allocation", "allocations")
    )
}
