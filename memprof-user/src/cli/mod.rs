//! Command line: what the user asks for. No logic beyond parsing.
use std::{path::PathBuf, str::FromStr};

use clap::{Args, Parser, Subcommand, ValueEnum};
use nix::sys::signal::Signal;

use crate::discover::allocators::CustomFunction;

fn alloc_fn(text: &str) -> Result<CustomFunction, String> {
    CustomFunction::parse(text, false)
}

fn free_fn(text: &str) -> Result<CustomFunction, String> {
    CustomFunction::parse(text, true)
}

fn region_fn(text: &str) -> Result<CustomFunction, String> {
    CustomFunction::region(text)
}

/// A signal memprof may take for itself: not one that ends the profile
/// (INT, TERM), nor one it cannot catch or must not (KILL, STOP, CHLD,
/// the fault signals).
fn signal(text: &str) -> Result<Signal, String> {
    let upper = text.trim().to_ascii_uppercase();
    let name = if upper.starts_with("SIG") {
        upper
    } else {
        format!("SIG{upper}")
    };
    let signal: Signal = name
        .parse()
        .map_err(|_| format!("'{text}' is not a signal name (try USR1, USR2 or HUP)"))?;
    use Signal::*;
    if matches!(
        signal,
        SIGINT
            | SIGTERM
            | SIGKILL
            | SIGSTOP
            | SIGCHLD
            | SIGSEGV
            | SIGBUS
            | SIGILL
            | SIGFPE
            | SIGTRAP
            | SIGABRT
            | SIGSYS
    ) {
        return Err(format!(
            "{} cannot be used: INT and TERM end the profile; try USR1, USR2 or HUP",
            signal.as_str()
        ));
    }
    Ok(signal)
}

const ABOUT: &str = "\
memprof: which line of code allocated the memory?

Counts every call to the allocators in the profiled processes with eBPF
uprobes: the malloc family (malloc, calloc, realloc, reallocarray,
posix_memalign, memalign/aligned_alloc, valloc, pvalloc) wherever it is
defined (glibc, musl, a static program, jemalloc, tcmalloc, mimalloc), C++'s
operator new (new, new[], nothrow, aligned), jemalloc's mallocx/rallocx,
mimalloc's mi_* and tcmalloc's tc_* functions, and any function named with
--alloc-fn. It sums bytes and calls per call stack in the
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

  sudo memprof trace --live --format timeline -o heap.svg -- ./my-program
      the heap over time, stacked by call site, its peak marked (a browser
      opens it; --format chrome for Perfetto UI)
  sudo memprof attach --pid 1234 --while handle_request --duration 30
      only what is allocated while handle_request is on the stack
  memprof report before.json --focus 'parse|json' --skip-frames 1
      only the stacks through the parser, the allocation wrapper dropped

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
    /// Watch processes until SIGTERM or Ctrl-C and serve what they
    /// allocate over HTTP: Prometheus metrics, pprof profiles as Go's
    /// net/http/pprof serves them (go tool pprof, Grafana Alloy, Parca).
    ///
    /// Watches every process on the host (but memprof), containers
    /// included; or those named by --pid, --comm, --exe and --cgroup: those
    /// running, and (--comm, --exe, --cgroup) those started later, from
    /// their exec on. A process that ended stays one --interval, then goes.
    /// The final report is printed at the end, as for attach.
    #[command(after_help = MONITOR_EXAMPLES)]
    Monitor(MonitorArgs),
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
    /// Run the command as USER (a name or a uid), with that user's groups
    /// and HOME; memprof itself keeps root. Default: under sudo, the user
    /// who ran sudo (SUDO_UID, SUDO_GID), so that the command runs and
    /// writes its files as in real use; else memprof's own user.
    /// `--user root` keeps root.
    #[arg(long, value_name = "USER", help_heading = "Target")]
    pub user: Option<String>,
    /// The command to run, and its arguments (after `--`).
    #[arg(required = true, last = true, value_name = "CMD")]
    pub command: Vec<String>,
}

