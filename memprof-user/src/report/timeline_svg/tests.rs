//! Renders a sample report of two processes and reads the SVG back:
//! well-formed, escaped, with its ticks, peak and bands where the data
//! puts them.
use serde_json::json;

use super::{
    super::model::TimelineStack,
    scale::{byte_step, secs_step, BYTE_UNITS},
    *,
};
use crate::human::error::UserError;

const MIB: u64 = 1024 * 1024;
const KIB: u64 = 1024;

fn stack(
    allocator: &str,
    function: &str,
    file: Option<&str>,
    line: Option<u32>,
) -> serde_json::Value {
    json!({
        "allocator": allocator, "bytes": 0, "count": 0, "partial": false,
        "frames": [{"address": "0x1000", "function": function, "file": file,
                    "line": line, "module": "/usr/lib/libfoo.so", "inlined": false}],
    })
}

/// Two processes: a live timeline (3 bands and a rest, the exact peak
/// between samples and above them all) and an allocated one starting
/// at 0 s; labels hold `<` and `&`.
pub(crate) fn sample_report() -> Report {
    let live_bands = [
        [MIB, 3 * MIB, 2 * MIB, MIB],
        [MIB / 2, MIB, 3 * MIB / 2, MIB / 2],
        [256 * KIB, 512 * KIB, 256 * KIB, 0],
    ];
    let live_rest = [100 * KIB, 200 * KIB, 300 * KIB, 50 * KIB];
    let live_total: Vec<u64> = (0..4)
        .map(|i| live_bands.iter().map(|band| band[i]).sum::<u64>() + live_rest[i])
        .collect();
    serde_json::from_value(json!({
        "version": 1, "mode": "live", "duration_secs": 2.5, "exact": true,
        "group_by": "stack", "bytes": 0, "count": 0, "lost": {},
        "processes": [
            {
                "pid": 4242, "command": "cache<&>", "exe": "", "cmdline": [],
                "exited": false, "bytes": 0, "count": 0, "total_stacks": 4,
                "stacks": [
                    stack("malloc", "std::vector<int>::push_back", Some("/src/vec.h"), Some(12)),
                    stack("operator new", "grow_cache", Some("/src/cache.c"), Some(42)),
                    stack("calloc", "a&b", None, None),
                    stack("malloc", "unfollowed", None, None),
                ],
                "timeline": {
                    "period_secs": 0.5, "metric": "live_bytes",
                    "secs": [0.5, 1.0, 1.5, 2.0], "total": live_total,
                    "stacks": [
                        {"stack": 0, "values": live_bands[0]},
                        {"stack": 1, "values": live_bands[1]},
                        {"stack": 2, "values": live_bands[2]},
                    ],
                },
                "live_bytes": live_total[3], "live_count": 10, "untracked_count": 0,
                "unknown_frees": 0, "peak_live_bytes": 6 * MIB, "peak_live_count": 20,
                "peak_secs": 1.2, "peak_stacks": [], "peak_exact": true,
            },
            {
                "pid": 777, "command": "build", "exe": "", "cmdline": [],
                "exited": true, "bytes": 0, "count": 0, "total_stacks": 2,
                "stacks": [
                    stack("malloc", "parse", Some("parse.c"), None),
                    stack(
                        "realloc",
                        "std::vector<std::basic_string<char>, std::allocator<std::basic_string<char>>>::_M_realloc_insert",
                        Some("/usr/include/c++/12/bits/vector.tcc"),
                        Some(512),
                    ),
                ],
                "timeline": {
                    "period_secs": 0.5, "metric": "allocated_bytes",
                    "secs": [0.0, 0.5, 1.0, 2.0], "total": [0, MIB, 4 * MIB, 5 * MIB],
                    "stacks": [
                        {"stack": 0, "values": [0, MIB / 2, 3 * MIB, 7 * MIB / 2]},
                        {"stack": 1, "values": [0, MIB / 4, MIB / 2, MIB]},
                    ],
                },
            },
            {
                "pid": 1, "command": "untimed", "exe": "", "cmdline": [],
                "exited": false, "bytes": 0, "count": 0, "total_stacks": 0, "stacks": [],
            },
        ],
    }))
    .expect("a valid report")
}

