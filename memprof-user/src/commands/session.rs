//! A profiling session: wait for the end (target exit, Ctrl-C, SIGTERM,
//! --duration) while handling process notices and --interval reports,
//! then detach and print the final report.
use std::{
    io::IsTerminal as _,
    sync::{Arc, Mutex},
    time::{Duration, Instant},
};

use anyhow::{Context as _, Result};
use aya::{maps::RingBuf, Ebpf};
use memprof_common::lost::LostCause;
use nix::{
    sys::{
        signal::{kill, Signal},
        wait::{waitpid, WaitPidFlag, WaitStatus},
    },
    unistd::Pid,
};
use tokio::{
    io::unix::AsyncFd,
    signal::unix::{signal, SignalKind},
};

use crate::{
    cli::ProfileOptions,
    collect,
    collect::{
        catalog::Catalog,
        heap::{monotonic_ns, HeapTracker},
        mappings::{MappingTracker, Origins},
        notices::{MappingSink, NoticeReader},
        peaks::PeakCapturer,
        timeline::TimelineRecorder,
        LiveSiteMaps,
    },
    commands::recording::Recording,
    discover::pid::Selection,
    host::pidfd::pidfd_open,
    monitor::{
        budget::Budget,
        evict::{Evictor, Held},
        http::Listener,
        out_dir::OutDir,
        view::View,
    },
    probes::Probes,
    report,
    report::{
        build::{record_series, Live, Series, Taken},
        model::{LimitsReport, LiveSettingsReport, ProbeReport, UnprobedReport},
        options::ReportOptions,
    },
    symbolize::Symbolizer,
};

/// How often `trace` and `attach` close the scope events of processes that
/// ended (`monitor` does it as it evicts them).
const PRUNE_PERIOD: Duration = Duration::from_secs(2);

/// What ends the session besides a signal.
pub enum Target {
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
}

enum Ending {
    TargetExited,
    Signal(Signal),
    Duration,
}