const MONITOR_EXAMPLES: &str = "\
Examples:
  sudo memprof monitor
      every process on the host, served on http://127.0.0.1:9464
  sudo memprof monitor --comm '^nginx$' --live
      every nginx, running or started later, and its live heap
  sudo memprof monitor --cgroup /system.slice/postgresql.service
      the processes of one service (or a container's cgroup)
  curl http://127.0.0.1:9464/metrics
      memprof_allocated_bytes_total{pid,comm,exe}, the top call sites
      (memprof_site_allocated_bytes_total), memprof's own health
  go tool pprof http://127.0.0.1:9464/debug/pprof/allocs
      what was allocated since the start (?seconds=N: in the next N s;
      ?pid=, ?comm=: one process); /debug/pprof/heap with --live";

#[derive(Args, Debug)]
pub struct MonitorArgs {
    /// A process to watch; repeatable.
    #[arg(long = "pid", short = 'p', value_name = "PID", help_heading = "Target")]
    pub pids: Vec<i32>,
    /// Watch the processes whose name (comm) matches REGEX, running or
    /// started later;
    /// repeatable.
    #[arg(long, value_name = "REGEX", value_parser = pattern, help_heading = "Target")]
    pub comm: Vec<regex::Regex>,
    /// Watch the processes of this executable, running or started later;
    /// repeatable.
    #[arg(long, value_name = "PATH", help_heading = "Target")]
    pub exe: Vec<PathBuf>,
    /// Watch the processes in this cgroup or below it, running or started
    /// later: its directory (/sys/fs/cgroup/system.slice/x.service) or its
    /// path as /proc/PID/cgroup shows it (/system.slice/x.service);
    /// repeatable. With no --pid, --comm, --exe or --cgroup, memprof
    /// watches every process on the host (but itself).
    #[arg(long = "cgroup", value_name = "PATH", help_heading = "Target")]
    pub cgroups: Vec<PathBuf>,
    /// Where the HTTP endpoints listen (another interface only when
    /// named); the last one given counts.
    #[arg(
        long,
        default_value = "127.0.0.1:9464",
        value_name = "ADDR",
        overrides_with = "listen",
        help_heading = "Serving"
    )]
    pub listen: std::net::SocketAddr,
    /// Call sites per process in memprof_site_allocated_bytes_total (the
    /// largest by bytes allocated), so that each process's series stay
    /// few. A process that ended stays in the figures one --interval
    /// (default 60 s), then goes.
    #[arg(long, default_value_t = 10, value_name = "N", help_heading = "Serving")]
    pub metrics_sites: usize,
    /// Also write a report to DIR every --interval (default 60 s) and at
    /// the end: JSON (docs/json-schema.md), or pprof profiles with
    /// --format pprof, named memprof-TIME by UTC time. SIGHUP writes one
    /// at once.
    #[arg(long, value_name = "DIR", help_heading = "Serving")]
    pub out: Option<PathBuf>,
    /// Files kept in --out DIR; the oldest go first.
    #[arg(
        long,
        default_value_t = 100,
        value_name = "N",
        value_parser = at_least_one::<usize>,
        help_heading = "Serving"
    )]
    pub out_keep: usize,
    /// What --out DIR's files may take in all (e.g. 500M); the oldest go
    /// first.
    #[arg(
        long,
        default_value = "1G",
        value_name = "BYTES",
        help_heading = "Serving"
    )]
    pub out_max_size: ByteCount,
    /// Processes profiled at once (the kernel's process table, under
    /// 100 bytes each). One that starts when the table is full is not profiled; its
    /// calls are counted as lost "process_table_full". Ended processes
    /// leave the table one --interval after their end.
    #[arg(
        long,
        default_value_t = 16384,
        value_name = "N",
        value_parser = at_least_one::<u32>,
        help_heading = "Limits"
    )]
    pub max_processes: u32,
    /// What memprof may cost each process, in percent of one CPU. memprof
    /// measures its probes' cost per allocation here at start and each
    /// process's allocation rate every second; a process (with what it
    /// forks) that would cost more has its probes in for one window of
    /// each span of 5-60 s only (its duty cycle, aiming at 80% of the
    /// budget; at least 100 ms at a random time), and its figures are
    /// estimates scaled from the windows by its CPU time in them
    /// (memprof_duty_cycle_ratio,
    /// memprof_overhead_ratio; JSON duty_cycle, overhead). On the whole
    /// host every process's probes go in and out together, as the
    /// costliest process's budget allows. With --live the cost is
    /// measured, not kept. Sampling is on (--sample-bytes 512K) unless
    /// --exact.
    #[arg(
        long,
        default_value_t = 1.0,
        value_name = "PCT",
        value_parser = positive_percent,
        help_heading = "Cost"
    )]
    pub max_overhead: f64,
    /// Count every call: no sampling, no budget.
    #[arg(long, conflicts_with_all = ["sample_bytes", "max_overhead"], help_heading = "Cost")]
    pub exact: bool,
    #[command(flatten)]
    pub options: ProfileOptions,
}

