//! A report in the Prometheus text format (0.0.4), for `memprof monitor`'s
//! `/metrics`: each process's totals, its top call sites, and memprof's
//! own health. Rows with the same labels (one process's images before and
//! after an exec, named alike) are summed: a scrape must not repeat a
//! series.
use std::{collections::BTreeMap, fmt::Write as _};

use crate::report::model::{BudgetReport, LimitsReport, ProcessReport, Report, StackReport};

/// One metric family: its rows by label set.
struct Family {
    name: &'static str,
    help: &'static str,
    kind: &'static str,
    rows: BTreeMap<String, f64>,
}

impl Family {
    fn new(name: &'static str, kind: &'static str, help: &'static str) -> Family {
        Family {
            name,
            help,
            kind,
            rows: BTreeMap::new(),
        }
    }

    /// Adds `value` to the row of `labels`.
    fn add(&mut self, labels: &[(&str, String)], value: f64) {
        *self.rows.entry(label_set(labels)).or_default() += value;
    }

    /// The row of `labels` holds the largest value given it.
    fn add_max(&mut self, labels: &[(&str, String)], value: f64) {
        let row = self.rows.entry(label_set(labels)).or_insert(value);
        *row = row.max(value);
    }

    fn write(&self, out: &mut String) {
        let _ = writeln!(out, "# HELP {} {}", self.name, self.help);
        let _ = writeln!(out, "# TYPE {} {}", self.name, self.kind);
        for (labels, value) in &self.rows {
            match labels.is_empty() {
                true => writeln!(out, "{} {value}", self.name),
                false => writeln!(out, "{}{{{labels}}} {value}", self.name),
            }
            .unwrap_or(());
        }
    }
}

/// The labels that name a process (`--metrics-labels`): each kept or
/// dropped. Series that read alike without the dropped ones are summed.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ProcessLabels {
    pub pid: bool,
    pub comm: bool,
    pub exe: bool,
    pub container: bool,
}

impl Default for ProcessLabels {
    fn default() -> Self {
        ProcessLabels {
            pid: true,
            comm: true,
            exe: true,
            container: true,
        }
    }
}

/// `--metrics-labels`: a comma-separated list of `pid`, `comm`, `exe`,
/// `container`.
pub fn process_labels_of(list: &str) -> Result<ProcessLabels, String> {
    let mut labels = ProcessLabels {
        pid: false,
        comm: false,
        exe: false,
        container: false,
    };
    for name in list.split(',').map(str::trim).filter(|n| !n.is_empty()) {
        match name {
            "pid" => labels.pid = true,
            "comm" => labels.comm = true,
            "exe" => labels.exe = true,
            "container" => labels.container = true,
            other => {
                return Err(format!(
                    "'{other}' is not a process label (pid, comm, exe, container)"
                ))
            }
        }
    }
    Ok(labels)
}

/// `report` with every call site (grouped by caller); each process's
/// `sites_per_process` largest by bytes allocated get a series, named by
/// `labels`.
pub fn render(report: &Report, sites_per_process: usize, labels: ProcessLabels) -> String {
    let mut families = process_families(report, labels);
    families.extend(cost_families(report, labels));
    families.push(site_family(report, sites_per_process, labels));
    families.extend(live_site_family(report, sites_per_process, labels));
    families.push(lost_family(report));
    families.extend(health_families(report));
    families.extend(own_process_families());
    families.extend(
        report
            .limits
            .as_ref()
            .map(limit_families)
            .unwrap_or_default(),
    );
    families.extend(
        report
            .budget
            .as_ref()
            .map(budget_families)
            .unwrap_or_default(),
    );
    let mut out = String::new();
    for family in &families {
        family.write(&mut out);
    }
    out
}

/// The labels that name a process's series, of those kept.
fn process_labels(process: &ProcessReport, kept: ProcessLabels) -> Vec<(&'static str, String)> {
    let mut who = Vec::new();
    if kept.pid {
        who.push(("pid", process.pid.to_string()));
    }
    if kept.comm {
        who.push(("comm", process.command.clone()));
    }
    if kept.exe {
        who.push(("exe", process.exe.clone()));
    }
    // The container's full id, as other tools label it (cAdvisor, the
    // kubelet), and the pod's UID where Kubernetes runs it.
    if kept.container {
        if let Some(container) = process.container_id.as_ref().or(process.container.as_ref()) {
            who.push(("container", container.clone()));
        }
        if let Some(pod) = &process.pod_uid {
            who.push(("pod_uid", pod.clone()));
        }
    }
    who
}

