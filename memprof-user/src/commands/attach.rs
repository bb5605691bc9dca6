//! `memprof attach --pid N`: running processes profiled until Ctrl-C,
//! --duration or their exit. `monitor` runs the same, serving besides.
use std::time::Duration;

use anyhow::Result;
use aya::Ebpf;

use super::{
    check_options, raise_fd_limit, session_program, tell_probes, tokio_runtime, unwind_tables,
    with_libc,
};
use crate::{
    cli::{
        settings::{probe_set, settings},
        AttachArgs,
    },
    commands::{
        recording::Recording,
        session::{MonitorPeriods, Profiled, Session},
    },
    discover::{allocators, pid},
    human::error::UserError,
    monitor::{
        budget::{self, Budget},
        calibrate::Calibration,
        evict, listen, out_dir,
    },
    probes::{self, Mode, Probes},
    report,
};

/// `monitor`'s --out interval and retention unless told.
pub(super) const DEFAULT_MONITOR_INTERVAL: f64 = 60.0;

/// `monitor`'s terminal view is redrawn this often unless told.
pub(super) const DEFAULT_REFRESH: f64 = 2.0;

/// `monitor`: what it serves besides the final report, and whom it
/// watches once they start.
pub(super) struct Serving {
    pub listener: listen::Listener,
    pub out: Option<out_dir::OutDir>,
    pub watch: Option<pid::Selection>,
    pub max_processes: u32,
    /// `--max-overhead` (none with `--exact`).
    pub max_overhead: Option<f64>,
    pub periods: MonitorPeriods,
}

pub(super) fn attach(args: AttachArgs) -> Result<i32> {
    profile_running(args, Mode::Attach, None)
}

/// Profiles running processes (`attach`, `monitor`), serving HTTP (and
/// writing reports to a directory) when `serving` says so.
pub(super) fn profile_running(
    args: AttachArgs,
    mode: Mode,
    serving: Option<Serving>,
) -> Result<i32> {
    let duration = check(&args)?;
    let watch = serving.as_ref().and_then(|s| s.watch.clone());
    // The budget's cost per call, measured with a child of memprof's own:
    // unprobed now, probed once the probes are in.
    let calibration = serving
        .as_ref()
        .and_then(|s| s.max_overhead)
        .map(|_| Calibration::start())
        .transpose()?;
    let runtimes = runtimes(&args, mode, watch.is_some())?;
    let max_processes = serving
        .as_ref()
        .map_or(probes::MAX_PROCESSES, |s| s.max_processes);
    let settings = settings(&args.options, mode, max_processes);
    let mut ebpf = probes::load(&settings)?;
    let session_program = session_program(&ebpf, &settings)?;
    probes::register_targets(&mut ebpf, &args.pids, args.options.live.live)?;
    let mut unwind = unwind_tables(&ebpf, &args.options, &args.pids)?;
    let set = probe_set(&args.options, mode, session_program);
    allocators::register_custom(&set.custom);
    let mut probes = Probes::attach(&mut ebpf, &runtimes, &args.pids, set)?;
    tell_probes(&probes, args.options.progress.verbose);
    // `monitor`: how long an ended process stays in the figures.
    let periods = serving.as_ref().map(|s| s.periods);
    let retention_secs = periods.map_or(DEFAULT_MONITOR_INTERVAL, |p| p.retention);
    let budget = match (calibration, serving.as_ref().and_then(|s| s.max_overhead)) {
        (Some(calibration), Some(max_overhead)) => Some(
            start_budget(&mut ebpf, &mut probes, calibration, max_overhead, mode)?
                .keeping_ended(Duration::from_secs_f64(retention_secs)),
        ),
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
        periods,
    };
    runtime.block_on(session.run(Profiled::Pids(args.pids)))
}

/// What must hold before anything starts: the options, the output file,
/// the processes and memprof's rights; and the --duration asked.
fn check(args: &AttachArgs) -> Result<Option<Duration>> {
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
    Ok(duration)
}

/// The files probed at the start: those the named processes run.
/// `monitor` waiting for its processes (`watches`) probes this host's C
/// library and loader (memprof's own), scoped to no one until one
/// starts; on the whole host, the files of every process and memprof's.
fn runtimes(args: &AttachArgs, mode: Mode, watches: bool) -> Result<Vec<allocators::Runtime>> {
    let whole_host = mode.whole_host();
    let own = std::process::id() as i32;
    let runtime_pids = match (watches, args.pids.is_empty()) {
        _ if whole_host => {
            let mut all = pid::Selection::everyone().running();
            all.push(own);
            all
        }
        (true, true) => vec![own],
        _ => args.pids.clone(),
    };
    runtime_pids
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
        .collect()
}

/// The budget, its cost per call measured by the calibration child now
/// that the probes are in. The child's calls are memprof's, not a
/// profiled process's: they leave the counts (its process entry goes as
/// any ended process's, by eviction).
fn start_budget(
    ebpf: &mut Ebpf,
    probes: &mut Probes,
    calibration: Calibration,
    max_overhead: f64,
    mode: Mode,
) -> Result<Budget> {
    let pid = calibration.pid;
    if !mode.whole_host() {
        probes.adopt(pid)?;
    }
    let cost_ns = calibration.finish()?;
    probes.forget(pid);
    evict::remove_sites(ebpf, |key| key.tgid == pid)?;
    budget::forget_count(ebpf, pid)?;
    let budget = Budget::new(max_overhead, cost_ns, mode.budget());
    // From now on a process that traps past a period's budget asks to be
    // taken out at once.
    probes.scopes().allow_first(budget.first_allowance());
    Ok(budget)
}
