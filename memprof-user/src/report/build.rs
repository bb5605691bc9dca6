//! From the kernel's counts to a report: one entry per process image,
//! its stacks (see `stacks`), its live heap in live mode, the series.
use std::collections::{BTreeMap, HashMap};

use memprof_common::{
    images::ProcessImage,
    lost::LostCause,
    mappings::mapping_name,
    sites::{AllocKey, AllocStats},
};

use super::{
    filters::StackFilter,
    model::{
        LiveProcessReport, LiveSettingsReport, LiveStackReport, ProbeReport, ProcessReport,
        RecordingReport, Report, SeriesPoint, StackReport, UnprobedReport, UnsymbolizedReport,
        REPORT_VERSION,
    },
    stacks::{shown_stacks, StackTotals},
};
use crate::{
    collect::{
        catalog::{Catalog, ProcessInfo},
        heap::LiveView,
        timeline::TimelineRecorder,
        Snapshot,
    },
    report::{
        options::{GroupBy, ReportOptions},
        timeline::timeline_report,
    },
    symbolize::Symbolizer,
};

/// Live mode: the scanned live heap and how it was taken.
pub struct Live<'a> {
    pub view: &'a LiveView,
    pub settings: LiveSettingsReport,
}

/// Totals of each process (pid, image generation) at each --interval report.
pub type Series = HashMap<(u32, u32), Vec<SeriesPoint>>;

/// Adds a point for every process of `snapshot` to `series`; with the
/// live bytes the kernel counts in live mode.
pub fn record_series(series: &mut Series, snapshot: &Snapshot, secs: f64, live: bool) {
    let mut totals: HashMap<(u32, u32), AllocStats> = HashMap::new();
    for (key, stats) in &snapshot.sites {
        let total = totals.entry((key.tgid, key.generation)).or_default();
        *total = total.merged(*stats);
    }
    for (process, total) in totals {
        series.entry(process).or_default().push(SeriesPoint {
            secs,
            bytes: total.bytes,
            count: total.count,
            live_bytes: live.then_some(total.live_bytes),
        });
    }
}

/// How the profile was taken, beyond the kernel's counts.
pub struct Taken<'a> {
    pub duration_secs: f64,
    /// --interval points so far.
    pub series: &'a Series,
    pub live: Option<&'a Live<'a>>,
    /// --sample-bytes.
    pub sample_bytes: Option<u64>,
    /// What was probed, and which targets had nothing to probe.
    pub probes: &'a [ProbeReport],
    pub unprobed: &'a [UnprobedReport],
    /// Targets profiled in part, and what their figures miss.
    pub partly_probed: &'a [UnprobedReport],
    /// The heap's samples over time, when taken.
    pub timeline: Option<&'a TimelineRecorder>,
    /// What was recorded, when not every call.
    pub recording: Option<RecordingReport>,
    /// `monitor`'s budget: the totals of the processes the kernel counted
    /// (`Budget::counted_totals`), in place of their stacks' sums (but
    /// where --focus/--ignore hid stacks).
    pub counted_totals: Option<&'a HashMap<ProcessImage, AllocStats>>,
}

