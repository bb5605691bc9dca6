//! Reports: the model (what a report holds), how it is built from a
//! snapshot, and how it is rendered.
pub mod build;
pub mod diff;
pub mod flamegraph;
pub mod folded;
pub mod json;
pub mod markdown;
pub mod model;
pub mod pprof;
pub mod saved;
pub mod stacks;
pub mod text;
pub mod tsv;

use std::{fs, io::Write as _, path::Path};

use anyhow::{Context as _, Result};

use crate::cli::Format;
pub use model::Report;

/// Renders `report` and writes it to `output` (a file, replaced) or stdout.
pub fn emit(report: &Report, format: Format, output: Option<&Path>) -> Result<()> {
    let rendered = match format {
        Format::Text => match output {
            Some(_) => text::render(report),
            None => text::render_for(report, text::Terminal::of_stdout()),
        }
        .into_bytes(),
        Format::Json => json::render(report)?.into_bytes(),
        Format::Folded => folded::render(report).into_bytes(),
        Format::Tsv => tsv::render(report).into_bytes(),
        Format::Markdown => markdown::render(report).into_bytes(),
        Format::Flamegraph => flamegraph::render(report)?.into_bytes(),
        Format::Pprof => pprof::render(report)?,
    };
    write_out(&rendered, output)
}

/// Writes `rendered` to `output` (a file, replaced) or stdout.
pub fn write_out(rendered: &[u8], output: Option<&Path>) -> Result<()> {
    match output {
        Some(path) => {
            fs::write(path, rendered).with_context(|| format!("writing {}", path.display()))
        }
        None => {
            let mut stdout = std::io::stdout().lock();
            stdout.write_all(rendered)?;
            stdout.flush()?;
            Ok(())
        }
    }
}
