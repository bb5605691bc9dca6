//! `monitor`'s cost budget (`--max-overhead`): what memprof's probes cost
//! each process, estimated every period from its allocation rate and the
//! cost per call measured at start (`calibrate`); and, to keep each
//! process under the budget, its probes put in for only part of each
//! period (`windows`), its figures scaled from those windows to unbiased
//! estimates (`scale`). Each process's totals are its calls and bytes as
//! the kernel counted them (`calls`), scaled alike: its sampled sites'
//! sums are estimates of those.
pub mod announce;
mod calls;
mod scale;
mod windows;

use std::{
    collections::{HashMap, HashSet},
    time::{Duration, Instant},
};

pub use calls::{forget_count, KernelCounts};
use memprof_common::{
    images::{generation_order, ProcessCalls, ProcessImage, REFUSED_GENERATION},
    sites::{AllocKey, AllocStats},
};
pub use scale::Scaling;

use crate::{probes::Scopes, report::model::BudgetReport};

/// How often the figures are read: a process whose probes are in all
/// along is measured, and may get a duty cycle, each period; one with a
/// duty cycle at the end of each of its spans (`windows`).
pub const PERIOD: Duration = Duration::from_secs(1);

/// The share of the budget a duty cycle aims at: a window's count, and so
/// the cost it predicts for the next span, is off by ±15% or so (samples),
/// and the windows' edges cost a little more, uncounted.
pub const AIM: f64 = 0.8;

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
            windows: windows::Windows::default(),
            scale: scale::Scale::default(),
            totals: scale::Scale::default(),
            counts: calls::CallCounts::default(),
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
        // The kernel counts by tgid: its calls are the image the pid is at
        // now (as the notices say; for an ended process, its newest seen).
        // One with no site yet (it exec'd, or a new process took the pid)
        // waits for its first: the older images keep their last counts.
        // An image exec'd over has its whole count (below).
        let newest = self.newest_images(calls.keys().copied(), exact);
        for (tgid, image) in newest {
            if !pid_may_be_at(current, &image) {
                if first_seen.contains(&image) {
                    self.awaiting.insert(image);
                }
                continue;
            }
            let counted = first_seen.contains(&image)
                || self.exact_calls.contains_key(&image)
                || self.awaiting.remove(&image);
            let Some(&count) = exact.by_tgid.get(&tgid).filter(|_| counted) else {
                continue;
            };
            // Never backwards (a pid taken by a new process before memprof
            // heard of it: its count starts afresh).
            let last = self.exact_calls.entry(image).or_default();
            if count.calls >= last.calls && count.traps >= last.traps {
                *last = count;
            }
        }
        // An image exec'd over: its count as summed at the exec, whole (the
        // calls of its last period were never read by tgid), in place of
        // what was read by tgid (which may be the new image's, the notices
        // behind).
        for (image, &count) in &exact.before_exec {
            let counted = first_seen.contains(image)
                || self.exact_calls.contains_key(image)
                || self.awaiting.remove(image);
            if counted {
                self.exact_calls.insert(*image, count);
                self.replaced.insert(*image);
            }
        }
        for (image, count) in &self.exact_calls {
            if let Some(calls) = calls.get_mut(image) {
                // What the probes cost: every trap, nested calls' too.
                *calls = count.traps;
            }
        }
        // The images whose root's span ends (or that have none yet).
        let ending: Vec<ProcessImage> = calls
            .keys()
            .filter(|image| self.windows.span_ends(self.roots[image]))
            .copied()
            .collect();
        let cpu_now: HashMap<u32, u64> = ending
            .iter()
            .filter_map(|image| {
                Some((
                    image.tgid,
                    crate::host::procfs::status::cpu_time_ns(image.tgid)?,
                ))
            })
            .collect();
        let mut shares: HashMap<ProcessImage, Scaling> = HashMap::new();
        // What each root's tree costs while its probes are in: its
        // costliest process's rate then.
        let mut full_cost: HashMap<u32, f64> = HashMap::new();
        for image in &ending {
            let root = self.roots[image];
            let Some(span) = ended_spans.get(&root) else {
                continue;
            };
            // First seen: did it start since the probes last went out
            // before this span's window (seen by that window alone)?
            let new_since_out = !self.span_cpu.contains_key(&image.tgid)
                && span
                    .unseen_since
                    .is_some_and(|out| crate::host::procfs::status::started_after(image.tgid, out));
            let base = match self.span_calls.get(image) {
                Some(&base) => base,
                // First seen in a span with a window: the kernel's count
                // goes back to its first trap, spans ago, unless it is
                // new since; its cost is known from its next span on.
                None if span.cpu_in.is_some()
                    && self.exact_calls.contains_key(image)
                    && !new_since_out =>
                {
                    calls[image]
                }
                None => 0,
            };
            let span_calls = calls[image].saturating_sub(base);
            let scaling = self.estimate(*image, span, span_calls, &cpu_now, new_since_out);
            shares.insert(*image, scaling);
            self.duty.insert(*image, span.share);
            // Its cost over the span, and while its probes were in.
            let cost = span_calls as f64 * self.cost_ns * 1e-9 / span.secs;
            self.overhead.insert(*image, cost);
            if span.share > 0.0 {
                let full = full_cost.entry(root).or_default();
                *full = full.max(cost / span.share);
            }
        }
        // Images of roots new this period were counted all along.
        let ended = |image: &ProcessImage| {
            shares.get(image).copied().or_else(|| {
                self.windows
                    .span_ends(self.roots[image])
                    .then_some(Scaling::Share(1.0))
            })
        };
        let span_bytes = self.scale.end_period(sites, &ended);
        let span_totals = self.totals.end_period(&self.exact_sites(), &ended);
        for image in &ending {
            if let Some(span) = ended_spans.get(&self.roots[image]) {
                // An unsampled image's from its count.
                let bytes = span_bytes.get(image).or_else(|| span_totals.get(image));
                self.span_rate
                    .insert(*image, bytes.copied().unwrap_or(0.0) / span.secs);
            }
        }
        // Roots the scopes can take out, and processes of their own (in
        // all along: the whole host, or not under a root).
        let switchable: HashSet<u32> = scopes.roots().collect();
        let known: HashSet<u32> = switchable
            .iter()
            .copied()
            .chain(self.roots.values().copied())
            .collect();
        self.windows.retain(|root| known.contains(&root));
        let planned: HashMap<u32, f64> = known
            .into_iter()
            .filter(|&root| self.windows.span_ends(root))
            .map(|root| {
                let need = full_cost.get(&root).copied().unwrap_or(0.0);
                let over = need > self.max_overhead;
                let duty = match self.enforced && over && switchable.contains(&root) {
                    true => (AIM * self.max_overhead / need).max(MIN_DUTY),
                    false => 1.0,
                };
                (root, duty)
            })
            .collect();
        self.windows.plan(now, PERIOD, &planned, scopes);
        for image in &ending {
            if planned.contains_key(&self.roots[image]) {
                self.span_calls.insert(*image, calls[image]);
                if let Some(&cpu) = cpu_now.get(&image.tgid) {
                    self.span_cpu.insert(image.tgid, cpu);
                }
            }
        }
        self.roots.retain(|image, _| calls.contains_key(image));
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

    /// How to estimate a process's calls in a span that its probes were
    /// in for part of: by the share of its calls the window saw, its CPU
    /// time while they were in out of its CPU time all span, both less
    /// what the traps themselves took (a process that does little but
    /// allocate runs slower with them in: its rate per second then says
    /// little of its rate without them). A window that saw it idle while it
    /// ran in the span (it stopped allocating, or started, just then): its
    /// last span's calls again, in proportion to its CPU time. Without CPU
    /// times, the share of the span's time. Remembers the process's own
    /// CPU time in the span for the next. `new_since_out`: first seen, it
    /// started after the probes last went out before the window.
    fn estimate(
        &mut self,
        image: ProcessImage,
        span: &windows::Ended,
        calls: u64,
        cpu_now: &HashMap<u32, u64>,
        new_since_out: bool,
    ) -> Scaling {
        let cpu_all = match (cpu_now.get(&image.tgid), self.span_cpu.get(&image.tgid)) {
            (Some(&now), Some(&then)) => Some(now.saturating_sub(then) as f64),
            // First seen: a process that started after the probes went out
            // before this window was seen by it alone, and its calls so
            // far are all this span's: so is all its CPU time. (It ran a
            // span or more unseen; measured from this span's start it
            // came out as low as 5/6 of the truth in 30 s.)
            (Some(&now), None) if new_since_out => Some(now as f64),
            _ => None,
        };
        let traps = calls as f64 * self.cost_ns;
        // Set below where a window's CPU time says it.
        self.trap_share.remove(&image);
        let Some(cpu_in) = &span.cpu_in else {
            if let Some(cpu_all) = cpu_all {
                self.own_cpu.insert(image, (cpu_all - traps).max(0.0));
            }
            return Scaling::Share(1.0);
        };
        let (Some(&cpu_in), Some(cpu_all)) = (cpu_in.get(&image.tgid), cpu_all) else {
            return Scaling::Share(span.share);
        };
        let cpu_in = cpu_in as f64;
        if cpu_in <= 0.0 {
            // Nothing seen: the span is like the last one seen, as far as
            // the CPU time says (1 ms of CPU or less: idle, nothing to add).
            return match self.own_cpu.get(&image) {
                Some(&last) if last > 0.0 && cpu_all > 1e6 => Scaling::Repeat(cpu_all / last),
                _ => Scaling::Share(span.share),
            };
        }
        // The calibration is an estimate too: never less than a tenth of
        // the CPU time in the window is the program's own.
        self.trap_share.insert(image, (traps / cpu_in).min(1.0));
        let own_in = (cpu_in - traps).max(cpu_in / 10.0);
        let own_all = (cpu_all - traps).max(own_in);
        self.own_cpu.insert(image, own_all);
        Scaling::Share(own_in / own_all)
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

    /// The totals of the images the kernel counted, scaled as the sites
    /// are, for the report (in place of their sites' sums): their calls
    /// and bytes, plus what `sites` (as counted) have of the direct
    /// mappings' and programs' own samples, which the kernel does not
    /// count. `kernel`: its counts now (`peek_calls`); `current`: the
    /// image each pid is at (`Catalog::current_generations`).
    pub fn counted_totals(
        &self,
        sites: &[(AllocKey, AllocStats)],
        kernel: &KernelCounts,
        current: &HashMap<u32, u32>,
        ended: &HashMap<u32, u32>,
    ) -> HashMap<ProcessImage, AllocStats> {
        // The image each pid's count is for, as the tick takes it: the one
        // the notices say the pid is at, or an ended process's newest (the
        // calls it made between the tick and its end are in its count).
        let images = self.images(sites, kernel, current, ended);
        let newest = self.newest_images(images.iter().copied(), kernel);
        let counts_for = |image: &ProcessImage| {
            newest.get(&image.tgid) == Some(image) && pid_may_be_at(current, image)
        };
        let mut counted = self.exact_sites();
        for (key, stats) in &mut counted {
            if let Some(&whole) = kernel.before_exec.get(&key.image()) {
                // Exec'd over since the tick.
                *stats = exact_stats(whole);
            } else if let (Some(now), true) =
                (kernel.by_tgid.get(&key.tgid), counts_for(&key.image()))
            {
                // Counted on since the tick.
                stats.count = stats.count.max(now.calls);
                stats.bytes = stats.bytes.max(now.bytes);
            }
        }
        // Seen since the tick: the kernel's count, as the tick will take it
        // (its samples' sum, shown now, would fall then).
        let new: HashSet<ProcessImage> = images
            .into_iter()
            .filter(|image| !self.roots.contains_key(image))
            .collect();
        for image in new {
            let now = match kernel.before_exec.get(&image) {
                Some(whole) => Some(whole),
                None => kernel
                    .by_tgid
                    .get(&image.tgid)
                    .filter(|_| counts_for(&image)),
            };
            if let Some(&now) = now {
                let key = AllocKey {
                    tgid: image.tgid,
                    generation: image.generation,
                    ..AllocKey::default()
                };
                counted.push((key, exact_stats(now)));
            }
        }
        self.totals.apply(&mut counted);
        let mut totals: HashMap<ProcessImage, AllocStats> = counted
            .into_iter()
            .map(|(key, stats)| (key.image(), stats))
            .collect();
        for (key, stats) in sites {
            if key.allocator >= memprof_common::mappings::MMAP {
                if let Some(total) = totals.get_mut(&key.image()) {
                    *total = total.merged(*stats);
                }
            }
        }
        totals
    }

    /// Every image to account for: those with sites, and those the
    /// kernel counted with none (`unsampled_images`).
    fn images(
        &self,
        sites: &[(AllocKey, AllocStats)],
        kernel: &KernelCounts,
        current: &HashMap<u32, u32>,
        ended: &HashMap<u32, u32>,
    ) -> HashSet<ProcessImage> {
        let mut images = self.unsampled_images(sites, kernel, current, ended);
        images.extend(sites.iter().map(|(key, _)| key.image()));
        images
    }

    /// The images with calls the kernel counted and no site: sampling
    /// picked none of their calls (a process that allocates B bytes goes
    /// unsampled with a chance of about e^(-B/sample)). They are counted
    /// all the same, and listed with their totals and no stacks: the
    /// image the notices say each counted pid is at, or, for a process
    /// that ended, its last (`ended`), and the images exec'd over, while
    /// the kernel's counts are given (an ended process's as long as it
    /// stays in the reports, `keeping_ended`). A process the catalog
    /// never heard of (a child forked without an exec, none of whose
    /// calls was sampled, that ended before a read found it running:
    /// `announce`) is not.
    fn unsampled_images(
        &self,
        sites: &[(AllocKey, AllocStats)],
        kernel: &KernelCounts,
        current: &HashMap<u32, u32>,
        ended: &HashMap<u32, u32>,
    ) -> HashSet<ProcessImage> {
        let sampled: HashSet<ProcessImage> = sites.iter().map(|(key, _)| key.image()).collect();
        let at = kernel
            .by_tgid
            .iter()
            .filter(|(_, count)| count.calls > 0)
            .filter_map(|(&tgid, _)| {
                let of_ended = kernel.ended.contains(&tgid);
                let generation = match current.get(&tgid) {
                    Some(&generation) if !of_ended => generation,
                    // The pid may run a new process already: the count is
                    // the ended one's.
                    _ if of_ended || !crate::host::procfs::status::process_runs(tgid) => {
                        *ended.get(&tgid)?
                    }
                    // Running, never announced (`announce` enters it
                    // at the next read; not with --live): its image is
                    // unknown.
                    _ => return None,
                };
                Some(ProcessImage { tgid, generation })
            });
        let execd_over = kernel
            .before_exec
            .iter()
            .filter(|(_, count)| count.calls > 0)
            .map(|(&image, _)| image);
        at.chain(execd_over)
            .filter(|image| image.generation != REFUSED_GENERATION && !sampled.contains(image))
            .collect()
    }

    /// Of `images`, each pid's newest, leaving out those exec'd over
    /// (their counts are whole, from the exec) and the calls of refused
    /// processes (no image: the tick's sites have them, a report's not):
    /// the image the pid's count is for, unless the notices say it is at
    /// a newer one.
    fn newest_images(
        &self,
        images: impl Iterator<Item = ProcessImage>,
        kernel: &KernelCounts,
    ) -> HashMap<u32, ProcessImage> {
        let mut newest: HashMap<u32, ProcessImage> = HashMap::new();
        for image in images {
            if image.generation == REFUSED_GENERATION
                || kernel.before_exec.contains_key(&image)
                || self.replaced.contains(&image)
            {
                continue;
            }
            let kept = newest.entry(image.tgid).or_insert(image);
            if generation_order(image.generation, kept.generation).is_gt() {
                *kept = image;
            }
        }
        newest
    }

    /// The images the kernel counted, each as one site: its calls and
    /// their bytes since it began.
    fn exact_sites(&self) -> Vec<(AllocKey, AllocStats)> {
        self.exact_calls
            .iter()
            .map(|(image, &counted)| {
                let key = AllocKey {
                    tgid: image.tgid,
                    generation: image.generation,
                    ..AllocKey::default()
                };
                (key, exact_stats(counted))
            })
            .collect()
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
        }
    }
}