/// Each process's bytes and calls, and in live mode its live bytes.
fn process_families(report: &Report, labels: ProcessLabels) -> Vec<Family> {
    let mut bytes = Family::new(
        "memprof_allocated_bytes_total",
        "counter",
        "Bytes allocated by the process since memprof started watching it.",
    );
    let mut calls = Family::new(
        "memprof_allocations_total",
        "counter",
        "Allocator calls of the process since memprof started watching it.",
    );
    let mut live = report.is_live().then(|| {
        Family::new(
            "memprof_live_bytes",
            "gauge",
            "Bytes the process allocated and has not freed (--live).",
        )
    });
    for process in &report.processes {
        let who = process_labels(process, labels);
        bytes.add(&who, process.bytes as f64);
        calls.add(&who, process.count as f64);
        if let (Some(live), Some(heap)) = (live.as_mut(), &process.live) {
            live.add(&who, heap.live_bytes as f64);
        }
    }
    [Some(bytes), Some(calls), live]
        .into_iter()
        .flatten()
        .collect()
}

/// With a budget, each process's estimated cost, duty cycle and traps'
/// share.
fn cost_families(report: &Report, labels: ProcessLabels) -> Vec<Family> {
    if report.budget.is_none() {
        return Vec::new();
    }
    let mut overhead = Family::new(
        "memprof_overhead_ratio",
        "gauge",
        "What memprof's probes cost the process over the last period, estimated, in CPUs (its allocations per second times the cost per allocation measured at start).",
    );
    let mut duty = Family::new(
        "memprof_duty_cycle_ratio",
        "gauge",
        "The share of the last period memprof's probes were in the process (1: all along; less: the budget took them out the rest, and its figures are estimates).",
    );
    let mut traps = Family::new(
        "memprof_trap_share_ratio",
        "gauge",
        "Of the process's CPU time in its last window, the share memprof's traps took, while its figures are scaled from windows (duty cycle under 1): above ~0.5 its estimates lean on the calibrated cost per call and come out low.",
    );
    let mut partial = Family::new(
        "memprof_partial",
        "gauge",
        "1 when the process's figures count only part of its life, unscaled (its probes were out for part of it and too little was seen to estimate the rest): a floor, not an estimate.",
    );
    let mut over = Family::new(
        "memprof_over_budget",
        "gauge",
        "1 when memprof's probes cost the process more than --max-overhead over its last span, even at the shortest duty cycle.",
    );
    let mut bound = Family::new(
        "memprof_overhead_bound_ratio",
        "gauge",
        "While the process's figures are estimates: the most memprof's probes can have cost it, in CPUs (the share of its time they were in); memprof_overhead_ratio leans on the calibrated cost per call, several times off where traps take most of a window.",
    );
    // Costs in CPUs add up over processes named alike (--metrics-labels
    // without pid); shares and flags do not: the largest stands.
    for process in &report.processes {
        let who = process_labels(process, labels);
        if let Some(most) = process.overhead_bound {
            bound.add(&who, most);
        }
        partial.add_max(&who, f64::from(u8::from(process.partial)));
        over.add_max(&who, f64::from(u8::from(process.over_budget)));
        if let Some(cost) = process.overhead {
            overhead.add(&who, cost);
        }
        if let Some(share) = process.duty_cycle {
            duty.add_max(&who, share);
        }
        if let Some(share) = process.trap_share {
            traps.add_max(&who, share);
        }
    }
    let mut families = vec![overhead, duty, traps, bound, partial, over];
    if let Some(budget) = &report.budget {
        let mut estimator = Family::new(
            "memprof_budget_estimator_info",
            "gauge",
            "How windows' counts are scaled to their spans (estimator), and whether a PMU counts instructions here (pmu): cpu_time without one.",
        );
        estimator.add(
            &[
                ("estimator", budget.estimator.clone()),
                ("pmu", "none".to_string()),
            ],
            1.0,
        );
        families.push(estimator);
        if let Some(totals) = &budget.totals {
            let mut kinds = Family::new(
                "memprof_host_allocations",
                "gauge",
                "The report's allocations by how they came about: counted (processes in all along), estimated (scaled from windows), partial (part of a life, unscaled).",
            );
            for (kind, figures) in [
                ("counted", totals.counted),
                ("estimated", totals.estimated),
                ("partial", totals.partial),
            ] {
                kinds.add(&[("kind", kind.to_string())], figures.count as f64);
            }
            families.push(kinds);
        }
    }
    families
}

