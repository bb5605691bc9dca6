//! The commands: each turns its options into settings, puts the probes
//! in place and runs the session to its end.
pub mod recording;
pub mod session;

use std::{path::Path, time::Duration};

use anyhow::Result;
use memprof_common::settings::{Gating, WatchExecs};

use crate::{
    cli::{
        AttachArgs, Cli, Command, DiffArgs, DiffFormat, MonitorArgs, ProfileOptions, ReportArgs,
        TraceArgs,
    },
    commands::{
        recording::Recording,
        session::{Session, Target},
    },
    discover::{allocators, launch, pid},
    human::error::{one_line, UserError},
    monitor::{budget, calibrate, evict, http, out_dir},
    probes,
    probes::{LiveSettings, ProbeSet, Probes, Settings},
    report, unwind,
};

pub fn run(cli: Cli) -> Result<i32> {
    match cli.command {
        Command::Trace(args) => trace(args),
        Command::Attach(args) => attach(args),
        Command::Report(args) => rerender(args),
        Command::Diff(args) => diff(args),
        Command::Monitor(args) => monitor(args),
    }
}

fn rerender(args: ReportArgs) -> Result<i32> {
    report::check_output(args.report.output.as_deref())?;
    let saved = report::saved::load(&args.file)?;
    let report = report::saved::recut(saved, &args.report);
    report::emit(&report, args.report.format, args.report.output.as_deref())?;
    Ok(0)
}

fn diff(args: DiffArgs) -> Result<i32> {
    report::check_output(args.output.as_deref())?;
    let base = report::saved::load(&args.base)?;
    let new = report::saved::load(&args.new)?;
    if let Some(reason) = report::diff::incomparable(&base, &new) {
        return Err(UserError::new(format!("cannot compare these reports: {reason}")).into());
    }
    let diff = report::diff::diff(&base, &new, args.top);
    let rendered = match args.format {
        DiffFormat::Text => report::diff::render_text(&diff),
        DiffFormat::Json => report::diff::render_json(&diff)?,
    };
    report::write_out(rendered.as_bytes(), args.output.as_deref())?;
    Ok(0)
}

/// `started`: memprof starts the processes (`trace`), so they may wait
/// while their libraries' unwind tables load; `static_program`: the
/// command has no loader to announce them.
fn settings(options: &ProfileOptions, started: bool, static_program: bool) -> Settings {
    Settings {
        max_stacks: options.limits.max_stacks,
        stack_map_size: options.limits.stack_map_size,
        live: options.live.live.then_some(LiveSettings {
            max_live: options.live.max_live,
            temp_threshold_ns: options.live.temp_threshold.nanos(),
            slots: options.live.live_slots,
            heap_slots: options.live.heap_slots,
        }),
        sample_bytes: options.sampling.sample_bytes.map_or(0, |bytes| bytes.0),
        unwind_rows: options
            .stacks
            .unwind
            .tables()
            .then_some(options.stacks.unwind_rows),
        hold_for_tables: started,
        hold_at_exec: started && static_program && options.stacks.unwind.tables(),
        mappings: counts_mappings(options),
        regions: !options.regions.while_fns.is_empty(),
        start_paused: options.regions.starts_paused(),
        recording_limited: options.regions.is_limited(),
        watch_execs: WatchExecs::Off,
        ignored_tgid: 0,
        evicts: false,
        max_processes: probes::MAX_PROCESSES,
        usdt: options.sampling.usdt,
        gating: Gating::Off,
        session: match options.dev.empty_programs || options.dev.no_session_probes {
            true => probes::SessionProbes::Off,
            false => probes::SessionProbes::for_profile(
                options.live.live,
                options.sampling.sample_bytes.map_or(0, |bytes| bytes.0),
                false,
            ),
        },
    }
}

/// memprof holds a perf event per process and uprobe event it scopes
/// (children given return probes, processes watched; per thread of a
/// process running at the attach): the soft limit on
/// open files goes up to the hard one (1,024 is a common soft limit).
fn raise_fd_limit() {
    use nix::sys::resource::{getrlimit, setrlimit, Resource};
    if let Ok((soft, hard)) = getrlimit(Resource::RLIMIT_NOFILE) {
        if soft < hard {
            let _ = setrlimit(Resource::RLIMIT_NOFILE, hard, hard);
        }
    }
}

