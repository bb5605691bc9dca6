//! An SVG chart of each process's heap over time (--format timeline),
//! drawn by hand: stacked areas, one per top stack, the rest on top. A
//! live timeline shows the bytes held at each sample, an allocated one
//! the allocation rate between samples.
use std::fmt::Write as _;

use anyhow::Result;

use super::{
    model::{ProcessReport, Report, TimelineReport},
    series::{timelines, Band, Curves, Peak, Span},
};
use crate::human::numbers::human_bytes;

const WIDTH: f64 = 960.0;
/// Room left of the plot for the y labels, right of it for the last x label.
const PLOT_LEFT: f64 = 84.0;
const PLOT_RIGHT_MARGIN: f64 = 32.0;
const TITLE_HEIGHT: f64 = 44.0;
const PLOT_HEIGHT: f64 = 280.0;
/// Below the plot: the x labels, then the legend.
const AXIS_HEIGHT: f64 = 34.0;
const LEGEND_ROW: f64 = 20.0;
const CHART_GAP: f64 = 28.0;
/// Stacks drawn one by one; the others join the rest.
const DRAWN_STACKS: usize = 8;
/// Tableau 10: distinct, and calm enough for large areas.
const COLORS: [&str; DRAWN_STACKS] = [
    "#4e79a7", "#f28e2b", "#59a14f", "#e15759", "#76b7b2", "#edc948", "#b07aa1", "#ff9da7",
];
const OTHER_COLOR: &str = "#bab0ac";
/// What a legend column holds before its label is cut (12 px sans-serif).
const LEGEND_CHARS: usize = 64;
/// A rough width of one character of the peak label, to keep it inside.
const CHAR_WIDTH: f64 = 7.0;
const BYTE_UNITS: [&str; 7] = ["B", "KiB", "MiB", "GiB", "TiB", "PiB", "EiB"];

