//! Saved JSON reports: loading them back and cutting them again
//! (`memprof report`, `memprof diff`).
use std::{collections::HashMap, io::Read as _, path::Path};

use anyhow::Result;

use super::{
    compression,
    filters::{skip_calls, StackFilter},
    frame,
    json::{tables, COMPACT_VERSION},
    model::{
        FiltersReport, HiddenReport, ProcessReport, Report, StackReport, TimelineStack,
        REPORT_VERSION, TIMELINE_STACKS,
    },
    stacks::{cut, frame_identity, group_by_caller, group_by_type, FrameIdentity},
};
use crate::{
    host::untrusted,
    human::error::UserError,
    report::options::{GroupBy, ReportOptions},
};

/// The saved report at `path`, of at most `max_bytes`. Only a regular
/// file is read (a FIFO or a device is refused at once).
pub fn load(path: &Path, max_bytes: u64) -> Result<Report> {
    let shown = path.display().to_string();
    let cannot = |reason: &dyn std::fmt::Display| {
        UserError::new(format!("{shown}: cannot read it: {reason}"))
    };
    let file = untrusted::open(path).map_err(|refused| match refused {
        untrusted::Refused::Unopenable(err) => cannot(&err),
        refused => cannot(&refused),
    })?;
    let size = file.metadata().map_err(|err| cannot(&err))?.len();
    if size > max_bytes {
        return Err(UserError::new(format!(
            "{shown}: {} bytes, more than --max-report-size ({max_bytes}): raise it to read this report",
            size
        ))
        .with_exit_code(2)
        .into());
    }
    let mut text = Vec::with_capacity(size as usize);
    file.take(max_bytes)
        .read_to_end(&mut text)
        .map_err(|err| cannot(&err))?;
    let text = compression::decompressed(text, max_bytes).map_err(|err| {
        UserError::new(format!(
            "{shown}: cannot decompress it: {err} (--max-report-size {max_bytes})"
        ))
        .with_exit_code(2)
    })?;
    parse_bytes(&text, &shown)
}

/// A saved report from its text; `shown` names it in errors (one line each).
pub fn parse(text: &str, shown: &str) -> Result<Report> {
    parse_bytes(text.as_bytes(), shown)
}

/// As [`parse`]: the version and version 2's tables are read first (the
/// rest skipped, not kept), then the report itself, typed, its frames
/// resolved through the tables: no tree of the whole document is made.
fn parse_bytes(text: &[u8], shown: &str) -> Result<Report> {
    #[derive(serde::Deserialize)]
    struct Head {
        version: Option<serde_json::Value>,
        #[serde(default)]
        modules: Vec<tables::ModuleEntry>,
        #[serde(default)]
        files: Vec<String>,
        #[serde(default)]
        functions: Vec<tables::FunctionEntry>,
        #[serde(default)]
        locations: Vec<tables::LocationEntry>,
    }
    let not_json = |err: serde_json::Error| -> anyhow::Error {
        match err.classify() {
            serde_json::error::Category::Data => UserError::new(format!(
                "{shown}: not a memprof JSON report (no \"version\" field, or malformed tables: {err})"
            ))
            .into(),
            _ => UserError::new(format!("{shown}: not JSON: {err}")).into(),
        }
    };
    let head: Head = serde_json::from_slice(text).map_err(not_json)?;
    let frames = match head.version.as_ref().and_then(|v| v.as_u64()) {
        Some(version) if version == REPORT_VERSION as u64 => Vec::new(),
        Some(version) if version == COMPACT_VERSION as u64 => tables::Tables {
            modules: head.modules,
            files: head.files,
            functions: head.functions,
            locations: head.locations,
        }
        .frames()
        .map_err(|err| UserError::new(format!("{shown}: not a memprof JSON report: {err}")))?,
        Some(version) => {
            return Err(UserError::new(format!(
                "{shown}: report version {version}; this memprof reads versions {REPORT_VERSION} and {COMPACT_VERSION}"
            ))
            .into())
        }
        None => {
            return Err(UserError::new(format!(
                "{shown}: not a memprof JSON report (no \"version\" field)"
            ))
            .into())
        }
    };
    let mut report: Report = frame::with_table(frames, || serde_json::from_slice(text))
        .map_err(|err| UserError::new(format!("{shown}: not a memprof JSON report: {err}")))?;
    // The model's own layout, whichever was read.
    report.version = REPORT_VERSION;
    Ok(report)
}

