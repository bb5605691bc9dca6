//! From the kernel's counts to a report: group by process, symbolize,
//! sort, cut to --top / --min-bytes / --depth.
use std::collections::{BTreeMap, BTreeSet, HashMap};

use memprof_common::{allocators::ALLOCATORS, AllocKey, AllocStats, LostCause, NO_STACK};

use super::model::{FrameReport, ProcessReport, Report, SeriesPoint, StackReport, REPORT_VERSION};
use crate::{
    cli::{GroupBy, ReportOptions},
    collect::Snapshot,
    procs::Catalog,
    symbolize::{Frame, Symbolizer},
};

/// Totals of each process (pid, image generation) at each --interval report.
pub type Series = HashMap<(u32, u32), Vec<SeriesPoint>>;

/// Adds a point for every process of `snapshot` to `series`.
pub fn record_series(series: &mut Series, snapshot: &Snapshot, secs: f64) {
    let mut totals: HashMap<(u32, u32), (u64, u64)> = HashMap::new();
    for (key, stats) in &snapshot.sites {
        let total = totals.entry((key.tgid, key.generation)).or_default();
        total.0 += stats.bytes;
        total.1 += stats.count;
    }
    for (process, (bytes, count)) in totals {
        series
            .entry(process)
            .or_default()
            .push(SeriesPoint { secs, bytes, count });
    }
}

pub fn build(
    snapshot: &Snapshot,
    catalog: &Catalog,
    symbolizer: &mut Symbolizer,
    options: &ReportOptions,
    duration_secs: f64,
    series: &Series,
) -> Report {
    let mut by_process: BTreeMap<(u32, u32), Vec<&(AllocKey, AllocStats)>> = BTreeMap::new();
    for site in &snapshot.sites {
        by_process
            .entry((site.0.tgid, site.0.generation))
            .or_default()
            .push(site);
    }
    let mut processes: Vec<ProcessReport> = by_process
        .into_iter()
        .map(|((pid, generation), sites)| {
            let info = catalog.get(pid, generation);
            let stacks = symbolized_stacks(snapshot, info, symbolizer, &sites);
            let stacks = match options.group_by {
                GroupBy::Stack => merge_identical(stacks),
                GroupBy::Caller => group_by_caller(stacks),
            };
            let mut report = process_report(pid, info, stacks, options);
            report.series = series.get(&(pid, generation)).cloned().unwrap_or_default();
            report
        })
        .collect();
    processes.sort_by(|a, b| b.bytes.cmp(&a.bytes).then(a.pid.cmp(&b.pid)));
    let lost = LostCause::ALL
        .iter()
        .map(|&cause| (cause.name().to_string(), snapshot.lost[cause as usize]))
        .collect();
    Report {
        version: REPORT_VERSION,
        mode: "alloc".to_string(),
        duration_secs,
        exact: true,
        group_by: match options.group_by {
            GroupBy::Stack => "stack",
            GroupBy::Caller => "caller",
        }
        .to_string(),
        bytes: processes.iter().map(|p| p.bytes).sum(),
        count: processes.iter().map(|p| p.count).sum(),
        processes,
        lost,
    }
}

/// Every stack of one process, symbolized in one batch, with all frames.
fn symbolized_stacks(
    snapshot: &Snapshot,
    info: Option<&crate::procs::ProcessInfo>,
    symbolizer: &mut Symbolizer,
    sites: &[&(AllocKey, AllocStats)],
) -> Vec<StackReport> {
    let addresses_of = |key: &AllocKey| -> Vec<u64> {
        let deeper = snapshot
            .stacks
            .get(&key.stack)
            .map(Vec::as_slice)
            .unwrap_or(&[]);
        std::iter::once(key.caller)
            .chain(deeper.iter().copied())
            .collect()
    };
    let unique: BTreeSet<u64> = sites
        .iter()
        .flat_map(|(key, _)| addresses_of(key))
        .filter(|&a| a != 0)
        .collect();
    let unique: Vec<u64> = unique.into_iter().collect();
    let symbolized: HashMap<u64, Vec<Frame>> = unique
        .iter()
        .copied()
        .zip(symbolizer.symbolize(info, &unique))
        .collect();
    sites
        .iter()
        .map(|(key, stats)| {
            let frames = addresses_of(key)
                .into_iter()
                .flat_map(|address| match symbolized.get(&address) {
                    Some(frames) => frames.iter().map(frame_report).collect(),
                    None => vec![frame_report(&unknown(address))],
                })
                .collect();
            StackReport {
                allocator: ALLOCATORS
                    .get(key.allocator as usize)
                    .map_or("?", |a| a.name)
                    .to_string(),
                bytes: stats.bytes,
                count: stats.count,
                partial: key.stack == NO_STACK,
                frames,
            }
        })
        .collect()
}

