//! Command line: what the user asks for. No logic beyond parsing.
use std::{path::PathBuf, str::FromStr};

use clap::{Args, Parser, Subcommand, ValueEnum};

const ABOUT: &str = "\
memprof: which line of code allocated the memory?

Counts every call to the malloc family (malloc, calloc, realloc, reallocarray,
posix_memalign, memalign/aligned_alloc, valloc, pvalloc) in the profiled
processes with eBPF uprobes, sums bytes and calls per call stack in the
kernel, and reports the top allocating call sites with function, file:line
and inlined frames. With --live it also pairs blocks with their frees: what
is still allocated, where, for how long (leaks). Nothing is injected into the
target: no LD_PRELOAD, no ptrace, no restart. Other processes on the host are
not slowed down.

Needs root (CAP_SYS_ADMIN, CAP_BPF and CAP_PERFMON).";

const EXAMPLES: &str = "\
Examples:
  sudo memprof trace -- ./my-program --its-args
      profile a command from start to exit (children too), then report
  sudo memprof attach --pid 1234 --duration 30
      profile a running process for 30 s (or until Ctrl-C)
  sudo memprof trace --top 5 --depth 3 --group-by caller -- make -j2
      the five call sites that allocated most, summed by direct caller
  sudo memprof trace --format json --top 100000 -o before.json -- ./my-program
      machine-readable report (schema: docs/json-schema.md)
  memprof report before.json --format folded | flamegraph.pl > flame.svg
      render a saved report again, here as folded stacks for a flame graph
  memprof diff before.json after.json
      what grew between two runs, stack by stack

  sudo memprof trace --live -- ./my-program
      what the program still had allocated at exit (leaks), largest first
  sudo memprof attach --pid 1234 --live --min-age 60 --duration 300
      blocks allocated over a minute ago and still live: a leak report

  sudo memprof attach --pid 1234 --sample-bytes 512K --duration 60
      sampled: a fraction of the cost, estimates marked as such

Numbers are exact (every call counted) unless --sample-bytes asks for
estimates. Events memprof could not record in full (a full map, a stack that
did not fit, an unreadable return address, a full pointer table) are counted
and shown under \"lost\" in every report.";

#[derive(Parser, Debug)]
#[command(name = "memprof", version, about = ABOUT, after_help = EXAMPLES)]
pub struct Cli {
    #[command(subcommand)]
    pub command: Command,
}

#[derive(Subcommand, Debug)]
pub enum Command {
    /// Run a command and profile it, and the processes it starts, until it exits.
    ///
    /// The command is started held: it runs only once the probes are in
    /// place, so no allocation is missed. memprof exits with its exit status.
    #[command(after_help = EXAMPLES)]
    Trace(TraceArgs),
    /// Profile running processes until Ctrl-C, --duration, or their exit.
    #[command(after_help = EXAMPLES)]
    Attach(AttachArgs),
    /// Render a saved JSON report again, in any format (no root needed).
    ///
    /// It holds only the stacks it was saved with: save with a large --top
    /// to cut it differently later.
    Report(ReportArgs),
    /// Compare two saved JSON reports: per-stack change in bytes and
    /// calls, largest growth first. Stacks match by their symbolized
    /// frames, so reports of different runs of one program compare.
    Diff(DiffArgs),
}

#[derive(Args, Debug)]
pub struct ReportArgs {
    /// A report written by `--format json`.
    #[arg(value_name = "FILE.json")]
    pub file: PathBuf,
    #[command(flatten)]
    pub report: ReportOptions,
}

#[derive(Args, Debug)]
pub struct DiffArgs {
    #[arg(value_name = "BASE.json")]
    pub base: PathBuf,
    #[arg(value_name = "NEW.json")]
    pub new: PathBuf,
    /// Show the N stacks that changed most.
    #[arg(long, default_value_t = 20, value_name = "N")]
    pub top: usize,
    /// `text` or `json`.
    #[arg(long, value_enum, default_value_t = DiffFormat::Text)]
    pub format: DiffFormat,
    /// Write to FILE instead of stdout.
    #[arg(short = 'o', long = "output", value_name = "FILE")]
    pub output: Option<PathBuf>,
}

