//! A profiling session: wait for the end (target exit, Ctrl-C, SIGTERM,
//! --duration) while handling process notices and --interval reports,
//! then detach and print the final report. `run` sets it up and runs the
//! event loop; each event is a method of `Running`.
mod exits;
mod reporter;
mod running;

use std::{
    io::IsTerminal as _,
    sync::{Arc, Mutex},
    time::{Duration, Instant},
};

use anyhow::{Context as _, Result};
use aya::{maps::RingBuf, Ebpf};
use nix::{sys::signal::Signal, unistd::Pid};
use tokio::{
    signal::unix::{signal, SignalKind},
    time::Interval,
};

use self::{exits::exit_watch, running::Running};
use crate::{
    cli::ProfileOptions,
    collect::{
        self,
        catalog::Catalog,
        heap::HeapTracker,
        mappings::{MappingTracker, Origins},
        notices::{MappingSink, NoticeReader},
        peaks::PeakCapturer,
        timeline::TimelineRecorder,
        LiveSiteMaps,
    },
    commands::recording::Recording,
    discover::pid::Selection,
    monitor::{
        budget::{
            over::{self, OverBudget},
            Budget,
        },
        evict::Evictor,
        http::ReportRequest,
        listen::{ListenAddress, Listener},
        out_dir::OutDir,
        view::View,
    },
    probes::Probes,
    report::{build::Series, model::LimitsReport, options::Format},
    symbolize::Symbolizer,
};

/// How often `trace` and `attach` close the scope events of processes that
/// ended (`monitor` does it as it evicts them).
const PRUNE_PERIOD: Duration = Duration::from_secs(2);

/// What is profiled: the command memprof started (`trace`), or running
/// processes (`attach`, `monitor`). Its end ends the session, besides a
/// signal or --duration.
pub enum Profiled {
    /// `trace`: the command memprof started; its exit ends the session.
    Command(Pid),
    /// `attach`: these processes; the session ends when all have exited.
    Pids(Vec<i32>),
}

pub struct Session {
    pub ebpf: Ebpf,
    pub probes: Probes,
    pub options: ProfileOptions,
    pub duration: Option<Duration>,
    /// `--unwind dwarf`: the kernel's unwind tables, kept up to date on
    /// the notice thread.
    pub unwind: Option<crate::unwind::kernel::KernelTables>,
    /// When calls are recorded (--delay, --start-on, --toggle-on).
    pub recording: Recording,
    /// `monitor`: the HTTP endpoints, which ask for reports.
    pub listener: Option<Listener>,
    /// `monitor --out DIR`: where each interval's report goes.
    pub out: Option<OutDir>,
    /// `monitor --comm/--exe`: processes started later that match are
    /// watched too.
    pub watch: Option<Selection>,
    /// `monitor`: what an ended process left goes after
    /// `retention_secs`; the tables' caps.
    pub evict_after: Option<LimitsReport>,
    /// `monitor` (not `--exact`): the cost budget.
    pub budget: Option<Budget>,
    /// `monitor`: how often the view is redrawn and --out written.
    pub periods: Option<MonitorPeriods>,
}

/// `monitor`'s periods, in seconds (--refresh, --out-interval,
/// --retention; --interval sets those not given).
#[derive(Clone, Copy, Debug)]
pub struct MonitorPeriods {
    pub refresh: f64,
    pub out: f64,
    pub retention: f64,
}

enum Ending {
    TargetExited,
    Signal(Signal),
    Duration,
}

/// The periods of the session's chores; each is there only when its
/// chore is.
#[derive(Default)]
struct Ticks {
    /// The live status line on a terminal.
    status: Option<Interval>,
    /// Live mode: ended processes leave the pointer table, peaks are polled.
    housekeeping: Option<Interval>,
    /// `monitor`'s budget: each period's read of the calls counted.
    budget: Option<Interval>,
    /// `monitor`: what ended processes left goes.
    eviction: Option<Interval>,
    /// `trace`, `attach`: scope events of ended processes close.
    pruning: Option<Interval>,
    /// The heap over time.
    timeline: Option<Interval>,
    /// --interval's reports, or the terminal view's redraw.
    report: Option<Interval>,
}

