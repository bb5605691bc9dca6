//! Project tasks: `cargo xtask bench`, `cargo xtask fuzz` (see
//! BENCHMARKS.md), `cargo xtask dist` (what installs memprof).
use anyhow::Result;
use clap::{Parser, Subcommand};

mod bench;
mod budget;
mod churn;
mod dist;
mod fuzz;
mod process;
mod workloads;
mod workspace;

use bench::Only;

#[derive(Parser)]
struct Cli {
    #[command(subcommand)]
    task: Task,
}

#[derive(Subcommand)]
enum Task {
    /// Measure memprof's overhead and report speed (needs root). Prints a
    /// markdown table to paste into BENCHMARKS.md.
    Bench {
        /// Allocations per run of the malloc loop.
        #[arg(long, default_value_t = 1_000_000)]
        allocations: u64,
        /// Runs per configuration; the median is reported.
        #[arg(long, default_value_t = 5)]
        runs: usize,
        /// Only the rows of other allocators (C++'s new, jemalloc,
        /// tcmalloc, mimalloc) against their floors.
        #[arg(long)]
        allocators_only: bool,
        /// Only the malloc loop's rows with and without direct-mapping
        /// tracking (--no-mmap), against the floor.
        #[arg(long)]
        mappings_only: bool,
        /// Only the malloc loop's rows of --while (the function off the
        /// stack, and on it) and of the timeline's sampling.
        #[arg(long)]
        regions_only: bool,
        /// Only the malloc loop's live-heap rows (the sampled live heap:
        /// session uprobes, in `trace` and under `monitor` of the whole
        /// host), against the floor.
        #[arg(long)]
        live_only: bool,
        /// Only the start and exit times (`trace -- /bin/true`, `attach`).
        #[arg(long)]
        start_exit_only: bool,
        /// Only the programs with 10,000 and 100,000 distinct stacks (a
        /// call's cost when its stack is new, the report's time, RSS).
        #[arg(long)]
        stacks_only: bool,
        /// Only a Python program's objects (bench/python_objects.py)
        /// untraced, under memray and under `memprof trace`: wall times
        /// and the allocations each counted.
        #[arg(long)]
        python_only: bool,
        /// Only a Go program's allocations (bench/go_alloc: 1,000,000
        /// objects) untraced, under Go's own profile of every allocation,
        /// on the bare uprobe and under `memprof trace`: the cost added
        /// per allocation.
        #[arg(long)]
        go_only: bool,
        /// Only `memprof monitor` under process churn for SECS seconds
        /// (short processes one after another): its CPU, memory, open
        /// files, lost events and tables every 30 s (60 s from 20 minutes).
        #[arg(long, value_name = "SECS")]
        monitor_churn_only: Option<u64>,
        /// Only four allocbench-like processes for SECS seconds, alone and
        /// under `memprof monitor`'s default budget (--runs rounds): their
        /// slowdowns, duty cycles and memprof's estimates.
        #[arg(long, value_name = "SECS")]
        monitor_budget_only: Option<u64>,
        /// Only real workloads (whole-host churn of short processes,
        /// sqlite3, a 10 s allocation loop) untraced and under `memprof
        /// monitor`'s default budget, ROUNDS rounds interleaved: their
        /// slowdowns and memprof's figures against the truth.
        #[arg(long, value_name = "ROUNDS")]
        monitor_workloads_only: Option<usize>,
        /// With --monitor-budget-only or --monitor-churn-only: memprof
        /// monitors the whole host (under the budget, every process's
        /// probes in and out together), not the processes by name.
        #[arg(long)]
        whole_host: bool,
        /// With --monitor-churn-only: `monitor --live` (the pointer table
        /// swept of what ended processes left).
        #[arg(long)]
        live: bool,
        /// With --monitor-churn-only: under monitor's default budget, not
        /// `--exact` (what a daemon left on does).
        #[arg(long)]
        budget: bool,
        /// Then fuzz each reader of untrusted input this long (0: no fuzzing).
        #[arg(long, default_value_t = 60, value_name = "SECS")]
        fuzz_secs: u64,
    },
    /// Fuzz the readers of input memprof does not control (saved JSON
    /// reports; ELF and DWARF files of profiled processes) for SECS
    /// seconds each: fails on a panic or an error of more than one line,
    /// prints how many inputs each reader was given.
    /// Build what installs memprof without building it, in target/dist/:
    /// the binary stripped (its BPF programs inside), man pages, shell
    /// completions, the systemd unit and a .deb (needs cargo-deb).
    Dist {
        /// Package the release binary already built instead of building it.
        #[arg(long)]
        no_build: bool,
    },
    Fuzz {
        #[arg(long, default_value_t = 60)]
        secs: u64,
        /// Run the coverage-guided targets (cargo-fuzz, libFuzzer, with
        /// nightly and AddressSanitizer; fuzz/coverage) instead, SECS each;
        /// cargo-fuzz is installed if missing.
        #[arg(long)]
        coverage: bool,
    },
}

fn main() -> Result<()> {
    match Cli::parse().task {
        Task::Bench {
            allocations,
            runs,
            allocators_only,
            mappings_only,
            regions_only,
            live_only,
            start_exit_only,
            stacks_only,
            python_only,
            go_only,
            monitor_churn_only,
            monitor_budget_only,
            monitor_workloads_only,
            whole_host,
            live,
            budget,
            fuzz_secs,
        } => {
            if let Some(secs) = monitor_churn_only {
                return churn::monitor_churn(secs, whole_host, live, budget);
            }
            if let Some(rounds) = monitor_workloads_only {
                return workloads::monitor_workloads(rounds);
            }
            if let Some(secs) = monitor_budget_only {
                return budget::monitor_budget(secs, runs, whole_host);
            }
            if stacks_only {
                return bench::stacks_only();
            }
            if python_only {
                return bench::python_only(runs);
            }
            if go_only {
                return bench::go_only(runs);
            }
            if start_exit_only {
                return bench::start_exit_only(runs);
            }
            // The first of the row-selecting flags given wins.
            let only = match (allocators_only, mappings_only, regions_only, live_only) {
                (true, _, _, _) => Only::Allocators,
                (_, true, _, _) => Only::Mappings,
                (_, _, true, _) => Only::Regions,
                (_, _, _, true) => Only::Live,
                _ => Only::All,
            };
            bench::bench(allocations, runs, only)?;
            if fuzz_secs > 0 {
                println!();
                fuzz::fuzz(fuzz_secs)?;
            }
            Ok(())
        }
        Task::Dist { no_build } => dist::dist(!no_build),
        Task::Fuzz {
            secs,
            coverage: false,
        } => fuzz::fuzz(secs),
        Task::Fuzz {
            secs,
            coverage: true,
        } => fuzz::coverage(secs),
    }
}
