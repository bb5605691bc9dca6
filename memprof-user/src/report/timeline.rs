//! The heap over time as a report shows it: each process image's samples
//! cut to its span, its total and its first stacks' figures.
use std::collections::HashSet;

use memprof_common::sites::AllocKey;

use crate::{
    collect::timeline::TimelineRecorder,
    report::model::{StackReport, TimelineReport, TimelineStack, TIMELINE_STACKS},
};

/// The timeline of one process image: the figures of its sites (but
/// `hidden` ones) summed, and those of the first `stacks`, over its span
/// (`TimelineRecorder::span`).
pub fn timeline_report(
    recorder: &TimelineRecorder,
    image: (u32, u32),
    stacks: &[StackReport],
    hidden: &HashSet<AllocKey>,
    runs: bool,
) -> TimelineReport {
    let span = recorder.span(image, hidden, runs);
    let total = recorder.figures(recorder.sites_of(image, hidden), span.clone());
    let stacks = stacks
        .iter()
        .take(TIMELINE_STACKS)
        .enumerate()
        .map(|(stack, report)| TimelineStack {
            stack,
            values: recorder.figures(report.sites.iter(), span.clone()),
        })
        .collect();
    TimelineReport {
        period_secs: recorder.period_secs(),
        metric: recorder.metric().to_string(),
        secs: recorder.secs()[span].to_vec(),
        total,
        stacks,
    }
}

#[cfg(test)]
mod tests {
    use memprof_common::sites::AllocStats;

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
            go_type: None,
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
        let timeline = timeline_report(&recorder, (1, 0), &stacks, &HashSet::new(), false);
        assert_eq!(timeline.metric, "live_bytes");
        // From the sample before its first change to the one after its last.
        assert_eq!(timeline.secs, [0.1, 0.2, 0.3, 0.4, 0.5]);
        assert_eq!(timeline.total, [0, 100, 350, 50, 50]);
        assert_eq!(timeline.stacks[0].values, [0, 100, 300, 0, 0]);
        assert_eq!(timeline.stacks[1].values, [0, 0, 50, 50, 50]);
        // A running process's timeline goes on to the last sample.
        let running = timeline_report(&recorder, (1, 0), &stacks, &HashSet::new(), true);
        assert_eq!(running.total.len(), 6);
        // Hidden sites are left out of the total.
        let hidden = timeline_report(&recorder, (1, 0), &stacks, &HashSet::from([a]), false);
        assert_eq!(hidden.total, [0, 50, 50]);
        // Nothing changed: every sample, all zero.
        let idle = timeline_report(&recorder, (3, 0), &[], &HashSet::new(), false);
        assert_eq!(idle.total, [0; 6]);
    }
}
