//! How a report is cut and rendered (its command-line options: report
//! code reads them as they are).
use std::path::PathBuf;

use clap::{Args, ValueEnum};

use crate::human::numbers::{at_least_one, ByteCount};

/// How a report is cut and rendered: what `trace`, `attach`, `monitor` and
/// `report` print, and what `monitor` serves.
#[derive(Args, Debug, Clone)]
#[command(next_help_heading = "Reporting")]
pub struct ReportOptions {
    /// Show the N stacks that rank first (by --sort), per process.
    ///
    /// Default: 10 in text and markdown; every stack in the formats that
    /// are saved (json, pprof, folded, tsv, flamegraph, timeline, chrome),
    /// so that `memprof report` can cut them again.
    #[arg(long, value_name = "N")]
    pub top: Option<usize>,
    /// Show at most N frames of each stack. Default: 12 in text and
    /// markdown; every frame recorded in the formats that are saved.
    #[arg(hide_short_help = true, long, value_name = "N", value_parser = at_least_one::<usize>)]
    pub depth: Option<usize>,
    /// Rank stacks by bytes, calls, live, temporary or average.
    ///
    /// What ranks the stacks (and what --top keeps): `bytes` allocated,
    /// `calls`, `live` bytes still held, `temporary` blocks (freed within
    /// --temp-threshold), `average` bytes a call. Default: live with
    /// --live, else bytes. live and temporary need a live profile.
    #[arg(long, value_enum, value_name = "KEY", hide_possible_values = true)]
    pub sort: Option<SortKey>,
    /// Hide stacks that allocated fewer bytes than this (e.g. 4096, 64K, 1MiB).
    #[arg(
        hide_short_help = true,
        long,
        default_value = "0",
        value_name = "BYTES"
    )]
    pub min_bytes: ByteCount,
    /// `stack`: one row per distinct call stack; `caller`: sum the stacks
    /// that share their direct caller (function and file:line); `type`:
    /// sum a Go program's allocations by the type allocated (other
    /// allocations by allocator function), each shown with its largest
    /// stack.
    #[arg(hide_short_help = true, long, value_enum, default_value_t = GroupBy::Stack)]
    pub group_by: GroupBy,
    /// Report format.
    #[arg(long, value_enum, default_value_t = Format::Text)]
    pub format: Format,
    /// Write the report to FILE instead of stdout.
    ///
    /// A JSON report to FILE.json.gz or FILE.json.zst is compressed
    /// (gzip, zstd); `memprof report` reads either.
    #[arg(short = 'o', long = "output", value_name = "FILE")]
    pub output: Option<PathBuf>,
    /// JSON layout: 2 lists each frame once and stacks as indices into
    /// that list; 1 writes each frame whole in each stack (the layout
    /// before version 2, for scripts that read it). `memprof report`
    /// reads both.
    #[arg(
        hide_short_help = true,
        long,
        value_enum,
        default_value_t = JsonVersion::V2,
        value_name = "VERSION"
    )]
    pub json_version: JsonVersion,
    #[command(flatten)]
    pub filters: FilterOptions,
}

/// Which stacks a report keeps, and which frames.
#[derive(Args, Debug, Clone)]
#[command(next_help_heading = "Filters")]
pub struct FilterOptions {
    /// Keep only the stacks through a function or file matching REGEX.
    ///
    /// Keep only the stacks with a frame whose function or source file
    /// matches REGEX (e.g. 'parse_|json', 'src/cache\.c'); the report
    /// says what the filters hid. On a saved report: among the stacks and
    /// frames it was saved with.
    #[arg(long, value_name = "REGEX", value_parser = pattern)]
    pub focus: Option<regex::Regex>,
    /// Drop the stacks with a frame whose function or source file matches
    /// REGEX (applied after --focus).
    #[arg(hide_short_help = true, long, value_name = "REGEX", value_parser = pattern)]
    pub ignore: Option<regex::Regex>,
    /// Drop the N innermost frames of every stack (allocation wrappers
    /// such as xmalloc), so that frame 0 is their caller and stacks that
    /// differ only there are summed. A frame is a call with the functions
    /// inlined into it; the outermost frame always stays.
    #[arg(hide_short_help = true, long, default_value_t = 0, value_name = "N")]
    pub skip_frames: usize,
}

