//! Saved JSON reports: loading them back and cutting them again
//! (`memprof report`, `memprof diff`).
use std::{collections::HashMap, fs, path::Path};

use anyhow::Result;

use super::{
    filters::{skip_calls, StackFilter},
    model::{
        FiltersReport, HiddenReport, ProcessReport, Report, StackReport, TimelineStack,
        REPORT_VERSION, TIMELINE_STACKS,
    },
    stacks::{add_samples, cut, frame_identity, group_by_caller, merge_live, FrameIdentity},
};
use crate::{
    cli::{GroupBy, ReportOptions},
    error::UserError,
};

pub fn load(path: &Path) -> Result<Report> {
    let shown = path.display().to_string();
    let text = fs::read_to_string(path)
        .map_err(|err| UserError::new(format!("{shown}: cannot read it: {err}")))?;
    parse(&text, &shown)
}

/// A saved report from its text; `shown` names it in errors (one line each).
pub fn parse(text: &str, shown: &str) -> Result<Report> {
    let value: serde_json::Value = serde_json::from_str(text)
        .map_err(|err| UserError::new(format!("{shown}: not JSON: {err}")))?;
    match value.get("version").and_then(|v| v.as_u64()) {
        Some(version) if version == REPORT_VERSION as u64 => {}
        Some(version) => {
            return Err(UserError::new(format!(
                "{shown}: report version {version}; this memprof reads version {REPORT_VERSION}"
            ))
            .into())
        }
        None => {
            return Err(UserError::new(format!(
                "{shown}: not a memprof JSON report (no \"version\" field)"
            ))
            .into())
        }
    }
    serde_json::from_value(value)
        .map_err(|err| UserError::new(format!("{shown}: not a memprof JSON report: {err}")).into())
}

/// Applies --focus, --ignore, --skip-frames, --group-by caller,
/// --min-bytes, --top and --depth to a saved report. It holds only the
/// stacks it was saved with: with --focus/--ignore a process's totals
/// become those of its saved stacks that are kept.
pub fn recut(mut report: Report, options: &ReportOptions) -> Report {
    let filter = StackFilter::of(options);
    let regroup = options.group_by == GroupBy::Caller && report.group_by != "caller";
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
        if regroup {
            process.stacks = group_by_caller(std::mem::take(&mut process.stacks));
        }
        cut(&mut process.stacks, options, drop_dead);
        stacks_to_bands(process);
        if let Some(live) = &mut process.live {
            if filter.is_active() {
                live.peak_stacks = kept_stacks(std::mem::take(&mut live.peak_stacks), &filter).0;
            }
            if regroup {
                live.peak_stacks = group_by_caller(std::mem::take(&mut live.peak_stacks));
            }
            cut(&mut live.peak_stacks, options, true);
        }
    }
    if regroup {
        report.group_by = "caller".to_string();
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

/// Filters a saved process's stacks; with --focus/--ignore its totals
/// become those of the stacks kept (the saved ones: the rest is unknown).
fn filter_stacks(process: &mut ProcessReport, filter: &StackFilter) -> HiddenReport {
    let (kept, hidden) = kept_stacks(std::mem::take(&mut process.stacks), filter);
    process.stacks = kept;
    if !filter.hides() {
        return hidden.0;
    }
    if let Some(timeline) = &mut process.timeline {
        // What hidden stacks held leaves the timeline's total as well.
        for band in hidden.1.iter().filter_map(|s| s.band.as_ref()) {
            for (total, value) in timeline.total.iter_mut().zip(band) {
                *total = total.saturating_sub(*value);
            }
        }
    }
    process.bytes = process.stacks.iter().map(|s| s.bytes).sum();
    process.count = process.stacks.iter().map(|s| s.count).sum();
    process.total_stacks = process.stacks.len();
    let mut hidden_here = process.hidden.unwrap_or_default();
    hidden_here.add(hidden.0);
    process.hidden = Some(hidden_here);
    hidden.0
}

/// The stacks the filter keeps, each without its skipped frames and
/// summed with those that now read the same; and what it hid.
fn kept_stacks(
    stacks: Vec<StackReport>,
    filter: &StackFilter,
) -> (Vec<StackReport>, (HiddenReport, Vec<StackReport>)) {
    let (mut kept, hidden): (Vec<_>, Vec<_>) = stacks
        .into_iter()
        .partition(|s| filter.keeps(s.frames.iter()));
    for stack in &mut kept {
        skip_calls(&mut stack.frames, filter);
    }
    let summary = HiddenReport {
        hidden_bytes: hidden.iter().map(|s| s.bytes).sum(),
        hidden_count: hidden.iter().map(|s| s.count).sum(),
        hidden_stacks: hidden.len() as u64,
    };
    (merge_same_frames(kept), (summary, hidden))
}

/// Sums saved stacks that read the same (after frames were skipped).
fn merge_same_frames(stacks: Vec<StackReport>) -> Vec<StackReport> {
    let mut merged: Vec<StackReport> = Vec::with_capacity(stacks.len());
    let mut index: HashMap<(String, bool, Vec<FrameIdentity>), usize> = HashMap::new();
    for stack in stacks {
        let identity = (
            stack.allocator.clone(),
            stack.partial,
            stack.frames.iter().map(frame_identity).collect(),
        );
        match index.get(&identity) {
            Some(&at) => {
                let kept = &mut merged[at];
                kept.bytes += stack.bytes;
                kept.count += stack.count;
                kept.samples = add_samples(kept.samples, stack.samples);
                kept.live = merge_live(kept.live, stack.live);
                kept.band = match (kept.band.take(), stack.band) {
                    (Some(a), Some(b)) => Some(a.iter().zip(&b).map(|(x, y)| x + y).collect()),
                    // One of them is not followed: both go to the rest.
                    _ => None,
                };
            }
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