pub fn build(
    snapshot: &Snapshot,
    catalog: &Catalog,
    symbolizer: &mut Symbolizer,
    options: &ReportOptions,
    taken: Taken,
) -> Report {
    let Taken {
        duration_secs,
        series,
        live,
        sample_bytes,
        probes,
        unprobed,
        partly_probed,
        timeline,
        recording,
        counted_totals,
    } = taken;
    let mut by_process: BTreeMap<(u32, u32), Vec<&(AllocKey, AllocStats)>> = BTreeMap::new();
    for site in &snapshot.sites {
        by_process
            .entry((site.0.tgid, site.0.generation))
            .or_default()
            .push(site);
    }
    // Processes the kernel counted whose calls sampling never picked:
    // their totals, no stacks (unless stacks are filtered: whether
    // theirs would match is unknown).
    if StackFilter::of(options).report().is_none() {
        for image in counted_totals.into_iter().flat_map(HashMap::keys) {
            by_process
                .entry((image.tgid, image.generation))
                .or_default();
        }
    }
    let mut processes: Vec<ProcessReport> = by_process
        .into_iter()
        .map(|((pid, generation), sites)| {
            let info = catalog.get(pid, generation);
            let image = ProcessImage {
                tgid: pid,
                generation,
            };
            let live_of = |key: &AllocKey, stats: &AllocStats| {
                live.map(|live| scanned_live(live.view, key, stats))
            };
            let drop_dead = live.is_some_and(|l| l.settings.min_age_secs.is_some());
            let (stacks, mut totals) = shown_stacks(
                snapshot, info, symbolizer, &sites, live_of, options, drop_dead,
            );
            let hidden_sites = std::mem::take(&mut totals.hidden_sites);
            let mut report = process_report(pid, info, stacks, totals);
            report.generation = generation;
            let counted = counted_totals.and_then(|totals| totals.get(&image));
            if let (Some(counted), None) = (counted, report.hidden) {
                report.bytes = counted.bytes;
                report.count = counted.count;
            }
            report.timeline = timeline.map(|timeline| {
                timeline_report(
                    timeline,
                    (pid, generation),
                    &report.stacks,
                    &hidden_sites,
                    !report.exited,
                )
            });
            report.series = series.get(&(pid, generation)).cloned().unwrap_or_default();
            if let Some(live) = live {
                let live_process = live_process_report(
                    live.view, image, &sites, snapshot, info, symbolizer, options,
                );
                report.live = Some(live_process);
            }
            report
        })
        .collect();
    processes.sort_by(|a, b| b.bytes.cmp(&a.bytes).then(a.pid.cmp(&b.pid)));
    let filters = StackFilter::of(options).report().map(|mut filters| {
        for hidden in processes.iter().filter_map(|p| p.hidden) {
            filters.hidden.add(hidden);
        }
        filters
    });
    let lost = LostCause::ALL
        .iter()
        .map(|&cause| (cause.name().to_string(), snapshot.lost[cause as usize]))
        .collect();
    Report {
        version: REPORT_VERSION,
        mode: if live.is_some() { "live" } else { "alloc" }.to_string(),
        duration_secs,
        started_at: std::time::SystemTime::now()
            .checked_sub(std::time::Duration::from_secs_f64(duration_secs.max(0.0)))
            .map(|at| humantime::format_rfc3339_millis(at).to_string()),
        exact: sample_bytes.is_none(),
        sample_bytes,
        group_by: match options.group_by {
            GroupBy::Stack => "stack",
            GroupBy::Caller => "caller",
            GroupBy::Type => "type",
        }
        .to_string(),
        cut: Some(options.cut_report()),
        bytes: processes.iter().map(|p| p.bytes).sum(),
        count: processes.iter().map(|p| p.count).sum(),
        processes,
        lost,
        live: live.map(|live| live.settings.clone()),
        probes: probes.to_vec(),
        unprobed: unprobed.to_vec(),
        partly_probed: partly_probed.to_vec(),
        unsymbolized: symbolizer
            .unreadable()
            .iter()
            .map(|(module, reason)| UnsymbolizedReport {
                module: module.clone(),
                reason: reason.clone(),
            })
            .collect(),
        filters,
        recording,
        limits: None,
        budget: None,
    }
}

/// A call site's live figures from the scan, with the kernel's counts of
/// temporary and untracked blocks.
fn scanned_live(view: &LiveView, key: &AllocKey, stats: &AllocStats) -> LiveStackReport {
    let scanned = view.sites.get(key).copied().unwrap_or_default();
    LiveStackReport {
        live_bytes: scanned.bytes,
        live_count: scanned.count,
        oldest_age_secs: (scanned.count > 0).then(|| scanned.oldest_age_ns as f64 / 1e9),
        temporary_count: stats.temporary_count,
        untracked_count: stats.untracked_count,
    }
}

