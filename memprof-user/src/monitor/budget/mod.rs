//! `monitor`'s cost budget (`--max-overhead`): what memprof's probes cost
//! each process, estimated every period from its allocation rate and the
//! cost per call measured at start (`calibrate`); and, to keep each
//! process under the budget, its probes put in for only part of each
//! period (`windows`), its figures scaled from those windows to unbiased
//! estimates (`scale`). Each process's totals are its calls and bytes as
//! the kernel counted them (`calls`, matched to images by `exact`),
//! scaled alike: its sampled sites' sums are estimates of those. At each
//! span's end, `span_end` sets the cost, the scaling and the next span.
pub mod announce;
mod calls;
mod exact;
pub mod over;
mod scale;
mod span_end;
#[cfg(test)]
mod tests;
mod windows;

use std::{
    collections::{HashMap, HashSet},
    time::{Duration, Instant},
};

pub use calls::{forget_count, KernelCounts};
use memprof_common::{
    images::{ProcessCalls, ProcessImage},
    sites::{AllocKey, AllocStats},
};
pub use scale::Scaling;
use span_end::Spans;

use crate::{probes::Scopes, report::model::BudgetReport};

/// How often the figures are read: a process whose probes are in all
/// along is measured, and may get a duty cycle, each period; one with a
/// duty cycle at the end of each of its spans (`windows`).
pub const PERIOD: Duration = Duration::from_secs(1);

/// The share of the budget a duty cycle aims at: a window's count, and so
/// the cost it predicts for the next span, is off by ±15% or so (samples),
/// and the windows' edges cost a little more, uncounted.
pub const AIM: f64 = 0.8;

/// How a window's figures are scaled to its span: by the process's CPU
/// time (the traps' calibrated cost taken out), there being no PMU to
/// count its own instructions by (decision 0040).
pub const ESTIMATOR: &str = "cpu_time";

/// How far over the budget a process's estimated cost may come (the
/// windows' counts are estimates of ±15% or so) before it is said to be
/// over it.
const OVER_BUDGET_SLACK: f64 = 1.25;

/// The smallest share of the time a process's probes are in: one window
/// of `windows::MIN_WINDOW` in the longest span.
pub const MIN_DUTY: f64 =
    windows::MIN_WINDOW.as_secs_f64() / (windows::MAX_SPAN_PERIODS as f64 * PERIOD.as_secs_f64());

pub struct Budget {
    /// Of one CPU, per process (`--max-overhead` / 100).
    max_overhead: f64,
    /// The probes' cost per allocation here, in ns (measured at start).
    cost_ns: f64,
    /// False where a process's probes cannot be taken out for part of the
    /// time: `--live` (frees made while they are out would be missed),
    /// the whole host without kthreadd to anchor on (a pid namespace).
    /// Then the cost is only measured.
    enforced: bool,
    /// The calls of the images first seen with a count of the kernel's
    /// (`CALLS`, by tgid: the image the pid is at), kept as their source:
    /// one that ended keeps its last count (an estimate from samples in
    /// its place was off by their error over its whole life). Counted
    /// since the image began: the kernel starts a pid's count afresh at
    /// its exec and at its fork; an image exec'd over has its whole count
    /// from the exec (`KernelCounts::before_exec`).
    exact_calls: HashMap<ProcessImage, ProcessCalls>,
    /// Images first seen before the notices said their pid was at them:
    /// counted by the kernel once it is.
    awaiting: HashSet<ProcessImage>,
    /// Images exec'd over whose whole count came from the exec: the pid's
    /// count is never theirs again (after the process ends, the notices
    /// no longer say which image it was at).
    replaced: HashSet<ProcessImage>,
    /// Each image's calls, and its process's CPU time, when its root's
    /// span began.
    span_calls: HashMap<ProcessImage, u64>,
    span_cpu: HashMap<u32, u64>,
    /// Each image's own CPU time (less the traps') in its last span whose
    /// calls were seen.
    own_cpu: HashMap<ProcessImage, f64>,
    /// Each image's estimated cost over its root's last span, in CPUs.
    overhead: HashMap<ProcessImage, f64>,
    /// The share of its root's last span each image's probes were in.
    duty: HashMap<ProcessImage, f64>,
    /// Each image's estimated bytes per second over its last span.
    span_rate: HashMap<ProcessImage, f64>,
    /// Of each image's CPU time in its last span's window, the share the
    /// traps took (calls × the cost per call), while its figures are
    /// scaled: how far they lean on the calibrated cost.
    trap_share: HashMap<ProcessImage, f64>,
    /// The root each image's probes go in and out with (see `Scopes`).
    roots: HashMap<ProcessImage, u32>,
    /// Images whose process ended mid-span, scaled to their end: their
    /// figures are final.
    finished: HashSet<ProcessImage>,
    /// Images whose figures are counts of part of their life that could
    /// not be scaled (too little seen, or no CPU time to scale by).
    partial: HashSet<ProcessImage>,
    /// Images some span of which was scaled (their figures estimates).
    estimated: HashSet<ProcessImage>,
    /// Each image's time with its probes in, and in all, over the spans
    /// that ended: at most that share of its time can the probes have
    /// cost it.
    life: HashMap<ProcessImage, (f64, f64)>,
    /// When the budget began: a process started since, first seen, has
    /// had its probes in or been counted since its start.
    started: Instant,
    windows: windows::Windows,
    scale: scale::Scale,
    /// The exact counts' estimates, as the sites' (`exact_sites`).
    totals: scale::Scale,
    counts: calls::CallCounts,
}

