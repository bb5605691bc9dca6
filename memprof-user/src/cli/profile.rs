//! The options `trace`, `attach` and `monitor` share, one struct per
//! heading of their help.
use std::path::PathBuf;

use clap::Args;
use nix::sys::signal::Signal;

use super::values::{alloc_fn, free_fn, positive_seconds, region_fn, signal, Seconds};
use crate::{
    discover::allocators::CustomFunction,
    human::numbers::{count_at_least_one, ByteCount},
    report::options::ReportOptions,
};

/// What `trace`, `attach` and `monitor` share: what to probe, how to walk
/// stacks, what to keep and how to report it.
#[derive(Args, Debug, Clone)]
pub struct ProfileOptions {
    #[command(flatten)]
    pub report: ReportOptions,
    #[command(flatten)]
    pub progress: ProgressOptions,
    #[command(flatten)]
    pub limits: LimitOptions,
    #[command(flatten)]
    pub target: TargetOptions,
    #[command(flatten)]
    pub symbols: SymbolOptions,
    #[command(flatten)]
    pub sampling: SamplingOptions,
    #[command(flatten)]
    pub stacks: StackOptions,
    #[command(flatten)]
    pub live: LiveOptions,
    #[command(flatten)]
    pub regions: RegionOptions,
    #[command(flatten)]
    pub dev: DevOptions,
}

/// What is reported while the profile runs.
#[derive(Args, Debug, Clone)]
#[command(next_help_heading = "Reporting")]
pub struct ProgressOptions {
    /// Also print a report every SECS seconds (totals so far; e.g. 10, 0.5, 1m).
    #[arg(hide_short_help = true, long, value_name = "SECS", value_parser = positive_seconds)]
    pub interval: Option<f64>,
    /// Sample the heap every SECS (e.g. 100ms, 0.5) for a timeline: the
    /// kernel's per-call-site counters are read, nothing is paid per
    /// allocation. On by default (100ms) with --format timeline and
    /// chrome; give it with --format json to render a timeline later
    /// (`memprof report saved.json --format timeline`).
    #[arg(hide_short_help = true, long, value_name = "SECS", value_parser = positive_seconds)]
    pub timeline_period: Option<f64>,
    /// Print each probed function, its module and probe offset on stderr
    /// (the JSON report lists them under "probes" in any case).
    #[arg(hide_short_help = true, long, short = 'v')]
    pub verbose: bool,
}

/// The kernel's tables: how many sites and stacks they hold.
#[derive(Args, Debug, Clone)]
#[command(next_help_heading = "Limits")]
pub struct LimitOptions {
    /// Capacity of the kernel table of distinct (process, stack, caller,
    /// function) entries. When full, further new stacks are counted under
    /// lost "map_full". (With --live, up to 4,096 more: the first sites
    /// take an id of their own, 56 bytes of kernel memory per id and CPU.)
    #[arg(
        hide_short_help = true,
        long,
        default_value_t = 65536,
        value_name = "N",
        value_parser = count_at_least_one)]
    pub max_stacks: u32,
    /// Capacity of the kernel's stack table (distinct call stacks, 128
    /// frames each: 2 KiB of kernel memory per stack stored, taken as
    /// stacks come, up to 128 MiB by default; room for one stack per
    /// --max-stacks entry). When it is full, new stacks keep only their direct caller
    /// and are counted under lost "stack_collision".
    #[arg(
        hide_short_help = true,
        long,
        default_value_t = 65536,
        value_name = "N",
        value_parser = count_at_least_one)]
    pub stack_map_size: u32,
}

