//! The numbers the bench reads: a value the programs print, and the median
//! of runs.

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
