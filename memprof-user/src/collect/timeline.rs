//! The heap over time (--format timeline/chrome, --timeline-period): every
//! period the kernel's per-call-site counters are read, as for a report;
//! nothing is paid per allocation. Each site keeps only its changes, so a
//! long profile of a steady program stays small.
use std::collections::{HashMap, HashSet};

use memprof_common::sites::{AllocKey, AllocStats};

pub struct TimelineRecorder {
    period_secs: f64,
    /// Live bytes (--live), else bytes allocated so far.
    live: bool,
    /// When each sample was taken, seconds since profiling started.
    secs: Vec<f64>,
    /// Each site's figure where it changed: (sample index, value).
    sites: HashMap<AllocKey, Vec<(u32, u64)>>,
}

impl TimelineRecorder {
    pub fn new(period_secs: f64, live: bool) -> TimelineRecorder {
        TimelineRecorder {
            period_secs,
            live,
            secs: Vec::new(),
            sites: HashMap::new(),
        }
    }

    /// One sample: every site's figure at `secs`. A site missing from
    /// `sites` keeps its last figure.
    pub fn sample<'a>(
        &mut self,
        secs: f64,
        sites: impl IntoIterator<Item = &'a (AllocKey, AllocStats)>,
    ) {
        let index = self.secs.len() as u32;
        self.secs.push(secs);
        for (key, stats) in sites {
            let value = if self.live {
                stats.live_bytes
            } else {
                stats.bytes
            };
            let changes = self.sites.entry(*key).or_default();
            if changes.last().map_or(0, |&(_, last)| last) != value {
                changes.push((index, value));
            }
        }
    }

    /// The figure it records: `live_bytes` (--live), else
    /// `allocated_bytes`.
    pub fn metric(&self) -> &'static str {
        if self.live {
            "live_bytes"
        } else {
            "allocated_bytes"
        }
    }

    pub fn period_secs(&self) -> f64 {
        self.period_secs
    }

    /// When each sample was taken, seconds since profiling started.
    pub fn secs(&self) -> &[f64] {
        &self.secs
    }

    /// The sites of process image `image`, but `hidden` ones.
    pub fn sites_of<'a>(
        &'a self,
        image: (u32, u32),
        hidden: &'a HashSet<AllocKey>,
    ) -> impl Iterator<Item = &'a AllocKey> + Clone + 'a {
        self.sites
            .keys()
            .filter(move |key| (key.tgid, key.generation) == image && !hidden.contains(key))
    }

    /// The samples a process image's timeline shows: from the sample before
    /// its sites' first change to the one after their last (to the end
    /// while it `runs`); every sample when none changed (its blocks all
    /// freed between two samples, or all its stacks hidden).
    pub fn span(
        &self,
        image: (u32, u32),
        hidden: &HashSet<AllocKey>,
        runs: bool,
    ) -> std::ops::Range<usize> {
        let changed = self
            .sites_of(image, hidden)
            .filter_map(|key| self.sites.get(key))
            .flat_map(|changes| changes.first().zip(changes.last()))
            .fold(None, |span: Option<(u32, u32)>, (first, last)| {
                Some(span.map_or((first.0, last.0), |(a, b)| (a.min(first.0), b.max(last.0))))
            });
        match changed {
            Some((first, last)) if !runs => {
                first.saturating_sub(1) as usize..(last as usize + 2).min(self.secs.len())
            }
            Some((first, _)) => first.saturating_sub(1) as usize..self.secs.len(),
            None => 0..self.secs.len(),
        }
    }

    /// The sum of `sites`' figures at each sample of `span`: their
    /// changes as differences, added up from the first sample.
    pub fn figures<'a>(
        &self,
        sites: impl Iterator<Item = &'a AllocKey>,
        span: std::ops::Range<usize>,
    ) -> Vec<u64> {
        let mut steps = vec![0u64; self.secs.len()];
        for changes in sites.filter_map(|key| self.sites.get(key)) {
            let mut before = 0u64;
            for &(index, value) in changes {
                // Wrapping: a figure that falls is a "negative" step.
                steps[index as usize] =
                    steps[index as usize].wrapping_add(value.wrapping_sub(before));
                before = value;
            }
        }
        let mut sum = 0u64;
        let running: Vec<u64> = steps
            .into_iter()
            .map(|step| {
                sum = sum.wrapping_add(step);
                sum
            })
            .collect();
        running[span].to_vec()
    }
}