fn positive_percent(text: &str) -> Result<f64, String> {
    match text.trim_end_matches('%').parse::<f64>() {
        Ok(pct) if pct > 0.0 && pct <= 100.0 => Ok(pct),
        _ => Err(format!("'{text}' is not a percentage in (0, 100]")),
    }
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
    /// Also print a report every SECS seconds (totals so far; e.g. 10, 0.5, 1m).
    #[arg(long, value_name = "SECS", value_parser = positive_seconds, help_heading = "Reporting")]
    pub interval: Option<f64>,
    /// Sample the heap every SECS (e.g. 100ms, 0.5) for a timeline: the
    /// kernel's per-call-site counters are read, nothing is paid per
    /// allocation. On by default (100ms) with --format timeline and
    /// chrome; give it with --format json to render a timeline later
    /// (`memprof report saved.json --format timeline`).
    #[arg(long, value_name = "SECS", value_parser = positive_seconds, help_heading = "Reporting")]
    pub timeline_period: Option<f64>,
    /// Capacity of the kernel table of distinct (process, stack, caller,
    /// function) entries. When full, further new stacks are counted under
    /// lost "map_full". (With --live, up to 4,096 more: the first sites
    /// take an id of their own, 56 bytes of kernel memory per id and CPU.)
    #[arg(
        long,
        default_value_t = 65536,
        value_name = "N",
        value_parser = at_least_one::<u32>,
        help_heading = "Limits"
    )]
    pub max_stacks: u32,
    /// Capacity of the kernel's stack table (distinct call stacks, 128
    /// frames each: 2 KiB of kernel memory per stack stored, taken as
    /// stacks come, up to 128 MiB by default; room for one stack per
    /// --max-stacks entry). When it is full, new stacks keep only their direct caller
    /// and are counted under lost "stack_collision".
    #[arg(
        long,
        default_value_t = 65536,
        value_name = "N",
        value_parser = at_least_one::<u32>,
        help_heading = "Limits"
    )]
    pub stack_map_size: u32,
    /// Benchmarks only: attach BPF programs that do nothing, to measure
    /// the cost of the uprobes alone (the floor).
    #[arg(long, hide = true)]
    pub empty_programs: bool,
    /// Benchmarks only: with --live and sampling, a return probe on
    /// every malloc-like call, as on kernels without session uprobes.
    #[arg(long, hide = true)]
    pub no_session_probes: bool,
    /// Benchmarks and tests only: with session probes, `trace` lets the
    /// processes it profiles fork without holding the children for their
    /// own probes (they use their parent's shared events, as `attach`'s).
    #[arg(long, hide = true)]
    pub no_fork_hold: bool,
    /// Benchmarks only: one empty probe on this function alone.
    #[arg(long, hide = true, value_name = "FUNCTION")]
    pub bench_probe: Option<String>,
    /// Tests only: site groups of the kernel's site table memprof may use
    /// (at most 64), to see them run out and be reclaimed.
    #[arg(long, hide = true, value_name = "N", value_parser = clap::value_parser!(u32).range(1..=64))]
    pub site_groups: Option<u32>,
    /// Tests only: entries of the kernel's table of USDT probes' specs
    /// memprof may use (at most 256), to see them run out and be reclaimed.
    #[arg(long, hide = true, value_name = "N", value_parser = clap::value_parser!(u32).range(1..=256))]
    pub usdt_specs: Option<u32>,
    /// Probe every function at its first instruction. By default a probe
    /// moves past leading instructions the kernel would have to single-step
    /// (glibc's free starts with one) to the first one it emulates, when
    /// that provably changes nothing memprof reads (glibc's free: ~16x cheaper).
    #[arg(long, help_heading = "Target")]
    pub no_probe_offsets: bool,
    /// Probe this C library instead of the one the target uses.
    #[arg(long, value_name = "PATH", help_heading = "Target")]
    pub libc: Option<PathBuf>,
    /// Count calls to a function of your own as allocations:
    /// SYMBOL[@MODULE]:size=N[,count=N][,ptr=N], N the 1-based argument
    /// position of the size in bytes (times count, for calloc-like
    /// functions) and of the block a realloc-like function is given; the
    /// block is the return value. Looked for in the program and its
    /// libraries (or MODULE: a path or file name). Reports name the
    /// allocator SYMBOL; what it allocates inside (malloc calls) counts once,
    /// as its own. Repeatable. Example: --alloc-fn rt_alloc:size=1
    #[arg(long = "alloc-fn", value_name = "SPEC", value_parser = alloc_fn, help_heading = "Target")]
    pub alloc_fns: Vec<CustomFunction>,
    /// The release function of an --alloc-fn allocator (for --live):
    /// SYMBOL[@MODULE]:ptr=N, N the 1-based position of the block.
    /// Repeatable. Example: --free-fn rt_free:ptr=1
    #[arg(long = "free-fn", value_name = "SPEC", value_parser = free_fn, help_heading = "Target")]
    pub free_fns: Vec<CustomFunction>,
    /// Do not count direct mappings. By default the anonymous mmap and
    /// mremap calls and the sbrk a program makes itself through the C
    /// library (not from inside a probed allocator, whose memory is counted
    /// already) are counted per call site as allocators "mmap", "mremap"
    /// and "brk", always exactly; with --live, munmap (whole or part of a
    /// mapping) ends what it unmaps. Off with --unwind fp (telling the
    /// program's mappings from malloc's takes whole stacks).
    #[arg(long, help_heading = "Target")]
    pub no_mmap: bool,
    /// Print each probed function, its module and probe offset on stderr
    /// (the JSON report lists them under "probes" in any case).
    #[arg(long, short = 'v', help_heading = "Reporting")]
    pub verbose: bool,
    /// Where separate debug files are looked for (repeatable; default
    /// /usr/lib/debug and /lib/debug): through a module's .gnu_debuglink,
    /// and by build id (DIR/.build-id/xx/rest.debug). Then, for stripped
    /// modules, from the debuginfod servers in DEBUGINFOD_URLS (cached in
    /// DEBUGINFOD_CACHE_PATH, else ~/.cache/debuginfod_client, shared with
    /// gdb and perf). Without names, .symtab/.dynsym are used; a frame with
    /// none prints as module+0xOFFSET (the same in every run), and reports
    /// carry each module's build id.
    #[arg(long = "debug-dir", value_name = "DIR", help_heading = "Symbols")]
    pub debug_dirs: Vec<PathBuf>,
    /// Record a sample of the calls, not every one: each allocated byte is
    /// a sample point with chance 1/BYTES (Poisson sampling, as tcmalloc,
    /// jemalloc and heapprofd do; e.g. 512K: K, M, G are powers of 1024). Reports show unbiased
    /// estimates, marked as such. Much cheaper without --live; with --live
    /// only sampled blocks are tracked (and, on kernels 6.13 and later,
    /// only sampled calls of malloc-like functions take a return probe).
    #[arg(long, value_name = "BYTES", help_heading = "Sampling")]
    pub sample_bytes: Option<ByteCount>,
    /// Programs that sample their own allocations and announce them
    /// through USDT probes (provider otel_memory or ddheap: alloc(ptr,
    /// size, weight), free(ptr)) are profiled through those probes instead
    /// of the allocators' entry points: unsampled calls then cost nothing.
    /// Their figures are the programs' estimates, marked as such.
    #[arg(long, help_heading = "Sampling")]
    pub usdt: bool,
    /// How stacks are walked. `auto` (default) = `dwarf`: with the unwind
    /// tables (.eh_frame, the CFI debuggers use) of every file the process
    /// maps, so stacks go on through code built without frame pointers
    /// (Debian's glibc, libstdc++, python3, most distro programs). memprof
    /// compiles a file's tables once (~6 ms for glibc), keeps them by
    /// build id (up to 64 MiB of them in its own memory, least recently
    /// used dropped first), and puts them in the kernel (~1.5 us per row, ~45 ms for
    /// glibc the first time); the kernel walks every recorded call with
    /// them (~0.15 us per frame). Under `trace` the command waits, stopped,
    /// while the tables of libraries it loads go in; an attached process is
    /// never stopped: its calls in that window (after a dlopen or exec) are
    /// cut and counted under lost "unwind_no_info". `fp` follows frame
    /// pointers: a little cheaper (~0.1 us per frame), but code built
    /// without them cuts the stack at its first such frame, or adds
    /// garbage frames. A stack that cannot be finished is counted and
    /// marked partial (lost "unwind_*").
    #[arg(
        long,
        value_enum,
        default_value_t = UnwindMode::Auto,
        value_name = "MODE",
        help_heading = "Stacks"
    )]
    pub unwind: UnwindMode,
    /// `--unwind auto|dwarf`: rows of unwind tables the kernel holds, for every
    /// file of every process (8 bytes each, allocated at start: the default
    /// 4M rows take 32 MiB, plus 8 MiB for the mappings of up to 4,096
    /// processes; glibc needs about 28,000 rows, python3 with its modules
    /// about 240,000, each file ~5% more for its page index). Files that
    /// do not fit are counted under lost
    /// "unwind_table_full" and their frames cut stacks short.
    #[arg(
        long,
        default_value_t = 4 << 20,
        value_name = "N",
        value_parser = at_least_one::<u32>,
        help_heading = "Stacks"
    )]
    pub unwind_rows: u32,
    #[command(flatten)]
    pub live: LiveOptions,
    #[command(flatten)]
    pub regions: RegionOptions,
}

