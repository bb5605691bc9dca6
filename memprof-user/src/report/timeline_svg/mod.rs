//! An SVG chart of each process's heap over time (--format timeline),
//! drawn by hand: stacked areas, one per top stack, the rest on top. A
//! live timeline shows the bytes held at each sample, an allocated one
//! the allocation rate between samples.
//!
//! This module lays out the page and each chart; `scale` maps data to
//! pixels and draws the axes, `bands` the stacked areas and their
//! legend, `labels` the peak's mark and the text every label goes
//! through.
use std::fmt::Write as _;

use anyhow::Result;

use self::{
    bands::{bands, legend},
    labels::{escape, peak_mark},
    scale::{grid_and_ticks, Scale},
};
use super::{
    model::{ProcessReport, Report, TimelineReport},
    series::{timelines, Curves},
};

mod bands;
mod labels;
mod scale;
#[cfg(test)]
pub(super) mod tests;

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