/// Whether `image`'s pid may be at it, as the notices say (`current`):
/// it is, or its process ended (the notices forget its pid).
fn pid_may_be_at(current: &HashMap<u32, u32>, image: &ProcessImage) -> bool {
    current
        .get(&image.tgid)
        .is_none_or(|&now| now == image.generation)
}

fn exact_stats(counted: ProcessCalls) -> AllocStats {
    AllocStats {
        bytes: counted.bytes,
        count: counted.calls,
        ..AllocStats::default()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn site(tgid: u32, count: u64) -> (AllocKey, AllocStats) {
        image_site(tgid, 0, count)
    }

    fn image_site(tgid: u32, generation: u32, count: u64) -> (AllocKey, AllocStats) {
        (
            AllocKey {
                tgid,
                generation,
                ..AllocKey::default()
            },
            AllocStats {
                count,
                ..AllocStats::default()
            },
        )
    }

    fn counted(calls: u64) -> ProcessCalls {
        ProcessCalls {
            calls,
            bytes: calls * 10,
            traps: calls,
        }
    }

    fn by_tgid(tgid: u32, count: ProcessCalls) -> KernelCounts {
        KernelCounts {
            by_tgid: HashMap::from([(tgid, count)]),
            ..KernelCounts::default()
        }
    }

    #[test]
    fn a_process_costs_its_call_rate_times_the_cost_per_call() {
        let mut scopes = Scopes::default();
        let mut budget = Budget::new(1.0, 500.0, false);
        let (exact, current) = (KernelCounts::default(), HashMap::new());
        budget.tick(
            &[site(7, 1_000)],
            &exact,
            &current,
            &HashMap::new(),
            &mut scopes,
        );
        std::thread::sleep(Duration::from_millis(100));
        budget.tick(
            &[site(7, 101_000), site(8, 5)],
            &exact,
            &current,
            &HashMap::new(),
            &mut scopes,
        );
        let image = |tgid| ProcessImage {
            tgid,
            generation: 0,
        };
        // 100,000 calls in ~0.1 s at 500 ns each: ~0.5 of a CPU.
        let cost = budget.overheads()[&image(7)];
        assert!((0.3..0.51).contains(&cost), "{cost}");
        // First seen now: measured from now on.
        assert_eq!(budget.overheads().get(&image(8)), None);
        assert_eq!(budget.duty_cycles()[&image(7)], 1.0);
    }

    #[test]
    fn an_image_counted_by_the_kernel_keeps_that_count_after_its_process_ends() {
        let mut scopes = Scopes::default();
        let mut budget = Budget::new(1.0, 500.0, false);
        let image = ProcessImage {
            tgid: 7,
            generation: 0,
        };
        // Its samples say 10 calls, the kernel 1,000.
        let kernel = ProcessCalls {
            calls: 1_000,
            bytes: 64_000,
            traps: 1_000,
        };
        let current = HashMap::from([(7, 0)]);
        budget.tick(
            &[site(7, 10)],
            &by_tgid(7, kernel),
            &current,
            &HashMap::new(),
            &mut scopes,
        );
        std::thread::sleep(Duration::from_millis(100));
        // It has ended (its entry gone) and made no call since: its
        // samples' estimate (here 50,000) must not stand in.
        budget.tick(
            &[site(7, 50_000)],
            &KernelCounts::default(),
            &HashMap::new(),
            &HashMap::new(),
            &mut scopes,
        );
        assert_eq!(budget.overheads()[&image], 0.0);
    }

    #[test]
    fn an_image_exec_d_over_another_counts_from_zero() {
        let mut scopes = Scopes::default();
        let mut budget = Budget::new(1.0, 500.0, false);
        let kernel = |calls| by_tgid(7, counted(calls));
        let site = |generation, count| image_site(7, generation, count);
        let at = |generation| HashMap::from([(7, generation)]);
        budget.tick(
            &[site(0, 3)],
            &kernel(100),
            &at(0),
            &HashMap::new(),
            &mut scopes,
        );
        // The shell exec'd its program, not sampled yet: the kernel counts
        // the program's calls from zero; they are not the shell's.
        budget.tick(
            &[site(0, 3)],
            &kernel(80),
            &at(1),
            &HashMap::new(),
            &mut scopes,
        );
        let both = [site(0, 3), site(1, 9)];
        budget.tick(&both, &kernel(150), &at(1), &HashMap::new(), &mut scopes);
        budget.tick(&both, &kernel(300), &at(1), &HashMap::new(), &mut scopes);
        // It ended; a new process took its pid (its count starts afresh).
        let three = [site(0, 3), site(1, 9), site(5_000, 2)];
        budget.tick(
            &three,
            &kernel(20),
            &at(5_000),
            &HashMap::new(),
            &mut scopes,
        );
        let counted: HashMap<u32, u64> = budget
            .exact_sites()
            .into_iter()
            .map(|(key, stats)| (key.generation, stats.count))
            .collect();
        assert_eq!(counted, HashMap::from([(0, 100), (1, 300), (5_000, 20)]));
    }

    #[test]
    fn an_image_exec_d_over_has_its_whole_count_from_the_exec() {
        let mut scopes = Scopes::default();
        let mut budget = Budget::new(1.0, 500.0, false);
        let site = |generation, count| image_site(7, generation, count);
        let image = |generation| ProcessImage {
            tgid: 7,
            generation,
        };
        let at = |generation| HashMap::from([(7, generation)]);
        budget.tick(
            &[site(0, 3)],
            &by_tgid(7, counted(100)),
            &at(0),
            &HashMap::new(),
            &mut scopes,
        );
        // It made 40 more calls, then exec'd; the notices are behind, and
        // the pid's count is the new image's (5).
        let whole = KernelCounts {
            by_tgid: HashMap::from([(7, counted(5))]),
            before_exec: HashMap::from([(image(0), counted(140))]),
            ..KernelCounts::default()
        };
        budget.tick(&[site(0, 4)], &whole, &at(0), &HashMap::new(), &mut scopes);
        assert_eq!(budget.exact_calls[&image(0)], counted(140));
        // A report now, the new image seen: each its own count.
        let both = [site(0, 4), site(1, 2)];
        let now = KernelCounts {
            by_tgid: HashMap::from([(7, counted(9))]),
            ..whole
        };
        let totals = budget.counted_totals(&both, &now, &at(1), &HashMap::new());
        assert_eq!(totals[&image(0)].count, 140);
        assert_eq!(totals[&image(1)].count, 9);
        // An image first seen after its exec: its whole count too.
        let mut fresh = Budget::new(1.0, 500.0, false);
        let late = KernelCounts {
            by_tgid: HashMap::from([(7, counted(9))]),
            before_exec: HashMap::from([(image(0), counted(140))]),
            ..KernelCounts::default()
        };
        fresh.tick(&both, &late, &at(1), &HashMap::new(), &mut scopes);
        assert_eq!(fresh.exact_calls[&image(0)], counted(140));
        assert_eq!(fresh.exact_calls[&image(1)], counted(9));
        // Long after, the new image never sampled, the process ended (the
        // notices forget its pid): the pid's last count is the new
        // image's, never the old one's.
        for _ in 0..6 {
            let ended = by_tgid(7, counted(500));
            budget.tick(
                &[site(0, 4)],
                &ended,
                &HashMap::new(),
                &HashMap::new(),
                &mut scopes,
            );
        }
        assert_eq!(budget.exact_calls[&image(0)], counted(140));
    }

    /// A process none of whose calls was sampled is one image with no
    /// site; once it ended, its last count stays its own, also when its
    /// pid runs a new process already (announced, not counted yet).
    #[test]
    fn an_unsampled_process_s_count_is_its_own_after_its_pid_is_reused() {
        let budget = Budget::new(1.0, 500.0, false);
        let image = |generation| ProcessImage {
            tgid: 7,
            generation,
        };
        let running = by_tgid(7, counted(50));
        let current = HashMap::from([(7, 1)]);
        let listed = budget.unsampled_images(&[], &running, &current, &HashMap::new());
        assert_eq!(listed, HashSet::from([image(1)]));
        // Its pid now runs generation 2; the count is the ended one's.
        let ended = KernelCounts {
            ended: HashSet::from([7]),
            ..running
        };
        let current = HashMap::from([(7, 2)]);
        let last = HashMap::from([(7, 1)]);
        let listed = budget.unsampled_images(&[], &ended, &current, &last);
        assert_eq!(listed, HashSet::from([image(1)]));
        // Sampled: an image with a site is no unsampled one.
        let listed = budget.unsampled_images(&[image_site(7, 1, 1)], &ended, &current, &last);
        assert!(listed.is_empty());
    }
}