/// What is recorded, and when: calls outside cost the trap, no stack walk.
#[derive(Args, Debug, Clone)]
pub struct RegionOptions {
    /// Record only the allocations a thread makes while FUNCTION is on its
    /// stack (a function of the program or its libraries; FUNCTION@MODULE
    /// for one module; C++: its mangled name), e.g. --while handle_request.
    /// Decided in the kernel per call. Repeatable: inside any of them. A
    /// child forked inside starts outside. FUNCTION gets a return probe: a
    /// C++ exception thrown through it ends the program, and a longjmp out
    /// of it leaves the thread inside (and its stacks may then read a
    /// wrong frame). Under monitor's budget a call of FUNCTION under way
    /// when the probes go in is not seen (a function that runs for
    /// seconds is undercounted: use --exact). monitor also looks for
    /// FUNCTION in the files of the processes it selects as they start: a
    /// name in no file mapped at its start is then a warning, not an
    /// error.
    #[arg(long = "while", value_name = "FUNCTION", value_parser = region_fn, help_heading = "Regions")]
    pub while_fns: Vec<CustomFunction>,
    /// Record nothing for the first SECS of the profile (start-up; e.g. 2,
    /// 500ms).
    #[arg(long, value_name = "SECS", value_parser = positive_seconds, help_heading = "Regions")]
    pub delay: Option<f64>,
    /// Start paused; record from the moment memprof receives SIGNAL
    /// (e.g. USR1: `kill -USR1 $(pidof memprof)`).
    #[arg(long, value_name = "SIGNAL", value_parser = signal, help_heading = "Regions")]
    pub start_on: Option<Signal>,
    /// Pause and resume recording each time memprof receives SIGNAL.
    #[arg(long, value_name = "SIGNAL", value_parser = signal, help_heading = "Regions")]
    pub toggle_on: Option<Signal>,
}

