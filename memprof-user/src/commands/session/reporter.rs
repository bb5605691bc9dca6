//! Making a report during or at the end of a session: the kernel's counts
//! read, the direct mappings and the budget's estimates added, the stacks
//! symbolized, and the report written where the command line asked.
use std::{collections::HashMap, sync::Mutex, time::Instant};

use anyhow::Result;
use aya::Ebpf;
use memprof_common::{images::ProcessImage, lost::LostCause, sites::AllocStats};

use super::keep_house;
use crate::{
    cli::ProfileOptions,
    collect::{
        self,
        catalog::Catalog,
        heap::{monotonic_ns, HeapTracker, LiveView},
        mappings::MappingTracker,
        timeline::TimelineRecorder,
        Snapshot,
    },
    commands::recording::Recording,
    monitor::{budget::Budget, evict::Evictor},
    probes::{Probes, Unprobed},
    report::{
        self,
        build::{record_series, Live, Series, Taken},
        model::{BudgetTotals, LimitsReport, LiveSettingsReport, ProbeReport, UnprobedReport},
        options::ReportOptions,
    },
    symbolize::Symbolizer,
};

/// What a report is made with.
pub(super) struct Reporter<'a> {
    pub catalog: &'a Mutex<Catalog>,
    pub symbolizer: &'a mut Symbolizer,
    pub options: &'a ProfileOptions,
    pub probes: &'a Mutex<Probes>,
    pub mappings: &'a Mutex<MappingTracker>,
    pub recording: &'a Recording,
    /// `monitor`: what was evicted.
    pub evictor: Option<&'a Evictor>,
    /// `monitor`: what the probes cost each process.
    pub budget: Option<&'a Budget>,
}

/// The probes as the report lists them.
struct ProbeLists {
    probes: Vec<ProbeReport>,
    unprobed: Vec<UnprobedReport>,
    partly_probed: Vec<UnprobedReport>,
}

fn probe_reports(probes: &Probes) -> ProbeLists {
    let listed = |targets: &[Unprobed]| {
        targets
            .iter()
            .map(|u| UnprobedReport {
                program: u.program.clone(),
                reason: u.reason.clone(),
            })
            .collect()
    };
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
    ProbeLists {
        probes: probed,
        unprobed: listed(&probes.unprobed),
        partly_probed: listed(&probes.partly_probed),
    }
}

