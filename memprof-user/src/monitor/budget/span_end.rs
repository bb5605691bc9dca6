//! The tick's work for the roots whose span ends: each image's cost over
//! the span, how its figures are scaled from its window (`estimate`), its
//! allocation rate, and the share of the next span each root's probes may
//! be in, from which the next span's calls and CPU time are counted.
use std::{
    collections::{HashMap, HashSet},
    time::Instant,
};

use memprof_common::{
    images::ProcessImage,
    sites::{AllocKey, AllocStats},
};

use super::{scale::Scaling, windows, Budget, AIM, MIN_DUTY, PERIOD};
use crate::probes::Scopes;

/// The fewest calls a window must have counted of a process it saw for
/// less than half its CPU time for its figures to be scaled as an
/// estimate: fewer, and they are `partial`.
const MIN_CALLS_TO_SCALE: u64 = 20;

/// The spans that end at a tick: of each root whose span ends, and of
/// each process that ended mid-span (scaled to its end).
pub(super) struct Spans<'a> {
    pub of_roots: &'a HashMap<u32, windows::Ended>,
    pub early: &'a HashMap<ProcessImage, windows::Ended>,
}

impl Spans<'_> {
    fn of(&self, image: &ProcessImage, root: u32) -> Option<&windows::Ended> {
        self.early.get(image).or_else(|| self.of_roots.get(&root))
    }
}

impl Budget {
    /// The images whose process ended while its root's span goes on: each
    /// one's span so far, to scale its figures to its end (its CPU time
    /// then, from the kernel, says how much of it the windows saw).
    pub(super) fn ended_mid_span(
        &self,
        now: Instant,
        calls: &HashMap<ProcessImage, u64>,
        ending: &[ProcessImage],
    ) -> HashMap<ProcessImage, windows::Ended> {
        calls
            .keys()
            .filter(|image| !ending.contains(image) && !self.finished.contains(image))
            .filter_map(|image| {
                let end_cpu = self.end_cpu(image)?;
                let span = self
                    .windows
                    .so_far(self.roots[image], now, image.tgid, end_cpu)?;
                Some((*image, span))
            })
            .collect()
    }

    /// An ended image's process's CPU time at its end (its exit, or its
    /// exec), as the kernel read it.
    pub(super) fn end_cpu(&self, image: &ProcessImage) -> Option<u64> {
        self.exact_calls
            .get(image)
            .map(|count| count.end_cpu_ns)
            .filter(|&ns| ns > 0)
    }

    /// The CPU time of each image's process now, or at its end.
    pub(super) fn cpu_times(&self, images: &[ProcessImage]) -> HashMap<u32, u64> {
        images
            .iter()
            .filter_map(|image| {
                let cpu = self
                    .end_cpu(image)
                    .or_else(|| crate::host::procfs::status::cpu_time_ns(image.tgid))?;
                Some((image.tgid, cpu))
            })
            .collect()
    }

    /// The images whose root's span ends (or that have none yet).
    pub(super) fn ending(&self, calls: &HashMap<ProcessImage, u64>) -> Vec<ProcessImage> {
        calls
            .keys()
            .filter(|image| {
                self.windows.span_ends(self.roots[image]) && !self.finished.contains(image)
            })
            .copied()
            .collect()
    }

    /// Each ending image's cost over its span, and how its figures are
    /// scaled; and what each root's tree costs while its probes are in:
    /// its costliest process's rate then.
    pub(super) fn span_costs(
        &mut self,
        ending: &[ProcessImage],
        spans: &Spans,
        calls: &HashMap<ProcessImage, u64>,
        cpu_now: &HashMap<u32, u64>,
    ) -> (HashMap<ProcessImage, Scaling>, HashMap<u32, f64>) {
        let mut shares: HashMap<ProcessImage, Scaling> = HashMap::new();
        let mut full_cost: HashMap<u32, f64> = HashMap::new();
        for image in ending {
            let root = self.roots[image];
            let Some(span) = spans.of(image, root) else {
                continue;
            };
            // First seen: did it start since the probes last went out
            // before this span's window (seen by that window alone)?
            let new_since_out = !self.span_cpu.contains_key(&image.tgid)
                && span
                    .unseen_since
                    .is_some_and(|out| crate::host::procfs::status::started_after(image.tgid, out));
            let base = self.span_base(image, span, calls, new_since_out);
            let span_calls = calls[image].saturating_sub(base);
            let scaling = self.estimate(*image, span, span_calls, cpu_now, new_since_out);
            shares.insert(*image, scaling);
            if span.share < 1.0 {
                self.estimated.insert(*image);
            }
            let life = self.life.entry(*image).or_default();
            *life = (life.0 + span.share * span.secs, life.1 + span.secs);
            self.duty.insert(*image, span.share);
            // Its cost over the span, and while its probes were in.
            let cost = span_calls as f64 * self.cost_ns * 1e-9 / span.secs;
            self.overhead.insert(*image, cost);
            if span.share > 0.0 && !spans.early.contains_key(image) {
                let full = full_cost.entry(root).or_default();
                *full = full.max(cost / span.share);
            }
        }
        (shares, full_cost)
    }

