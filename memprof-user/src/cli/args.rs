//! Each command's arguments.
use std::path::PathBuf;

use clap::{Args, ValueEnum};

use super::{profile::ProfileOptions, values::positive_percent};
use crate::{
    human::numbers::{at_least_one, ByteCount},
    monitor::listen::ListenAddress,
    report::options::{pattern, ReportOptions},
};

#[derive(Args, Debug)]
pub struct ReportArgs {
    /// A report written by `--format json`.
    #[arg(value_name = "FILE.json")]
    pub file: PathBuf,
    /// Read a saved report of at most SIZE (it is held in memory whole).
    #[arg(
        hide_short_help = true,
        long,
        default_value = "1G",
        value_name = "SIZE"
    )]
    pub max_report_size: ByteCount,
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
    /// Read saved reports of at most SIZE each (each is held in memory
    /// whole).
    #[arg(
        hide_short_help = true,
        long,
        default_value = "1G",
        value_name = "SIZE"
    )]
    pub max_report_size: ByteCount,
}

#[derive(ValueEnum, Clone, Copy, Debug, PartialEq, Eq)]
pub enum DiffFormat {
    Text,
    Json,
}

/// `trace`: the command and whom it runs as. (The command comes first:
/// declared after the flattened options, it would be listed under their
/// last heading.)
#[derive(Args, Debug)]
pub struct TraceArgs {
    /// The command to run, and its arguments (after `--`).
    #[arg(required = true, last = true, value_name = "CMD")]
    pub command: Vec<String>,
    #[command(flatten)]
    pub options: ProfileOptions,
    #[command(flatten)]
    pub run_as: RunAs,
}

/// Whom `trace` runs the command as.
#[derive(Args, Debug)]
#[command(next_help_heading = "Target")]
pub struct RunAs {
    /// Run the command as USER (default: the user who ran sudo).
    ///
    /// Run the command as USER (a name or a uid), with that user's groups
    /// and HOME; memprof itself keeps root. Default: under sudo, the user
    /// who ran sudo (SUDO_UID, SUDO_GID), so that the command runs and
    /// writes its files as in real use; else memprof's own user.
    /// `--user root` keeps root.
    #[arg(long, value_name = "USER")]
    pub user: Option<String>,
}

#[derive(Args, Debug)]
pub struct AttachArgs {
    /// Process id to profile; repeat for several processes.
    #[arg(long = "pid", short = 'p', required = true, value_name = "PID")]
    pub pids: Vec<i32>,
    /// Stop after this long (90, 30s, 5m, 1h; default: Ctrl-C or exit).
    #[arg(long, value_name = "DURATION", value_parser = crate::cli::values::positive_seconds)]
    pub duration: Option<f64>,
    #[command(flatten)]
    pub options: ProfileOptions,
}

/// `monitor`: whom it watches, what it serves, what it may cost.
#[derive(Args, Debug)]
pub struct MonitorArgs {
    #[command(flatten)]
    pub selection: Selection,
    #[command(flatten)]
    pub serving: ServingOptions,
    #[command(flatten)]
    pub timing: MonitorTiming,
    #[command(flatten)]
    pub limits: MonitorLimits,
    #[command(flatten)]
    pub cost: CostOptions,
    #[command(flatten)]
    pub options: ProfileOptions,
}

/// The processes `monitor` watches.
#[derive(Args, Debug)]
#[command(next_help_heading = "Target")]
pub struct Selection {
    /// A process to watch; repeatable.
    #[arg(long = "pid", short = 'p', value_name = "PID")]
    pub pids: Vec<i32>,
    /// Watch processes whose name (comm) matches REGEX; repeatable.
    ///
    /// Watch the processes whose name (comm) matches REGEX, running or
    /// started later; repeatable.
    #[arg(long, value_name = "REGEX", value_parser = pattern)]
    pub comm: Vec<regex::Regex>,
    /// Watch the processes of this executable, running or started later;
    /// repeatable.
    #[arg(long, value_name = "PATH")]
    pub exe: Vec<PathBuf>,
    /// Watch the processes in this cgroup or below it; repeatable.
    ///
    /// Watch the processes in this cgroup or below it, running or started
    /// later: its directory (/sys/fs/cgroup/system.slice/x.service) or its
    /// path as /proc/PID/cgroup shows it (/system.slice/x.service);
    /// repeatable. With no --pid, --comm, --exe or --cgroup, memprof
    /// watches every process on the host (but itself).
    #[arg(long = "cgroup", value_name = "PATH")]
    pub cgroups: Vec<PathBuf>,
}