impl RegionOptions {
    /// Whether recording starts paused.
    pub fn starts_paused(&self) -> bool {
        self.delay.is_some() || self.start_on.is_some()
    }

    /// Whether some calls may go unrecorded.
    pub fn is_limited(&self) -> bool {
        !self.while_fns.is_empty() || self.starts_paused() || self.toggle_on.is_some()
    }
}

/// `--unwind`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum)]
pub enum UnwindMode {
    /// Unwind tables (today the same as dwarf: frame pointers are never
    /// mixed in, as a frame pointer in code built without them is a guess).
    Auto,
    /// Unwind tables (.eh_frame) of every mapped file, walked in the kernel.
    Dwarf,
    /// Frame pointers.
    Fp,
}

impl UnwindMode {
    /// Whether the kernel walks with unwind tables.
    pub fn tables(self) -> bool {
        matches!(self, UnwindMode::Auto | UnwindMode::Dwarf)
    }
}

#[derive(Args, Debug, Clone)]
pub struct LiveOptions {
    /// Track every block until it is freed: report what is still
    /// allocated (live bytes and count, age of the oldest block) per stack,
    /// each process's peak, and short-lived "temporary" allocations. At the
    /// end of `trace`, what is still allocated is the leak report.
    #[arg(long, help_heading = "Live heap")]
    pub live: bool,
    /// Live blocks tracked at most; up to N, none is lost. Beyond, new
    /// blocks are counted in the totals but not tracked ("untracked", and
    /// lost "live_table_full"). Kernel memory taken at start: a table of
    /// 2N slots rounded up to a power of two, 88 bytes each, and a hash
    /// map of N entries for blocks the table has no room for near their
    /// hash, about 153 bytes each (88 + 73 MiB for the default).
    #[arg(
        long,
        default_value_t = 500_000,
        value_name = "N",
        value_parser = at_least_one::<u32>,
        requires = "live",
        help_heading = "Live heap"
    )]
    pub max_live: u32,
    /// Tests only: slots of the pointer table (rounded up to a power of
    /// two) instead of 2 x --max-live; blocks it has no room for go to the
    /// overflow map.
    #[arg(long, hide = true, value_name = "N", requires = "live")]
    pub live_slots: Option<u32>,
    /// Tests only: slots for the process images' exact heaps (rounded up
    /// to a power of two) instead of 16,384.
    #[arg(long, hide = true, value_name = "N", requires = "live")]
    pub heap_slots: Option<u32>,
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

