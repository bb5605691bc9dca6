//! A timeline as the charts draw it (`timeline_svg`, `chrome`): each
//! process's series as figures per span (samples, or the intervals a rate
//! holds over), its bands (the stacks it follows, then the rest), the peak
//! to mark, and the bands' labels.
use anyhow::Result;

use super::model::{ProcessReport, Report, TimelineReport};
use crate::human::{error::UserError, numbers::human_bytes};

/// The processes that hold a timeline, each with it; an error when none does.
pub(super) fn timelines(report: &Report) -> Result<Vec<(&ProcessReport, &TimelineReport)>> {
    let found: Vec<_> = report
        .processes
        .iter()
        .filter_map(|process| Some((process, process.timeline.as_ref()?)))
        .collect();
    if report.processes.is_empty() {
        return Err(UserError::new("nothing to draw: the report is empty").into());
    }
    if found.is_empty() {
        return Err(UserError::new(
            "this report holds no timeline: profile with --format timeline or --format chrome, or save the JSON report with --timeline-period",
        )
        .into());
    }
    Ok(found)
}

/// A timeline as figures to draw: one value per span, for the process
/// and for each band.
pub(super) struct Curves {
    pub live: bool,
    pub spans: Vec<Span>,
    /// The process's figure over each span.
    pub total: Vec<f64>,
    /// Bottom-up: the stacks the timeline follows, largest first, then the rest.
    pub bands: Vec<Band>,
}

/// Live: one sample (start == end). Allocated: the interval a rate holds over.
pub(super) struct Span {
    pub start: f64,
    pub end: f64,
    /// The sample it ends at.
    sample: usize,
}

pub(super) struct Band {
    /// Index into the process's stacks; None for the rest.
    pub stack: Option<usize>,
    pub label: String,
    pub values: Vec<f64>,
}

/// The highest point of a chart.
pub(super) struct Peak {
    pub secs: f64,
    pub value: f64,
    pub exact: bool,
    /// What the label says of it, when not simply exact or an estimate.
    pub note: Option<String>,
}

impl Curves {
    /// `timeline` with its first `max_bands` stacks as bands; the rest is
    /// what the total holds beyond them.
    pub(super) fn new(
        process: &ProcessReport,
        timeline: &TimelineReport,
        max_bands: usize,
    ) -> Self {
        let followed = &timeline.stacks[..timeline.stacks.len().min(max_bands)];
        let rest: Vec<u64> = (0..timeline.secs.len())
            .map(|i| {
                let banded: u64 = followed.iter().map(|band| at(&band.values, i)).sum();
                at(&timeline.total, i).saturating_sub(banded)
            })
            .collect();
        let live = timeline.is_live();
        let spans = spans(timeline);
        let figures = |values: &[u64]| -> Vec<f64> {
            spans
                .iter()
                .map(|span| figure(values, span, live))
                .collect()
        };
        let mut bands: Vec<Band> = followed
            .iter()
            .map(|band| Band {
                stack: Some(band.stack),
                label: stack_label(process, band.stack),
                values: figures(&band.values),
            })
            .collect();
        bands.push(Band {
            stack: None,
            label: "other".to_string(),
            values: figures(&rest),
        });
        Curves {
            live,
            total: figures(&timeline.total),
            spans,
            bands,
        }
    }

    /// Live: the process's peak, exact, which may fall between samples and
    /// above them; but the exact peak counts the allocators' blocks only,
    /// so a process that also mapped memory directly (stacked here too)
    /// gets its highest sample, with both exact peaks in the note.
    /// Without the live figures: the highest sample. Allocated: the
    /// highest rate, at the middle of its interval (the rate is the
    /// interval's mean, drawn as a flat step).
    pub(super) fn peak(&self, report: &Report, process: &ProcessReport) -> Option<Peak> {
        let live = process.live.as_ref().filter(|_| self.live);
        // The exact peak is the whole process's: not what is drawn when
        // filters hid some of its stacks.
        let filtered = process.hidden.is_some_and(|h| h.hidden_stacks > 0);
        if let Some(live) = live.filter(|live| live.mapped_peak_bytes == 0 && !filtered) {
            return Some(Peak {
                secs: live.peak_secs,
                value: live.peak_live_bytes as f64,
                exact: report.exact && live.peak_exact,
                note: None,
            });
        }
        let (span, value) = self
            .spans
            .iter()
            .zip(&self.total)
            .max_by(|a, b| a.1.total_cmp(b.1))?;
        Some(Peak {
            secs: if self.live {
                span.end
            } else {
                (span.start + span.end) / 2.0
            },
            value: *value,
            exact: report.exact && !self.live,
            note: live.map(|live| match filtered {
                true => format!(
                    "highest sample of the stacks kept; the whole process's exact peak: {}",
                    human_bytes(live.peak_live_bytes)
                ),
                false => format!(
                    "highest sample; exact peaks: allocators {}, direct mappings {}",
                    human_bytes(live.peak_live_bytes),
                    human_bytes(live.mapped_peak_bytes)
                ),
            }),
        })
    }
}

/// Sample `i` of a series; 0 where a series is short.
fn at(values: &[u64], i: usize) -> u64 {
    values.get(i).copied().unwrap_or(0)
}

/// Live: the samples. Allocated: sample i's rate holds over
/// (secs[i-1], secs[i]]; the first sample is the baseline (what was
/// counted before it, under `attach` since the probes went in, has no
/// known interval).
fn spans(timeline: &TimelineReport) -> Vec<Span> {
    let secs = &timeline.secs;
    let span = |sample: usize, start: f64| Span {
        start,
        end: secs[sample],
        sample,
    };
    if timeline.is_live() {
        return (0..secs.len()).map(|i| span(i, secs[i])).collect();
    }
    (1..secs.len())
        .map(|i| span(i, secs[i - 1]))
        // A sample at the time of the one before has no rate.
        .filter(|span| span.end > span.start)
        .collect()
}

/// A series' value over `span`: the sample itself, or the rate (counters
/// only grow; a drop is read as no allocation).
fn figure(values: &[u64], span: &Span, live: bool) -> f64 {
    let value = at(values, span.sample);
    if live {
        return value as f64;
    }
    let before = span.sample.checked_sub(1).map_or(0, |i| at(values, i));
    value.saturating_sub(before) as f64 / (span.end - span.start)
}

/// "#2 malloc grow_cache (cache.c:42)": the stack's rank in the report
/// (stacks with the same caller differ deeper), the allocator and its
/// direct caller.
fn stack_label(process: &ProcessReport, index: usize) -> String {
    let rank = index + 1;
    let Some(stack) = process.stacks.get(index) else {
        return format!("#{rank}");
    };
    let Some(frame) = stack.frames.first() else {
        return format!("#{rank} {}", stack.allocated());
    };
    let place = match (&frame.file, frame.line) {
        (Some(file), Some(line)) => format!(" ({}:{line})", basename(file)),
        (Some(file), None) => format!(" ({})", basename(file)),
        _ => String::new(),
    };
    format!("#{rank} {} {}{place}", stack.allocated(), frame.label())
}

fn basename(path: &str) -> &str {
    path.rsplit('/').next().unwrap_or(path)
}
