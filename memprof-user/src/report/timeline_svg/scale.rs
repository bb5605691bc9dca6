//! The plot's scale (data to pixels, tick steps a reader can add up)
//! and the axes drawn from it: grid lines and tick labels.
use std::fmt::Write as _;

use super::{PLOT_HEIGHT, PLOT_LEFT, PLOT_RIGHT_MARGIN, WIDTH};
use crate::report::{
    model::Report,
    series::{Curves, Peak},
};

pub(super) const BYTE_UNITS: [&str; 7] = ["B", "KiB", "MiB", "GiB", "TiB", "PiB", "EiB"];

/// Where a plot sits, what it shows, and its tick steps: data to pixels.
pub(super) struct Scale {
    pub(super) left: f64,
    pub(super) top: f64,
    pub(super) width: f64,
    pub(super) height: f64,
    max_secs: f64,
    secs_step: f64,
    max_value: f64,
    value_step: ByteStep,
    /// The values are rates: "/s" after each.
    pub(super) rate: bool,
}

/// A tick step of `bytes`, labelled in BYTE_UNITS[unit].
#[derive(Clone, Copy)]
pub(super) struct ByteStep {
    pub(super) bytes: f64,
    unit: usize,
}

impl Scale {
    /// The plot whose top is `top`: x from 0 to the end of the profile (or
    /// the last sample, or the peak), y from 0 to a tick above the highest
    /// stack and the peak.
    pub(super) fn new(report: &Report, curves: &Curves, peak: &Peak, top: f64) -> Self {
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

    pub(super) fn x(&self, secs: f64) -> f64 {
        self.left + secs / self.max_secs * self.width
    }

    pub(super) fn y(&self, value: f64) -> f64 {
        self.top + self.height - value / self.max_value * self.height
    }

    pub(super) fn right(&self) -> f64 {
        self.left + self.width
    }

    pub(super) fn bottom(&self) -> f64 {
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
pub(super) fn secs_step(max: f64) -> f64 {
    (-3..)
        .flat_map(|k| [1.0, 2.0, 5.0].map(|m| m * 10f64.powi(k)))
        .find(|step| max / step < 8.0)
        .expect("a step fits any finite span")
}

/// The smallest of 1, 2, 5 ... 500 B, 1 KiB ... that cuts `max` into at
/// most 7 intervals: ticks up to the next one at or above `max` are then
/// 4 to 8 (the candidates grow by 2.5 at most).
pub(super) fn byte_step(max: f64) -> ByteStep {
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

/// Grid lines at each tick and the ticks' labels, anchored exactly at
/// their tick (x labels centered below it, y labels middled left of it).
pub(super) fn grid_and_ticks(scale: &Scale) -> String {
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