impl Budget {
    pub fn new(max_overhead_percent: f64, cost_ns: f64, enforced: bool) -> Budget {
        Budget {
            max_overhead: max_overhead_percent / 100.0,
            cost_ns,
            enforced,
            exact_calls: HashMap::new(),
            awaiting: HashSet::new(),
            replaced: HashSet::new(),
            span_calls: HashMap::new(),
            span_cpu: HashMap::new(),
            own_cpu: HashMap::new(),
            overhead: HashMap::new(),
            duty: HashMap::new(),
            span_rate: HashMap::new(),
            trap_share: HashMap::new(),
            roots: HashMap::new(),
            finished: HashSet::new(),
            partial: HashSet::new(),
            estimated: HashSet::new(),
            life: HashMap::new(),
            started: Instant::now(),
            windows: windows::Windows::default(),
            scale: scale::Scale::default(),
            totals: scale::Scale::default(),
            counts: calls::CallCounts::default(),
        }
    }

    /// The traps a second of the budget pays for, at the calibrated cost
    /// (0 where it is only measured: no allowance is kept).
    pub fn traps_per_sec(&self) -> f64 {
        match self.enforced && self.cost_ns > 0.0 {
            true => self.max_overhead * 1e9 / self.cost_ns,
            false => 0.0,
        }
    }

    /// What a process first seen may trap before it asks to be taken out:
    /// its budget for one period.
    pub fn first_allowance(&self) -> u64 {
        (self.traps_per_sec() * PERIOD.as_secs_f64()) as u64
    }

    /// Processes `tgids` spent their allowance (`OVER_BUDGET`): their
    /// roots' probes go out now, not at the period's end.
    pub fn over_allowance(&mut self, tgids: &[u32], scopes: &mut Scopes) {
        if !self.enforced {
            return;
        }
        let now = Instant::now();
        let mut roots: Vec<u32> = tgids
            .iter()
            .filter_map(|&tgid| scopes.root_of(tgid))
            .collect();
        roots.sort_unstable();
        roots.dedup();
        for root in roots {
            // A process started since the budget began, new this period:
            // its probes were in from its start (its span's CPU time 0).
            let tree = scopes.tree(root);
            for &pid in &tree {
                if !self.span_cpu.contains_key(&pid)
                    && crate::host::procfs::status::started_after(pid, self.started)
                {
                    self.span_cpu.insert(pid, 0);
                }
            }
            let span_cpu = &self.span_cpu;
            self.windows
                .cut(root, &tree, now, |pid| span_cpu.get(&pid).copied(), scopes);
        }
    }

