//! JSON rendering (schema: docs/json-schema.md): version 2, each frame
//! listed once in shared tables, by default; version 1, each frame whole
//! in each stack, with `--json-version 1`.
mod layout;
pub mod tables;

use std::io;

use serde::Serialize;

use super::{frame, options::JsonVersion, Report};
use tables::Tables;

/// The layout version 2 writes.
pub const COMPACT_VERSION: u32 = 2;

/// The report as JSON in layout `version`, written as it is serialized.
pub fn write(report: &Report, version: JsonVersion, out: &mut dyn io::Write) -> io::Result<()> {
    match version {
        JsonVersion::V1 => serde_json::to_writer_pretty(&mut *out, report)?,
        JsonVersion::V2 => write_compact(
            report,
            serde_json::Serializer::with_formatter(&mut *out, layout::OneLineLists::new()),
        )?,
    }
    out.write_all(b"\n")
}

/// The report as version 2 on one line, for a program to read (the
/// HTML page's data).
pub fn write_unindented(report: &Report, out: &mut dyn io::Write) -> io::Result<()> {
    write_compact(report, serde_json::Serializer::new(out))
}

/// Version 2 through `serializer`: the tables, then the report with its
/// frames as indices into them.
fn write_compact<W: io::Write, F: serde_json::ser::Formatter>(
    report: &Report,
    mut serializer: serde_json::Serializer<W, F>,
) -> io::Result<()> {
    let (tables, indices) = Tables::of(report);
    let compact = Compact {
        version: COMPACT_VERSION,
        tables: &tables,
        report,
    };
    frame::with_indices(indices, || compact.serialize(&mut serializer))?;
    Ok(())
}

/// The report as JSON text, whole (for small reports and tests).
pub fn render(report: &Report, version: JsonVersion) -> anyhow::Result<String> {
    let mut text = Vec::new();
    write(report, version, &mut text)?;
    Ok(String::from_utf8(text)?)
}

/// Version 2: the tables first (a reader has them before the stacks),
/// then the report, whose stacks' frames are indices into them.
#[derive(Serialize)]
struct Compact<'a> {
    version: u32,
    #[serde(flatten)]
    tables: &'a Tables,
    #[serde(flatten)]
    report: &'a Report,
}
