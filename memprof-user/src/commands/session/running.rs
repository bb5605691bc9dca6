//! A session under way: what the event loop's handlers share, one method
//! per event, and the end (detach, last report, exit status).
use std::{
    sync::{Arc, Mutex},
    time::Instant,
};

use anyhow::Result;
use aya::Ebpf;

use super::{
    clear_status,
    exits::{finish_command, stop_holding},
    keep_house,
    reporter::Reporter,
    sample_timeline, show_status, write_out, Ending, Profiled,
};
use crate::{
    cli::ProfileOptions,
    collect::{
        self, catalog::Catalog, heap::HeapTracker, mappings::MappingTracker, notices::NoticeReader,
        timeline::TimelineRecorder,
    },
    commands::recording::{Change, Recording},
    monitor::{
        self,
        budget::Budget,
        evict::{Evictor, Held},
        http::ReportRequest,
        out_dir::OutDir,
        view::View,
    },
    probes::Probes,
    report::{
        self,
        build::Series,
        options::{GroupBy, ReportOptions},
    },
    symbolize::Symbolizer,
};

pub(super) struct Running {
    pub ebpf: Ebpf,
    pub options: ProfileOptions,
    pub started: Instant,
    pub catalog: Arc<Mutex<Catalog>>,
    pub symbolizer: Symbolizer,
    /// Shared with the notice thread, which probes libraries loaded later.
    pub probes: Arc<Mutex<Probes>>,
    pub mappings: Arc<Mutex<MappingTracker>>,
    /// When calls are recorded (--delay, --start-on, --toggle-on).
    pub recording: Recording,
    /// `--live`: the pointer table's scans and the peaks.
    pub heap: Option<HeapTracker>,
    /// --interval (not `monitor`): a point per report.
    pub series: Option<Series>,
    pub timeline: Option<TimelineRecorder>,
    /// `monitor`: what ended processes left goes after a while.
    pub evictor: Option<Evictor>,
    /// `monitor` (not `--exact`): the cost budget.
    pub budget: Option<Budget>,
    /// `monitor --out DIR`: where each interval's report goes.
    pub out: Option<OutDir>,
    /// `monitor` on a terminal: a view like top's.
    pub view: Option<View>,
    /// "serving http://ADDR" for the view, when serving.
    pub serving: String,
    /// The live status line is drawn (and must be cleared before a report).
    pub status_shown: bool,
    /// The last report an endpoint asked for: the requests of the same
    /// second with the same cut share it (a scrape storm builds one).
    pub served: Option<Served>,
}

/// A report built for an endpoint.
pub(super) struct Served {
    at: Instant,
    /// The cut, as its Debug form (it has no Eq of its own).
    cut: String,
    report: crate::report::Report,
}

/// How long an endpoint's report is served again to requests that ask
/// for the same cut.
const SERVED_FOR: std::time::Duration = std::time::Duration::from_secs(1);

/// Which report: the one the command line asked for (it adds a point to
/// the series and the last sample of the timeline), or another cut of
/// the same figures.
enum Cut<'a> {
    AsAsked,
    Other(&'a ReportOptions),
}

impl Running {
    fn secs(&self) -> f64 {
        self.started.elapsed().as_secs_f64()
    }

    /// When a process's probes go in or out next (the budget).
    pub fn next_switch(&self) -> Option<Instant> {
        self.budget.as_ref().and_then(Budget::next_switch)
    }

    pub fn show_status(&self) {
        show_status(&self.ebpf, self.started, self.heap.as_ref());
    }

    pub fn keep_house(&mut self) -> Result<()> {
        if let Some(heap) = self.heap.as_mut() {
            keep_house(heap, &mut self.ebpf, &self.catalog, false)?;
        }
        Ok(())
    }