/// The charts of `svg`, one string each.
fn charts(svg: &str) -> Vec<&str> {
    svg.split("<g class=\"chart\"").skip(1).collect()
}

/// Each element starting with `start`, up to its end tag or `/>`.
fn elements<'a>(svg: &'a str, start: &str) -> Vec<&'a str> {
    svg.match_indices(start)
        .map(|(i, _)| {
            let rest = &svg[i..];
            let end = rest.find("</").or_else(|| rest.find("/>")).unwrap();
            &rest[..end]
        })
        .collect()
}

fn attr<'a>(element: &'a str, name: &str) -> &'a str {
    let start = element.find(&format!(" {name}=\"")).unwrap() + name.len() + 3;
    let len = element[start..].find('"').unwrap();
    &element[start..start + len]
}

fn number(element: &str, name: &str) -> f64 {
    attr(element, name).parse().unwrap()
}

fn content(element: &str) -> &str {
    &element[element.find('>').unwrap() + 1..]
}

/// A linear axis read back from two tick labels: value to pixel.
struct Axis {
    ticks: Vec<(f64, f64)>,
}

impl Axis {
    fn read(chart: &str, class: &str, coordinate: &str, parse: fn(&str) -> f64) -> Axis {
        let ticks = elements(chart, &format!("<text class=\"{class}\""))
            .iter()
            .map(|tick| (number(tick, coordinate), parse(content(tick))))
            .collect();
        Axis { ticks }
    }

    fn pixel(&self, value: f64) -> f64 {
        let ((p0, v0), (p1, v1)) = (self.ticks[0], *self.ticks.last().unwrap());
        p0 + (value - v0) * (p1 - p0) / (v1 - v0)
    }
}

fn parse_secs(label: &str) -> f64 {
    label.strip_suffix(" s").unwrap().parse().unwrap()
}

fn parse_bytes(label: &str) -> f64 {
    let (n, unit) = label.trim_end_matches("/s").split_once(' ').unwrap();
    let power = BYTE_UNITS.iter().position(|u| *u == unit).unwrap();
    n.parse::<f64>().unwrap() * 1024f64.powi(power as i32)
}

fn axes(chart: &str) -> (Axis, Axis) {
    (
        Axis::read(chart, "x-tick", "x", parse_secs),
        Axis::read(chart, "y-tick", "y", parse_bytes),
    )
}

fn path_points(path: &str) -> Vec<(f64, f64)> {
    let d = attr(path, "d")
        .trim_start_matches('M')
        .trim_end_matches('Z');
    d.split(" L")
        .map(|point| {
            let (x, y) = point.split_once(',').unwrap();
            (x.parse().unwrap(), y.parse().unwrap())
        })
        .collect()
}

/// Well-formed XML, as far as this renderer writes it: tags nest,
/// attributes are quoted, `<` never and `&` only as an entity in text.
fn assert_well_formed(xml: &str) {
    let (_, body) = xml.split_once("?>").expect("an XML declaration");
    let mut open = Vec::new();
    let mut rest = body;
    while let Some((text, tail)) = rest.split_once('<') {
        assert_text(text);
        let (tag, after) = tail.split_once('>').expect("a tag ends");
        rest = after;
        if let Some(name) = tag.strip_prefix('/') {
            assert_eq!(open.pop(), Some(name), "end tag matches");
            continue;
        }
        let (inner, empty) = tag.strip_suffix('/').map_or((tag, false), |t| (t, true));
        let (name, mut attrs) = inner.split_once(' ').unwrap_or((inner, ""));
        assert!(
            !name.is_empty() && name.chars().all(|c| c.is_ascii_alphanumeric() || c == '-'),
            "tag name {name:?}"
        );
        while let Some((key, value)) = attrs.trim_start().split_once("=\"") {
            assert!(
                key.chars().all(|c| c.is_ascii_alphanumeric() || c == '-'),
                "attribute {key:?}"
            );
            let (value, after) = value.split_once('"').expect("a quoted value");
            assert_text(value);
            attrs = after;
        }
        assert!(attrs.trim().is_empty(), "unquoted attribute in {tag:?}");
        if !empty {
            open.push(name);
        }
    }
    assert_text(rest);
    assert!(open.is_empty(), "unclosed {open:?}");
}