impl Session {
    /// Runs to the end; returns memprof's exit status.
    pub async fn run(self, profiled: Profiled) -> Result<i32> {
        let Session {
            mut ebpf,
            probes,
            options,
            duration,
            unwind,
            mut recording,
            listener,
            out,
            watch,
            evict_after,
            budget,
            periods,
        } = self;
        // Set up: the socket is bound, the command started, the probes in.
        crate::host::privileges::drop_unneeded();
        let started = Instant::now();
        recording.begin();
        let catalog = new_catalog(options.live.live);
        let watch_shown = watch.as_ref().map(|watch| match watch.is_everyone() {
            true => "every process on the host (but memprof)",
            false => "for the processes selected to start",
        });
        // The symbolizer's waits end soon after a stop signal, though the
        // loop that takes it may be busy in a report.
        crate::host::stop::watch()?;
        let symbolizer = Symbolizer::with_debug_dirs(&options.symbols.debug_dirs)
            .with_time_limit(Duration::from_secs_f64(options.symbols.symbol_time_limit));
        // `monitor`: serves over HTTP and runs until a signal.
        let monitor = listener.is_some();
        // Kept only with --interval: a point per report (not by a monitor,
        // whose reports would carry every point since its start).
        let series = (options.progress.interval.is_some() && !monitor).then(Series::default);
        let timeline = options
            .timeline_period()
            .map(|period| TimelineRecorder::new(period, options.live.live));
        let heap = options.live.live.then(|| {
            let min_age_ns = options.live.min_age.map_or(0, |age| age.nanos());
            HeapTracker::new(min_age_ns, options.sampling(), options.live.max_live)
        });
        let evictor = evict_after.map(|after| Evictor::new(after, &catalog));
        let mut ticks = Ticks::of(&options, heap.is_some(), budget.is_some(), evictor.as_ref());
        let mut over_budget = budget
            .is_some()
            .then(|| OverBudget::open(&mut ebpf))
            .transpose()?;
        // Shared with the notice thread, which probes libraries loaded later.
        let probes = Arc::new(Mutex::new(probes));
        let mappings = Arc::new(Mutex::new(MappingTracker::new(
            options.live.temp_threshold.nanos(),
        )));
        let notices = spawn_notices(
            &mut ebpf,
            &options,
            heap.as_ref(),
            Shared {
                catalog: &catalog,
                probes: &probes,
                mappings: &mappings,
            },
            unwind,
            watch,
        )?;
        let mut sigint = signal(SignalKind::interrupt())?;
        let mut sigterm = signal(SignalKind::terminate())?;
        // With --out, SIGHUP (logrotate, systemctl reload) writes a report
        // at once, and does not end memprof.
        let mut sighup = out
            .is_some()
            .then(|| signal(SignalKind::hangup()))
            .transpose()?;
        let exits = exit_watch(&profiled)?;
        let mut exits = std::pin::pin!(exits);
        let deadline = tokio::time::sleep(duration.unwrap_or(Duration::from_secs(u64::MAX / 4)));
        let mut deadline = std::pin::pin!(deadline);
        let view = terminal_view(monitor, out.is_some(), &options);
        let every = match periods {
            Some(periods) if view.is_some() => Some(periods.refresh),
            Some(periods) if out.is_some() => Some(periods.out),
            _ => options.progress.interval,
        };
        ticks.report = every.map(|secs| {
            let period = Duration::from_secs_f64(secs);
            tokio::time::interval_at(tokio::time::Instant::now() + period, period)
        });
        let (serving, mut requests) = serve(listener)?;
        if let Profiled::Pids(pids) = &profiled {
            announce_attached(&catalog, pids, watch_shown);
        }
        // A live status line, only for a person watching a terminal.
        ticks.status = (std::io::stderr().is_terminal() && view.is_none())
            .then(|| tokio::time::interval(Duration::from_secs(1)));
        let mut running = Running {
            ebpf,
            options,
            started,
            catalog,
            symbolizer,
            probes,
            mappings,
            recording,
            heap,
            series,
            timeline,
            evictor,
            budget,
            out,
            view,
            serving,
            status_shown: ticks.status.is_some(),
            served: None,
        };
        let ending = loop {
            // The budget: when a process's probes go in or out next.
            let next_switch = running.next_switch();
            tokio::select! {
                _ = tick(&mut ticks.status) => running.show_status(),
                _ = sigint.recv() => break Ending::Signal(Signal::SIGINT),
                _ = sigterm.recv() => break Ending::Signal(Signal::SIGTERM),
                _ = &mut deadline, if duration.is_some() => break Ending::Duration,
                result = &mut exits, if !monitor => { result?; break Ending::TargetExited; }
                _ = tick(&mut ticks.housekeeping) => running.keep_house()?,
                Some(request) = receive(&mut requests) => running.answer(request),
                _ = tick(&mut ticks.eviction) => running.evict()?,
                _ = tick(&mut ticks.pruning) => running.prune(),
                _ = tick(&mut ticks.budget) => running.read_budget()?,
                _ = sleep_until(next_switch) => running.switch_budget(),
                tgids = over::next(&mut over_budget) => running.over_budget(&tgids),
                change = running.recording.changed(), if running.recording.may_change() => {
                    running.apply_recording(change)?;
                }
                _ = tick(&mut ticks.timeline) => running.sample_timeline()?,
                _ = tick(&mut ticks.report) => running.periodic_report()?,
                _ = hang_up(&mut sighup) => running.hangup_report()?,
            }
        };
        // Requests from now on fail at once, not after the final report.
        drop(requests);
        running.finish(&profiled, &ending, notices).await
    }
}

