//! The command line: what the user asks for, parsed by clap. `args` holds
//! each command's arguments, `profile` the options the profiling
//! commands share, `values` the parsers clap needs; `settings` turns the
//! options into the settings of the kernel side and the probes.
pub mod args;
pub mod profile;
pub mod settings;
pub mod values;

pub use args::{
    AttachArgs, CompletionsArgs, DiffArgs, DiffFormat, ManArgs, MonitorArgs, ReportArgs, TraceArgs,
};
use clap::{Parser, Subcommand};
pub use profile::ProfileOptions;

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

const SHORT_ABOUT: &str = "Which line of code allocated the memory: an eBPF allocation profiler";

/// Under -h: where the rest is.
const MORE: &str = "All options, what each costs, and examples: --help.";

const EXAMPLES: &str = "\
Examples:
  sudo memprof trace -- ./my-program --its-args
      profile a command from start to exit (children too), then report
  sudo memprof attach --pid 1234 --duration 30
      profile a running process for 30 s (or until Ctrl-C)
  sudo memprof trace --top 5 --depth 3 --group-by caller -- make -j2
      the five call sites that allocated most, summed by direct caller
  sudo memprof trace --format json -o before.json -- ./my-program
      every stack and frame, machine-readable (docs/json-schema.md)
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

/// `--version`: the release and the commit it was built from.
pub const VERSION: &str = concat!(env!("CARGO_PKG_VERSION"), " (", env!("MEMPROF_COMMIT"), ")");

#[derive(Parser, Debug)]
#[command(
    name = "memprof",
    version = VERSION,
    about = SHORT_ABOUT,
    long_about = ABOUT,
    after_help = MORE,
    after_long_help = EXAMPLES
)]
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
    #[command(after_help = MORE, after_long_help = EXAMPLES)]
    Trace(TraceArgs),
    /// Profile running processes until Ctrl-C, --duration, or their exit.
    #[command(after_help = MORE, after_long_help = EXAMPLES)]
    Attach(AttachArgs),
    /// Watch processes until SIGTERM and serve what they allocate over HTTP.
    ///
    /// Watch processes until SIGTERM or Ctrl-C and serve what they
    /// allocate over HTTP: Prometheus metrics, pprof profiles as Go's
    /// net/http/pprof serves them (go tool pprof, Grafana Alloy, Parca).
    ///
    /// Watches every process on the host (but memprof), containers
    /// included; or those named by --pid, --comm, --exe and --cgroup: those
    /// running, and (--comm, --exe, --cgroup) those started later, from
    /// their exec on. A process that ended stays --retention, then goes.
    /// The final report is printed at the end, as for attach.
    #[command(after_help = MORE, after_long_help = MONITOR_EXAMPLES)]
    Monitor(Box<MonitorArgs>),
    /// Render a saved JSON report again, in any format (no root needed).
    ///
    /// Cut as its options say: --top, --depth, --sort, --focus, --ignore,
    /// --group-by. A report saved as JSON keeps every stack and frame
    /// unless it was saved with --top or --depth.
    Report(ReportArgs),
    /// Compare two saved JSON reports, stack by stack, largest growth first.
    ///
    /// Compare two saved JSON reports: per-stack change in bytes and
    /// calls, largest growth first. Stacks match by their symbolized
    /// frames, so reports of different runs of one program compare.
    Diff(DiffArgs),
    /// Check, without profiling anything, whether memprof can run here.
    ///
    /// Kernel version, capabilities, BTF, uprobes, tracefs, lockdown, the
    /// preemption model, the PID namespace, the BPF JIT,
    /// perf_event_paranoid, then memprof's own BPF programs loaded and
    /// verified (and dropped). Each line says ok, note (memprof runs with
    /// less) or FAIL, with what to do. Exits 1 when something fails.
    Doctor,
    /// Print the completion script of a shell (bash, zsh, fish, elvish, powershell).
    ///
    /// bash: `source <(memprof completions bash)`, or save it as
    /// /usr/share/bash-completion/completions/memprof. zsh: save it as
    /// _memprof in a directory of $fpath. fish: save it as
    /// ~/.config/fish/completions/memprof.fish.
    Completions(CompletionsArgs),
    /// Print a man page (roff): `memprof man | man -l -`.
    ///
    /// `memprof man` is memprof(1), `memprof man trace` memprof-trace(1),
    /// and so on for each command.
    Man(ManArgs),
}