/// One chart per process that has a timeline, stacked down the page.
pub fn render(report: &Report) -> Result<String> {
    let mut body = String::new();
    let mut top = 0.0;
    for (process, timeline) in timelines(report)? {
        let (chart, height) = chart(report, process, timeline, top);
        body.push_str(&chart);
        top += height;
    }
    Ok(format!(
        r##"<?xml version="1.0" encoding="UTF-8"?>
<svg xmlns="http://www.w3.org/2000/svg" width="{WIDTH}" height="{top}" viewBox="0 0 {WIDTH} {top}" font-family="DejaVu Sans, Verdana, sans-serif" font-size="12">
<style>
.title {{ font-size: 15px; font-weight: bold; fill: #222; }}
.band {{ stroke: #fff; stroke-width: 0.5; stroke-linejoin: round; }}
.band:hover {{ opacity: 0.8; }}
.grid {{ stroke: #e6e6e6; }}
.plot {{ fill: none; stroke: #999; }}
.x-tick, .y-tick {{ fill: #555; font-size: 11px; }}
.peak {{ fill: #c0392b; stroke: #fff; stroke-width: 1.5; }}
.peak-label {{ fill: #c0392b; font-weight: bold; paint-order: stroke; stroke: #fff; stroke-width: 4px; stroke-linejoin: round; }}
.legend {{ fill: #333; }}
.empty {{ fill: #888; font-size: 16px; }}
</style>
<rect width="100%" height="100%" fill="#fff"/>
{body}</svg>
"##
    ))
}

/// Where a plot sits, what it shows, and its tick steps: data to pixels.
struct Scale {
    left: f64,
    top: f64,
    width: f64,
    height: f64,
    max_secs: f64,
    secs_step: f64,
    max_value: f64,
    value_step: ByteStep,
    /// The values are rates: "/s" after each.
    rate: bool,
}

/// A tick step of `bytes`, labelled in BYTE_UNITS[unit].
#[derive(Clone, Copy)]
struct ByteStep {
    bytes: f64,
    unit: usize,
}

impl Scale {
    /// The plot whose top is `top`: x from 0 to the end of the profile (or
    /// the last sample, or the peak), y from 0 to a tick above the highest
    /// stack and the peak.
    fn new(report: &Report, curves: &Curves, peak: &Peak, top: f64) -> Self {
        let last = curves.spans.last().map_or(0.0, |span| span.end);
        // A floor keeps an instant-long profile drawable.
        let max_secs = last.max(report.duration_secs).max(peak.secs).max(0.01);
        let highest = (0..curves.spans.len())
            .map(|i| curves.bands.iter().map(|band| band.values[i]).sum::<f64>())
            .fold(peak.value, f64::max)
            // An empty heap still gets ticks, of whole bytes.
            .max(4.0);
        // Headroom, so the peak's dot and label stay off the frame.
        let wanted = highest * 1.08;
        let value_step = byte_step(wanted);
        Scale {
            left: PLOT_LEFT,
            top,
            width: WIDTH - PLOT_LEFT - PLOT_RIGHT_MARGIN,
            height: PLOT_HEIGHT,
            max_secs,
            secs_step: secs_step(max_secs),
            max_value: (wanted / value_step.bytes).ceil() * value_step.bytes,
            value_step,
            rate: !curves.live,
        }
    }

    fn x(&self, secs: f64) -> f64 {
        self.left + secs / self.max_secs * self.width
    }

    fn y(&self, value: f64) -> f64 {
        self.top + self.height - value / self.max_value * self.height
    }

    fn right(&self) -> f64 {
        self.left + self.width
    }

    fn bottom(&self) -> f64 {
        self.top + self.height
    }

    /// "4 MiB", "500 KiB/s": a multiple of the step, in the step's unit.
    fn value_label(&self, value: f64) -> String {
        let unit = 1024f64.powi(self.value_step.unit as i32);
        format!(
            "{} {}{}",
            decimals(value / unit),
            BYTE_UNITS[self.value_step.unit],
            if self.rate { "/s" } else { "" }
        )
    }
}

/// The smallest 1, 2 or 5 × 10^k seconds that fits fewer than 8 times in
/// `max`: ticks from 0 up to `max` are then 4 to 8 (the candidates grow by
/// 2.5 at most). A millisecond at least, as labels have 3 decimals.
fn secs_step(max: f64) -> f64 {
    (-3..)
        .flat_map(|k| [1.0, 2.0, 5.0].map(|m| m * 10f64.powi(k)))
        .find(|step| max / step < 8.0)
        .expect("a step fits any finite span")
}

/// The smallest of 1, 2, 5 ... 500 B, 1 KiB ... that cuts `max` into at
/// most 7 intervals: ticks up to the next one at or above `max` are then
/// 4 to 8 (the candidates grow by 2.5 at most).
fn byte_step(max: f64) -> ByteStep {
    (0..BYTE_UNITS.len())
        .flat_map(|unit| {
            [1.0, 2.0, 5.0, 10.0, 20.0, 50.0, 100.0, 200.0, 500.0].map(|m| ByteStep {
                bytes: m * 1024f64.powi(unit as i32),
                unit,
            })
        })
        .find(|step| max / step.bytes <= 7.0)
        // Beyond 3500 EiB (rates from bogus clocks): any step, in EiB.
        .unwrap_or(ByteStep {
            bytes: max / 7.0,
            unit: BYTE_UNITS.len() - 1,
        })
}

/// Up to 3 decimals, trailing zeros dropped: "0.5", "2", "1.125".
fn decimals(value: f64) -> String {
    let text = format!("{value:.3}");
    text.trim_end_matches('0').trim_end_matches('.').to_string()
}

/// One process's chart, `top` pixels down the document: its SVG and height.
fn chart(
    report: &Report,
    process: &ProcessReport,
    timeline: &TimelineReport,
    top: f64,
) -> (String, f64) {
    let curves = Curves::new(process, timeline, DRAWN_STACKS);
    let mut svg = format!("<g class=\"chart\" data-pid=\"{}\">\n", process.pid);
    let _ = writeln!(
        svg,
        r#"<text class="title" x="16" y="{:.2}">{}</text>"#,
        top + 26.0,
        escape(&title(report, process, &curves))
    );
    let plot_top = top + TITLE_HEIGHT;
    // No spans, no chart: even a known exact peak would float alone.
    let peak = curves
        .peak(report, process)
        .filter(|_| !curves.spans.is_empty());
    let Some(peak) = peak else {
        svg.push_str(&no_samples(plot_top, timeline));
        svg.push_str("</g>\n");
        return (svg, TITLE_HEIGHT + PLOT_HEIGHT + CHART_GAP);
    };
    let scale = Scale::new(report, &curves, &peak, plot_top);
    svg.push_str(&grid_and_ticks(&scale));
    svg.push_str(&bands(&scale, &curves));
    // Drawn over the bands, so the frame stays whole.
    let _ = writeln!(
        svg,
        r#"<rect class="plot" x="{:.2}" y="{:.2}" width="{:.2}" height="{:.2}"/>"#,
        scale.left, scale.top, scale.width, scale.height
    );
    svg.push_str(&peak_mark(&scale, &peak));
    let (legend, legend_height) = legend(&curves, scale.bottom() + AXIS_HEIGHT);
    svg.push_str(&legend);
    svg.push_str("</g>\n");
    let height = TITLE_HEIGHT + PLOT_HEIGHT + AXIS_HEIGHT + legend_height + CHART_GAP;
    (svg, height)
}

/// "pid 1234 command — live heap (estimates)".
fn title(report: &Report, process: &ProcessReport, curves: &Curves) -> String {
    format!(
        "pid {} {} — {}{}",
        process.pid,
        process.command,
        if curves.live {
            "live heap"
        } else {
            "bytes allocated per second"
        },
        if report.exact { "" } else { " (estimates)" }
    )
}

/// An empty plot saying why: no samples, or (allocated) a single one at
/// the start, which has no rate.
fn no_samples(top: f64, timeline: &TimelineReport) -> String {
    let width = WIDTH - PLOT_LEFT - PLOT_RIGHT_MARGIN;
    let message = if timeline.secs.is_empty() {
        "no samples"
    } else {
        "no samples after the start: no rate to draw"
    };
    format!(
        r#"<rect class="plot" x="{PLOT_LEFT:.2}" y="{top:.2}" width="{width:.2}" height="{PLOT_HEIGHT:.2}"/>
<text class="empty" x="{:.2}" y="{:.2}" text-anchor="middle" dominant-baseline="middle">{message}</text>
"#,
        PLOT_LEFT + width / 2.0,
        top + PLOT_HEIGHT / 2.0
    )
}

/// Grid lines at each tick and the ticks' labels, anchored exactly at
/// their tick (x labels centered below it, y labels middled left of it).
fn grid_and_ticks(scale: &Scale) -> String {
    let mut svg = String::new();
    // The epsilon keeps a tick that falls on the end despite rounding.
    let x_ticks = (scale.max_secs / scale.secs_step + 1e-9).floor() as usize;
    for i in 0..=x_ticks {
        let secs = i as f64 * scale.secs_step;
        let x = scale.x(secs);
        let _ = writeln!(
            svg,
            r#"<line class="grid" x1="{x:.2}" y1="{:.2}" x2="{x:.2}" y2="{:.2}"/>
<text class="x-tick" x="{x:.2}" y="{:.2}" text-anchor="middle">{} s</text>"#,
            scale.top,
            scale.bottom(),
            scale.bottom() + 16.0,
            decimals(secs)
        );
    }
    let y_ticks = (scale.max_value / scale.value_step.bytes).round() as usize;
    for i in 0..=y_ticks {
        let value = i as f64 * scale.value_step.bytes;
        let y = scale.y(value);
        let _ = writeln!(
            svg,
            r#"<line class="grid" x1="{:.2}" y1="{y:.2}" x2="{:.2}" y2="{y:.2}"/>
<text class="y-tick" x="{:.2}" y="{y:.2}" text-anchor="end" dominant-baseline="middle">{}</text>"#,
            scale.left,
            scale.right(),
            scale.left - 8.0,
            scale.value_label(value)
        );
    }
    svg
}

/// The stacked areas, bottom-up, each with a tooltip naming its largest value.
fn bands(scale: &Scale, curves: &Curves) -> String {
    let mut svg = String::new();
    let mut base = vec![0.0; curves.spans.len()];
    for (k, band) in curves.bands.iter().enumerate() {
        let top: Vec<f64> = base.iter().zip(&band.values).map(|(b, v)| b + v).collect();
        let mut outline = boundary(scale, &curves.spans, &top);
        outline.extend(boundary(scale, &curves.spans, &base).into_iter().rev());
        let path: Vec<String> = outline
            .iter()
            .map(|(x, y)| format!("{x:.2},{y:.2}"))
            .collect();
        let largest = band.values.iter().copied().fold(0.0, f64::max);
        let _ = writeln!(
            svg,
            r#"<path class="band" data-stack="{}" fill="{}" d="M{}Z"><title>{}: up to {}</title></path>"#,
            band.stack
                .map_or("other".to_string(), |stack| stack.to_string()),
            color(k, band),
            path.join(" L"),
            escape(&band.label),
            escape(&amount(largest, scale.rate))
        );
        base = top;
    }
    svg
}

/// One edge of a band, left to right: through the samples (live), or in
/// steps flat over each interval (allocated).
fn boundary(scale: &Scale, spans: &[Span], values: &[f64]) -> Vec<(f64, f64)> {
    let mut points: Vec<(f64, f64)> = spans
        .iter()
        .zip(values)
        .flat_map(|(span, &value)| {
            let y = scale.y(value);
            [(scale.x(span.start), y), (scale.x(span.end), y)]
        })
        .collect();
    points.dedup();
    points
}

fn color(k: usize, band: &Band) -> &'static str {
    match band.stack {
        Some(_) => COLORS[k % COLORS.len()],
        None => OTHER_COLOR,
    }
}

/// "12.3 MiB", or "3.1 MiB/s" for a rate.
fn amount(value: f64, rate: bool) -> String {
    let bytes = human_bytes(value.round() as u64);
    if rate {
        format!("{bytes}/s")
    } else {
        bytes
    }
}

/// The peak's dot and its label, kept inside the plot: beside the dot
/// where it fits, above it unless too near the top.
fn peak_mark(scale: &Scale, peak: &Peak) -> String {
    let (cx, cy) = (scale.x(peak.secs), scale.y(peak.value));
    let label = format!(
        "peak {} at {:.2} s ({})",
        amount(peak.value, scale.rate),
        peak.secs,
        match (&peak.note, peak.exact) {
            (Some(note), _) => note.as_str(),
            (None, true) => "exact",
            (None, false) => "estimate",
        }
    );
    let width = label.chars().count() as f64 * CHAR_WIDTH;
    // Right of the dot, else left of it, else as far right as it fits.
    let x = if cx + 8.0 + width <= scale.right() {
        cx + 8.0
    } else if cx - 8.0 - width >= scale.left {
        cx - 8.0 - width
    } else {
        (scale.right() - width).max(scale.left)
    };

    let y = if cy - 10.0 < scale.top + 14.0 {
        cy + 18.0
    } else {
        cy - 10.0
    };
    format!(
        r#"<circle class="peak" cx="{cx:.2}" cy="{cy:.2}" r="4"/>
<text class="peak-label" x="{x:.2}" y="{y:.2}" text-anchor="start">{}</text>
"#,
        escape(&label)
    )
}

/// A swatch and a label per band, in two columns filled top-down; a label
/// too long is cut, whole in its tooltip. Returns the SVG and its height.
fn legend(curves: &Curves, top: f64) -> (String, f64) {
    let rows = curves.bands.len().div_ceil(2);
    let column_width = (WIDTH - PLOT_LEFT - PLOT_RIGHT_MARGIN) / 2.0;
    let mut svg = String::new();
    for (k, band) in curves.bands.iter().enumerate() {
        let x = PLOT_LEFT + (k / rows) as f64 * column_width;
        let y = top + (k % rows) as f64 * LEGEND_ROW;
        let _ = writeln!(
            svg,
            r#"<g class="legend"><title>{}</title><rect x="{x:.2}" y="{:.2}" width="12" height="12" fill="{}"/><text x="{:.2}" y="{y:.2}" dominant-baseline="middle">{}</text></g>"#,
            escape(&band.label),
            y - 6.0,
            color(k, band),
            x + 18.0,
            escape(&cut(&band.label, LEGEND_CHARS))
        );
    }
    (svg, rows as f64 * LEGEND_ROW)
}

/// `text` in at most `max` characters: a long one loses its middle, as
/// its end names the function and where it is.
fn cut(text: &str, max: usize) -> String {
    let chars: Vec<char> = text.chars().collect();
    if chars.len() <= max {
        return text.to_string();
    }
    let head = max / 3;
    let tail = max - head - 1;
    let (start, end) = (&chars[..head], &chars[chars.len() - tail..]);
    format!(
        "{}…{}",
        start.iter().collect::<String>(),
        end.iter().collect::<String>()
    )
}

/// Text for XML content and attribute values.
fn escape(text: &str) -> String {
    let mut out = String::with_capacity(text.len());
    for c in text.chars() {
        match c {
            '&' => out.push_str("&amp;"),
            '<' => out.push_str("&lt;"),
            '>' => out.push_str("&gt;"),
            '"' => out.push_str("&quot;"),
            '\'' => out.push_str("&apos;"),
            _ => out.push(c),
        }
    }
    out
}

#[cfg(test)]
pub(super) mod tests {
    use serde_json::json;

    use super::{super::model::TimelineStack, *};
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
            svg.contains(
                "(highest sample; exact peaks: allocators 6.0 MiB, direct mappings 4.0 MiB)"
            ),
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
}