#[derive(ValueEnum, Clone, Copy, Debug, PartialEq, Eq)]
pub enum DiffFormat {
    Text,
    Json,
}

#[derive(Args, Debug)]
pub struct TraceArgs {
    #[command(flatten)]
    pub options: ProfileOptions,
    /// The command to run, and its arguments (after `--`).
    #[arg(required = true, last = true, value_name = "CMD")]
    pub command: Vec<String>,
}

#[derive(Args, Debug)]
pub struct AttachArgs {
    /// Process id to profile; repeat for several processes.
    #[arg(long = "pid", short = 'p', required = true, value_name = "PID")]
    pub pids: Vec<i32>,
    /// Stop after this many seconds (default: until Ctrl-C or the processes exit).
    #[arg(long, value_name = "SECS")]
    pub duration: Option<f64>,
    #[command(flatten)]
    pub options: ProfileOptions,
}

#[derive(Args, Debug, Clone)]
pub struct ProfileOptions {
    #[command(flatten)]
    pub report: ReportOptions,
    /// Also print a report every SECS seconds (totals so far).
    #[arg(long, value_name = "SECS", help_heading = "Reporting")]
    pub interval: Option<f64>,
    /// Capacity of the kernel table of distinct (process, stack, caller,
    /// function) entries. When full, further new stacks are counted under
    /// lost "map_full". (With --live, N more: sites first take one of N
    /// ids of their own, 56 bytes of kernel memory per id and CPU.)
    #[arg(
        long,
        default_value_t = 65536,
        value_name = "N",
        help_heading = "Limits"
    )]
    pub max_stacks: u32,
    /// Capacity of the kernel's stack table (distinct call stacks). When it
    /// is full, new stacks keep only their direct caller and are counted
    /// under lost "stack_collision".
    #[arg(
        long,
        default_value_t = 16384,
        value_name = "N",
        help_heading = "Limits"
    )]
    pub stack_map_size: u32,
    /// Benchmarks only: attach BPF programs that do nothing, to measure
    /// the cost of the uprobes alone (the floor).
    #[arg(long, hide = true)]
    pub empty_programs: bool,
    /// Benchmarks only: one empty probe on this function alone.
    #[arg(long, hide = true, value_name = "FUNCTION")]
    pub bench_probe: Option<String>,
    /// Probe every function at its first instruction. By default a probe
    /// moves past leading instructions the kernel would have to single-step
    /// (glibc's free starts with one) to the first one it emulates, when
    /// that provably changes nothing memprof reads (glibc's free: ~16x cheaper).
    #[arg(long, help_heading = "Target")]
    pub no_probe_offsets: bool,
    /// Probe this C library instead of the one the target uses.
    #[arg(long, value_name = "PATH", help_heading = "Target")]
    pub libc: Option<PathBuf>,
    /// Record a sample of the calls, not every one: each allocated byte is
    /// a sample point with chance 1/BYTES (Poisson sampling, as tcmalloc,
    /// jemalloc and heapprofd do; e.g. 512K). Reports show unbiased
    /// estimates, marked as such. Much cheaper without --live; with --live
    /// only sampled blocks are tracked.
    #[arg(long, value_name = "BYTES", help_heading = "Sampling")]
    pub sample_bytes: Option<ByteCount>,
    #[command(flatten)]
    pub live: LiveOptions,
}