    /// Ended processes' counts are given as long as they stay in the
    /// reports (`retention`), for those none of whose calls was sampled.
    pub fn keeping_ended(mut self, retention: Duration) -> Budget {
        let reads = retention.as_secs_f64() / PERIOD.as_secs_f64();
        self.counts.keep_finals(reads.ceil() as u32 + 1);
        self
    }

    /// Each process's calls so far, as the kernel counted them, for
    /// `tick`.
    pub fn read_calls(&mut self, ebpf: &mut aya::Ebpf) -> anyhow::Result<KernelCounts> {
        self.counts.read(ebpf)
    }

    /// The kernel's counts now, between two ticks (a report), for
    /// `counted_totals`.
    pub fn peek_calls(&self, ebpf: &aya::Ebpf) -> anyhow::Result<KernelCounts> {
        self.counts.peek(ebpf)
    }

    /// A period's end: each image's calls since the last (`exact`, by
    /// tgid, counted in the kernel; else `sites` as counted, estimated
    /// when sampling) give its cost; for each root whose span ends, its
    /// figures are scaled from its window and the share of the next span
    /// its probes may be in is set.
    pub fn tick(
        &mut self,
        sites: &[(AllocKey, AllocStats)],
        exact: &KernelCounts,
        current: &HashMap<u32, u32>,
        ended: &HashMap<u32, u32>,
        scopes: &mut Scopes,
    ) {
        let now = Instant::now();
        let ended_spans = self.windows.end_period(now, scopes);
        let (mut calls, first_seen) = self.sampled_calls(sites, exact, current, ended, scopes);
        self.take_kernel_counts(&mut calls, exact, current, &first_seen);
        let ending = self.ending(&calls);
        let early = self.ended_mid_span(now, &calls, &ending);
        let ending: Vec<ProcessImage> = ending.into_iter().chain(early.keys().copied()).collect();
        let cpu_now = self.cpu_times(&ending);
        let spans = Spans {
            of_roots: &ended_spans,
            early: &early,
        };
        let (shares, full_cost) = self.span_costs(&ending, &spans, &calls, &cpu_now);
        self.record_span_rates(sites, &ending, &spans, &shares);
        let planned = self.plan_spans(now, &full_cost, scopes);
        self.start_spans(&ending, &planned, &calls, &cpu_now);
        // Scaled to their end: their figures, cost and duty cycle are final.
        for image in &ending {
            if self.end_cpu(image).is_some() {
                self.span_calls.insert(*image, calls[image]);
                self.finished.insert(*image);
            }
        }
        self.forget_gone(&calls);
    }

    /// Every image to account for, with its calls as `sites` count them
    /// (0 for one with none), and those of them first seen now; each gets
    /// the root its probes go in and out with.
    fn sampled_calls(
        &mut self,
        sites: &[(AllocKey, AllocStats)],
        exact: &KernelCounts,
        current: &HashMap<u32, u32>,
        ended: &HashMap<u32, u32>,
        scopes: &Scopes,
    ) -> (HashMap<ProcessImage, u64>, HashSet<ProcessImage>) {
        let images = self.images(sites, exact, current, ended);
        let first_seen: HashSet<ProcessImage> = images
            .iter()
            .filter(|image| !self.roots.contains_key(image))
            .copied()
            .collect();
        let mut calls: HashMap<ProcessImage, u64> =
            images.into_iter().map(|image| (image, 0)).collect();
        for image in calls.keys() {
            self.roots
                .entry(*image)
                .or_insert_with(|| scopes.root_of(image.tgid).unwrap_or(image.tgid));
        }
        for (key, stats) in sites {
            *calls.entry(key.image()).or_default() += stats.count;
        }
        (calls, first_seen)
    }