impl ReportOptions {
    /// The stacks shown per process: --top, else by the format.
    pub fn shown_top(&self) -> usize {
        self.top.unwrap_or(if self.format.keeps_everything() {
            usize::MAX
        } else {
            DEFAULT_TOP
        })
    }

    /// The frames shown per stack: --depth, else by the format.
    pub fn shown_depth(&self) -> usize {
        self.depth.unwrap_or(if self.format.keeps_everything() {
            usize::MAX
        } else {
            DEFAULT_DEPTH
        })
    }

    /// The cut a report is made with, as it records it.
    pub fn cut_report(&self) -> super::model::CutReport {
        let given = |value: usize| (value != usize::MAX).then_some(value);
        super::model::CutReport {
            top: given(self.shown_top()),
            depth: given(self.shown_depth()),
            sort: self.sort.map(SortKey::name),
        }
    }
}

/// What text and markdown show unless told.
pub const DEFAULT_TOP: usize = 10;
pub const DEFAULT_DEPTH: usize = 12;

/// A regular expression (Rust's `regex` syntax, as ripgrep's).
pub fn pattern(s: &str) -> Result<regex::Regex, String> {
    regex::Regex::new(s).map_err(|err| {
        let detail = err.to_string();
        let last = detail.lines().last().unwrap_or_default().trim().to_string();
        format!("'{s}' is not a regular expression: {last}")
    })
}

#[derive(ValueEnum, Clone, Copy, Debug, PartialEq, Eq)]
pub enum GroupBy {
    Stack,
    Caller,
    Type,
}

#[derive(ValueEnum, Clone, Copy, Debug, PartialEq, Eq)]
pub enum SortKey {
    Bytes,
    Calls,
    Live,
    Temporary,
    Average,
}

impl SortKey {
    pub fn name(self) -> String {
        self.to_possible_value()
            .map(|value| value.get_name().to_string())
            .unwrap_or_default()
    }

    /// Whether it ranks by what only a live profile knows.
    pub fn needs_live(self) -> bool {
        matches!(self, SortKey::Live | SortKey::Temporary)
    }
}

/// The layout of a JSON report (docs/json-schema.md).
#[derive(ValueEnum, Clone, Copy, Debug, PartialEq, Eq)]
pub enum JsonVersion {
    #[value(name = "1")]
    V1,
    #[value(name = "2")]
    V2,
}

#[derive(ValueEnum, Clone, Copy, Debug, PartialEq, Eq)]
pub enum Format {
    /// Human-readable, the default.
    Text,
    /// Machine-readable, every number and frame (docs/json-schema.md).
    Json,
    /// `process;outer;...;inner bytes` lines for flamegraph.pl, inferno, speedscope.
    Folded,
    /// `count<TAB>bytes<TAB>frame0<TAB>frame1...` lines.
    Tsv,
    /// A table per process, to paste into an issue.
    Markdown,
    /// An SVG flame graph (width: bytes), to open in a browser.
    Flamegraph,
    /// Gzipped pprof protobuf, for `go tool pprof`, Pyroscope, Parca, Grafana.
    Pprof,
    /// An SVG chart of each process's heap over time (live bytes with
    /// --live, else bytes allocated per second), stacked by the top call
    /// sites, the peak marked: open it in a browser.
    Timeline,
    /// The same series in the Trace Event Format (counter tracks per
    /// process and call site), for Perfetto UI or chrome://tracing.
    Chrome,
    /// One self-contained page to explore in a browser: a flame graph to
    /// zoom and search, the heap over time, the top call sites.
    Html,
    /// speedscope's file format, for https://www.speedscope.app.
    Speedscope,
}

impl Format {
    /// Whether the format is one that is saved and read again: it keeps
    /// every stack and frame unless --top/--depth say otherwise.
    pub fn keeps_everything(self) -> bool {
        !matches!(self, Format::Text | Format::Markdown)
    }

    /// Whether the format draws the heap over time.
    pub fn is_timeline(self) -> bool {
        matches!(self, Format::Timeline | Format::Chrome | Format::Html)
    }
}