fn assert_text(text: &str) {
    for (i, _) in text.match_indices('&') {
        let entity = ["&amp;", "&lt;", "&gt;", "&quot;", "&apos;"];
        assert!(
            entity.iter().any(|e| text[i..].starts_with(e)),
            "bare & in {text:?}"
        );
    }
}

#[test]
fn svg_is_well_formed_and_escaped() {
    let svg = render(&sample_report()).unwrap();
    assert_well_formed(&svg);
    assert!(svg.contains("malloc std::vector&lt;int&gt;::push_back (vec.h:12)"));
    assert!(svg.contains("calloc a&amp;b"));
    assert!(svg.contains("pid 4242 cache&lt;&amp;&gt; — live heap"));
    assert!(svg.contains("pid 777 build — bytes allocated per second"));
    assert_eq!(
        charts(&svg).len(),
        2,
        "the process without a timeline has no chart"
    );
}

#[test]
fn ticks_are_nice_and_in_range() {
    let svg = render(&sample_report()).unwrap();
    let (x, y) = axes(charts(&svg)[0]);
    let secs: Vec<f64> = x.ticks.iter().map(|t| t.1).collect();
    assert_eq!(
        secs,
        [0.0, 0.5, 1.0, 1.5, 2.0, 2.5],
        "up to the report's duration"
    );
    let bytes: Vec<f64> = y.ticks.iter().map(|t| t.1 / MIB as f64).collect();
    assert_eq!(
        bytes,
        [0.0, 1.0, 2.0, 3.0, 4.0, 5.0, 6.0, 7.0],
        "above the exact peak"
    );
    for chart in charts(&svg) {
        let (x, y) = axes(chart);
        assert!((4..=8).contains(&x.ticks.len()) && (4..=8).contains(&y.ticks.len()));
    }
    let rate = elements(charts(&svg)[1], "<text class=\"y-tick\"");
    assert!(content(rate.last().unwrap()).ends_with(" MiB/s"));
}

/// The dot, read back through the tick labels, is the peak within
/// half a pixel: live, the exact one between and above the samples;
/// allocated, the highest rate at the middle of its interval.
#[test]
fn peak_is_marked_where_it_is() {
    let svg = render(&sample_report()).unwrap();
    let expected = [(1.2, 6.0 * MIB as f64), (0.75, 6.0 * MIB as f64)];
    for (chart, (secs, value)) in charts(&svg).into_iter().zip(expected) {
        let (x, y) = axes(chart);
        let circle = elements(chart, "<circle class=\"peak\"")[0];
        assert!((number(circle, "cx") - x.pixel(secs)).abs() <= 0.5);
        assert!((number(circle, "cy") - y.pixel(value)).abs() <= 0.5);
    }
    assert!(svg.contains("peak 6.0 MiB at 1.20 s (exact)"));
    assert!(svg.contains("peak 6.0 MiB/s at 0.75 s (exact)"));
    let plot = elements(charts(&svg)[0], "<rect class=\"plot\"")[0];
    let (top, bottom) = (
        number(plot, "y"),
        number(plot, "y") + number(plot, "height"),
    );
    let circle = elements(charts(&svg)[0], "<circle class=\"peak\"")[0];
    assert!((top..=bottom).contains(&number(circle, "cy")));
}

/// A process that also mapped memory directly: its exact peak counts
/// allocator blocks only, so the highest sample is marked, as such.
#[test]
fn with_direct_mappings_the_highest_sample_is_marked() {
    let mut report = sample_report();
    let live = report.processes[0].live.as_mut().unwrap();
    live.mapped_peak_bytes = 4 * MIB;
    let timeline = report.processes[0].timeline.as_ref().unwrap();
    let (secs, highest) = timeline
        .secs
        .iter()
        .zip(&timeline.total)
        .max_by_key(|(_, total)| **total)
        .map(|(&secs, &total)| (secs, total as f64))
        .unwrap();
    let svg = render(&report).unwrap();
    let chart = charts(&svg)[0];
    let (x, y) = axes(chart);
    let circle = elements(chart, "<circle class=\"peak\"")[0];
    assert!((number(circle, "cx") - x.pixel(secs)).abs() <= 0.5);
    assert!((number(circle, "cy") - y.pixel(highest)).abs() <= 0.5);
    assert!(
        svg.contains("(highest sample; exact peaks: allocators 6.0 MiB, direct mappings 4.0 MiB)"),
        "{svg}"
    );
}