    /// `image`'s calls when its span began.
    fn span_base(
        &self,
        image: &ProcessImage,
        span: &windows::Ended,
        calls: &HashMap<ProcessImage, u64>,
        new_since_out: bool,
    ) -> u64 {
        match self.span_calls.get(image) {
            Some(&base) => base,
            // First seen in a span with a window: the kernel's count
            // goes back to its first trap, spans ago, unless it is
            // new since; its cost is known from its next span on.
            // (Unless its CPU time when the span began is known: its
            // probes went out early, its first allowance spent.)
            None if span.cpu_in.is_some()
                && self.exact_calls.contains_key(image)
                && !new_since_out
                && !self.span_cpu.contains_key(&image.tgid) =>
            {
                calls[image]
            }
            None => 0,
        }
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
            // Nothing to scale by but the time: not an estimate to trust.
            if span.share < 1.0 && calls > 0 {
                self.partial.insert(image);
            }
            return Scaling::Share(span.share);
        };
        let cpu_in = cpu_in as f64;
        if cpu_in <= 0.0 {
            // Nothing seen: the span is like the last one seen, as far as
            // the CPU time says (1 ms of CPU or less: idle, nothing to add).
            return match self.own_cpu.get(&image) {
                Some(&last) if last > 0.0 && cpu_all > 1e6 => Scaling::Repeat(cpu_all / last),
                _ => {
                    if cpu_all > 1e6 {
                        self.partial.insert(image);
                    }
                    Scaling::Share(span.share)
                }
            };
        }
        if calls < MIN_CALLS_TO_SCALE && cpu_in < cpu_all / 2.0 {
            self.partial.insert(image);
        }
        // The calibration is an estimate too: never less than a tenth of
        // the CPU time in the window is the program's own.
        self.trap_share.insert(image, (traps / cpu_in).min(1.0));
        let own_in = (cpu_in - traps).max(cpu_in / 10.0);
        let own_all = (cpu_all - traps).max(own_in);
        self.own_cpu.insert(image, own_all);
        Scaling::Share(own_in / own_all)
    }

    /// The period's end for the scaled figures (the sites' and the exact
    /// counts'), and each ending image's allocation rate over its span.
    pub(super) fn record_span_rates(
        &mut self,
        sites: &[(AllocKey, AllocStats)],
        ending: &[ProcessImage],
        spans: &Spans,
        shares: &HashMap<ProcessImage, Scaling>,
    ) {
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
        for image in ending {
            if let Some(span) = spans.of(image, self.roots[image]) {
                // An unsampled image's from its count.
                let bytes = span_bytes.get(image).or_else(|| span_totals.get(image));
                self.span_rate
                    .insert(*image, bytes.copied().unwrap_or(0.0) / span.secs);
            }
        }
    }

    /// The next span of each root whose span ends, with the share of it
    /// its probes may be in (`full_cost`: its tree's cost while they are
    /// in); roots gone from the scopes and the images are forgotten.
    /// Returns the shares planned.
    pub(super) fn plan_spans(
        &mut self,
        now: Instant,
        full_cost: &HashMap<u32, f64>,
        scopes: &mut Scopes,
    ) -> HashMap<u32, f64> {
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
        let traps_per_sec = self.traps_per_sec();
        self.windows
            .plan(now, PERIOD, &planned, traps_per_sec, scopes);
        planned
    }

    /// Each ending image whose root got a new span: its calls and its
    /// process's CPU time now, where that span starts.
    pub(super) fn start_spans(
        &mut self,
        ending: &[ProcessImage],
        planned: &HashMap<u32, f64>,
        calls: &HashMap<ProcessImage, u64>,
        cpu_now: &HashMap<u32, u64>,
    ) {
        for image in ending {
            if planned.contains_key(&self.roots[image]) {
                self.span_calls.insert(*image, calls[image]);
                if let Some(&cpu) = cpu_now.get(&image.tgid) {
                    self.span_cpu.insert(image.tgid, cpu);
                }
            }
        }
    }
}