/// What is probed beyond the known allocators, and how.
#[derive(Args, Debug, Clone)]
#[command(next_help_heading = "Target")]
pub struct TargetOptions {
    /// Probe every function at its first instruction. By default a probe
    /// moves past leading instructions the kernel would have to single-step
    /// (glibc's free starts with one) to the first one it emulates, when
    /// that provably changes nothing memprof reads (glibc's free: ~16x cheaper).
    #[arg(hide_short_help = true, long)]
    pub no_probe_offsets: bool,
    /// Probe this C library instead of the one the target uses.
    #[arg(hide_short_help = true, long, value_name = "PATH")]
    pub libc: Option<PathBuf>,
    /// Count calls to a function of your own as allocations:
    /// SYMBOL[@MODULE]:size=N[,count=N][,ptr=N], N the 1-based argument
    /// position of the size in bytes (times count, for calloc-like
    /// functions) and of the block a realloc-like function is given; the
    /// block is the return value. Looked for in the program and its
    /// libraries (or MODULE: a path or file name). Reports name the
    /// allocator SYMBOL; what it allocates inside (malloc calls) counts once,
    /// as its own. Repeatable. Example: --alloc-fn rt_alloc:size=1.
    /// A Go function (Go 1.17 and later) is probed at its entry only, its
    /// arguments read from Go's registers, and not with --live (Go moves
    /// its stacks: a return probe would kill the program). Go's own heap
    /// (runtime.mallocgc) is counted without it.
    #[arg(hide_short_help = true, long = "alloc-fn", value_name = "SPEC", value_parser = alloc_fn)]
    pub alloc_fns: Vec<CustomFunction>,
    /// The release function of an --alloc-fn allocator (for --live):
    /// SYMBOL[@MODULE]:ptr=N, N the 1-based position of the block.
    /// Repeatable. Example: --free-fn rt_free:ptr=1
    #[arg(hide_short_help = true, long = "free-fn", value_name = "SPEC", value_parser = free_fn)]
    pub free_fns: Vec<CustomFunction>,
    /// Do not count direct mappings. By default the anonymous mmap and
    /// mremap calls and the sbrk a program makes itself through the C
    /// library (not from inside a probed allocator, whose memory is counted
    /// already) are counted per call site as allocators "mmap", "mremap"
    /// and "brk", always exactly; with --live, munmap (whole or part of a
    /// mapping) ends what it unmaps. Off with --unwind fp (telling the
    /// program's mappings from malloc's takes whole stacks).
    #[arg(hide_short_help = true, long)]
    pub no_mmap: bool,
    /// Count only what reaches malloc in CPython processes. By default
    /// Python's own allocators are probed like malloc's family: each
    /// object from PyObject_Malloc, PyMem_Malloc and their family (calloc,
    /// realloc, free) counted with its size, and the malloc calls and
    /// arena mmaps made inside them not counted a second time.
    #[arg(hide_short_help = true, long)]
    pub no_python_allocators: bool,
}

/// Where names and file:line come from.
#[derive(Args, Debug, Clone)]
#[command(next_help_heading = "Symbols")]
pub struct SymbolOptions {
    /// Where separate debug files are looked for (repeatable; default
    /// /usr/lib/debug and /lib/debug): through a module's .gnu_debuglink,
    /// and by build id (DIR/.build-id/xx/rest.debug). Then, for stripped
    /// modules, from the debuginfod servers in DEBUGINFOD_URLS (cached in
    /// DEBUGINFOD_CACHE_PATH, else ~/.cache/debuginfod_client, shared with
    /// gdb and perf). Without names, .symtab/.dynsym are used; a frame with
    /// none prints as module+0xOFFSET (the same in every run), and reports
    /// carry each module's build id.
    #[arg(hide_short_help = true, long = "debug-dir", value_name = "DIR")]
    pub debug_dirs: Vec<PathBuf>,
    /// How long reading one file's symbols may take (its debug file and
    /// a debuginfod download included; e.g. 30, 2m). A file that takes
    /// longer is shown as module+0xOFFSET, listed under "not symbolized"
    /// with the reason, and not read again. Files are read on a thread of
    /// their own: SIGTERM or Ctrl-C still gives the report within 2 s.
    #[arg(hide_short_help = true, long, value_name = "SECS", default_value = "30", value_parser = positive_seconds)]
    pub symbol_time_limit: f64,
}

/// Which calls are recorded.
#[derive(Args, Debug, Clone)]
#[command(next_help_heading = "Sampling")]
pub struct SamplingOptions {
    /// Record a sample of the calls (e.g. 512K): estimates, far cheaper.
    ///
    /// Record a sample of the calls, not every one: each allocated byte is
    /// a sample point with chance 1/BYTES (Poisson sampling, as tcmalloc,
    /// jemalloc and heapprofd do; e.g. 512K: K, M, G are powers of 1024). Reports show unbiased
    /// estimates, marked as such. Much cheaper without --live; with --live
    /// only sampled blocks are tracked (and, on kernels 6.13 and later,
    /// only sampled calls of malloc-like functions take a return probe).
    #[arg(long, value_name = "BYTES")]
    pub sample_bytes: Option<ByteCount>,
    /// Programs that sample their own allocations and announce them
    /// through USDT probes (provider otel_memory or ddheap: alloc(ptr,
    /// size, weight), free(ptr)) are profiled through those probes instead
    /// of the allocators' entry points: unsampled calls then cost nothing.
    /// Their figures are the programs' estimates, marked as such.
    #[arg(hide_short_help = true, long)]
    pub usdt: bool,
}