/// A time span of more than zero seconds (a period).
fn positive_seconds(s: &str) -> Result<f64, String> {
    match s.parse::<Seconds>()? {
        Seconds(secs) if secs > 0.0 && secs < 1e9 => Ok(secs),
        _ => Err("must be more than 0 seconds".to_string()),
    }
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
        value_parser = at_least_one::<usize>,
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
    /// Keep only the stacks with a frame whose function or source file
    /// matches REGEX (e.g. 'parse_|json', 'src/cache\.c'); the report
    /// says what the filters hid. On a saved report: among the stacks and
    /// frames it was saved with.
    #[arg(long, value_name = "REGEX", value_parser = pattern, help_heading = "Filters")]
    pub focus: Option<regex::Regex>,
    /// Drop the stacks with a frame whose function or source file matches
    /// REGEX (applied after --focus).
    #[arg(long, value_name = "REGEX", value_parser = pattern, help_heading = "Filters")]
    pub ignore: Option<regex::Regex>,
    /// Drop the N innermost frames of every stack (allocation wrappers
    /// such as xmalloc), so that frame 0 is their caller and stacks that
    /// differ only there are summed. A frame is a call with the functions
    /// inlined into it; the outermost frame always stays.
    #[arg(long, default_value_t = 0, value_name = "N", help_heading = "Filters")]
    pub skip_frames: usize,
}

