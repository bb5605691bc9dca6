//! The peak's dot and label, and the text every label goes through:
//! amounts in binary units, XML escaping.
use super::scale::Scale;
use crate::{human::numbers::human_bytes, report::series::Peak};

/// A rough width of one character of the peak label, to keep it inside.
const CHAR_WIDTH: f64 = 7.0;

/// "12.3 MiB", or "3.1 MiB/s" for a rate.
pub(super) fn amount(value: f64, rate: bool) -> String {
    let bytes = human_bytes(value.round() as u64);
    if rate {
        format!("{bytes}/s")
    } else {
        bytes
    }
}

/// The peak's dot and its label, kept inside the plot: beside the dot
/// where it fits, above it unless too near the top.
pub(super) fn peak_mark(scale: &Scale, peak: &Peak) -> String {
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

/// Text for XML content and attribute values.
pub(super) fn escape(text: &str) -> String {
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
