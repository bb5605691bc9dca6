//! Printing the measured rows: the markdown table of medians, and the
//! lines that set rows against each other.
use super::{
    rows::{Workload, FLOOR},
    run::Measured,
};

/// The table of medians, each with its ratio to its workload's floor.
pub fn table(measured: &Measured) {
    println!("| what | ns per malloc+free | × floor | target |");
    println!("|---|---:|---:|---:|");
    for (row, ns) in measured.rows() {
        let ratio = ns / measured.floor_of(row.workload);
        let target = row
            .targets
            .iter()
            .map(|&target| {
                if ratio <= target {
                    format!("≤ {target} met")
                } else {
                    format!("≤ {target} **missed**")
                }
            })
            .collect::<Vec<_>>()
            .join("; ");
        println!("| {} | {ns:.0} | {ratio:.2} | {target} |", row.name);
    }
}

/// The malloc loop's row run with `flags` over the one with `without`.
fn loop_ratio(measured: &Measured, flags: &[&str], without: &[&str]) -> f64 {
    measured.median_of(Workload::AllocLoop, flags)
        / measured.median_of(Workload::AllocLoop, without)
}

pub fn mapping_ratios(measured: &Measured) {
    println!();
    println!(
        "Direct-mapping tracking on / off (--no-mmap), malloc loop: totals {:.3}x, --live {:.3}x.",
        loop_ratio(measured, &[], &["--no-mmap"]),
        loop_ratio(measured, &["--live"], &["--live", "--no-mmap"]),
    );
}

pub fn region_ratios(measured: &Measured) {
    println!();
    println!(
        "Regions, malloc loop: --while off the stack / floor {:.3}x; --while on it / totals {:.3}x; timeline / totals {:.3}x.",
        loop_ratio(measured, &["--while", "printf"], FLOOR),
        loop_ratio(measured, &["--while", "churn"], &[]),
        loop_ratio(measured, &["--format", "timeline"], &[]),
    );
}

/// What unwinding one more frame costs: the loop without frame pointers
/// at 31 frames against 11.
pub fn frame_cost(measured: &Measured) {
    let total_at = |frames: u32| measured.median_of(Workload::DeepNoFp(frames), &[]);
    println!();
    println!(
        "Cost per unwound frame (CFI tables, in the kernel): {:.0} ns ((31 frames - 11 frames) / 20).",
        (total_at(31) - total_at(11)) / 20.0
    );
}

/// What the table's medians are of, and which rows it lacks.
pub fn run_counts(runs: usize, allocations: u64, has_bpftrace: bool) {
    println!();
    println!("Median of {runs} runs of {allocations} malloc(64)+free pairs, one call site.");
    if !has_bpftrace {
        println!("(bpftrace is not installed: its rows are left out.)");
    }
}
