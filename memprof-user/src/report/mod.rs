//! Reports: the model (what a report holds), how it is built from a
//! snapshot, and how it is rendered.
pub mod build;
pub mod chrome;
pub mod compression;
pub mod diff;
pub mod escape;
pub mod filters;
pub mod flamegraph;
pub mod folded;
pub mod frame;
pub mod html;
pub mod json;
pub mod markdown;
pub mod model;
pub mod options;
pub mod output;
pub mod pprof;
pub mod saved;
pub mod series;
pub mod speedscope;
pub mod stacks;
pub mod text;
pub mod timeline;
pub mod timeline_svg;
pub mod tsv;

use anyhow::Result;
pub use model::Report;
pub use output::{check_output, write_out, write_with};

use crate::report::{
    compression::{write_compressed, Compression},
    options::{Format, ReportOptions},
};

/// Renders `report` as `options` ask (format, `-o`, JSON layout) and
/// writes it to a file (replaced) or stdout. The formats people read get
/// the names a profiled process controls escaped
/// ([`Report::escape_names`]); JSON and pprof keep them exact.
pub fn emit(mut report: Report, options: &ReportOptions) -> Result<()> {
    let (format, output) = (options.format, options.output.as_deref());
    if !matches!(
        format,
        Format::Json | Format::Pprof | Format::Chrome | Format::Html | Format::Speedscope
    ) {
        report.escape_names();
    }
    let report = &report;
    if format == Format::Json {
        let compression = output.map_or(Compression::None, Compression::of_name);
        return write_with(output, |out| {
            write_compressed(compression, out, |out| {
                json::write(report, options.json_version, out)
            })
        });
    }
    let rendered = match format {
        Format::Text => match output {
            Some(_) => text::render(report),
            None => text::render_for(report, text::Terminal::of_stdout()),
        }
        .into_bytes(),
        Format::Json => unreachable!("streamed above"),
        Format::Folded => folded::render(report).into_bytes(),
        Format::Tsv => tsv::render(report).into_bytes(),
        Format::Markdown => markdown::render(report).into_bytes(),
        Format::Flamegraph => flamegraph::render(report)?.into_bytes(),
        Format::Pprof => pprof::render(report)?,
        Format::Timeline => timeline_svg::render(report)?.into_bytes(),
        Format::Chrome => chrome::render(report)?.into_bytes(),
        Format::Html => html::render(report)?,
        Format::Speedscope => speedscope::render(report)?.into_bytes(),
    };
    write_out(&rendered, output)
}
