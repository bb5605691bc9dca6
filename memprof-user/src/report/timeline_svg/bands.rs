//! The stacked areas, one per drawn stack and the rest on top, and
//! their legend.
use std::fmt::Write as _;

use super::{
    labels::{amount, escape},
    scale::Scale,
    DRAWN_STACKS, LEGEND_ROW, PLOT_LEFT, PLOT_RIGHT_MARGIN, WIDTH,
};
use crate::report::series::{Band, Curves, Span};

/// Tableau 10: distinct, and calm enough for large areas.
const COLORS: [&str; DRAWN_STACKS] = [
    "#4e79a7", "#f28e2b", "#59a14f", "#e15759", "#76b7b2", "#edc948", "#b07aa1", "#ff9da7",
];
const OTHER_COLOR: &str = "#bab0ac";
/// What a legend column holds before its label is cut (12 px sans-serif).
const LEGEND_CHARS: usize = 64;

/// The stacked areas, bottom-up, each with a tooltip naming its largest value.
pub(super) fn bands(scale: &Scale, curves: &Curves) -> String {
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

/// A swatch and a label per band, in two columns filled top-down; a label
/// too long is cut, whole in its tooltip. Returns the SVG and its height.
pub(super) fn legend(curves: &Curves, top: f64) -> (String, f64) {
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