#[derive(Args, Debug, Clone)]
pub struct LiveOptions {
    /// Track every block until it is freed: report what is still
    /// allocated (live bytes and count, age of the oldest block) per stack,
    /// each process's peak, and short-lived "temporary" allocations. At the
    /// end of `trace`, what is still allocated is the leak report.
    #[arg(long, help_heading = "Live heap")]
    pub live: bool,
    /// Capacity of the kernel's table of live blocks. When it is full, new
    /// blocks are counted in the totals but not tracked ("untracked", and
    /// lost "live_table_full"). The table has 2N slots rounded up to a
    /// power of two, 88 bytes of kernel memory each, taken at start (88 MiB
    /// for the default).
    #[arg(
        long,
        default_value_t = 500_000,
        value_name = "N",
        requires = "live",
        help_heading = "Live heap"
    )]
    pub max_live: u32,
    /// A block freed within this time of its allocation is a temporary
    /// allocation (e.g. 1ms, 250us, 0.01).
    #[arg(
        long,
        default_value = "1ms",
        value_name = "TIME",
        requires = "live",
        help_heading = "Live heap"
    )]
    pub temp_threshold: Seconds,
    /// Show only blocks at least this old (e.g. 30, 5m): a leak report of
    /// a long-running process.
    #[arg(
        long,
        value_name = "SECS",
        requires = "live",
        help_heading = "Live heap"
    )]
    pub min_age: Option<Seconds>,
}

/// A time span given as seconds (`0.5`, `30`) or with a unit (`1ms`, `5m`).
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Seconds(pub f64);

impl Seconds {
    pub fn nanos(self) -> u64 {
        (self.0 * 1e9) as u64
    }
}

impl FromStr for Seconds {
    type Err = String;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        let invalid = || format!("'{s}' is not a time span (try 30, 0.5, 1ms or 5m)");
        if let Ok(secs) = s.parse::<f64>() {
            return (secs.is_finite() && secs >= 0.0)
                .then_some(Seconds(secs))
                .ok_or_else(invalid);
        }
        humantime::parse_duration(s)
            .map(|d| Seconds(d.as_secs_f64()))
            .map_err(|_| invalid())
    }
}

#[derive(Args, Debug, Clone)]
pub struct ReportOptions {
    /// Show the N stacks that allocated most bytes, per process.
    #[arg(
        long,
        default_value_t = 10,
        value_name = "N",
        help_heading = "Reporting"
    )]
    pub top: usize,
    /// Show at most N frames of each stack.
    #[arg(
        long,
        default_value_t = 12,
        value_name = "N",
        help_heading = "Reporting"
    )]
    pub depth: usize,
    /// Hide stacks that allocated fewer bytes than this (e.g. 4096, 64K, 1MiB).
    #[arg(
        long,
        default_value = "0",
        value_name = "BYTES",
        help_heading = "Reporting"
    )]
    pub min_bytes: ByteCount,
    /// `stack`: one row per distinct call stack; `caller`: sum the stacks
    /// that share their direct caller (function and file:line).
    #[arg(long, value_enum, default_value_t = GroupBy::Stack, help_heading = "Reporting")]
    pub group_by: GroupBy,
    /// Report format.
    #[arg(long, value_enum, default_value_t = Format::Text, help_heading = "Reporting")]
    pub format: Format,
    /// Write the report to FILE instead of stdout.
    #[arg(
        short = 'o',
        long = "output",
        value_name = "FILE",
        help_heading = "Reporting"
    )]
    pub output: Option<PathBuf>,
}

#[derive(ValueEnum, Clone, Copy, Debug, PartialEq, Eq)]
pub enum GroupBy {
    Stack,
    Caller,
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
}

/// A byte count given as `4096`, `64K`, `64KiB`, `1.5MB`...
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ByteCount(pub u64);

impl FromStr for ByteCount {
    type Err = String;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        if let Ok(n) = s.parse::<u64>() {
            return Ok(ByteCount(n));
        }
        bytesize::ByteSize::from_str(s)
            .map(|size| ByteCount(size.as_u64()))
            .map_err(|_| format!("'{s}' is not a byte count (try 4096, 64K or 1MiB)"))
    }
}
