//! JSON rendering (schema: docs/json-schema.md).
use anyhow::Result;

use super::Report;

pub fn render(report: &Report) -> Result<String> {
    let mut text = serde_json::to_string_pretty(report)?;
    text.push('\n');
    Ok(text)
}
