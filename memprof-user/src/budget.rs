//! `monitor`'s cost budget (`--max-overhead`): what memprof's probes cost
//! each process, estimated every period from its allocation rate and the
//! cost per call measured at start (`calibrate`), exported next to the
//! budget.
use std::{
    collections::HashMap,
    time::{Duration, Instant},
};

use memprof_common::{AllocKey, AllocStats, ProcessImage};

use crate::report::model::BudgetReport;

/// How often each process's rate is measured.
pub const PERIOD: Duration = Duration::from_secs(5);

pub struct Budget {
    /// Of one CPU, per process (`--max-overhead` / 100).
    max_overhead: f64,
    /// The probes' cost per allocation here, in ns (measured at start).
    cost_ns: f64,
    /// Each image's calls at the last period's end, and when (rebuilt
    /// each period: evicted images drop out).
    last: Option<(Instant, HashMap<ProcessImage, u64>)>,
    /// Each image's estimated cost over the last period, in CPUs.
    overhead: HashMap<ProcessImage, f64>,
}

impl Budget {
    pub fn new(max_overhead_percent: f64, cost_ns: f64) -> Budget {
        Budget {
            max_overhead: max_overhead_percent / 100.0,
            cost_ns,
            last: None,
            overhead: HashMap::new(),
        }
    }

    /// A period's end: each image's calls since the last (`sites` in
    /// calls, estimated when sampling), as a cost.
    pub fn tick(&mut self, sites: &[(AllocKey, AllocStats)]) {
        let now = Instant::now();
        let mut calls: HashMap<ProcessImage, u64> = HashMap::new();
        for (key, stats) in sites {
            *calls.entry(key.image()).or_default() += stats.count;
        }
        if let Some((then, before)) = &self.last {
            let secs = now.duration_since(*then).as_secs_f64().max(1e-3);
            self.overhead = calls
                .iter()
                .map(|(image, &now_calls)| {
                    let new = now_calls.saturating_sub(before.get(image).copied().unwrap_or(0));
                    (*image, new as f64 / secs * self.cost_ns * 1e-9)
                })
                .collect();
        }
        self.last = Some((now, calls));
    }

    /// Each image's estimated cost over the last period (in CPUs).
    pub fn overheads(&self) -> &HashMap<ProcessImage, f64> {
        &self.overhead
    }

    pub fn report(&self) -> BudgetReport {
        BudgetReport {
            max_overhead: self.max_overhead,
            cost_per_call_ns: self.cost_ns,
            period_secs: PERIOD.as_secs_f64(),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn site(tgid: u32, count: u64) -> (AllocKey, AllocStats) {
        (
            AllocKey {
                tgid,
                ..AllocKey::default()
            },
            AllocStats {
                count,
                ..AllocStats::default()
            },
        )
    }

    #[test]
    fn a_process_costs_its_call_rate_times_the_cost_per_call() {
        let mut budget = Budget::new(1.0, 500.0);
        budget.tick(&[site(7, 1_000)]);
        std::thread::sleep(Duration::from_millis(100));
        budget.tick(&[site(7, 101_000), site(8, 5)]);
        let image = |tgid| ProcessImage {
            tgid,
            generation: 0,
        };
        // 100,000 calls in ~0.1 s at 500 ns each: ~0.5 of a CPU.
        let cost = budget.overheads()[&image(7)];
        assert!((0.3..0.51).contains(&cost), "{cost}");
        assert!(budget.overheads()[&image(8)] < 0.01);
    }
}