/// The session-uprobe program, where `settings` use one.
fn session_program(ebpf: &aya::Ebpf, settings: &Settings) -> Result<Option<std::os::fd::OwnedFd>> {
    match settings.session {
        probes::SessionProbes::Off => Ok(None),
        _ => probes::load_session_program(ebpf).map(Some),
    }
}

/// Direct mappings are counted unless `--no-mmap`, and only with unwind
/// tables: whose a mapping is (the program's, or malloc's inside) takes
/// whole stacks, and glibc has no frame pointers.
fn counts_mappings(options: &ProfileOptions) -> bool {
    !options.target.no_mmap && options.stacks.unwind.tables()
}

fn probe_set(options: &ProfileOptions) -> ProbeSet {
    let custom: Vec<_> = options
        .target
        .alloc_fns
        .iter()
        .chain(&options.target.free_fns)
        .chain(&options.regions.while_fns)
        .cloned()
        .collect();
    allocators::register_custom(&custom);
    ProbeSet {
        live: options.live.live,
        empty_programs: options.dev.empty_programs,
        probe_offsets: !options.target.no_probe_offsets,
        bench_probe: options.dev.bench_probe.clone(),
        custom,
        verbose: options.progress.verbose,
        mappings: counts_mappings(options),
        whole_host: false,
        skips_own_program: false,
        watches_later: false,
        switchable: false,
        usdt: options.sampling.usdt,
        session_program: None,
        hold_forks: false,
        site_groups: options.dev.site_groups,
        usdt_specs: options.dev.usdt_specs,
    }
}

/// `--libc PATH` takes the place of the target's C library.
fn with_libc(mut runtime: allocators::Runtime, libc: Option<&Path>) -> allocators::Runtime {
    if let Some(libc) = libc {
        runtime.modules.retain(|m| {
            !allocators::is_libc_name(m.file_name().and_then(|n| n.to_str()).unwrap_or(""))
        });
        runtime.modules.push(libc.to_path_buf());
    }
    runtime
}

/// `--verbose`: what was probed; and, always, targets with nothing to probe.
fn tell_probes(probes: &Probes, verbose: bool) {
    if verbose {
        for function in &probes.functions {
            eprintln!("{}", probes::describe(function));
        }
        let sessions = probes.session_functions();
        if sessions > 0 {
            eprintln!(
                "memprof: session uprobes on {sessions} malloc-like functions: \
                 only sampled calls take a return probe"
            );
        }
    }
    for unprobed in &probes.unprobed {
        eprintln!(
            "memprof: warning: {}: {}",
            unprobed.program, unprobed.reason
        );
    }
}

/// At most what an allocator row (a byte in the probe's cookie) allows.
fn check_custom(options: &ProfileOptions) -> Result<()> {
    if options.target.alloc_fns.len() > 100 {
        return Err(UserError::new("at most 100 --alloc-fn functions")
            .with_exit_code(2)
            .into());
    }
    Ok(())
}

/// Option values clap cannot check alone.
fn check_options(options: &ProfileOptions) -> Result<()> {
    check_custom(options)?;
    let regions = &options.regions;
    if regions.start_on.is_some() && regions.start_on == regions.toggle_on {
        return Err(
            UserError::new("--start-on and --toggle-on need different signals")
                .with_exit_code(2)
                .into(),
        );
    }
    if options
        .sampling
        .sample_bytes
        .is_some_and(|bytes| bytes.0 == 0)
    {
        return Err(UserError::new("--sample-bytes must be at least 1 byte")
            .with_exit_code(2)
            .into());
    }
    Ok(())
}