impl Session {
    /// Runs to the end; returns memprof's exit status.
    pub async fn run(self, target: Target) -> Result<i32> {
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
            mut budget,
        } = self;
        let started = Instant::now();
        recording.begin();
        let catalog = Arc::new(Mutex::new(Catalog::default()));
        if options.live.live {
            catalog
                .lock()
                .unwrap_or_else(|e| e.into_inner())
                .keep_ended();
        }
        let watch_shown = watch.as_ref().map(|watch| match watch.is_everyone() {
            true => "every process on the host (but memprof)",
            false => "for the processes selected to start",
        });
        let mut symbolizer = Symbolizer::with_debug_dirs(&options.symbols.debug_dirs);
        // `monitor`: serves over HTTP and runs until a signal.
        let monitor = listener.is_some();
        // Kept only with --interval: a point per report (not by a monitor,
        // whose reports would carry every point since its start).
        let mut series = (options.progress.interval.is_some() && !monitor).then(Series::default);
        let mut timeline = options
            .timeline_period()
            .map(|period| TimelineRecorder::new(period, options.live.live));
        let mut timeline_tick = options.timeline_period().map(|period| {
            let mut tick = tokio::time::interval(Duration::from_secs_f64(period));
            // A slow read stretches the period; `secs` keeps the real times.
            tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
            tick
        });
        let mut heap = options.live.live.then(|| {
            HeapTracker::new(
                options.live.min_age.map_or(0, |age| age.nanos()),
                options.sampling(),
                options.live.max_live,
            )
        });
        // Live mode: ended processes leave the pointer table, peaks are polled.
        let mut housekeeping = heap
            .is_some()
            .then(|| tokio::time::interval(Duration::from_millis(100)));
        let peak_capturer = match &heap {
            Some(heap) => Some(PeakCapturer {
                maps: LiveSiteMaps::open(&ebpf)?,
                heaps: crate::probes::own_handle(&ebpf, "HEAPS")?,
                sampling: options.sampling(),
                captures: heap.captures.clone(),
                started_ns: heap.started_ns,
            }),
            None => None,
        };
        let mut evictor = evict_after.map(|after| Evictor::new(after, &catalog));
        let mut budget_tick = budget
            .as_ref()
            .map(|_| tokio::time::interval(crate::monitor::budget::PERIOD));
        let mut eviction = evictor
            .as_ref()
            .map(|evictor| tokio::time::interval(evictor.period()));
        // Without eviction (trace, attach), the scope events of the
        // processes that ended still go: a build forks thousands, each
        // with events of its own (and, ended first, its heirs get theirs).
        let mut pruning = evictor.is_none().then(|| {
            tokio::time::interval_at(tokio::time::Instant::now() + PRUNE_PERIOD, PRUNE_PERIOD)
        });
        // Shared with the notice thread, which probes libraries loaded later.
        let probes = Arc::new(Mutex::new(probes));
        let mappings = Arc::new(Mutex::new(MappingTracker::new(
            options.live.temp_threshold.nanos(),
        )));
        let notices = NoticeReader::spawn(
            RingBuf::try_from(ebpf.take_map("NOTICES").context("map NOTICES")?)?,
            catalog.clone(),
            peak_capturer,
            unwind,
            probes.clone(),
            MappingSink {
                tracker: mappings.clone(),
                origins: Origins::new(crate::probes::own_handle(&ebpf, "STACKS")?),
            },
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
        let exits = exit_watch(&target)?;
        let mut exits = std::pin::pin!(exits);
        let deadline = tokio::time::sleep(duration.unwrap_or(Duration::from_secs(u64::MAX / 4)));
        let mut deadline = std::pin::pin!(deadline);
        // `monitor` on a terminal, its report not asked elsewhere: a view
        // like top's, redrawn every interval (2 s unless --interval).
        let mut view = (monitor
            && out.is_none()
            && options.report.output.is_none()
            && options.report.format == crate::report::options::Format::Text
            && std::io::stdout().is_terminal())
        .then(View::default);
        let every = options.progress.interval.or(view.as_ref().map(|_| 2.0));
        let mut interval = every.map(|secs| {
            tokio::time::interval_at(
                tokio::time::Instant::now() + Duration::from_secs_f64(secs),
                Duration::from_secs_f64(secs),
            )
        });

        let listening = listener
            .as_ref()
            .map_or(String::new(), |l| format!("http://{}", l.address));
        let mut requests = match listener {
            Some(listener) => {
                let (sender, receiver) = tokio::sync::mpsc::channel(16);
                let address = listener.address;
                listener.spawn(sender)?;
                eprintln!(
                    "memprof: serving http://{address}/metrics and /debug/pprof/{{allocs,heap}}"
                );
                Some(receiver)
            }
            None => None,
        };
        if let Target::Pids(pids) = &target {
            let mut known = catalog.lock().unwrap_or_else(|e| e.into_inner());
            for &pid in pids {
                known.attach_to(pid as u32);
            }
            drop(known);
            // Scripts wait for this line before they make the target work.
            match &watch_shown {
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
        // A live status line, only for a person watching a terminal.
        let mut status = (std::io::stderr().is_terminal() && view.is_none())
            .then(|| tokio::time::interval(Duration::from_secs(1)));
        // What a report is made with, borrowed afresh for each.
        macro_rules! reporter {
            () => {
                Reporter {
                    catalog: &catalog,
                    symbolizer: &mut symbolizer,
                    options: &options,
                    probes: &probes,
                    mappings: &mappings,
                    recording: &recording,
                    evictor: evictor.as_ref(),
                    budget: budget.as_ref(),
                }
            };
        }
        let ending = loop {
            // The budget: when a process's probes go in or out next.
            let next_switch = budget.as_ref().and_then(Budget::next_switch);
            tokio::select! {
                _ = async { status.as_mut().unwrap().tick().await }, if status.is_some() => {
                    show_status(&ebpf, started, heap.as_ref());
                }
                _ = sigint.recv() => break Ending::Signal(Signal::SIGINT),
                _ = sigterm.recv() => break Ending::Signal(Signal::SIGTERM),
                _ = &mut deadline, if duration.is_some() => break Ending::Duration,
                result = &mut exits, if !monitor => { result?; break Ending::TargetExited; }
                _ = async { housekeeping.as_mut().unwrap().tick().await }, if housekeeping.is_some() => {
                    if let Some(heap) = heap.as_mut() {
                        keep_house(heap, &mut ebpf, &catalog, false)?;
                    }
                }
                Some(request) = async { requests.as_mut().unwrap().recv().await }, if requests.is_some() => {
                    let reporter = reporter!();
                    let report = reporter.build(&mut ebpf, heap.as_mut(), started.elapsed().as_secs_f64(), None, None, &request.cut);
                    let _ = request.reply.send(report.map(|(report, _)| report).map_err(|err| format!("{err:#}")));
                }
                _ = async { eviction.as_mut().unwrap().tick().await }, if eviction.is_some() => {
                    if let Some(evictor) = evictor.as_mut() {
                        evictor.sweep(&mut ebpf, Held {
                            catalog: &catalog,
                            mappings: &mappings,
                            heap: heap.as_mut(),
                            symbolizer: &mut symbolizer,
                            probes: &probes,
                        })?;
                    }
                }
                _ = async { pruning.as_mut().unwrap().tick().await }, if pruning.is_some() => {
                    probes.lock().unwrap_or_else(|e| e.into_inner()).prune();
                }
                _ = async { budget_tick.as_mut().unwrap().tick().await }, if budget_tick.is_some() => {
                    if let Some(budget) = budget.as_mut() {
                        let mut sites = collect::read_sites(&ebpf, options.sampling())?;
                        sites.extend(mappings.lock().unwrap_or_else(|e| e.into_inner()).sites());
                        let exact = budget.read_calls(&mut ebpf)?;
                        let (current, ended) = {
                            let mut catalog = catalog.lock().unwrap_or_else(|e| e.into_inner());
                            if !options.live.live {
                                crate::monitor::budget::announce::unannounced(&mut ebpf, &mut catalog, &exact)?;
                            }
                            (catalog.current_generations().clone(), catalog.ended_generations(|tgid| exact.by_tgid.contains_key(&tgid)))
                        };
                        budget.tick(&sites, &exact, &current, &ended, probes.lock().unwrap_or_else(|e| e.into_inner()).scopes());
                    }
                }
                _ = async { tokio::time::sleep_until(next_switch.unwrap().into()).await }, if next_switch.is_some() => {
                    if let Some(budget) = budget.as_mut() {
                        budget.switch(probes.lock().unwrap_or_else(|e| e.into_inner()).scopes());
                    }
                }
                change = recording.changed(), if recording.may_change() => {
                    recording.apply(change, &mut ebpf, started.elapsed().as_secs_f64())?;
                }
                _ = async { timeline_tick.as_mut().unwrap().tick().await }, if timeline_tick.is_some() => {
                    if let Some(timeline) = timeline.as_mut() {
                        sample_timeline(timeline, &ebpf, &options, &mappings, started.elapsed().as_secs_f64())?;
                    }
                }
                _ = async { interval.as_mut().unwrap().tick().await }, if interval.is_some() => {
                    clear_status(status.is_some());
                    let reporter = reporter!();
                    let secs = started.elapsed().as_secs_f64();
                    match (&out, view.as_mut()) {
                        (_, Some(view)) => {
                            let mut cut = options.report.clone();
                            (cut.group_by, cut.depth) = (crate::report::options::GroupBy::Caller, 1);
                            let (report, _) = reporter.build(&mut ebpf, heap.as_mut(), secs, None, None, &cut)?;
                            let serving = requests.as_ref().map_or(String::new(), |_| format!("serving {listening}"));
                            // A terminal gone (hung up) is no error of the profile's.
                            let mut stdout = std::io::stdout();
                            let _ = std::io::Write::write_all(&mut stdout, view.render(&report, &serving).as_bytes());
                            let _ = std::io::Write::flush(&mut stdout);
                        }
                        (Some(out), None) => {
                            let (report, _) = reporter.build(&mut ebpf, heap.as_mut(), secs, series.as_mut(), timeline.as_mut(), &options.report)?;
                            write_out(out, &report);
                        }
                        (None, None) => reporter.print(&mut ebpf, heap.as_mut(), secs, series.as_mut(), timeline.as_mut())?,
                    }
                }
                _ = async { sighup.as_mut().unwrap().recv().await }, if sighup.is_some() => {
                    if let Some(out) = &out {
                        let reporter = reporter!();
                        let (report, _) = reporter.build(&mut ebpf, heap.as_mut(), started.elapsed().as_secs_f64(), series.as_mut(), timeline.as_mut(), &options.report)?;
                        write_out(out, &report);
                    }
                }
            }
        };
        // Requests from now on fail at once, not after the final report.
        drop(requests);

        clear_status(status.is_some());
        let profiled_secs = started.elapsed().as_secs_f64();
        // No process may be stopped for a notice no one will read (a child
        // still running, which loads a library).
        if matches!(target, Target::Command(_)) {
            stop_holding(&mut ebpf)?;
        }
        // The probes detach from now on, beside the rest: that waits for
        // the kernel (about 0.1 s per shared event), and the user waits
        // for the report, not for it. No library gets probes from now on.
        let detaching = probes
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .start_detach();
        if let Some(heap) = heap.as_mut() {
            // The last peak poll, timed at the end of the profile.
            keep_house(heap, &mut ebpf, &catalog, true)?;
        }
        let exit_code = match &target {
            Target::Command(pid) => finish_command(*pid, &ending).await,
            Target::Pids(_) => 0,
        };
        let notices_ended = notices.stop();
        let reporter = reporter!();
        let printed = match &out {
            // The last snapshot, in the directory.
            Some(out) => reporter
                .build(
                    &mut ebpf,
                    heap.as_mut(),
                    profiled_secs,
                    series.as_mut(),
                    timeline.as_mut(),
                    &options.report,
                )
                .and_then(|(report, _)| {
                    write_out(out, &report);
                    report::emit(
                        &report,
                        options.report.format,
                        options.report.output.as_deref(),
                    )
                }),
            None => reporter.print(
                &mut ebpf,
                heap.as_mut(),
                profiled_secs,
                series.as_mut(),
                timeline.as_mut(),
            ),
        };
        let _ = detaching.join();
        printed?;
        notices_ended?;
        Ok(exit_code)
    }
}

/// `--out DIR`: one more report there; a failed write (a full disk) is
/// said, and the watching goes on.
fn write_out(out: &OutDir, report: &report::Report) {
    if let Err(err) = out.write(report) {
        eprintln!("memprof: warning: {err:#}");
    }
}

/// From now on the kernel stops no process to wait for memprof (see
/// `HOLD_FOR_TABLES`); a stop it decided on just before is announced in a
/// notice the notice thread still reads (it empties the ring buffer
/// before it ends).
fn stop_holding(ebpf: &mut Ebpf) -> Result<()> {
    let mut holds_off: aya::maps::Array<&mut aya::maps::MapData, u32> =
        aya::maps::Array::try_from(ebpf.map_mut("HOLDS_OFF").context("map HOLDS_OFF")?)?;
    holds_off.set(0, 1, 0).context("map HOLDS_OFF")?;
    // A program that read the flag before it changed finishes in
    // microseconds, its notice submitted.
    std::thread::sleep(Duration::from_millis(5));
    Ok(())
}

/// "memprof: 12 s, 1,234,567 allocations, 3 processes" on stderr, in place.
fn show_status(ebpf: &Ebpf, started: Instant, heap: Option<&HeapTracker>) {
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

fn clear_status(shown: bool) {
    if shown {
        eprint!("\r\x1b[2K");
    }
}

/// Live mode: takes what ended processes left out of the kernel's
/// table and polls for peaks (`force`: now).
fn keep_house(
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
fn sample_timeline(
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

/// What a report is made with.
struct Reporter<'a> {
    catalog: &'a Mutex<Catalog>,
    symbolizer: &'a mut Symbolizer,
    options: &'a ProfileOptions,
    probes: &'a Mutex<Probes>,
    mappings: &'a Mutex<MappingTracker>,
    recording: &'a Recording,
    /// `monitor`: what was evicted.
    evictor: Option<&'a Evictor>,
    /// `monitor`: what the probes cost each process.
    budget: Option<&'a Budget>,
}

/// The probes as the report lists them.
fn probe_reports(probes: &Probes) -> (Vec<ProbeReport>, Vec<UnprobedReport>) {
    let probed = probes
        .functions
        .iter()
        .map(|f| ProbeReport {
            module: f.module.display().to_string(),
            function: f.function.clone(),
            role: f.role.to_string(),
            allocator: f.allocator.map(str::to_string),
            offset: format!("{:#x}", f.file_offset),
        })
        .collect();
    let unprobed = probes
        .unprobed
        .iter()
        .map(|u| UnprobedReport {
            program: u.program.clone(),
            reason: u.reason.clone(),
        })
        .collect();
    (probed, unprobed)
}

impl Reporter<'_> {
    /// Makes the report (see [`Reporter::build`]), writes it out as the
    /// command line asked.
    fn print(
        self,
        ebpf: &mut Ebpf,
        heap: Option<&mut HeapTracker>,
        duration_secs: f64,
        series: Option<&mut Series>,
        timeline: Option<&mut TimelineRecorder>,
    ) -> Result<()> {
        let timer = Instant::now();
        let options = self.options;
        let (report, recorded) =
            self.build(ebpf, heap, duration_secs, series, timeline, &options.report)?;
        report::emit(
            &report,
            options.report.format,
            options.report.output.as_deref(),
        )?;
        if std::env::var_os("MEMPROF_TIMINGS").is_some() {
            // Read by `cargo xtask bench`: this report's time, and memprof's
            // own CPU time and peak memory so far.
            let stacks: usize = report.processes.iter().map(|p| p.total_stacks).sum();
            let usage = nix::sys::resource::getrusage(nix::sys::resource::UsageWho::RUSAGE_SELF)?;
            let cpu =
                |t: nix::sys::time::TimeVal| t.tv_sec() as f64 * 1e3 + t.tv_usec() as f64 / 1e3;
            eprintln!(
                "memprof-timing: report_ms={:.1} stacks={stacks} calls={recorded} cpu_ms={:.1} max_rss_kb={}",
                timer.elapsed().as_secs_f64() * 1e3,
                cpu(usage.user_time()) + cpu(usage.system_time()),
                usage.max_rss()
            );
        }
        Ok(())
    }

    /// The report of everything counted so far, cut by `cut`; and the
    /// calls recorded.
    fn build(
        self,
        ebpf: &mut Ebpf,
        heap: Option<&mut HeapTracker>,
        duration_secs: f64,
        series: Option<&mut Series>,
        timeline: Option<&mut TimelineRecorder>,
        cut: &ReportOptions,
    ) -> Result<(report::Report, u64)> {
        let mut started_ns = 0;
        let mut live_view = match heap {
            Some(heap) => {
                keep_house(heap, ebpf, self.catalog, true)?;
                started_ns = heap.started_ns;
                Some(heap.view(ebpf)?)
            }
            None => None,
        };
        let sample_bytes = self.options.sampling.sample_bytes.map(|bytes| bytes.0);
        let mut snapshot = collect::snapshot(ebpf, self.options.sampling())?;
        let (mapped, mapped_live, mapped_peaks) = {
            let mappings = self.mappings.lock().unwrap_or_else(|e| e.into_inner());
            let min_age_ns = self.options.live.min_age.map_or(0, |age| age.nanos());
            (
                mappings.sites(),
                mappings.live(min_age_ns, monotonic_ns()),
                mappings.peaks(),
            )
        };
        collect::add_sites(ebpf, &mut snapshot, mapped)?;
        // Processes whose probes the budget kept in for part of a period:
        // estimates from those windows.
        if let Some(budget) = self.budget {
            budget.scale(&mut snapshot.sites);
        }
        if let Some(evictor) = self.evictor {
            snapshot.lost[LostCause::ProcessTableFull as usize] += evictor.refused_calls();
        }
        {
            let probes = self.probes.lock().unwrap_or_else(|e| e.into_inner());
            snapshot.lost[LostCause::ForkUnheld as usize] += probes.unlinked_forks();
            snapshot.lost[LostCause::ProbedLate as usize] += probes.probed_late;
        }
        if let Some(view) = live_view.as_mut() {
            view.sites.extend(mapped_live);
            view.mapped_peaks = mapped_peaks
                .into_iter()
                .map(|(image, (bytes, at_ns))| {
                    (
                        image,
                        (bytes, at_ns.saturating_sub(started_ns) as f64 / 1e9),
                    )
                })
                .collect();
        }
        let timeline = timeline.map(|timeline| {
            // The last sample: the moment of this report.
            timeline.sample(duration_secs, &snapshot.sites);
            &*timeline
        });
        let no_series = Series::default();
        let series: &Series = match series {
            Some(series) => {
                record_series(series, &snapshot, duration_secs, live_view.is_some());
                series
            }
            None => &no_series,
        };
        let live = live_view.as_ref().map(|view| Live {
            view,
            settings: LiveSettingsReport {
                min_age_secs: self.options.live.min_age.map(|age| age.0),
                temp_threshold_secs: self.options.live.temp_threshold.0,
                peak_poll_secs: view.peak_poll_secs,
            },
        });
        let (probes, unprobed, site_groups, usdt_used) = {
            let held = self.probes.lock().unwrap_or_else(|e| e.into_inner());
            let (probes, unprobed) = probe_reports(&held);
            (probes, unprobed, held.site_groups(), held.usdt_placed)
        };
        let mut catalog = self.catalog.lock().unwrap_or_else(|e| e.into_inner());
        catalog.refresh(snapshot.sites.iter().map(|(k, _)| (k.tgid, k.generation)));
        let counted_totals = match self.budget {
            Some(budget) => {
                let kernel = budget.peek_calls(ebpf)?;
                Some(budget.counted_totals(
                    &snapshot.sites,
                    &kernel,
                    catalog.current_generations(),
                    &catalog.ended_generations(|tgid| kernel.by_tgid.contains_key(&tgid)),
                ))
            }
            None => None,
        };
        let report = report::build::build(
            &snapshot,
            &catalog,
            self.symbolizer,
            cut,
            Taken {
                duration_secs,
                series,
                live: live.as_ref(),
                sample_bytes,
                probes: &probes,
                unprobed: &unprobed,
                timeline,
                recording: self.recording.report(duration_secs),
                counted_totals: counted_totals.as_ref(),
            },
        );
        let mut report = report::Report {
            limits: self.evictor.map(|evictor| LimitsReport {
                site_groups: site_groups.used,
                max_site_groups: site_groups.limit,
                freed_probed_files: site_groups.freed_files,
                ..evictor.report()
            }),
            budget: self.budget.map(Budget::report),
            // Figures from programs' own samples (--usdt) are estimates.
            exact: report.exact && !usdt_used && !self.budget.is_some_and(Budget::scaled),
            ..report
        };
        if let Some(budget) = self.budget {
            for process in &mut report.processes {
                let image = memprof_common::images::ProcessImage {
                    tgid: process.pid,
                    generation: process.generation,
                };
                process.overhead = budget.overheads().get(&image).copied();
                process.duty_cycle = budget.duty_cycles().get(&image).copied();
                process.trap_share = budget.trap_shares().get(&image).copied();
                if process.duty_cycle.is_some_and(|duty| duty < 1.0) {
                    process.span_rate = budget.span_rates().get(&image).copied();
                }
            }
        }
        let recorded: u64 = snapshot.sites.iter().map(|(_, s)| s.samples).sum();
        Ok((report, recorded))
    }
}

/// The traced command's exit status, shell style (128+N for signal N).
/// On Ctrl-C / SIGTERM the command gets the signal too, if the terminal
/// did not already deliver it.
async fn finish_command(pid: Pid, ending: &Ending) -> i32 {
    if let Ending::Signal(signal) = ending {
        if !wait_exit(pid, Duration::from_millis(100)).await {
            let _ = kill(pid, *signal);
            wait_exit(pid, Duration::from_secs(2)).await;
        }
    }
    match waitpid(pid, Some(WaitPidFlag::WNOHANG)) {
        Ok(WaitStatus::Exited(_, code)) => code,
        Ok(WaitStatus::Signaled(_, signal, _)) => 128 + signal as i32,
        _ => match ending {
            Ending::Signal(signal) => 128 + *signal as i32,
            _ => 0,
        },
    }
}

/// Waits up to `limit` for `pid` to exit (without reaping it).
async fn wait_exit(pid: Pid, limit: Duration) -> bool {
    let Ok(fd) = pidfd_open(pid.as_raw()) else {
        return true;
    };
    let Ok(fd) = watch(fd) else {
        return true;
    };
    tokio::time::timeout(limit, fd.readable()).await.is_ok()
}

/// Resolves when the target processes have all exited.
fn exit_watch(target: &Target) -> Result<impl std::future::Future<Output = Result<()>>> {
    let pids: Vec<i32> = match target {
        Target::Command(pid) => vec![pid.as_raw()],
        Target::Pids(pids) => pids.clone(),
    };
    let fds = pids
        .iter()
        .filter_map(|&pid| pidfd_open(pid).ok())
        .map(watch)
        .collect::<std::io::Result<Vec<_>>>()?;
    Ok(async move {
        for fd in &fds {
            let _ = fd.readable().await?;
        }
        Ok(())
    })
}

/// Registers a readable fd (a ring buffer, a pidfd) with the runtime.
fn watch<T: std::os::fd::AsRawFd>(inner: T) -> std::io::Result<AsyncFd<T>> {
    // SAFETY: `inner` owns its fd, which stays open as long as the AsyncFd.
    unsafe { AsyncFd::register_with_interest(inner, tokio::io::Interest::READABLE) }
        .map_err(std::io::Error::from)
}