/// Each process's `sites_per_process` largest call sites by bytes.
fn site_family(report: &Report, sites_per_process: usize, labels: ProcessLabels) -> Family {
    let mut sites = Family::new(
        "memprof_site_allocated_bytes_total",
        "counter",
        "Bytes allocated at each of the process's top call sites (--metrics-sites).",
    );
    add_top_sites(&mut sites, report, (sites_per_process, labels), |stack| {
        Some(stack.bytes)
    });
    sites
}

/// With --live, each process's `sites_per_process` call sites that hold
/// most: chosen by live bytes, so that a slow leak gets its series.
fn live_site_family(
    report: &Report,
    sites_per_process: usize,
    labels: ProcessLabels,
) -> Option<Family> {
    let mut sites = Family::new(
        "memprof_site_live_bytes",
        "gauge",
        "Bytes still allocated at each of the process's call sites that hold most (--live, --metrics-sites).",
    );
    report.is_live().then(|| {
        add_top_sites(&mut sites, report, (sites_per_process, labels), |stack| {
            stack.live.map(|live| live.live_bytes)
        });
        sites
    })
}

/// A row per process for each of its `most` stacks with the largest
/// `value`, labelled by the process (`labels`: its pid and comm, of
/// those kept) and their frame 0.
fn add_top_sites(
    family: &mut Family,
    report: &Report,
    (most, labels): (usize, ProcessLabels),
    value: impl Fn(&StackReport) -> Option<u64>,
) {
    for process in &report.processes {
        let mut largest: Vec<(&StackReport, u64)> = process
            .stacks
            .iter()
            .filter_map(|stack| Some((stack, value(stack)?)))
            .filter(|&(_, value)| value > 0)
            .collect();
        largest.sort_by_key(|&(_, value)| std::cmp::Reverse(value));
        for (stack, value) in largest.into_iter().take(most) {
            let Some(frame) = stack.frames.first() else {
                continue;
            };
            let mut site: Vec<(&str, String)> = process_labels(process, labels)
                .into_iter()
                .filter(|(name, _)| matches!(*name, "pid" | "comm"))
                .collect();
            site.extend([
                ("function", frame.label()),
                ("file", frame.file.clone().unwrap_or_default()),
                (
                    "line",
                    frame.line.map(|l| l.to_string()).unwrap_or_default(),
                ),
            ]);
            family.add(&site, value as f64);
        }
    }
}

/// Events lost, by cause.
fn lost_family(report: &Report) -> Family {
    let mut lost = Family::new(
        "memprof_lost_events_total",
        "counter",
        "Events memprof could not record in full, by cause.",
    );
    for (cause, n) in &report.lost {
        lost.add(&[("cause", cause.clone())], *n as f64);
    }
    lost
}

/// A gauge with a single value.
fn health(name: &'static str, help: &'static str, value: f64) -> Family {
    let mut family = Family::new(name, "gauge", help);
    family.add(&[], value);
    family
}

/// memprof's own health: what it watches and probes, whether it counts
/// every call, its resident memory.
fn health_families(report: &Report) -> Vec<Family> {
    let processes = health(
        "memprof_processes_profiled",
        "Processes memprof watches that still run.",
        report.processes.iter().filter(|p| !p.exited).count() as f64,
    );
    let probes = health(
        "memprof_probes_attached",
        "Functions memprof put a probe on.",
        report.probes.len() as f64,
    );
    let unprobed = health(
        "memprof_unprobed_targets",
        "Programs and libraries memprof could not probe: their calls are not counted (the report's unprobed list says why).",
        report.unprobed.len() as f64,
    );
    let exact = health(
        "memprof_exact",
        "1 when every call is counted, 0 when figures are estimates from samples.",
        if report.exact { 1.0 } else { 0.0 },
    );
    let rss = health(
        "memprof_resident_memory_bytes",
        "memprof's own resident memory.",
        resident_bytes() as f64,
    );
    vec![processes, probes, unprobed, exact, rss]
}

/// What every exporter says of itself (Prometheus's client conventions):
/// memprof's CPU time and resident memory, and which build it is.
fn own_process_families() -> Vec<Family> {
    let mut cpu = Family::new(
        "process_cpu_seconds_total",
        "counter",
        "Total user and system CPU time memprof spent, in seconds.",
    );
    cpu.add(&[], cpu_seconds());
    let rss = health(
        "process_resident_memory_bytes",
        "memprof's resident memory size in bytes.",
        resident_bytes() as f64,
    );
    let mut build = Family::new(
        "memprof_build_info",
        "gauge",
        "Always 1: the version and commit of the memprof that serves these metrics.",
    );
    build.add(
        &[
            ("version", env!("CARGO_PKG_VERSION").to_string()),
            ("commit", env!("MEMPROF_COMMIT").to_string()),
        ],
        1.0,
    );
    vec![cpu, rss, build]
}

