//! `memprof monitor`: the processes selected now and those that start
//! later (or the whole host), watched until SIGTERM or Ctrl-C, served
//! over HTTP meanwhile.
use anyhow::Result;

use super::{
    attach::{profile_running, Serving, DEFAULT_MONITOR_INTERVAL, DEFAULT_REFRESH},
    session::MonitorPeriods,
};
use crate::{
    cli::{AttachArgs, MonitorArgs},
    discover::pid,
    human::{error::UserError, numbers::ByteCount},
    monitor::{listen, out_dir, web_config::WebConfig},
    probes::{self, Mode},
};

/// `monitor`'s sampling unless `--exact` or `--sample-bytes`: 512 KiB.
const MONITOR_SAMPLE_BYTES: u64 = 512 * 1024;

/// `memprof monitor`: the processes selected now, watched until SIGTERM
/// or Ctrl-C, served over HTTP meanwhile.
pub(super) fn monitor(args: MonitorArgs) -> Result<i32> {
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
    let web = match &args.serving.web_config {
        Some(path) => WebConfig::load(path)?,
        None => WebConfig::open(),
    };
    let listener = listen::Listener::bind(
        &args.serving.listen,
        args.serving.listen_group.as_deref(),
        web,
        crate::monitor::http::Settings {
            metrics_sites: args.serving.metrics_sites,
            metrics_labels: args.serving.metrics_labels,
            live: args.options.live.live,
        },
    )?;
    let mut options = args.options;
    // The budget's sampling, unless every call is to be counted.
    if !args.cost.exact && options.sampling.sample_bytes.is_none() && !options.sampling.usdt {
        options.sampling.sample_bytes = Some(ByteCount(MONITOR_SAMPLE_BYTES));
    }
    let interval = options.progress.interval;
    let periods = MonitorPeriods {
        refresh: args.timing.refresh.or(interval).unwrap_or(DEFAULT_REFRESH),
        out: args
            .timing
            .out_interval
            .or(interval)
            .unwrap_or(DEFAULT_MONITOR_INTERVAL),
        retention: args
            .timing
            .retention
            .or(interval)
            .unwrap_or(DEFAULT_MONITOR_INTERVAL),
    };
    let out = match &args.serving.out {
        Some(dir) => Some(out_dir::OutDir::open(
            dir,
            &options.report,
            args.serving.out_keep,
            args.serving.out_max_size.0,
        )?),
        None => None,
    };
    let max_overhead = (!args.cost.exact).then_some(args.cost.max_overhead);
    // The budget takes each process's probes out for part of each
    // period (on the whole host, every process's together: one event
    // traps everywhere, its allocators' anchored on kthreadd, not there
    // in a pid namespace); not in live mode (frees made while they are
    // out would be missed).
    let budget =
        max_overhead.is_some() && !options.live.live && (!whole_host || probes::has_kthreadd());
    let mode = match whole_host {
        true => Mode::MonitorWholeHost { budget },
        false => Mode::MonitorByName {
            watches_later: watch.is_some(),
            budget,
        },
    };
    profile_running(
        AttachArgs {
            pids,
            duration: None,
            options,
        },
        mode,
        Some(Serving {
            listener,
            out,
            watch,
            max_processes: args.limits.max_processes,
            max_overhead,
            periods,
        }),
    )
}