fn trace(args: TraceArgs) -> Result<i32> {
    check_options(&args.options)?;
    report::check_output(args.options.report.output.as_deref())?;
    let run_as = launch::run_as(args.run_as.user.as_deref())?;
    let program = launch::resolve_program(&args.command[0])?;
    pid::check_privileges()?;
    let runtime = with_libc(
        allocators::runtime_of_program(&program)?,
        args.options.target.libc.as_deref(),
    );
    let static_program = runtime.loader.is_none();
    let settings = settings(&args.options, true, static_program);
    let mut ebpf = probes::load(&settings)?;
    // Lets go what memprof stopped if memprof cannot (it is told when the
    // profile ended well).
    let watchdog = probes::watchdog::Watchdog::start(&ebpf)
        .inspect_err(|err| eprintln!("memprof: warning: {}", one_line(err)))
        .ok();
    let session_program = session_program(&ebpf, &settings)?;
    // The command's tables are loaded when its exec is announced.
    let unwind = unwind_tables(&ebpf, &args.options, &[])?;
    let child = launch::HeldChild::spawn(&program, &args.command, run_as.as_ref())?;
    // Forked already: the command runs with the limit it was given.
    raise_fd_limit();
    if static_program {
        // Known to the kernel before its exec, which then holds it.
        probes::register_targets(&mut ebpf, &[child.pid.as_raw()], args.options.live.live)?;
    }
    let probes = Probes::attach(
        &mut ebpf,
        &[runtime],
        &[child.pid.as_raw()],
        ProbeSet {
            session_program,
            hold_forks: !args.options.dev.no_fork_hold,
            ..probe_set(&args.options)
        },
    )?;
    tell_probes(&probes, args.options.progress.verbose);
    let runtime = tokio_runtime()?;
    // Its signals are memprof's before the command can send them.
    let recording = {
        let _inside = runtime.enter();
        Recording::new(&args.options.regions)?
    };
    let pid = child.release(&program)?;
    let session = Session {
        ebpf,
        probes,
        options: args.options,
        duration: None,
        unwind,
        recording,
        listener: None,
        out: None,
        watch: None,
        evict_after: None,
        budget: None,
    };
    let status = runtime.block_on(session.run(Target::Command(pid)))?;
    if let Some(watchdog) = watchdog {
        watchdog.all_released();
    }
    Ok(status)
}

/// `memprof monitor`: the processes selected now, watched until SIGTERM
/// or Ctrl-C, served over HTTP meanwhile.
fn monitor(args: MonitorArgs) -> Result<i32> {
    let own = std::process::id() as i32;
    if args.selection.pids.contains(&own) {
        return Err(UserError::new("memprof does not watch itself")
            .with_exit_code(2)
            .into());
    }
    let cgroups = args
        .selection
        .cgroups
        .iter()
        .map(|path| pid::cgroup_path(path))
        .collect::<Result<Vec<_>>>()?;
    // Nothing named: the whole host.
    let whole_host = args.selection.pids.is_empty()
        && args.selection.comm.is_empty()
        && args.selection.exe.is_empty()
        && cgroups.is_empty();
    if whole_host && args.options.sampling.usdt {
        return Err(UserError::new(
            "--usdt needs the processes named (--pid, --comm, --exe, --cgroup): on the whole host \
             the allocators' probes trap in every process",
        )
        .with_exit_code(2)
        .into());
    }
    let watch = match whole_host {
        true => Some(pid::Selection::everyone()),
        false => pid::Selection::new(&args.selection.comm, &args.selection.exe, &cgroups),
    };
    let mut pids = args.selection.pids.clone();
    // A selected process that ended since the scan is no error.
    // On the whole host the probes trap everywhere: no process is named.
    if !whole_host {
        pids.extend(
            watch
                .iter()
                .flat_map(|w| w.running())
                .filter(|&pid| pid::check_pid(pid).is_ok()),
        );
    }
    pids.sort_unstable();
    pids.dedup();
    let listener = http::Listener::bind(
        args.serving.listen,
        args.serving.metrics_sites,
        args.options.live.live,
    )?;
    let mut options = args.options;
    // The budget's sampling, unless every call is to be counted.
    if !args.cost.exact && options.sampling.sample_bytes.is_none() && !options.sampling.usdt {
        options.sampling.sample_bytes =
            Some(crate::human::numbers::ByteCount(MONITOR_SAMPLE_BYTES));
    }
    let out = match &args.serving.out {
        Some(dir) => {
            options.progress.interval =
                options.progress.interval.or(Some(DEFAULT_MONITOR_INTERVAL));
            Some(out_dir::OutDir::open(
                dir,
                options.report.format,
                args.serving.out_keep,
                args.serving.out_max_size.0,
            )?)
        }
        None => None,
    };
    profile_running(
        AttachArgs {
            pids,
            duration: None,
            options,
        },
        Some(Serving {
            listener,
            out,
            watch,
            max_processes: args.limits.max_processes,
            whole_host,
            max_overhead: (!args.cost.exact).then_some(args.cost.max_overhead),
        }),
    )
}

