//! The timeline as a Chrome trace (Trace Event Format, JSON object form),
//! which Perfetto UI and chrome://tracing open: per process, a counter
//! track for its heap, one per stack the timeline follows and one for the
//! rest, and the peak as an instant event.
use anyhow::Result;
use serde_json::{json, Value};

use super::{
    model::{ProcessReport, Report},
    series::{self, Curves, Peak},
};

pub fn render(report: &Report) -> Result<String> {
    let timelines = series::timelines(report)?;
    let mut events = Vec::new();
    for (rank, &(process, timeline)) in timelines.iter().enumerate() {
        events.extend(metadata(process, rank));
        // Every stack the timeline follows gets a track: the viewer can hide them.
        let curves = Curves::new(process, timeline, usize::MAX);
        events.extend(counters(process, &curves));
        events.extend(
            curves
                .peak(report, process)
                .map(|peak| peak_event(process, &curves, &peak)),
        );
    }
    // One setting for the whole run: the first timeline's stands for all.
    let (_, first) = timelines[0];
    let trace = json!({
        "traceEvents": events,
        "displayTimeUnit": "ms",
        "otherData": {
            "mode": report.mode,
            "exact": report.exact,
            "metric": first.metric,
            "period_secs": first.period_secs,
        },
    });
    Ok(serde_json::to_string(&trace)?)
}

/// The process's name and place in the viewer, and its one thread's name.
fn metadata(process: &ProcessReport, rank: usize) -> [Value; 3] {
    let pid = process.pid;
    let event = |name: &str, args: Value| json!({"name": name, "ph": "M", "pid": pid, "tid": pid, "args": args});
    [
        event(
            "process_name",
            json!({"name": format!("{} (pid {pid})", process.command)}),
        ),
        event("process_sort_index", json!({"sort_index": rank})),
        event("thread_name", json!({"name": process.command})),
    ]
}

/// The counter tracks: "heap" (the process's figure), then "#1 …" per
/// band, largest first, then "other".
fn counters(process: &ProcessReport, curves: &Curves) -> Vec<Value> {
    let (heap_key, band_key) = if curves.live {
        ("live bytes", "bytes")
    } else {
        ("bytes allocated per second", "bytes per second")
    };
    let mut events = track(process, curves, "heap", heap_key, &curves.total);
    for band in &curves.bands {
        // Labels carry the stack's rank: "#1 malloc parse (parse.c:12)".
        events.extend(track(process, curves, &band.label, band_key, &band.values));
    }
    events
}

/// One counter track. A counter holds its value until the next event, so
/// a rate is set at the start of its interval and dropped to 0 at the
/// last sample, where the figures end.
fn track(
    process: &ProcessReport,
    curves: &Curves,
    name: &str,
    key: &str,
    values: &[f64],
) -> Vec<Value> {
    let event = |secs: f64, value: f64| {
        json!({
            "name": name,
            "ph": "C",
            "ts": secs * 1e6,
            "pid": process.pid,
            "tid": process.pid,
            "args": {key: value.round() as u64},
        })
    };
    let mut events: Vec<Value> = curves
        .spans
        .iter()
        .zip(values)
        .map(|(span, &value)| event(span.start, value))
        .collect();
    if let (false, Some(last)) = (curves.live, curves.spans.last()) {
        events.push(event(last.end, 0.0));
    }
    events
}

/// The peak, as `Curves::peak` finds it: live, the exact peak; allocated,
/// the highest rate, at the middle of its interval.
fn peak_event(process: &ProcessReport, curves: &Curves, peak: &Peak) -> Value {
    let key = if curves.live {
        "bytes"
    } else {
        "bytes per second"
    };
    json!({
        "name": "peak",
        "ph": "i",
        "s": "p",
        "ts": peak.secs * 1e6,
        "pid": process.pid,
        "tid": process.pid,
        "args": match &peak.note {
            Some(note) => json!({key: peak.value.round() as u64, "exact": peak.exact, "note": note}),
            None => json!({key: peak.value.round() as u64, "exact": peak.exact}),
        },
    })
}

#[cfg(test)]
mod tests {
    use super::{super::timeline_svg::tests::sample_report, *};
    use crate::human::error::UserError;

    const MIB: u64 = 1024 * 1024;

    fn trace(report: &Report) -> Value {
        serde_json::from_str(&render(report).unwrap()).expect("valid JSON")
    }

    fn events<'a>(trace: &'a Value, pid: u32, ph: &'a str) -> impl Iterator<Item = &'a Value> {
        trace["traceEvents"]
            .as_array()
            .unwrap()
            .iter()
            .filter(move |event| event["pid"] == pid && event["ph"] == ph)
    }