/// memprof's CPU time, all threads, user and system.
fn cpu_seconds() -> f64 {
    // SAFETY: getrusage writes the struct it is given.
    let usage = unsafe {
        let mut usage: libc::rusage = std::mem::zeroed();
        if libc::getrusage(libc::RUSAGE_SELF, &mut usage) != 0 {
            return 0.0;
        }
        usage
    };
    let seconds = |t: libc::timeval| t.tv_sec as f64 + t.tv_usec as f64 / 1e6;
    seconds(usage.ru_utime) + seconds(usage.ru_stime)
}

/// The budget's settings.
fn budget_families(budget: &BudgetReport) -> Vec<Family> {
    vec![
        health(
            "memprof_max_overhead_ratio",
            "What memprof may cost each process, in CPUs (--max-overhead).",
            budget.max_overhead,
        ),
        health(
            "memprof_probe_cost_seconds",
            "The probes' cost per allocation on this host, measured at start.",
            budget.cost_per_call_ns * 1e-9,
        ),
        health(
            "memprof_budget_enforced",
            "1 when processes over the budget have their probes in for part of each period only (on the whole host, every process together); 0 where their cost is only measured (--live).",
            f64::from(u8::from(budget.enforced)),
        ),
    ]
}

/// What `monitor` evicted, and how full the kernel's tables are.
fn limit_families(limits: &LimitsReport) -> Vec<Family> {
    let mut evicted = Family::new(
        "memprof_evicted_total",
        "counter",
        "What memprof dropped: ended processes (one interval after their end), the stacks only they used, and the probes of files no process maps any more (when the site table was full).",
    );
    evicted.add(
        &[("what", "processes".into())],
        limits.evicted_processes as f64,
    );
    evicted.add(&[("what", "stacks".into())], limits.evicted_stacks as f64);
    let mut resets = Family::new(
        "memprof_symbol_cache_resets_total",
        "counter",
        "Times the symbol caches were emptied, over their cap.",
    );
    resets.add(&[], limits.symbol_cache_resets as f64);
    let mut entries = Family::new(
        "memprof_table_entries",
        "gauge",
        "Entries in the kernel's tables at the last sweep (caps: --max-processes, --max-stacks, --stack-map-size; site_groups: groups of probes, one to three per file probed).",
    );
    entries.add(&[("table", "processes".into())], limits.processes as f64);
    entries.add(&[("table", "sites".into())], limits.sites as f64);
    entries.add(&[("table", "stacks".into())], limits.stacks as f64);
    entries.add(
        &[("table", "site_groups".into())],
        limits.site_groups as f64,
    );
    let mut capacity = Family::new(
        "memprof_table_capacity",
        "gauge",
        "What the kernel's tables hold at most; beyond, events are counted as lost.",
    );
    capacity.add(
        &[("table", "processes".into())],
        limits.max_processes as f64,
    );
    capacity.add(&[("table", "sites".into())], limits.max_sites as f64);
    capacity.add(&[("table", "stacks".into())], limits.max_stacks as f64);
    capacity.add(
        &[("table", "site_groups".into())],
        limits.max_site_groups as f64,
    );
    evicted.add(
        &[("what", "probed_files".into())],
        limits.freed_probed_files as f64,
    );
    vec![evicted, resets, entries, capacity]
}

/// `key="value",…`, escaped.
fn label_set(labels: &[(&str, String)]) -> String {
    labels
        .iter()
        .map(|(key, value)| format!("{key}=\"{}\"", escape(value)))
        .collect::<Vec<_>>()
        .join(",")
}

/// Backslash, double quote and line feed escaped, as the format asks.
fn escape(value: &str) -> String {
    value
        .replace('\\', "\\\\")
        .replace('"', "\\\"")
        .replace('\n', "\\n")
}

