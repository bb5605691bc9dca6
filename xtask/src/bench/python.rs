//! `cargo xtask bench --python-only`: what profiling a Python program's
//! objects costs, side by side in one run on `bench/python_objects.py`:
//! untraced, memray with `--trace-python-allocators` (which hooks Python's
//! allocators inside the process), and `memprof trace` exact, with
//! `--no-python-allocators` and with `--sample-bytes 512K`; each with the
//! allocations it counted.
use std::{path::Path, process::Command};

use anyhow::{Context as _, Result};

use super::numbers::timed;
use crate::{
    process::run,
    workspace::{bench_dir, build_memprof, root},
};

/// The interpreters measured: pyenv's 3.12 (its allocators are
/// functions of their own) and Debian's python3.11 (LTO: inlined into
/// their callers, counted in part).
const PYTHONS: [&str; 2] = [
    "/root/.pyenv/versions/3.12.1/bin/python3.12",
    "/usr/bin/python3.11",
];

pub fn python_objects(runs: usize) -> Result<()> {
    let memprof = build_memprof()?;
    let script = root().join("bench/python_objects.py");
    let script = script.to_str().context("script path")?;
    println!(
        "| interpreter | run | wall (s, median of {runs}) | × untraced | allocations counted |"
    );
    println!("|---|---|---:|---:|---:|");
    for python in PYTHONS {
        if !Path::new(python).exists() {
            println!("| {python} | (not installed) | | | |");
            continue;
        }
        let untraced = timed(runs, || run(Command::new(python).arg(script)).map(|_| None))?;
        row(python, "untraced", untraced, untraced);
        match memray_ready(python) {
            true => {
                let capture = bench_dir()?.join("python_objects.memray");
                let memray = timed(runs, || {
                    let _ = std::fs::remove_file(&capture);
                    run(Command::new(python)
                        .args([
                            "-m",
                            "memray",
                            "run",
                            "--trace-python-allocators",
                            "-q",
                            "-f",
                            "-o",
                        ])
                        .arg(&capture)
                        .arg(script))?;
                    memray_count(python, &capture)
                })?;
                row(python, "memray --trace-python-allocators", memray, untraced);
            }
            false => println!("| {python} | memray (not installable here) | | | |"),
        }
        for (name, flags) in [
            ("memprof trace", &[][..]),
            (
                "memprof trace --no-python-allocators",
                &["--no-python-allocators"][..],
            ),
            (
                "memprof trace --sample-bytes 512K",
                &["--sample-bytes", "512K"][..],
            ),
        ] {
            let traced = timed(runs, || {
                let output = run(Command::new(&memprof)
                    .args(["trace", "--format", "json"])
                    .args(flags)
                    .args(["--", python, script]))?;
                Ok(Some(counted(&output.stdout)?))
            })?;
            row(python, name, traced, untraced);
        }
    }
    Ok(())
}

fn row(
    python: &str,
    name: &str,
    (wall, count): (f64, Option<u64>),
    (untraced, _): (f64, Option<u64>),
) {
    println!(
        "| {python} | {name} | {wall:.2} | {:.1} | {} |",
        wall / untraced,
        count.map_or(String::new(), |c| c.to_string())
    );
}

/// Whether memray runs with `python`, installed from PyPI if it is not.
fn memray_ready(python: &str) -> bool {
    let works = || {
        Command::new(python)
            .args(["-m", "memray", "--version"])
            .output()
            .is_ok_and(|o| o.status.success())
    };
    works()
        || (Command::new(python)
            .args(["-m", "pip", "install", "-q", "memray"])
            .status()
            .is_ok_and(|s| s.success())
            && works())
}

/// The allocations memray recorded in `capture` (`memray stats --json`).
fn memray_count(python: &str, capture: &Path) -> Result<Option<u64>> {
    let stats = bench_dir()?.join("python_objects.stats.json");
    let _ = std::fs::remove_file(&stats);
    run(Command::new(python)
        .args(["-m", "memray", "stats", "--json", "-f", "-o"])
        .arg(&stats)
        .arg(capture))?;
    let value: serde_json::Value = serde_json::from_slice(&std::fs::read(&stats)?)?;
    Ok(value["metadata"]["total_allocations"].as_u64())
}

/// The calls a memprof JSON report counted, over all its processes.
fn counted(report: &[u8]) -> Result<u64> {
    let value: serde_json::Value = serde_json::from_slice(report).context("memprof's JSON")?;
    Ok(value["count"].as_u64().unwrap_or(0))
}