impl Ticks {
    /// The chores' periods known at the start (the status line's and the
    /// reports' come later).
    fn of(options: &ProfileOptions, live: bool, budget: bool, evictor: Option<&Evictor>) -> Ticks {
        Ticks {
            timeline: options.timeline_period().map(|period| {
                let mut tick = tokio::time::interval(Duration::from_secs_f64(period));
                // A slow read stretches the period; `secs` keeps the real times.
                tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
                tick
            }),
            housekeeping: live.then(|| tokio::time::interval(Duration::from_millis(100))),
            budget: budget.then(|| tokio::time::interval(crate::monitor::budget::PERIOD)),
            eviction: evictor.map(|evictor| tokio::time::interval(evictor.period())),
            // Without eviction (trace, attach), the scope events of the
            // processes that ended still go: a build forks thousands, each
            // with events of its own (and, ended first, its heirs get theirs).
            pruning: evictor.is_none().then(|| {
                tokio::time::interval_at(tokio::time::Instant::now() + PRUNE_PERIOD, PRUNE_PERIOD)
            }),
            ..Ticks::default()
        }
    }
}

/// What memprof knows of each process image (`--live`: the images that
/// ended are kept for the pointer table's scans).
fn new_catalog(live: bool) -> Arc<Mutex<Catalog>> {
    let mut catalog = Catalog::default();
    if live {
        catalog.keep_ended();
    }
    Arc::new(Mutex::new(catalog))
}

/// What the session shares with the notice thread.
struct Shared<'a> {
    catalog: &'a Arc<Mutex<Catalog>>,
    probes: &'a Arc<Mutex<Probes>>,
    mappings: &'a Arc<Mutex<MappingTracker>>,
}

/// The notice thread, with the maps it reads on its own.
fn spawn_notices(
    ebpf: &mut Ebpf,
    options: &ProfileOptions,
    heap: Option<&HeapTracker>,
    shared: Shared<'_>,
    unwind: Option<crate::unwind::kernel::KernelTables>,
    watch: Option<Selection>,
) -> Result<NoticeReader> {
    let peak_capturer = match heap {
        Some(heap) => Some(PeakCapturer {
            maps: LiveSiteMaps::open(ebpf)?,
            heaps: crate::probes::own_handle(ebpf, "HEAPS")?,
            sampling: options.sampling(),
            captures: heap.captures.clone(),
            started_ns: heap.started_ns,
        }),
        None => None,
    };
    NoticeReader::spawn(
        RingBuf::try_from(ebpf.take_map("NOTICES").context("map NOTICES")?)?,
        shared.catalog.clone(),
        peak_capturer,
        unwind,
        shared.probes.clone(),
        MappingSink {
            tracker: shared.mappings.clone(),
            origins: Origins::new(crate::probes::own_handle(ebpf, "STACKS")?),
        },
        watch,
    )
}

/// `monitor` on a terminal, its report not asked elsewhere: a view like
/// top's, redrawn every interval (2 s unless --interval).
fn terminal_view(monitor: bool, out: bool, options: &ProfileOptions) -> Option<View> {
    (monitor
        && !out
        && options.report.output.is_none()
        && options.report.format == Format::Text
        && std::io::stdout().is_terminal())
    .then(View::default)
}

/// `monitor`'s HTTP endpoints, serving from now on: the line the view
/// shows, and the requests for reports.
fn serve(
    listener: Option<Listener>,
) -> Result<(String, Option<tokio::sync::mpsc::Receiver<ReportRequest>>)> {
    let Some(listener) = listener.filter(Listener::serves) else {
        return Ok((String::new(), None));
    };
    let serving = match &listener.address {
        ListenAddress::Tcp(address) => format!("serving http://{address}"),
        address => format!("serving {address}"),
    };
    let (sender, receiver) = tokio::sync::mpsc::channel(16);
    let address = listener.address.clone();
    listener.spawn(sender)?;
    match address {
        ListenAddress::Unix(path) => eprintln!(
            "memprof: serving /metrics and /debug/pprof/{{allocs,heap}} on the unix socket {}",
            path.display()
        ),
        address => {
            eprintln!("memprof: serving http://{address}/metrics and /debug/pprof/{{allocs,heap}}")
        }
    }
    Ok((serving, Some(receiver)))
}