/// This process's resident set (/proc/self/statm), in bytes.
fn resident_bytes() -> u64 {
    let pages = std::fs::read_to_string("/proc/self/statm")
        .ok()
        .and_then(|statm| statm.split_whitespace().nth(1)?.parse::<u64>().ok())
        .unwrap_or(0);
    // SAFETY: sysconf has no preconditions.
    let page = unsafe { libc::sysconf(libc::_SC_PAGESIZE) }.max(0) as u64;
    pages * page
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn labels_are_escaped_and_series_not_repeated() {
        let report: Report = serde_json::from_value(serde_json::json!({
            "version": 1, "mode": "alloc", "duration_secs": 1.0, "exact": true,
            "group_by": "caller", "bytes": 30, "count": 3, "lost": {"map_full": 2},
            "processes": [
                {"pid": 7, "command": "a\"b", "exe": "/x\\y", "cmdline": [], "exited": false,
                 "bytes": 10, "count": 1, "total_stacks": 1, "stacks": [
                    {"allocator": "malloc", "bytes": 10, "count": 1, "partial": false,
                     "frames": [{"address": "0x1", "function": "f", "file": "a.c", "line": 3,
                                 "module": "/x", "inlined": false}]}]},
                {"pid": 7, "command": "a\"b", "exe": "/x\\y", "cmdline": [], "exited": true,
                 "bytes": 20, "count": 2, "total_stacks": 0, "stacks": []}
            ]
        }))
        .unwrap();
        let text = render(&report, 10, ProcessLabels::default());
        assert!(text.contains(
            "memprof_allocated_bytes_total{pid=\"7\",comm=\"a\\\"b\",exe=\"/x\\\\y\"} 30\n"
        ));
        assert!(text.contains(
            "memprof_site_allocated_bytes_total{pid=\"7\",comm=\"a\\\"b\",function=\"f\",file=\"a.c\",line=\"3\"} 10\n"
        ));
        assert!(text.contains("memprof_lost_events_total{cause=\"map_full\"} 2\n"));
        assert!(text.contains("# TYPE memprof_allocations_total counter\n"));
        assert!(!text.contains("memprof_live_bytes"));
        assert_eq!(text.matches("memprof_allocations_total{").count(), 1);
    }

    #[test]
    fn dropped_labels_sum_the_processes_named_alike() {
        let process = |pid: u32, bytes: u64| {
            serde_json::json!({"pid": pid, "command": "worker", "exe": "/w", "cmdline": [],
                "exited": false, "bytes": bytes, "count": 1, "total_stacks": 0, "stacks": []})
        };
        let report: Report = serde_json::from_value(serde_json::json!({
            "version": 1, "mode": "alloc", "duration_secs": 1.0, "exact": true,
            "group_by": "caller", "bytes": 30, "count": 2, "lost": {},
            "processes": [process(1, 10), process(2, 20)]
        }))
        .unwrap();
        let labels = process_labels_of("comm,exe").unwrap();
        let text = render(&report, 10, labels);
        assert!(text.contains("memprof_allocated_bytes_total{comm=\"worker\",exe=\"/w\"} 30\n"));
        assert!(!text.contains("pid=\""));
        assert!(text.contains("memprof_build_info{version=\""));
        assert!(text.contains("# TYPE process_cpu_seconds_total counter\n"));
        assert_eq!(
            process_labels_of("pid,cpu").unwrap_err(),
            "'cpu' is not a process label (pid, comm, exe, container)"
        );
    }

    #[test]
    fn live_sites_are_chosen_by_what_they_hold() {
        let stack = |function: &str, bytes: u64, live: u64| {
            serde_json::json!({"allocator": "malloc", "bytes": bytes, "count": 1, "partial": false,
                "live_bytes": live, "live_count": 1, "oldest_age_secs": 1.0,
                "temporary_count": 0, "untracked_count": 0,
                "frames": [{"address": "0x1", "function": function, "inlined": false}]})
        };
        let report: Report = serde_json::from_value(serde_json::json!({
            "version": 1, "mode": "live", "duration_secs": 1.0, "exact": true,
            "group_by": "caller", "bytes": 1_000_100, "count": 2, "lost": {},
            "live": {"min_age_secs": null, "temp_threshold_secs": 0.1},
            "processes": [{"pid": 3, "command": "leaky", "exe": "/l", "cmdline": [],
                "exited": false, "bytes": 1_000_100, "count": 2, "total_stacks": 2,
                "stacks": [stack("churn", 1_000_000, 0), stack("leak", 100, 100)]}]
        }))
        .unwrap();
        let text = render(&report, 1, ProcessLabels::default());
        // One site each: the most allocated, the most held.
        assert!(text.contains(
            "memprof_site_allocated_bytes_total{pid=\"3\",comm=\"leaky\",function=\"churn\""
        ));
        assert!(text.contains("memprof_site_live_bytes{pid=\"3\",comm=\"leaky\",function=\"leak\",file=\"\",line=\"\"} 100\n"));
        assert!(
            !text.contains("memprof_site_live_bytes{pid=\"3\",comm=\"leaky\",function=\"churn\"")
        );
    }
}