/// How stacks are walked.
#[derive(Args, Debug, Clone)]
#[command(next_help_heading = "Stacks")]
pub struct StackOptions {
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
        hide_short_help = true,
        long,
        value_enum,
        default_value_t = UnwindMode::Auto,
        value_name = "MODE")]
    pub unwind: UnwindMode,
    /// `--unwind auto|dwarf`: rows of unwind tables the kernel holds, for every
    /// file of every process (8 bytes each, allocated at start: the default
    /// 4M rows take 32 MiB, plus 8 MiB for the mappings of up to 4,096
    /// processes; glibc needs about 28,000 rows, python3 with its modules
    /// about 240,000, each file ~5% more for its page index). Files that
    /// do not fit are counted under lost
    /// "unwind_table_full" and their frames cut stacks short.
    #[arg(
        hide_short_help = true,
        long,
        default_value = "4M",
        value_name = "N",
        value_parser = count_at_least_one)]
    pub unwind_rows: u32,
}

/// Benchmarks and tests only: hidden from --help.
#[derive(Args, Debug, Clone)]
pub struct DevOptions {
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
}

/// `--live`: every block tracked until it is freed.
#[derive(Args, Debug, Clone)]
#[command(next_help_heading = "Live heap")]
pub struct LiveOptions {
    /// Track every block until it is freed: what is still allocated, leaks.
    ///
    /// Track every block until it is freed: report what is still
    /// allocated (live bytes and count, age of the oldest block) per stack,
    /// each process's peak, and short-lived "temporary" allocations. At the
    /// end of `trace`, what is still allocated is the leak report.
    #[arg(long)]
    pub live: bool,
    /// Live blocks tracked at most; up to N, none is lost. Beyond, new
    /// blocks are counted in the totals but not tracked ("untracked", and
    /// lost "live_table_full"). Kernel memory taken at start: a table of
    /// 2N slots rounded up to a power of two, 88 bytes each, and a hash
    /// map of N entries for blocks the table has no room for near their
    /// hash, about 153 bytes each (88 + 73 MiB for the default).
    #[arg(
        hide_short_help = true,
        long,
        default_value_t = 500_000,
        value_name = "N",
        value_parser = count_at_least_one,
        requires = "live")]
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
        hide_short_help = true,
        long,
        default_value = "1ms",
        value_name = "TIME",
        requires = "live"
    )]
    pub temp_threshold: Seconds,
    /// Show only blocks at least this old (e.g. 30, 5m): a leak report of
    /// a long-running process.
    #[arg(hide_short_help = true, long, value_name = "SECS", requires = "live")]
    pub min_age: Option<Seconds>,
}

/// What is recorded, and when: calls outside cost the trap, no stack walk.
#[derive(Args, Debug, Clone)]
#[command(next_help_heading = "Regions")]
pub struct RegionOptions {
    /// Record only the allocations made while FUNCTION is on the stack.
    ///
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
    #[arg(long = "while", value_name = "FUNCTION", value_parser = region_fn)]
    pub while_fns: Vec<CustomFunction>,
    /// Record nothing for the first SECS of the profile (start-up; e.g. 2,
    /// 500ms).
    #[arg(hide_short_help = true, long, value_name = "SECS", value_parser = positive_seconds)]
    pub delay: Option<f64>,
    /// Start paused; record from the moment memprof receives SIGNAL
    /// (e.g. USR1: `kill -USR1 $(pidof memprof)`).
    #[arg(hide_short_help = true, long, value_name = "SIGNAL", value_parser = signal)]
    pub start_on: Option<Signal>,
    /// Pause and resume recording each time memprof receives SIGNAL.
    #[arg(hide_short_help = true, long, value_name = "SIGNAL", value_parser = signal)]
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

impl ProfileOptions {
    /// Whether the kernel counts calls in sampling units (--sample-bytes,
    /// --usdt): user space turns them into (estimated) calls.
    pub fn sampling(&self) -> bool {
        self.sampling.sample_bytes.is_some() || self.sampling.usdt
    }

    /// The timeline's sampling period, when one is taken.
    pub fn timeline_period(&self) -> Option<f64> {
        self.progress
            .timeline_period
            .or(self.report.format.is_timeline().then_some(0.1))
    }
}
