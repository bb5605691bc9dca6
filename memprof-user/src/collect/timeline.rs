//! The heap over time (--format timeline/chrome, --timeline-period): every
//! period the kernel's per-call-site counters are read, as for a report;
//! nothing is paid per allocation. Each site keeps only its changes, so a
//! long profile of a steady program stays small.
use std::collections::{HashMap, HashSet};

use memprof_common::sites::{AllocKey, AllocStats};

use crate::report::model::{StackReport, TimelineReport, TimelineStack, TIMELINE_STACKS};

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

    /// The timeline of one process image: the figures of its sites (but
    /// `hidden` ones) summed, and those of the first `stacks`, from the
    /// sample before its first change to the one after its last (to the
    /// end while it `runs`); every sample when none changed (its blocks
    /// all freed between two samples, or all its stacks hidden).
    pub fn report(
        &self,
        image: (u32, u32),
        stacks: &[StackReport],
        hidden: &HashSet<AllocKey>,
        runs: bool,
    ) -> TimelineReport {
        let own = self
            .sites
            .iter()
            .filter(|(key, _)| (key.tgid, key.generation) == image && !hidden.contains(key));
        let changed = own
            .clone()
            .flat_map(|(_, changes)| changes.first().zip(changes.last()))
            .fold(None, |span: Option<(u32, u32)>, (first, last)| {
                Some(span.map_or((first.0, last.0), |(a, b)| (a.min(first.0), b.max(last.0))))
            });
        let span = match changed {
            Some((first, last)) if !runs => {
                first.saturating_sub(1) as usize..(last as usize + 2).min(self.secs.len())
            }
            Some((first, _)) => first.saturating_sub(1) as usize..self.secs.len(),
            None => 0..self.secs.len(),
        };
        let total = self.figures(own.map(|(key, _)| key), span.clone());
        let stacks = stacks
            .iter()
            .take(TIMELINE_STACKS)
            .enumerate()
            .map(|(stack, report)| TimelineStack {
                stack,
                values: self.figures(report.sites.iter(), span.clone()),
            })
            .collect();
        TimelineReport {
            period_secs: self.period_secs,
            metric: if self.live {
                "live_bytes"
            } else {
                "allocated_bytes"
            }
            .to_string(),
            secs: self.secs[span].to_vec(),
            total,
            stacks,
        }
    }

    /// The sum of `sites`' figures at each sample of `span`: their
    /// changes as differences, added up from the first sample.
    fn figures<'a>(
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

#[cfg(test)]
mod tests {
    use super::*;

    fn key(tgid: u32, caller: u64) -> AllocKey {
        AllocKey {
            tgid,
            generation: 0,
            allocator: 0,
            reserved: 0,
            stack: 0,
            caller,
        }
    }

    fn live(bytes: u64) -> AllocStats {
        AllocStats {
            live_bytes: bytes,
            ..AllocStats::default()
        }
    }

    fn stack(sites: Vec<AllocKey>) -> StackReport {
        StackReport {
            allocator: "malloc".into(),
            bytes: 0,
            count: 0,
            partial: false,
            samples: None,
            frames: Vec::new(),
            addresses: Vec::new(),
            sites,
            band: None,
            live: None,
        }
    }

    #[test]
    fn a_process_heap_is_summed_from_its_sites_changes() {
        let (a, b, other) = (key(1, 10), key(1, 20), key(2, 10));
        let mut recorder = TimelineRecorder::new(0.1, true);
        recorder.sample(0.1, &[(other, live(5))]);
        recorder.sample(0.2, &[(a, live(100)), (other, live(5))]);
        recorder.sample(0.3, &[(a, live(300)), (b, live(50))]);
        recorder.sample(0.4, &[(a, live(0)), (b, live(50))]);
        recorder.sample(0.5, &[(a, live(0)), (b, live(50))]);
        recorder.sample(0.6, &[(a, live(0)), (b, live(50))]);
        let stacks = [stack(vec![a]), stack(vec![b])];
        let timeline = recorder.report((1, 0), &stacks, &HashSet::new(), false);
        assert_eq!(timeline.metric, "live_bytes");
        // From the sample before its first change to the one after its last.
        assert_eq!(timeline.secs, [0.1, 0.2, 0.3, 0.4, 0.5]);
        assert_eq!(timeline.total, [0, 100, 350, 50, 50]);
        assert_eq!(timeline.stacks[0].values, [0, 100, 300, 0, 0]);
        assert_eq!(timeline.stacks[1].values, [0, 0, 50, 50, 50]);
        // A running process's timeline goes on to the last sample.
        let running = recorder.report((1, 0), &stacks, &HashSet::new(), true);
        assert_eq!(running.total.len(), 6);
        // Hidden sites are left out of the total.
        let hidden = recorder.report((1, 0), &stacks, &HashSet::from([a]), false);
        assert_eq!(hidden.total, [0, 50, 50]);
        // Nothing changed: every sample, all zero.
        let idle = recorder.report((3, 0), &[], &HashSet::new(), false);
        assert_eq!(idle.total, [0; 6]);
    }
}
