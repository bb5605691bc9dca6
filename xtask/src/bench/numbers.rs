//! The numbers the bench reads: a value the programs print, and the median
//! of runs.
use std::time::Instant;

use anyhow::Result;

/// Value of `key` in "key value" / "key=value" output.
pub fn field(text: &str, key: &str) -> Option<f64> {
    let start = text.find(key)? + key.len();
    text[start..]
        .trim_start_matches([' ', '='])
        .split(|c: char| c.is_whitespace())
        .next()?
        .parse()
        .ok()
}

pub fn median(mut values: Vec<f64>) -> f64 {
    values.sort_by(f64::total_cmp);
    values[values.len() / 2]
}

/// The median wall time of `runs` runs of `once`, and the count the last
/// one gave.
pub fn timed(
    runs: usize,
    mut once: impl FnMut() -> Result<Option<u64>>,
) -> Result<(f64, Option<u64>)> {
    let mut times = Vec::new();
    let mut count = None;
    for _ in 0..runs {
        let started = Instant::now();
        count = once()?;
        times.push(started.elapsed().as_secs_f64());
    }
    Ok((median(times), count))
}