/// `monitor`: what it serves besides the final report, and whom it
/// watches once they start.
struct Serving {
    listener: http::Listener,
    out: Option<out_dir::OutDir>,
    watch: Option<pid::Selection>,
    max_processes: u32,
    /// Nothing named: every process on the host.
    whole_host: bool,
    /// `--max-overhead` (none with `--exact`).
    max_overhead: Option<f64>,
}

/// `monitor`'s sampling unless `--exact` or `--sample-bytes`: 512 KiB.
const MONITOR_SAMPLE_BYTES: u64 = 512 * 1024;

/// `monitor`'s report interval (--out's files) unless --interval says;
/// ended processes stay that long.
const DEFAULT_MONITOR_INTERVAL: f64 = 60.0;

fn attach(args: AttachArgs) -> Result<i32> {
    profile_running(args, None)
}

/// Profiles running processes (`attach`, `monitor`), serving HTTP (and
/// writing reports to a directory) when `serving` says so.
fn profile_running(args: AttachArgs, serving: Option<Serving>) -> Result<i32> {
    check_options(&args.options)?;
    raise_fd_limit();
    report::check_output(args.options.report.output.as_deref())?;
    for &pid in &args.pids {
        pid::check_pid(pid)?;
    }
    pid::check_privileges()?;
    let duration = args
        .duration
        .map(Duration::try_from_secs_f64)
        .transpose()
        .map_err(|_| UserError::new("--duration must be a positive number of seconds"))?;
    let watch = serving.as_ref().and_then(|s| s.watch.clone());
    let whole_host = serving.as_ref().is_some_and(|s| s.whole_host);
    let own = std::process::id() as i32;
    // `monitor` waiting for its processes probes this host's C library and
    // loader (memprof's own), scoped to no one until one starts; on the
    // whole host, the files of every process and memprof's.
    let runtime_pids = match (&watch, args.pids.is_empty()) {
        _ if whole_host => {
            let mut all = pid::Selection::everyone().running();
            all.push(own);
            all
        }
        (Some(_), true) => vec![own],
        _ => args.pids.clone(),
    };
    // The budget's cost per call, measured with a child of memprof's own:
    // unprobed now, probed once the probes are in.
    let calibration = serving
        .as_ref()
        .and_then(|s| s.max_overhead)
        .map(|_| calibrate::Calibration::start())
        .transpose()?;
    let runtimes = runtime_pids
        .iter()
        // On the whole host, a process that ended meanwhile is no error.
        .filter_map(|&pid| match allocators::runtime_of_pid(pid) {
            Err(_) if whole_host && pid != own => None,
            // Nor a file gone since (the process ended meanwhile).
            Ok(mut runtime) if whole_host => {
                runtime.modules.retain(|module| module.exists());
                Some(Ok(runtime))
            }
            runtime => Some(runtime.map(|r| with_libc(r, args.options.target.libc.as_deref()))),
        })
        .collect::<Result<Vec<_>>>()?;
    // The budget takes each process's probes out for part of each
    // period (on the whole host, every process's together: one event
    // traps everywhere, its allocators' anchored on kthreadd, not there
    // in a pid namespace); not in live mode (frees made while they are
    // out would be missed).
    let enforced = serving.as_ref().is_some_and(|s| s.max_overhead.is_some())
        && !args.options.live.live
        && (!whole_host || probes::has_kthreadd());
    let base = settings(&args.options, false, false);
    let settings = Settings {
        gating: match (enforced, whole_host) {
            (false, _) => Gating::Off,
            (true, false) => Gating::Processes,
            (true, true) => Gating::Host,
        },
        watch_execs: match (&watch, whole_host) {
            (_, true) => WatchExecs::Every,
            (Some(_), false) => WatchExecs::Unwatched,
            (None, false) => WatchExecs::Off,
        },
        ignored_tgid: if whole_host { own as u32 } else { 0 },
        evicts: serving.is_some(),
        max_processes: serving
            .as_ref()
            .map_or(probes::MAX_PROCESSES, |s| s.max_processes),
        session: match (base.session, whole_host) {
            (probes::SessionProbes::Scoped, true) => probes::SessionProbes::WholeHost,
            (session, _) => session,
        },
        ..base
    };
    let mut ebpf = probes::load(&settings)?;
    let session_program = session_program(&ebpf, &settings)?;
    probes::register_targets(&mut ebpf, &args.pids, args.options.live.live)?;
    let mut unwind = unwind_tables(&ebpf, &args.options, &args.pids)?;
    let set = ProbeSet {
        whole_host,
        skips_own_program: true,
        watches_later: whole_host || watch.is_some(),
        switchable: enforced,
        session_program,
        ..probe_set(&args.options)
    };
    let mut probes = Probes::attach(&mut ebpf, &runtimes, &args.pids, set)?;
    tell_probes(&probes, args.options.progress.verbose);
    // `monitor`: an ended process stays one interval in the figures.
    let retention_secs = args
        .options
        .progress
        .interval
        .unwrap_or(DEFAULT_MONITOR_INTERVAL);
    let budget = match (calibration, serving.as_ref().and_then(|s| s.max_overhead)) {
        (Some(calibration), Some(max_overhead)) => {
            let pid = calibration.pid;
            if !whole_host {
                probes.adopt(pid)?;
            }
            let cost_ns = calibration.finish()?;
            probes.forget(pid);
            // Its calls are memprof's, not a profiled process's (its
            // process entry goes as any ended process's, by eviction).
            evict::remove_sites(&mut ebpf, |key| key.tgid == pid)?;
            budget::forget_count(&mut ebpf, pid)?;
            let budget = budget::Budget::new(max_overhead, cost_ns, enforced);
            Some(budget.keeping_ended(Duration::from_secs_f64(retention_secs)))
        }
        _ => None,
    };
    if let Some(tables) = unwind.as_mut() {
        // A library loaded while the probes went in was announced to no
        // one: read the mappings again (the files' tables are cached).
        for &pid in &args.pids {
            let _ = tables.refresh(pid as u32);
        }
    }
    let runtime = tokio_runtime()?;
    let recording = {
        let _inside = runtime.enter();
        Recording::new(&args.options.regions)?
    };
    let evict_after = serving.as_ref().map(|serving| report::model::LimitsReport {
        retention_secs,
        max_processes: serving.max_processes.into(),
        max_sites: args.options.limits.max_stacks.into(),
        max_stacks: args.options.limits.stack_map_size.into(),
        ..Default::default()
    });
    let (listener, out) = match serving {
        Some(Serving { listener, out, .. }) => (Some(listener), out),
        None => (None, None),
    };
    let session = Session {
        ebpf,
        probes,
        options: args.options,
        duration,
        unwind,
        recording,
        listener,
        out,
        watch,
        evict_after,
        budget,
    };
    runtime.block_on(session.run(Target::Pids(args.pids)))
}

/// `--unwind dwarf`: the kernel's unwind tables, with those of `pids`
/// loaded (before the probes fire).
fn unwind_tables(
    ebpf: &aya::Ebpf,
    options: &ProfileOptions,
    pids: &[i32],
) -> Result<Option<unwind::kernel::KernelTables>> {
    if !options.stacks.unwind.tables() {
        return Ok(None);
    }
    let mut tables = unwind::kernel::KernelTables::open(ebpf)?;
    for &pid in pids {
        // A process that exits meanwhile needs none.
        let _ = tables.refresh(pid as u32);
    }
    Ok(Some(tables))
}

fn tokio_runtime() -> Result<tokio::runtime::Runtime> {
    Ok(tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()?)
}
