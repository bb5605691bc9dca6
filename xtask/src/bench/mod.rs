//! `cargo xtask bench`: memprof's overhead on malloc loops, as a table of
//! rows against their floors, then what memprof itself costs: its CPU,
//! its start and exit, unwind tables, many distinct stacks.
use std::process::Command;

use anyhow::Result;

use crate::workspace::{bench_dir, build_memprof, compile};

mod daemon;
mod go;
pub mod numbers;
mod print;
mod programs;
mod python;
mod rows;
mod run;
mod stacks;
mod start_exit;

pub use rows::Only;

/// The rows `only` keeps, `runs` times each (`allocations` malloc+free
/// pairs a run), and with all of them the other measurements.
pub fn bench(allocations: u64, runs: usize, only: Only) -> Result<()> {
    let memprof = build_memprof()?;
    let dir = bench_dir()?;
    let programs = programs::Programs::build(&dir)?;
    let has_bpftrace = Command::new("bpftrace").arg("--version").output().is_ok();
    let rows = rows::select(rows::all(has_bpftrace), only);
    let measured = run::measure(rows, runs, &memprof, &programs, allocations)?;
    // The table, the ratios the flag asked for, then (only for the whole
    // bench) the other measurements.
    print::table(&measured);
    if matches!(only, Only::All | Only::Mappings) {
        print::mapping_ratios(&measured);
    }
    if matches!(only, Only::All | Only::Regions) {
        print::region_ratios(&measured);
    }
    if only != Only::All {
        return Ok(());
    }
    print::frame_cost(&measured);
    print::run_counts(runs, allocations, has_bpftrace);
    daemon::cpu_per_million(&memprof, &programs.alloc_loop)?;
    start_exit::start_and_exit(&memprof, runs)?;
    daemon::unwind_tables(&memprof, &dir)?;
    stacks::distinct_stacks(&memprof, &programs.many_stacks)
}

/// `--stacks-only`: the distinct stacks' lines alone.
pub fn stacks_only() -> Result<()> {
    let memprof = build_memprof()?;
    let many_stacks = bench_dir()?.join("many_stacks");
    compile("bench/many_stacks.c", &many_stacks)?;
    stacks::distinct_stacks(&memprof, &many_stacks)
}

/// `--go-only`: a Go program's allocations, untraced, under Go's own
/// profile of each and under memprof.
pub fn go_only(runs: usize) -> Result<()> {
    go::go_allocations(runs)
}

/// `--python-only`: a Python program's objects, untraced, under memray
/// and under memprof.
pub fn python_only(runs: usize) -> Result<()> {
    python::python_objects(runs)
}

/// `--start-exit-only`: the start and exit times alone.
pub fn start_exit_only(runs: usize) -> Result<()> {
    let memprof = build_memprof()?;
    start_exit::start_and_exit(&memprof, runs)
}