    /// An HTTP endpoint's report: the one built for the same cut within
    /// the last second, else a new one.
    pub fn answer(&mut self, request: ReportRequest) {
        let cut = format!("{:?}", request.cut);
        if let Some(served) = &self.served {
            if served.cut == cut && served.at.elapsed() < SERVED_FOR {
                let _ = request.reply.send(Ok(served.report.clone()));
                return;
            }
        }
        let at = Instant::now();
        let report = self.build(self.secs(), Cut::Other(&request.cut));
        if let Ok((report, _)) = &report {
            self.served = Some(Served {
                at,
                cut,
                report: report.clone(),
            });
        }
        let _ = request.reply.send(
            report
                .map(|(report, _)| report)
                .map_err(|err| format!("{err:#}")),
        );
    }

    pub fn evict(&mut self) -> Result<()> {
        if let Some(evictor) = self.evictor.as_mut() {
            evictor.sweep(
                &mut self.ebpf,
                Held {
                    catalog: &self.catalog,
                    mappings: &self.mappings,
                    heap: self.heap.as_mut(),
                    symbolizer: &mut self.symbolizer,
                    probes: &self.probes,
                },
            )?;
        }
        Ok(())
    }

    pub fn prune(&self) {
        self.probes
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .prune();
    }

    /// The budget's period: each process's calls read, its cost and duty
    /// cycle decided again.
    pub fn read_budget(&mut self) -> Result<()> {
        let Some(budget) = self.budget.as_mut() else {
            return Ok(());
        };
        let mut sites = collect::read_sites(&self.ebpf, self.options.sampling())?;
        sites.extend(
            self.mappings
                .lock()
                .unwrap_or_else(|e| e.into_inner())
                .sites(),
        );
        let exact = budget.read_calls(&mut self.ebpf)?;
        let (current, ended) = {
            let mut catalog = self.catalog.lock().unwrap_or_else(|e| e.into_inner());
            if !self.options.live.live {
                monitor::budget::announce::unannounced(&mut self.ebpf, &mut catalog, &exact)?;
            }
            (
                catalog.current_generations().clone(),
                catalog.ended_generations(|tgid| exact.by_tgid.contains_key(&tgid)),
            )
        };
        budget.tick(
            &sites,
            &exact,
            &current,
            &ended,
            self.probes
                .lock()
                .unwrap_or_else(|e| e.into_inner())
                .scopes(),
        );
        Ok(())
    }

    /// Processes that spent their allowance: out now.
    pub fn over_budget(&mut self, tgids: &[u32]) {
        if let Some(budget) = self.budget.as_mut() {
            budget.over_allowance(
                tgids,
                self.probes
                    .lock()
                    .unwrap_or_else(|e| e.into_inner())
                    .scopes(),
            );
        }
    }

    pub fn switch_budget(&mut self) {
        if let Some(budget) = self.budget.as_mut() {
            budget.switch(
                self.probes
                    .lock()
                    .unwrap_or_else(|e| e.into_inner())
                    .scopes(),
            );
        }
    }

    pub fn apply_recording(&mut self, change: Change) -> Result<()> {
        let secs = self.secs();
        self.recording.apply(change, &mut self.ebpf, secs)
    }

    pub fn sample_timeline(&mut self) -> Result<()> {
        let secs = self.secs();
        if let Some(timeline) = self.timeline.as_mut() {
            sample_timeline(timeline, &self.ebpf, &self.options, &self.mappings, secs)?;
        }
        Ok(())
    }

    /// Every --interval: the terminal view redrawn, a report in --out's
    /// directory, or one printed.
    pub fn periodic_report(&mut self) -> Result<()> {
        clear_status(self.status_shown);
        let secs = self.secs();
        if self.view.is_some() {
            let mut cut = self.options.report.clone();
            (cut.group_by, cut.depth) = (GroupBy::Caller, Some(1));
            let (mut report, _) = self.build(secs, Cut::Other(&cut))?;
            report.escape_names();
            if let Some(view) = self.view.as_mut() {
                // A terminal gone (hung up) is no error of the profile's.
                let mut stdout = std::io::stdout();
                let _ = std::io::Write::write_all(
                    &mut stdout,
                    view.render(&report, &self.serving).as_bytes(),
                );
                let _ = std::io::Write::flush(&mut stdout);
            }
        } else if self.out.is_some() {
            self.write_out(secs)?;
        } else {
            self.print(secs)?;
        }
        Ok(())
    }

