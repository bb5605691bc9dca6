//! The human-readable report.
use std::fmt::Write as _;

use super::model::{FrameReport, ProcessReport, Report, StackReport};

pub fn render(report: &Report) -> String {
    let mut out = String::new();
    let _ = writeln!(
        out,
        "memprof: {} in {} allocations, {} process{}, {:.2} s ({})",
        human_bytes(report.bytes),
        thousands(report.count),
        report.processes.len(),
        if report.processes.len() == 1 {
            ""
        } else {
            "es"
        },
        report.duration_secs,
        if report.exact {
            "exact counts, every call recorded"
        } else {
            "estimated from samples"
        },
    );
    for process in &report.processes {
        render_process(&mut out, process, &report.group_by);
    }
    render_lost(&mut out, report);
    out
}

fn render_process(out: &mut String, process: &ProcessReport, group_by: &str) {
    let _ = writeln!(out);
    let name = if process.cmdline.is_empty() {
        process.command.clone()
    } else {
        process.cmdline.join(" ")
    };
    let _ = writeln!(
        out,
        "pid {}  {}{}{}",
        process.pid,
        name,
        if process.exe.is_empty() {
            String::new()
        } else {
            format!("  ({})", process.exe)
        },
        if process.exited { "  [exited]" } else { "" },
    );
    let unit = if group_by == "caller" {
        "callers"
    } else {
        "stacks"
    };
    let _ = writeln!(
        out,
        "  {} in {} allocations from {} {unit}; {} shown, largest first",
        human_bytes(process.bytes),
        thousands(process.count),
        thousands(process.total_stacks as u64),
        process.stacks.len(),
    );
    if !process.series.is_empty() {
        render_series(out, &process.series);
    }
    for (rank, stack) in process.stacks.iter().enumerate() {
        render_stack(out, rank + 1, stack);
    }
}

/// The --interval series as a small table.
fn render_series(out: &mut String, series: &[super::model::SeriesPoint]) {
    let _ = writeln!(
        out,
        "\n  {:>10}  {:>12}  {:>14}",
        "time", "allocated", "calls"
    );
    for point in series {
        let _ = writeln!(
            out,
            "  {:>8.1} s  {:>12}  {:>14}",
            point.secs,
            human_bytes(point.bytes),
            thousands(point.count)
        );
    }
}

fn render_stack(out: &mut String, rank: usize, stack: &StackReport) {
    let _ = writeln!(out);
    let average = stack.bytes.checked_div(stack.count).unwrap_or(0);
    let _ = writeln!(
        out,
        "  #{rank:<3} {:>10}  {:>14} B  {:>10} calls  avg {:>10}  {}",
        human_bytes(stack.bytes),
        thousands(stack.bytes),
        thousands(stack.count),
        human_bytes(average),
        stack.allocator,
    );
    let width = stack
        .frames
        .iter()
        .map(|f| function_label(f).len())
        .max()
        .unwrap_or(0)
        .min(60);
    for frame in &stack.frames {
        let _ = writeln!(
            out,
            "        {:<width$}  {}",
            function_label(frame),
            location_label(frame)
        );
    }
    if stack.partial {
        let _ = writeln!(out, "        [deeper frames not recorded: see lost events]");
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

/// "file.c:12", else "libfoo.so+0x1234", else the raw address.
fn location_label(frame: &FrameReport) -> String {
    match (&frame.file, frame.line, &frame.module) {
        (Some(file), Some(line), _) => format!("{}:{line}", short_path(file)),
        (Some(file), None, _) => short_path(file).to_string(),
        (None, _, Some(module)) => format!("{} {}", short_path(module), frame.address),
        (None, _, None) => frame.address.clone(),
    }
}

fn short_path(path: &str) -> &str {
    path.rsplit('/').next().unwrap_or(path)
}

fn render_lost(out: &mut String, report: &Report) {
    let _ = writeln!(out);
    let lost: Vec<String> = report
        .lost
        .iter()
        .filter(|(_, &n)| n > 0)
        .map(|(cause, n)| format!("{cause} {}", thousands(*n)))
        .collect();
    if lost.is_empty() {
        let _ = writeln!(out, "lost events: none");
    } else {
        let _ = writeln!(out, "lost events: {}", lost.join(", "));
        let _ = writeln!(
            out,
            "  map_full: not counted at all (raise --max-stacks); stack_collision: counted, \
             direct caller only (raise --stack-map-size); stack_error: counted, direct caller \
             only (the frame-pointer walk failed: code without frame pointers, such as glibc); \
             read_fault: counted, caller unknown; notice_dropped: process symbolized late"
        );
    }
}

/// "4.0 MiB": binary units, as allocators count.
pub fn human_bytes(bytes: u64) -> String {
    if bytes < 1024 {
        return format!("{bytes} B");
    }
    bytesize::ByteSize::b(bytes).display().iec().to_string()
}

/// "1,234,567".
pub fn thousands(n: u64) -> String {
    let digits = n.to_string();
    let mut out = String::with_capacity(digits.len() + digits.len() / 3);
    for (i, c) in digits.chars().enumerate() {
        if i > 0 && (digits.len() - i).is_multiple_of(3) {
            out.push(',');
        }
        out.push(c);
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn formats_numbers() {
        assert_eq!(thousands(0), "0");
        assert_eq!(thousands(1234567), "1,234,567");
        assert_eq!(human_bytes(512), "512 B");
        assert_eq!(human_bytes(4 * 1024 * 1024), "4.0 MiB");
    }
}
