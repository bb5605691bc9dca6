//! Running the rows, each `runs` times: the median of each one's ns per
//! malloc+free.
use std::{path::Path, process::Command};

use anyhow::{Context as _, Result};

use super::{
    numbers::{field, median},
    programs::Programs,
    rows::{Row, Runner, Workload, FLOOR},
};
use crate::process::{run, start_monitor, Terminated};

/// The rows, each with the median of its runs.
pub struct Measured {
    rows: Vec<Row>,
    medians: Vec<f64>,
}

impl Measured {
    pub fn rows(&self) -> impl Iterator<Item = (&Row, f64)> {
        self.rows.iter().zip(self.medians.iter().copied())
    }

    /// The median of the memprof row of `workload` run with `wanted` flags
    /// (NaN if that row was not run).
    pub fn median_of(&self, workload: Workload, wanted: &[&str]) -> f64 {
        self.rows()
            .find(|(row, _)| {
                row.workload == workload
                    && matches!(row.runner, Runner::Memprof(flags) if flags == wanted)
            })
            .map_or(f64::NAN, |(_, ns)| ns)
    }

    /// The floor a row of `workload` is measured against: its workload's;
    /// for the loops without frame pointers, the 11 frames' one.
    pub fn floor_of(&self, workload: Workload) -> f64 {
        let workload = match workload {
            Workload::DeepNoFp(_) => Workload::DeepNoFp(11),
            workload => workload,
        };
        self.median_of(workload, FLOOR)
    }
}

/// Runs every row `runs` times, `allocations` malloc+free pairs a run.
pub fn measure(
    rows: Vec<Row>,
    runs: usize,
    memprof: &Path,
    programs: &Programs,
    allocations: u64,
) -> Result<Measured> {
    let n = allocations.to_string();
    // Interleaved, so that machine noise hits every row alike.
    let mut samples = vec![Vec::new(); rows.len()];
    for _ in 0..runs {
        for (index, row) in rows.iter().enumerate() {
            samples[index].push(ns_per_op(row, memprof, programs, &n)?);
        }
    }
    let medians = samples.into_iter().map(median).collect();
    Ok(Measured { rows, medians })
}

/// One run of `row`'s loop, `n` allocations: the ns per malloc+free it
/// printed.
fn ns_per_op(row: &Row, memprof: &Path, programs: &Programs, n: &str) -> Result<f64> {
    let (program, depth) = programs.of(row.workload);
    let output = match &row.runner {
        Runner::Untraced => run(Command::new(program).arg(n))?,
        Runner::Memprof(flags) => run(Command::new(memprof)
            .args(["trace", "-o", "/dev/null"])
            .args(*flags)
            .arg("--")
            .arg(program)
            .arg(n)
            .args(depth.as_ref()))?,
        Runner::MonitorHost(flags) => {
            let _monitor = monitor_host(memprof, flags)?;
            run(Command::new(program).arg(n).args(depth.as_ref()))?
        }
        Runner::Bpftrace(script) => run(Command::new("bpftrace")
            .arg("-e")
            .arg(script.replace("LIBC", &programs.libc.display().to_string()))
            .arg("-c")
            .arg(format!("{} {n}", programs.alloc_loop.display())))?,
    };
    let stdout = String::from_utf8_lossy(&output.stdout);
    field(&stdout, "ns_per_op").with_context(|| format!("{}: no ns_per_op in {stdout}", row.name))
}

/// `memprof monitor` of the whole host with `flags`, its probes in; it
/// ends (SIGTERM: its probes go) when the guard is dropped.
fn monitor_host(memprof: &Path, flags: &[&str]) -> Result<Terminated> {
    let args: Vec<&str> = flags
        .iter()
        .copied()
        .chain(["--listen", "127.0.0.1:19473", "-o", "/dev/null"])
        .collect();
    Ok(Terminated(start_monitor(memprof, &args)?))
}