#[allow(clippy::too_many_arguments)]
fn live_process_report(
    view: &LiveView,
    image: ProcessImage,
    sites: &[&(AllocKey, AllocStats)],
    snapshot: &Snapshot,
    info: Option<&ProcessInfo>,
    symbolizer: &mut Symbolizer,
    options: &ReportOptions,
) -> LiveProcessReport {
    let live_bytes = sites
        .iter()
        .filter_map(|(key, _)| view.sites.get(key))
        .map(|f| f.bytes)
        .sum();
    let live_count = sites
        .iter()
        .filter_map(|(key, _)| view.sites.get(key))
        .map(|f| f.count)
        .sum();
    let peak = view.peaks.get(&image).cloned().unwrap_or_default();
    let mapped_peak = view.mapped_peaks.get(&image).copied().unwrap_or_default();
    let peak_sites: Vec<&(AllocKey, AllocStats)> = peak.sites.iter().collect();
    // At the peak, the kernel's own live counts: no ages.
    let live_at_peak = |_: &AllocKey, stats: &AllocStats| {
        Some(LiveStackReport {
            live_bytes: stats.live_bytes,
            live_count: stats.live_count,
            oldest_age_secs: None,
            temporary_count: stats.temporary_count,
            untracked_count: stats.untracked_count,
        })
    };
    let (peak_stacks, _) = shown_stacks(
        snapshot,
        info,
        symbolizer,
        &peak_sites,
        live_at_peak,
        options,
        true,
    );
    LiveProcessReport {
        live_bytes,
        live_count,
        untracked_count: sites.iter().map(|(_, s)| s.untracked_count).sum(),
        unknown_frees: view.unknown_frees.get(&image).copied().unwrap_or(0),
        internal_frees: view.internal_frees.get(&image).copied().unwrap_or(0),
        peak_live_bytes: peak.bytes,
        peak_live_count: peak.count,
        peak_secs: peak.secs,
        peak_stacks,
        peak_exact: peak.exact,
        peak_stacks_bytes: peak.held_bytes,
        peak_stacks_secs: peak.held_secs,
        mapped_live_bytes: sites
            .iter()
            .filter(|(key, _)| mapping_name(key.allocator).is_some())
            .filter_map(|(key, _)| view.sites.get(key))
            .map(|f| f.bytes)
            .sum(),
        mapped_peak_bytes: mapped_peak.0,
        mapped_peak_secs: mapped_peak.1,
    }
}

fn process_report(
    pid: u32,
    info: Option<&ProcessInfo>,
    stacks: Vec<StackReport>,
    totals: StackTotals,
) -> ProcessReport {
    let StackTotals {
        bytes,
        count,
        stacks: total_stacks,
        hidden,
        ..
    } = totals;
    ProcessReport {
        pid,
        generation: 0,
        command: info.map(|i| i.command.clone()).unwrap_or_default(),
        exe: info.and_then(|i| i.exe.clone()).unwrap_or_default(),
        cmdline: info.map(|i| i.cmdline.clone()).unwrap_or_default(),
        cgroup: info.and_then(|i| i.cgroup.clone()),
        overhead: None,
        duty_cycle: None,
        trap_share: None,
        partial: false,
        overhead_bound: None,
        counted: None,
        over_budget: false,
        span_rate: None,
        container: info.and_then(|i| i.container.clone()),
        container_id: info.and_then(|i| i.container_id.clone()),
        pod_uid: info.and_then(|i| i.pod_uid.clone()),
        exited: info.is_none_or(|i| i.exited),
        bytes,
        count,
        total_stacks,
        hidden,
        stacks,
        series: Vec::new(),
        timeline: None,
        live: None,
    }
}
