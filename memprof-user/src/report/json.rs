//! JSON rendering (schema: docs/json-schema.md).
use std::io;

use super::Report;

/// The report as JSON, written as it is serialized.
pub fn write(report: &Report, out: &mut dyn io::Write) -> io::Result<()> {
    serde_json::to_writer_pretty(&mut *out, report)?;
    out.write_all(b"\n")
}

/// The report as JSON text, whole (for small reports and tests).
pub fn render(report: &Report) -> anyhow::Result<String> {
    let mut text = Vec::new();
    write(report, &mut text)?;
    Ok(String::from_utf8(text)?)
}