/// Applies --focus, --ignore, --skip-frames, --group-by caller or type,
/// --min-bytes, --top and --depth to a saved report. It holds only the
/// stacks it was saved with: with --focus/--ignore a process's totals
/// become those of its saved stacks that are kept.
pub fn recut(mut report: Report, options: &ReportOptions) -> Report {
    let filter = StackFilter::of(options);
    // Rows already summed are not split or summed again.
    let regroup = match options.group_by {
        GroupBy::Stack => None,
        grouping => (report.group_by == "stack").then_some(grouping),
    };
    let regrouped = |stacks| match regroup {
        Some(GroupBy::Type) => group_by_type(stacks),
        _ => group_by_caller(stacks),
    };
    let drop_dead = report
        .live
        .as_ref()
        .is_some_and(|live| live.min_age_secs.is_some());
    let mut hidden_in_all = HiddenReport::default();
    for process in &mut report.processes {
        bands_to_stacks(process);
        if filter.is_active() {
            let hidden = filter_stacks(process, &filter);
            hidden_in_all.add(hidden);
        }
        if regroup.is_some() {
            process.stacks = regrouped(std::mem::take(&mut process.stacks));
        }
        cut(&mut process.stacks, options, drop_dead);
        stacks_to_bands(process);
        if let Some(live) = &mut process.live {
            if filter.is_active() {
                live.peak_stacks = kept_stacks(std::mem::take(&mut live.peak_stacks), &filter).0;
            }
            if regroup.is_some() {
                live.peak_stacks = regrouped(std::mem::take(&mut live.peak_stacks));
            }
            cut(&mut live.peak_stacks, options, true);
        }
    }
    let applied = options.cut_report();
    report.cut = Some(match &report.cut {
        Some(saved) => saved.then(&applied),
        None => applied,
    });
    if let Some(grouping) = regroup {
        report.group_by = match grouping {
            GroupBy::Type => "type",
            _ => "caller",
        }
        .to_string();
    }
    if filter.hides() {
        report.bytes = report.processes.iter().map(|p| p.bytes).sum();
        report.count = report.processes.iter().map(|p| p.count).sum();
    }
    if let Some(applied) = filter.report() {
        let filters = report.filters.get_or_insert_with(FiltersReport::default);
        filters.focus.extend(applied.focus);
        filters.ignore.extend(applied.ignore);
        filters.skip_frames += applied.skip_frames;
        filters.hidden.add(hidden_in_all);
    }
    report
}

/// Filters a saved process's stacks. With --focus/--ignore its totals
/// become those of the stacks kept (the saved ones: the rest is unknown),
/// and so does its timeline's total.
fn filter_stacks(process: &mut ProcessReport, filter: &StackFilter) -> HiddenReport {
    let before = process.stacks.len();
    let (kept, hidden) = kept_stacks(std::mem::take(&mut process.stacks), filter);
    let summary = HiddenReport {
        hidden_bytes: hidden.iter().map(|s| s.bytes).sum(),
        hidden_count: hidden.iter().map(|s| s.count).sum(),
        hidden_stacks: hidden.len() as u64,
    };
    // Stacks --skip-frames summed count as one.
    let merged_away = before - hidden.len() - kept.len();
    process.total_stacks = process.total_stacks.saturating_sub(merged_away);
    process.stacks = kept;
    if !filter.hides() {
        return summary;
    }
    if let Some(timeline) = &mut process.timeline {
        timeline.total = filtered_total(&timeline.total, &process.stacks, &hidden);
    }
    process.bytes = process.stacks.iter().map(|s| s.bytes).sum();
    process.count = process.stacks.iter().map(|s| s.count).sum();
    process.total_stacks = process.stacks.len();
    let mut hidden_here = process.hidden.unwrap_or_default();
    hidden_here.add(summary);
    process.hidden = Some(hidden_here);
    summary
}

/// A timeline's total without what `hidden` stacks held: exact when the
/// timeline followed each of them; else only the followed stacks `kept`
/// are known to remain.
fn filtered_total(total: &[u64], kept: &[StackReport], hidden: &[StackReport]) -> Vec<u64> {
    let band_at = |stacks: &[StackReport], i: usize| -> u64 {
        stacks.iter().filter_map(|s| s.band.as_ref()?.get(i)).sum()
    };
    if hidden.iter().all(|s| s.band.is_some()) {
        (0..total.len())
            .map(|i| total[i].saturating_sub(band_at(hidden, i)))
            .collect()
    } else {
        (0..total.len()).map(|i| band_at(kept, i)).collect()
    }
}

/// The stacks the filter keeps, each without its skipped frames and
/// (with --skip-frames) summed with those that now read the same; and the
/// stacks it hid.
fn kept_stacks(
    stacks: Vec<StackReport>,
    filter: &StackFilter,
) -> (Vec<StackReport>, Vec<StackReport>) {
    let (mut kept, hidden): (Vec<_>, Vec<_>) = stacks
        .into_iter()
        .partition(|s| filter.keeps(s.frames.iter().map(|f| &**f)));
    if !filter.skips() {
        return (kept, hidden);
    }
    for stack in &mut kept {
        skip_calls(&mut stack.frames, filter);
    }
    (merge_same_frames(kept), hidden)
}

/// Sums saved stacks that read the same (after frames were skipped).
fn merge_same_frames(stacks: Vec<StackReport>) -> Vec<StackReport> {
    let mut merged: Vec<StackReport> = Vec::with_capacity(stacks.len());
    let mut index: HashMap<(String, bool, Vec<FrameIdentity>), usize> = HashMap::new();
    for stack in stacks {
        let identity = (
            stack.allocated(),
            stack.partial,
            stack.frames.iter().map(|f| frame_identity(f)).collect(),
        );
        match index.get(&identity) {
            Some(&at) => merged[at].absorb(stack),
            None => {
                index.insert(identity, merged.len());
                merged.push(stack);
            }
        }
    }
    merged
}

/// Gives each stack its timeline values while the stacks are cut again
/// (they move; stacks regrouped by caller lose them to the rest).
fn bands_to_stacks(process: &mut ProcessReport) {
    let Some(timeline) = &mut process.timeline else {
        return;
    };
    for band in std::mem::take(&mut timeline.stacks) {
        if let Some(stack) = process.stacks.get_mut(band.stack) {
            stack.band = Some(band.values);
        }
    }
}

fn stacks_to_bands(process: &mut ProcessReport) {
    let Some(timeline) = &mut process.timeline else {
        return;
    };
    timeline.stacks = process
        .stacks
        .iter_mut()
        .enumerate()
        .filter_map(|(stack, s)| s.band.take().map(|values| TimelineStack { stack, values }))
        .take(TIMELINE_STACKS)
        .collect();
}