#[test]
fn stacked_top_is_the_total() {
    let report = sample_report();
    let svg = render(&report).unwrap();
    let chart = charts(&svg)[0];
    let (x, y) = axes(chart);
    let points: Vec<(f64, f64)> = elements(chart, "<path class=\"band\"")
        .iter()
        .flat_map(|path| path_points(path))
        .collect();
    let timeline = report.processes[0].timeline.as_ref().unwrap();
    for (&secs, &total) in timeline.secs.iter().zip(&timeline.total) {
        let px = x.pixel(secs);
        let top = points
            .iter()
            .filter(|p| (p.0 - px).abs() < 0.01)
            .map(|p| p.1)
            .fold(f64::INFINITY, f64::min);
        assert!((top - y.pixel(total as f64)).abs() <= 0.5, "at {secs} s");
    }
}

#[test]
fn bands_stack_in_order_with_the_rest_on_top() {
    let svg = render(&sample_report()).unwrap();
    let order: Vec<Vec<&str>> = charts(&svg)
        .iter()
        .map(|chart| {
            elements(chart, "<path class=\"band\"")
                .iter()
                .map(|path| attr(path, "data-stack"))
                .collect()
        })
        .collect();
    assert_eq!(
        order,
        [vec!["0", "1", "2", "other"], vec!["0", "1", "other"]]
    );
}

#[test]
fn stacks_beyond_the_drawn_ones_join_the_rest() {
    let mut process = sample_report().processes.swap_remove(0);
    let timeline = TimelineReport {
        period_secs: 1.0,
        metric: "live_bytes".to_string(),
        secs: vec![1.0],
        total: vec![100],
        stacks: (0..10)
            .map(|stack| TimelineStack {
                stack,
                values: vec![stack as u64],
            })
            .collect(),
    };
    process.timeline = Some(timeline.clone());
    let curves = Curves::new(&process, &timeline, DRAWN_STACKS);
    assert_eq!(curves.bands.len(), DRAWN_STACKS + 1);
    let rest = curves.bands.last().unwrap();
    assert_eq!(
        (rest.stack, rest.values.as_slice()),
        (None, &[100.0 - 28.0][..])
    );
}

#[test]
fn there_are_4_to_8_ticks() {
    for power in -20..60 {
        let max = 2f64.powf(power as f64 / 2.0) * 1.37;
        if max >= 0.01 {
            let x_ticks = (max / secs_step(max)).floor() + 1.0;
            assert!((4.0..=8.0).contains(&x_ticks), "{max} s: {x_ticks} ticks");
        }
        if max >= 4.0 {
            let y_ticks = (max / byte_step(max).bytes).ceil() + 1.0;
            assert!((4.0..=8.0).contains(&y_ticks), "{max} B: {y_ticks} ticks");
        }
    }
    for max in [0.01, 14.5, 38.2, 3600.0] {
        let x_ticks = (max / secs_step(max)).floor() + 1.0;
        assert!((4.0..=8.0).contains(&x_ticks), "{max} s: {x_ticks} ticks");
    }
}

#[test]
fn estimates_are_said() {
    let mut report = sample_report();
    report.exact = false;
    let svg = render(&report).unwrap();
    assert!(svg.contains("— live heap (estimates)"));
    assert!(svg.contains("peak 6.0 MiB at 1.20 s (estimate)"));
}

#[test]
fn a_timeline_without_samples_says_so() {
    let mut report = sample_report();
    let timeline = report.processes[0].timeline.as_mut().unwrap();
    timeline.secs.clear();
    timeline.total.clear();
    timeline.stacks.clear();
    let svg = render(&report).unwrap();
    assert_well_formed(&svg);
    let chart = charts(&svg)[0];
    assert!(chart.contains(">no samples</text>"));
    assert!(!chart.contains("class=\"peak\""));
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