/// A regular expression (Rust's `regex` syntax, as ripgrep's).
fn pattern(s: &str) -> Result<regex::Regex, String> {
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
}

impl Format {
    /// Whether the format draws the heap over time.
    pub fn is_timeline(self) -> bool {
        matches!(self, Format::Timeline | Format::Chrome)
    }
}

impl ProfileOptions {
    /// Whether the kernel counts calls in sampling units (--sample-bytes,
    /// --usdt): user space turns them into (estimated) calls.
    pub fn sampling(&self) -> bool {
        self.sample_bytes.is_some() || self.usdt
    }

    /// The timeline's sampling period, when one is taken.
    pub fn timeline_period(&self) -> Option<f64> {
        self.timeline_period
            .or(self.report.format.is_timeline().then_some(0.1))
    }
}

/// A byte count given as `4096`, `64K`, `64KiB`, `1.5M`... K, M, G and T
/// are powers of 1024 everywhere, with or without `B`/`iB` (`512K` and
/// `512KiB` and `512KB` are all 524,288 bytes), as allocators and
/// `ls -h` count.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ByteCount(pub u64);

impl FromStr for ByteCount {
    type Err = String;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        let invalid = || format!("'{s}' is not a byte count (try 4096, 64K or 1MiB)");
        let text = s.trim();
        let split = text
            .find(|c: char| !(c.is_ascii_digit() || c == '.'))
            .unwrap_or(text.len());
        let (number, unit) = text.split_at(split);
        let shift = match unit.trim().to_ascii_lowercase().as_str() {
            "" | "b" => 0,
            "k" | "kb" | "kib" => 10,
            "m" | "mb" | "mib" => 20,
            "g" | "gb" | "gib" => 30,
            "t" | "tb" | "tib" => 40,
            _ => return Err(invalid()),
        };
        if let Ok(whole) = number.parse::<u64>() {
            return whole
                .checked_mul(1 << shift)
                .map(ByteCount)
                .ok_or_else(invalid);
        }
        let value: f64 = number.parse().map_err(|_| invalid())?;
        let bytes = value * (1u64 << shift) as f64;
        if !bytes.is_finite() || bytes >= u64::MAX as f64 || bytes.fract() != 0.0 {
            return Err(invalid());
        }
        Ok(ByteCount(bytes as u64))
    }
}

/// A count that must be at least 1 (a table size, a depth).
fn at_least_one<T: FromStr + PartialOrd + From<u8>>(s: &str) -> Result<T, String> {
    match s.parse::<T>() {
        Ok(n) if n >= T::from(1u8) => Ok(n),
        Ok(_) => Err("must be at least 1".to_string()),
        Err(_) => Err(format!("'{s}' is not a whole number")),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn byte_units_are_powers_of_1024() {
        for (text, bytes) in [
            ("4096", 4096),
            ("512K", 512 << 10),
            ("512k", 512 << 10),
            ("512KiB", 512 << 10),
            ("512KB", 512 << 10),
            ("64 KiB", 64 << 10),
            ("1M", 1 << 20),
            ("1.5M", 3 << 19),
            ("2G", 2 << 30),
            ("10B", 10),
        ] {
            assert_eq!(text.parse::<ByteCount>(), Ok(ByteCount(bytes)), "{text}");
        }
        for bad in ["lots", "", "K", "1.3B", "99999999999T", "1.5Q"] {
            assert!(bad.parse::<ByteCount>().is_err(), "{bad}");
        }
    }

    #[test]
    fn counts_start_at_one() {
        assert_eq!(at_least_one::<u32>("3"), Ok(3));
        assert!(at_least_one::<u32>("0").is_err());
        assert!(at_least_one::<usize>("x").is_err());
    }
}