    /// SIGHUP with --out: a report there at once.
    pub fn hangup_report(&mut self) -> Result<()> {
        if self.out.is_some() {
            self.write_out(self.secs())?;
        }
        Ok(())
    }

    /// Detaches, makes the last report and returns memprof's exit status.
    pub async fn finish(
        mut self,
        profiled: &Profiled,
        ending: &Ending,
        notices: NoticeReader,
    ) -> Result<i32> {
        clear_status(self.status_shown);
        let profiled_secs = self.secs();
        // No process may be stopped for a notice no one will read (a child
        // still running, which loads a library).
        if matches!(profiled, Profiled::Command(_)) {
            stop_holding(&mut self.ebpf)?;
        }
        // The probes detach from now on, beside the rest: that waits for
        // the kernel (about 0.1 s per shared event), and the user waits
        // for the report, not for it. No library gets probes from now on.
        let detaching = self
            .probes
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .start_detach();
        if let Some(heap) = self.heap.as_mut() {
            // The last peak poll, timed at the end of the profile.
            keep_house(heap, &mut self.ebpf, &self.catalog, true)?;
        }
        let exit_code = match profiled {
            Profiled::Command(pid) => finish_command(*pid, ending).await,
            Profiled::Pids(_) => 0,
        };
        let notices_ended = notices.stop();
        let printed = match self.out.is_some() {
            // The last snapshot, in the directory.
            true => self
                .build(profiled_secs, Cut::AsAsked)
                .and_then(|(report, _)| {
                    if let Some(out) = &self.out {
                        write_out(out, &report);
                    }
                    report::emit(report, &self.options.report)
                }),
            false => self.print(profiled_secs),
        };
        let _ = detaching.join();
        printed?;
        notices_ended?;
        Ok(exit_code)
    }

    /// The report as asked, into --out's directory.
    fn write_out(&mut self, secs: f64) -> Result<()> {
        let (report, _) = self.build(secs, Cut::AsAsked)?;
        if let Some(out) = &self.out {
            write_out(out, &report);
        }
        Ok(())
    }

    /// A reporter borrowing what a report is made with, beside the rest.
    fn parts(&mut self) -> Parts<'_> {
        Parts {
            reporter: Reporter {
                catalog: &self.catalog,
                symbolizer: &mut self.symbolizer,
                options: &self.options,
                probes: &self.probes,
                mappings: &self.mappings,
                recording: &self.recording,
                evictor: self.evictor.as_ref(),
                budget: self.budget.as_ref(),
            },
            ebpf: &mut self.ebpf,
            heap: self.heap.as_mut(),
            series: self.series.as_mut(),
            timeline: self.timeline.as_mut(),
            asked: &self.options.report,
        }
    }

    fn build(&mut self, secs: f64, cut: Cut<'_>) -> Result<(report::Report, u64)> {
        let parts = self.parts();
        match cut {
            Cut::AsAsked => parts.reporter.build(
                parts.ebpf,
                parts.heap,
                secs,
                parts.series,
                parts.timeline,
                parts.asked,
            ),
            Cut::Other(cut) => parts
                .reporter
                .build(parts.ebpf, parts.heap, secs, None, None, cut),
        }
    }

    /// The report as asked, written where the command line said.
    fn print(&mut self, secs: f64) -> Result<()> {
        let parts = self.parts();
        parts
            .reporter
            .print(parts.ebpf, parts.heap, secs, parts.series, parts.timeline)
    }
}

/// What a report is made with, borrowed from a [`Running`] at once.
struct Parts<'a> {
    reporter: Reporter<'a>,
    ebpf: &'a mut Ebpf,
    heap: Option<&'a mut HeapTracker>,
    series: Option<&'a mut Series>,
    timeline: Option<&'a mut TimelineRecorder>,
    /// The cut the command line asked for.
    asked: &'a ReportOptions,
}