    /// What is kept of images gone (from `calls`, this period's images).
    fn forget_gone(&mut self, calls: &HashMap<ProcessImage, u64>) {
        self.roots.retain(|image, _| calls.contains_key(image));
        self.finished.retain(|image| calls.contains_key(image));
        self.partial.retain(|image| calls.contains_key(image));
        self.estimated.retain(|image| calls.contains_key(image));
        self.life.retain(|image, _| calls.contains_key(image));
        self.exact_calls
            .retain(|image, _| calls.contains_key(image));
        self.awaiting.retain(|image| calls.contains_key(image));
        self.replaced.retain(|image| calls.contains_key(image));
        self.span_calls.retain(|image, _| calls.contains_key(image));
        self.duty.retain(|image, _| calls.contains_key(image));
        self.span_rate.retain(|image, _| calls.contains_key(image));
        self.trap_share.retain(|image, _| calls.contains_key(image));
        self.overhead.retain(|image, _| calls.contains_key(image));
        self.own_cpu.retain(|image, _| calls.contains_key(image));
        let tgids: HashSet<u32> = calls.keys().map(|image| image.tgid).collect();
        self.span_cpu.retain(|tgid, _| tgids.contains(tgid));
    }

    /// When a process's probes go in or out next.
    pub fn next_switch(&self) -> Option<Instant> {
        self.windows.next_switch()
    }

    /// Puts in or takes out the probes whose window opens or closes now.
    pub fn switch(&mut self, scopes: &mut Scopes) {
        self.windows.switch(Instant::now(), scopes);
    }

    /// `sites` (as counted) turned into estimates of all calls, for the
    /// processes whose probes were in for part of a period only.
    pub fn scale(&self, sites: &mut [(AllocKey, AllocStats)]) {
        self.scale.apply(sites);
    }

    /// True once any process's figures are estimates from part of a period.
    pub fn scaled(&self) -> bool {
        self.scale.scaled()
    }

    /// Each image's estimated cost over the last period (in CPUs).
    pub fn overheads(&self) -> &HashMap<ProcessImage, f64> {
        &self.overhead
    }

    /// The share of the last period each image's probes were in.
    pub fn duty_cycles(&self) -> &HashMap<ProcessImage, f64> {
        &self.duty
    }

    /// Each image's allocation rate over its last span (bytes per second,
    /// an estimate where the span was scaled): its estimate grows only at
    /// a span's end, so a rate between two reads of it says 0 in between.
    pub fn span_rates(&self) -> &HashMap<ProcessImage, f64> {
        &self.span_rate
    }

    /// Whether `image`'s probes cost it more than the budget over its last
    /// span.
    pub fn over_budget(&self, image: &ProcessImage) -> bool {
        self.overhead
            .get(image)
            .is_some_and(|&cost| cost > self.max_overhead * OVER_BUDGET_SLACK)
    }

    /// The calls the kernel counted of `image` with its probes in.
    pub fn counted_calls(&self, image: &ProcessImage) -> Option<u64> {
        self.exact_calls.get(image).map(|count| count.calls)
    }

    /// Whether `image`'s figures are estimates (some span scaled).
    pub fn is_estimated(&self, image: &ProcessImage) -> bool {
        self.estimated.contains(image)
    }

    /// For an image whose figures are estimates: the most its probes can
    /// have cost it, in CPUs: the share of its time they were in (all of
    /// it lost to them, at worst).
    pub fn overhead_bound(&self, image: &ProcessImage) -> Option<f64> {
        let &(probed, all) = self.life.get(image)?;
        (self.estimated.contains(image) && all > 0.0).then(|| probed / all)
    }

    /// The images whose figures count part of their life only, unscaled.
    pub fn partial(&self) -> &HashSet<ProcessImage> {
        &self.partial
    }

    /// Of each scaled image's CPU time in its last window, the traps'.
    pub fn trap_shares(&self) -> &HashMap<ProcessImage, f64> {
        &self.trap_share
    }

    pub fn report(&self) -> BudgetReport {
        BudgetReport {
            max_overhead: self.max_overhead,
            cost_per_call_ns: self.cost_ns,
            period_secs: PERIOD.as_secs_f64(),
            enforced: self.enforced,
            first_allowance: self.first_allowance(),
            estimator: ESTIMATOR.to_string(),
            totals: None,
        }
    }
}