    /// Counter `name` of `pid`: (seconds, value under `key`) per event.
    fn counter(trace: &Value, pid: u32, name: &str, key: &str) -> Vec<(f64, u64)> {
        events(trace, pid, "C")
            .filter(|event| event["name"] == name)
            .map(|event| {
                assert_eq!(event["tid"], pid);
                let secs = event["ts"].as_f64().unwrap() / 1e6;
                (secs, event["args"][key].as_u64().unwrap())
            })
            .collect()
    }

    #[test]
    fn live_counters_are_the_samples() {
        let report = sample_report();
        let trace = trace(&report);
        let timeline = report.processes[0].timeline.as_ref().unwrap();
        let at_samples = |values: Vec<u64>| -> Vec<(f64, u64)> {
            timeline.secs.iter().copied().zip(values).collect()
        };
        assert_eq!(
            counter(&trace, 4242, "heap", "live bytes"),
            at_samples(timeline.total.clone())
        );
        assert_eq!(
            counter(
                &trace,
                4242,
                "#1 malloc std::vector<int>::push_back (vec.h:12)",
                "bytes"
            ),
            at_samples(timeline.stacks[0].values.clone())
        );
        assert_eq!(
            counter(&trace, 4242, "#3 calloc a&b", "bytes"),
            at_samples(timeline.stacks[2].values.clone())
        );
        let rest = (0..timeline.secs.len())
            .map(|i| timeline.total[i] - timeline.stacks.iter().map(|s| s.values[i]).sum::<u64>())
            .collect();
        assert_eq!(counter(&trace, 4242, "other", "bytes"), at_samples(rest));
    }

    /// Each rate starts its interval (the first at 0 s, the sample at 0 s
    /// having none of its own) and drops to 0 at the last sample.
    #[test]
    fn allocated_counters_are_rates_over_each_interval() {
        let trace = trace(&sample_report());
        assert_eq!(
            counter(&trace, 777, "heap", "bytes allocated per second"),
            [(0.0, 2 * MIB), (0.5, 6 * MIB), (1.0, MIB), (2.0, 0)]
        );
        assert_eq!(
            counter(&trace, 777, "#1 malloc parse (parse.c)", "bytes per second"),
            [(0.0, MIB), (0.5, 5 * MIB), (1.0, MIB / 2), (2.0, 0)]
        );
        assert_eq!(
            counter(&trace, 777, "other", "bytes per second"),
            [(0.0, MIB / 2), (0.5, MIB / 2), (1.0, 0), (2.0, 0)]
        );
    }

    #[test]
    fn peaks_are_instant_events() {
        let mut report = sample_report();
        report.exact = false;
        let trace = trace(&report);
        let peak = |pid| -> Vec<&Value> { events(&trace, pid, "i").collect() };
        let live = peak(4242);
        assert_eq!(live.len(), 1);
        assert_eq!(
            (&live[0]["name"], &live[0]["s"]),
            (&json!("peak"), &json!("p"))
        );
        assert_eq!(live[0]["ts"].as_f64(), Some(1.2e6));
        assert_eq!(live[0]["args"], json!({"bytes": 6 * MIB, "exact": false}));
        let allocated = peak(777);
        assert_eq!(allocated[0]["ts"].as_f64(), Some(0.75e6));
        assert_eq!(
            allocated[0]["args"],
            json!({"bytes per second": 6 * MIB, "exact": false})
        );
    }

    #[test]
    fn processes_are_named_and_settings_kept() {
        let trace = trace(&sample_report());
        let metadata: Vec<(&Value, &Value)> = events(&trace, 4242, "M")
            .map(|event| (&event["name"], &event["args"]))
            .collect();
        assert_eq!(
            metadata,
            [
                (
                    &json!("process_name"),
                    &json!({"name": "cache<&> (pid 4242)"})
                ),
                (&json!("process_sort_index"), &json!({"sort_index": 0})),
                (&json!("thread_name"), &json!({"name": "cache<&>"})),
            ]
        );
        assert_eq!(events(&trace, 1, "M").count(), 0, "no timeline, no tracks");
        assert_eq!(trace["displayTimeUnit"], "ms");
        assert_eq!(
            trace["otherData"],
            json!({"mode": "live", "exact": true, "metric": "live_bytes", "period_secs": 0.5})
        );
    }

    #[test]
    fn no_timeline_is_an_error() {
        let mut report = sample_report();
        for process in &mut report.processes {
            process.timeline = None;
        }
        let err = render(&report).unwrap_err();
        assert!(err.downcast_ref::<UserError>().is_some());
        assert!(err.to_string().starts_with("this report holds no timeline"));
    }
}
