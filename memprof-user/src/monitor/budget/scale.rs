//! Estimates for processes whose probes were in for part of each span:
//! what each call site counted in a span, divided by the share of the
//! span's calls its probes were in for, summed over spans; what the span
//! under way has counted so far is added as counted. So the figures never
//! fall (Prometheus reads a counter that falls as a restart), and catch
//! up at each span's end. A site whose probes were in all along keeps its
//! counts as they are.
use std::collections::HashMap;

use memprof_common::{
    images::ProcessImage,
    sites::{AllocKey, AllocStats},
};

#[derive(Default)]
pub struct Scale {
    sites: HashMap<AllocKey, Scaled>,
    /// Some period was counted in part.
    scaled: bool,
}

#[derive(Clone, Copy, Default)]
struct Scaled {
    /// Estimated bytes and calls up to the last period's end.
    bytes: f64,
    count: f64,
    /// What the kernel had counted then.
    counted: AllocStats,
    /// What the last span whose calls were seen added.
    added: (f64, f64),
}

/// How a span's counts become estimates.
#[derive(Clone, Copy, Debug, PartialEq)]
pub enum Scaling {
    /// Divided by the share of the span's calls the window saw.
    Share(f64),
    /// None seen: the last span seen's, times this.
    Repeat(f64),
}

impl Scale {
    /// A period ends: `sites` as counted now; `ended` the share of its
    /// span each image's calls were counted in, for the images whose
    /// span ends now (None: it goes on). Sites gone from `sites`
    /// (evicted) are forgotten. Returns the bytes each image whose span
    /// ended added to its estimate with it.
    pub fn end_period(
        &mut self,
        sites: &[(AllocKey, AllocStats)],
        ended: &dyn Fn(&ProcessImage) -> Option<Scaling>,
    ) -> HashMap<ProcessImage, f64> {
        let mut before = std::mem::take(&mut self.sites);
        let mut span_bytes: HashMap<ProcessImage, f64> = HashMap::new();
        for (key, stats) in sites {
            let mut site = before.remove(key).unwrap_or_default();
            let estimate_before = site.bytes;
            let scaling = ended(&key.image());
            match scaling {
                Some(Scaling::Share(share)) => {
                    self.scaled |= share < 1.0;
                    site.added = site.add(stats, share);
                    site.counted = *stats;
                }
                Some(Scaling::Repeat(times)) => {
                    self.scaled = true;
                    site.add(stats, 1.0);
                    site.bytes += site.added.0 * times;
                    site.count += site.added.1 * times;
                    site.counted = *stats;
                }
                // Its span goes on.
                None => {}
            }
            if scaling.is_some() {
                *span_bytes.entry(key.image()).or_default() += site.bytes - estimate_before;
            }
            self.sites.insert(*key, site);
        }
        span_bytes
    }

    /// `sites` as counted now, turned into estimates.
    pub fn apply(&self, sites: &mut [(AllocKey, AllocStats)]) {
        if !self.scaled {
            return;
        }
        for (key, stats) in sites.iter_mut() {
            let mut site = self.sites.get(key).copied().unwrap_or_default();
            site.add(stats, 1.0);
            stats.bytes = site.bytes.round() as u64;
            stats.count = site.count.round() as u64;
        }
    }

    pub fn scaled(&self) -> bool {
        self.scaled
    }
}

impl Scaled {
    /// Adds what was counted since `self.counted`, in a span whose calls
    /// the probes saw `share` of; returns what it added. (None seen:
    /// nothing can have been counted.)
    fn add(&mut self, now: &AllocStats, share: f64) -> (f64, f64) {
        if share <= 0.0 {
            return (0.0, 0.0);
        }
        let new = |now: u64, then: u64| now.saturating_sub(then) as f64 / share.min(1.0);
        let added = (
            new(now.bytes, self.counted.bytes),
            new(now.count, self.counted.count),
        );
        self.bytes += added.0;
        self.count += added.1;
        added
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn site(bytes: u64, count: u64) -> [(AllocKey, AllocStats); 1] {
        [(
            AllocKey::default(),
            AllocStats {
                bytes,
                count,
                ..AllocStats::default()
            },
        )]
    }

    #[test]
    fn each_period_is_divided_by_its_own_share() {
        let mut scale = Scale::default();
        // All in: exact; then a quarter in (100 -> 400).
        scale.end_period(&site(1_000, 10), &|_| Some(Scaling::Share(1.0)));
        let mut now = site(1_000, 10);
        scale.apply(&mut now);
        assert_eq!(now[0].1.bytes, 1_000, "nothing scaled yet");
        let added = scale.end_period(&site(1_100, 11), &|_| Some(Scaling::Share(0.25)));
        assert_eq!(added[&AllocKey::default().image()], 400.0);
        // The span under way: as counted so far.
        let mut now = site(1_150, 12);
        scale.apply(&mut now);
        assert_eq!((now[0].1.bytes, now[0].1.count), (1_000 + 400 + 50, 15));
    }

    #[test]
    fn a_period_with_no_window_counts_nothing_and_evicted_sites_go() {
        let mut scale = Scale::default();
        scale.end_period(&site(100, 1), &|_| Some(Scaling::Share(0.5)));
        // A span going on: nothing added yet.
        scale.end_period(&site(150, 2), &|_| None);
        scale.end_period(&site(100, 1), &|_| Some(Scaling::Share(0.0)));
        let mut now = site(100, 1);
        scale.apply(&mut now);
        assert_eq!(now[0].1.bytes, 200);
        scale.end_period(&[], &|_| Some(Scaling::Share(1.0)));
        assert!(scale.sites.is_empty());
    }

    #[test]
    fn a_span_whose_window_saw_nothing_repeats_the_last_one_seen() {
        let mut scale = Scale::default();
        scale.end_period(&site(100, 1), &|_| Some(Scaling::Share(0.5)));
        // Nothing counted; the process ran half as long as in that span.
        let added = scale.end_period(&site(100, 1), &|_| Some(Scaling::Repeat(0.5)));
        let mut now = site(100, 1);
        scale.apply(&mut now);
        assert_eq!((now[0].1.bytes, now[0].1.count), (300, 3));
        // What the span added to the estimate, for its rate.
        assert_eq!(added[&AllocKey::default().image()], 100.0);
    }
}