impl Reporter<'_> {
    /// Makes the report (see [`Reporter::build`]), writes it out as the
    /// command line asked.
    pub fn print(
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
        let stacks: usize = report.processes.iter().map(|p| p.total_stacks).sum();
        report::emit(report, &options.report)?;
        if std::env::var_os("MEMPROF_TIMINGS").is_some() {
            print_timings(stacks, recorded, timer)?;
        }
        Ok(())
    }

    /// The report of everything counted so far, cut by `cut`; and the
    /// calls recorded.
    pub fn build(
        self,
        ebpf: &mut Ebpf,
        heap: Option<&mut HeapTracker>,
        duration_secs: f64,
        series: Option<&mut Series>,
        timeline: Option<&mut TimelineRecorder>,
        cut: &ReportOptions,
    ) -> Result<(report::Report, u64)> {
        let (started_ns, mut live_view) = match heap {
            Some(heap) => {
                keep_house(heap, ebpf, self.catalog, true)?;
                (heap.started_ns, Some(heap.view(ebpf)?))
            }
            None => (0, None),
        };
        let snapshot = self.read(ebpf, live_view.as_mut(), started_ns)?;
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
        let (lists, site_groups, usdt_used) = {
            let held = self.probes.lock().unwrap_or_else(|e| e.into_inner());
            (probe_reports(&held), held.site_groups(), held.usdt_placed)
        };
        let mut catalog = self.catalog.lock().unwrap_or_else(|e| e.into_inner());
        catalog.refresh(snapshot.sites.iter().map(|(k, _)| (k.tgid, k.generation)));
        let counted_totals = self.counted_totals(ebpf, &snapshot, &catalog)?;
        let report = report::build::build(
            &snapshot,
            &catalog,
            self.symbolizer,
            cut,
            Taken {
                duration_secs,
                series,
                live: live.as_ref(),
                sample_bytes: self.options.sampling.sample_bytes.map(|bytes| bytes.0),
                probes: &lists.probes,
                unprobed: &lists.unprobed,
                partly_probed: &lists.partly_probed,
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
            add_budget_figures(&mut report, budget);
        }
        let recorded: u64 = snapshot.sites.iter().map(|(_, s)| s.samples).sum();
        Ok((report, recorded))
    }

    /// The kernel's counts with the direct mappings' sites, the budget's
    /// estimates and the losses only user space counts; the direct
    /// mappings' live blocks and peaks into `live_view`.
    fn read(
        &self,
        ebpf: &Ebpf,
        live_view: Option<&mut LiveView>,
        started_ns: u64,
    ) -> Result<Snapshot> {
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
        if let Some(view) = live_view {
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
        Ok(snapshot)
    }

    /// Under the budget: each process image's totals as the kernel counted
    /// them, every call.
    fn counted_totals(
        &self,
        ebpf: &mut Ebpf,
        snapshot: &Snapshot,
        catalog: &Catalog,
    ) -> Result<Option<HashMap<ProcessImage, AllocStats>>> {
        let Some(budget) = self.budget else {
            return Ok(None);
        };
        let kernel = budget.peek_calls(ebpf)?;
        Ok(Some(budget.counted_totals(
            &snapshot.sites,
            &kernel,
            catalog.current_generations(),
            &catalog.ended_generations(|tgid| kernel.by_tgid.contains_key(&tgid)),
        )))
    }
}

/// Each process's cost and duty cycle under the budget, and how much of
/// the totals is counted, estimated and partial.
fn add_budget_figures(report: &mut report::Report, budget: &Budget) {
    let mut totals = BudgetTotals::default();
    for process in &mut report.processes {
        let image = ProcessImage {
            tgid: process.pid,
            generation: process.generation,
        };
        process.overhead = budget.overheads().get(&image).copied();
        process.duty_cycle = budget.duty_cycles().get(&image).copied();
        process.trap_share = budget.trap_shares().get(&image).copied();
        process.partial = budget.partial().contains(&image);
        process.over_budget = budget.over_budget(&image);
        let estimated = budget.is_estimated(&image);
        if estimated {
            process.overhead_bound = budget.overhead_bound(&image);
            process.counted = budget.counted_calls(&image);
        }
        if process.duty_cycle.is_some_and(|duty| duty < 1.0) {
            process.span_rate = budget.span_rates().get(&image).copied();
        }
        let kind = match (process.partial, estimated) {
            (true, _) => &mut totals.partial,
            (false, true) => &mut totals.estimated,
            (false, false) => &mut totals.counted,
        };
        kind.processes += 1;
        kind.bytes += process.bytes;
        kind.count += process.count;
    }
    if let Some(budget) = report.budget.as_mut() {
        budget.totals = Some(totals);
    }
}

/// `MEMPROF_TIMINGS`, read by `cargo xtask bench`: this report's time, and
/// memprof's own CPU time and peak memory so far.
fn print_timings(stacks: usize, recorded: u64, timer: Instant) -> Result<()> {
    let usage = nix::sys::resource::getrusage(nix::sys::resource::UsageWho::RUSAGE_SELF)?;
    let cpu = |t: nix::sys::time::TimeVal| t.tv_sec() as f64 * 1e3 + t.tv_usec() as f64 / 1e3;
    eprintln!(
        "memprof-timing: report_ms={:.1} stacks={stacks} calls={recorded} cpu_ms={:.1} max_rss_kb={}",
        timer.elapsed().as_secs_f64() * 1e3,
        cpu(usage.user_time()) + cpu(usage.system_time()),
        usage.max_rss()
    );
    Ok(())
}