/// What `monitor` serves and writes while it runs.
#[derive(Args, Debug)]
#[command(next_help_heading = "Serving")]
pub struct ServingOptions {
    /// Where to serve: HOST:PORT, unix:/PATH or none.
    ///
    /// Where the HTTP endpoints listen: HOST:PORT (another interface only
    /// when named: without TLS or authentication, anyone who reaches it
    /// reads every process's command lines and paths), unix:/PATH (a unix
    /// socket, mode 0660), or none; the last one given counts.
    #[arg(
        long,
        default_value = "127.0.0.1:9464",
        value_name = "ADDR",
        overrides_with = "listen"
    )]
    pub listen: ListenAddress,
    /// With --listen unix:/PATH: the group (a name or a gid) that may
    /// connect to the socket.
    #[arg(hide_short_help = true, long, value_name = "GROUP")]
    pub listen_group: Option<String>,
    /// TLS and basic authentication for the endpoints, in the file format
    /// of Prometheus' exporter-toolkit (node_exporter's
    /// --web.config.file): tls_server_config (cert_file, key_file,
    /// client_auth_type, client_ca_file) and basic_auth_users (bcrypt
    /// hashes). See docs/monitoring.md.
    #[arg(hide_short_help = true, long, value_name = "FILE")]
    pub web_config: Option<PathBuf>,
    /// Call sites per process in memprof_site_allocated_bytes_total (the
    /// largest by bytes allocated), so that each process's series stay
    /// few. A process that ended stays in the figures for --retention,
    /// then goes.
    #[arg(hide_short_help = true, long, default_value_t = 10, value_name = "N")]
    pub metrics_sites: usize,
    /// The labels that name each process's series on /metrics, of pid,
    /// comm, exe and container (e.g. `comm,exe` drops pid: the series of
    /// processes named alike are then summed, and stay across restarts).
    #[arg(
        hide_short_help = true,
        long,
        default_value = "pid,comm,exe,container",
        value_name = "LIST",
        value_parser = crate::monitor::metrics::process_labels_of
    )]
    pub metrics_labels: crate::monitor::metrics::ProcessLabels,
    /// Also write a report to DIR every interval and at the end.
    ///
    /// Also write a report to DIR every --out-interval (default 60 s) and at
    /// the end: JSON (docs/json-schema.md), or pprof profiles with
    /// --format pprof, named memprof-TIME by UTC time. SIGHUP writes one
    /// at once.
    #[arg(long, value_name = "DIR")]
    pub out: Option<PathBuf>,
    /// Files kept in --out DIR; the oldest go first.
    #[arg(
        hide_short_help = true,
        long,
        default_value_t = 100,
        value_name = "N",
        value_parser = at_least_one::<usize>)]
    pub out_keep: usize,
    /// What --out DIR's files may take in all (e.g. 500M); the oldest go
    /// first.
    #[arg(
        hide_short_help = true,
        long,
        default_value = "1G",
        value_name = "BYTES"
    )]
    pub out_max_size: ByteCount,
}

/// `monitor`'s periods, each of which --interval sets when it is not given.
#[derive(Args, Debug)]
#[command(next_help_heading = "Serving")]
pub struct MonitorTiming {
    /// How often the terminal view is redrawn (e.g. 5, 500ms; default:
    /// --interval, else 2 s).
    #[arg(
        long,
        hide_short_help = true,
        value_name = "SECS",
        value_parser = crate::cli::values::positive_seconds
    )]
    pub refresh: Option<f64>,
    /// How often a report is written to --out DIR (e.g. 30s, 5m;
    /// default: --interval, else 60 s).
    #[arg(
        long,
        hide_short_help = true,
        value_name = "SECS",
        value_parser = crate::cli::values::positive_seconds
    )]
    pub out_interval: Option<f64>,
    /// How long an ended process stays in the figures (/metrics, pprof,
    /// reports) before it goes (e.g. 5m; default: --interval, else 60 s).
    #[arg(
        long,
        hide_short_help = true,
        value_name = "SECS",
        value_parser = crate::cli::values::positive_seconds
    )]
    pub retention: Option<f64>,
}

/// `monitor`'s process table.
#[derive(Args, Debug)]
#[command(next_help_heading = "Limits")]
pub struct MonitorLimits {
    /// Processes profiled at once (the kernel's process table, under
    /// 100 bytes each). One that starts when the table is full is not profiled; its
    /// calls are counted as lost "process_table_full". Ended processes
    /// leave the table --retention after their end.
    #[arg(
        hide_short_help = true,
        long,
        default_value_t = 16384,
        value_name = "N",
        value_parser = at_least_one::<u32>)]
    pub max_processes: u32,
}

/// What `monitor` may cost each process.
#[derive(Args, Debug)]
#[command(next_help_heading = "Cost")]
pub struct CostOptions {
    /// What memprof may cost each process, in percent of one CPU.
    ///
    /// memprof measures its probes' cost per allocation here at start and each
    /// process's allocation rate every second; a process (with what it
    /// forks) that would cost more has its probes in for one window of
    /// each span of 3-60 s only (its duty cycle, aiming at 80% of the
    /// budget; at least 10 ms at a random time), and its figures are
    /// estimates scaled from the windows by its CPU time in them
    /// (memprof_duty_cycle_ratio,
    /// memprof_overhead_ratio; JSON duty_cycle, overhead). The kernel
    /// counts each process's traps against its allowance as they happen:
    /// a new process's probes go out the moment it has spent a period's
    /// budget, not at the next read. On the whole
    /// host every process's probes go in and out together, as the
    /// costliest process's budget allows. With --live the cost is
    /// measured, not kept. Sampling is on (--sample-bytes 512K) unless
    /// --exact.
    #[arg(
        long,
        default_value_t = 1.0,
        value_name = "PCT",
        value_parser = positive_percent)]
    pub max_overhead: f64,
    /// Count every call: no sampling, no budget.
    #[arg(hide_short_help = true, long, conflicts_with_all = ["sample_bytes", "max_overhead"])]
    pub exact: bool,
}

#[derive(Args, Debug)]
pub struct CompletionsArgs {
    /// The shell.
    #[arg(value_enum, value_name = "SHELL")]
    pub shell: clap_complete::Shell,
}

#[derive(Args, Debug)]
pub struct ManArgs {
    /// A command (trace, attach, monitor, report, diff, doctor, completions, man):
    /// its own page.
    #[arg(value_name = "COMMAND")]
    pub command: Option<String>,
}