/// `attach`, `monitor`: the processes named are known from the start.
/// Scripts wait for the line printed before they make the target work.
fn announce_attached(catalog: &Mutex<Catalog>, pids: &[i32], watch_shown: Option<&str>) {
    let mut known = catalog.lock().unwrap_or_else(|e| e.into_inner());
    for &pid in pids {
        known.attach_to(pid as u32);
    }
    drop(known);
    match watch_shown {
        Some(what) if pids.is_empty() => {
            eprintln!("memprof: attached, watching {what}; Ctrl-C to stop")
        }
        _ => eprintln!(
            "memprof: attached to {} process{}; Ctrl-C to stop",
            pids.len(),
            if pids.len() == 1 { "" } else { "es" }
        ),
    }
}

/// The next tick of a chore's period; never, for a chore not there.
async fn tick(interval: &mut Option<Interval>) {
    match interval {
        Some(interval) => {
            interval.tick().await;
        }
        None => std::future::pending().await,
    }
}

/// The next message on a channel that may not be there.
async fn receive<T>(receiver: &mut Option<tokio::sync::mpsc::Receiver<T>>) -> Option<T> {
    match receiver {
        Some(receiver) => receiver.recv().await,
        None => std::future::pending().await,
    }
}

/// `at`, or never.
async fn sleep_until(at: Option<Instant>) {
    match at {
        Some(at) => tokio::time::sleep_until(at.into()).await,
        None => std::future::pending().await,
    }
}

/// The next SIGHUP, where memprof takes it.
async fn hang_up(signal: &mut Option<tokio::signal::unix::Signal>) {
    match signal {
        Some(signal) => {
            signal.recv().await;
        }
        None => std::future::pending().await,
    }
}

/// `--out DIR`: one more report there; a failed write (a full disk) is
/// said, and the watching goes on.
pub(super) fn write_out(out: &OutDir, report: &crate::report::Report) {
    if let Err(err) = out.write(report) {
        eprintln!("memprof: warning: {err:#}");
    }
}

/// "memprof: 12 s, 1,234,567 allocations, 3 processes" on stderr, in place.
pub(super) fn show_status(ebpf: &Ebpf, started: Instant, heap: Option<&HeapTracker>) {
    let live = heap.is_some();
    let ended =
        |key: &memprof_common::sites::AllocKey| heap.is_some_and(|heap| heap.has_ended(key));
    if let Ok(totals) = collect::totals(ebpf, ended) {
        eprint!(
            "\r\x1b[2Kmemprof: {:.0} s, {}, {}{}",
            started.elapsed().as_secs_f64(),
            crate::human::numbers::how_many(totals.calls, "allocation", "allocations"),
            crate::human::numbers::how_many(totals.processes as u64, "process", "processes"),
            if live {
                format!(
                    ", {} live",
                    crate::human::numbers::human_bytes(totals.live_bytes)
                )
            } else {
                String::new()
            }
        );
    }
}

pub(super) fn clear_status(shown: bool) {
    if shown {
        eprint!("\r\x1b[2K");
    }
}

/// Live mode: takes what ended processes left out of the kernel's
/// table and polls for peaks (`force`: now).
pub(super) fn keep_house(
    heap: &mut HeapTracker,
    ebpf: &mut Ebpf,
    catalog: &Mutex<Catalog>,
    force: bool,
) -> Result<()> {
    let ended = catalog
        .lock()
        .unwrap_or_else(|e| e.into_inner())
        .take_ended();
    // Peaks first: an ended process's live counts stay in the kernel's
    // stats, so the poll still sees what it held at the end.
    heap.poll_peaks(ebpf, force)?;
    heap.sweep(ebpf, &ended, force)
}

/// One sample of the heap over time: every call site's figures, the
/// kernel's and the direct mappings'.
pub(super) fn sample_timeline(
    timeline: &mut TimelineRecorder,
    ebpf: &Ebpf,
    options: &ProfileOptions,
    mappings: &Mutex<MappingTracker>,
    secs: f64,
) -> Result<()> {
    let sampling = options.sampling();
    let mut sites = match options.live.live {
        true => collect::read_live_sites(ebpf, sampling)?,
        false => collect::read_sites(ebpf, sampling)?,
    };
    sites.extend(mappings.lock().unwrap_or_else(|e| e.into_inner()).sites());
    timeline.sample(secs, &sites);
    Ok(())
}