fn unknown(address: u64) -> Frame {
    Frame {
        address,
        function: None,
        file: None,
        line: None,
        module: None,
        module_offset: None,
        inlined: false,
    }
}

fn frame_report(frame: &Frame) -> FrameReport {
    FrameReport {
        address: format!("{:#x}", frame.address),
        function: frame.function.clone(),
        file: frame.file.clone(),
        line: frame.line,
        module: frame.module.clone(),
        inlined: frame.inlined,
    }
}

/// Sums stacks that read the same once symbolized: one source line can
/// hold several call sites (an unrolled loop), and users ask "which line".
fn merge_identical(stacks: Vec<StackReport>) -> Vec<StackReport> {
    let identity = |stack: &StackReport| {
        let frames: Vec<_> = stack
            .frames
            .iter()
            .map(|f| (frame_identity(f), f.inlined))
            .collect();
        (stack.allocator.clone(), stack.partial, frames)
    };
    let mut merged: Vec<StackReport> = Vec::new();
    let mut index = HashMap::new();
    for stack in stacks {
        match index.entry(identity(&stack)) {
            std::collections::hash_map::Entry::Occupied(slot) => {
                let kept: &mut StackReport = &mut merged[*slot.get()];
                kept.bytes += stack.bytes;
                kept.count += stack.count;
            }
            std::collections::hash_map::Entry::Vacant(slot) => {
                slot.insert(merged.len());
                merged.push(stack);
            }
        }
    }
    merged
}

/// What a frame is to a reader: (function, file, line), or its address
/// when it has no name.
pub type FrameIdentity = (Option<String>, Option<String>, Option<u32>, String);

pub fn frame_identity(frame: &FrameReport) -> FrameIdentity {
    match frame.function {
        Some(_) => (
            frame.function.clone(),
            frame.file.clone(),
            frame.line,
            String::new(),
        ),
        None => (None, None, None, frame.address.clone()),
    }
}

/// Sums the stacks that share frame 0 (function and file:line; the
/// address when there is no name).
pub fn group_by_caller(stacks: Vec<StackReport>) -> Vec<StackReport> {
    let mut groups: BTreeMap<FrameIdentity, (StackReport, BTreeSet<String>)> = BTreeMap::new();
    for stack in stacks {
        let Some(first) = stack.frames.first() else {
            continue;
        };
        let (group, allocators) = groups.entry(frame_identity(first)).or_insert_with(|| {
            let group = StackReport {
                allocator: String::new(),
                bytes: 0,
                count: 0,
                partial: false,
                frames: vec![first.clone()],
            };
            (group, BTreeSet::new())
        });
        group.bytes += stack.bytes;
        group.count += stack.count;
        allocators.insert(stack.allocator);
    }
    groups
        .into_values()
        .map(|(mut group, allocators)| {
            group.allocator = allocators.into_iter().collect::<Vec<_>>().join(",");
            group
        })
        .collect()
}

/// Largest first, then --min-bytes, --top and --depth.
pub fn cut(stacks: &mut Vec<StackReport>, options: &ReportOptions) {
    stacks.sort_by(|a, b| {
        b.bytes
            .cmp(&a.bytes)
            .then(b.count.cmp(&a.count))
            .then(a.frames.cmp(&b.frames))
    });
    stacks.retain(|s| s.bytes >= options.min_bytes.0);
    stacks.truncate(options.top);
    for stack in stacks {
        stack.frames.truncate(options.depth.max(1));
    }
}

fn process_report(
    pid: u32,
    info: Option<&crate::procs::ProcessInfo>,
    mut stacks: Vec<StackReport>,
    options: &ReportOptions,
) -> ProcessReport {
    let bytes = stacks.iter().map(|s| s.bytes).sum();
    let count = stacks.iter().map(|s| s.count).sum();
    let total_stacks = stacks.len();
    cut(&mut stacks, options);
    ProcessReport {
        pid,
        command: info.map(|i| i.command.clone()).unwrap_or_default(),
        exe: info.and_then(|i| i.exe.clone()).unwrap_or_default(),
        cmdline: info.map(|i| i.cmdline.clone()).unwrap_or_default(),
        exited: info.is_none_or(|i| i.exited),
        bytes,
        count,
        total_stacks,
        stacks,
        series: Vec::new(),
    }
}
