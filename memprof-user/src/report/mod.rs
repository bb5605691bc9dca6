//! Reports: the model (what a report holds), how it is built from a
//! snapshot, and how it is rendered.
pub mod build;
pub mod diff;
pub mod flamegraph;
pub mod folded;
pub mod json;
pub mod markdown;
pub mod model;
pub mod saved;
pub mod text;
pub mod tsv;

use std::{fs, io::Write as _, path::Path};

use anyhow::{Context as _, Result};

use crate::cli::Format;
pub use model::Report;

/// Renders `report` and writes it to `output` (a file, replaced) or stdout.
pub fn emit(report: &Report, format: Format, output: Option<&Path>) -> Result<()> {
    let rendered = match format {
        Format::Text => text::render(report),
        Format::Json => json::render(report)?,
        Format::Folded => folded::render(report),
        Format::Tsv => tsv::render(report),
        Format::Markdown => markdown::render(report),
        Format::Flamegraph => flamegraph::render(report)?,
    };
    write_out(&rendered, output)
}

/// Writes `rendered` to `output` (a file, replaced) or stdout.
pub fn write_out(rendered: &str, output: Option<&Path>) -> Result<()> {
    match output {
        Some(path) => {
            fs::write(path, rendered).with_context(|| format!("writing {}", path.display()))
        }
        None => {
            let mut stdout = std::io::stdout().lock();
            stdout.write_all(rendered.as_bytes())?;
            stdout.flush()?;
            Ok(())
        }
    }
}
