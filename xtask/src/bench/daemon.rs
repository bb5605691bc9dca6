//! What memprof itself costs, beside the loop's slowdown: its CPU time
//! per million allocations, and preparing the unwind tables of a process
//! whose files it has not seen.
use std::{path::Path, process::Command};

use anyhow::{Context as _, Result};

use super::numbers::field;
use crate::{process::run, workspace::root};

/// The daemon's own CPU, totals and --live: the difference between a
/// short and a long run leaves out start-up (loading and verifying the
/// BPF programs).
pub fn cpu_per_million(memprof: &Path, alloc_loop: &Path) -> Result<()> {
    for (name, flags) in [("totals", &[][..]), ("--live", &["--live"][..])] {
        let cpu_at = |count: u64| -> Result<f64> {
            let output = run(Command::new(memprof)
                .env("MEMPROF_TIMINGS", "1")
                .args(["trace", "-o", "/dev/null"])
                .args(flags)
                .arg("--")
                .arg(alloc_loop)
                .arg(count.to_string()))?;
            field(&String::from_utf8_lossy(&output.stderr), "cpu_ms").context("no cpu_ms")
        };
        let (short, long) = (cpu_at(100_000)?, cpu_at(2_100_000)?);
        println!(
            "Daemon CPU time per million allocations ({name}): {:.1} ms (start-up and report: {short:.0} ms).",
            (long - short) / 2.0
        );
    }
    Ok(())
}

/// Preparing unwind tables (compile each file's CFI, write its rows to
/// the kernel) for a process the first time memprof sees its files:
/// python3 with modules, and a C++ program (compiled into `dir`).
pub fn unwind_tables(memprof: &Path, dir: &Path) -> Result<()> {
    let cpp = dir.join("heap_patterns");
    run(Command::new("g++")
        .args(["-O2", "-g", "-o"])
        .arg(&cpp)
        .arg(root().join("tests/fixtures/heap_patterns.cpp")))?;
    let python: [&str; 3] = ["python3", "-c", "import json, decimal, sqlite3, ssl"];
    let cpp_command = [cpp.to_str().context("path")?, "1000"];
    for (name, command) in [
        (
            "python3 -c 'import json, decimal, sqlite3, ssl'",
            &python[..],
        ),
        (
            "a C++ program (tests/fixtures/heap_patterns.cpp, libstdc++)",
            &cpp_command[..],
        ),
    ] {
        let output = run(Command::new(memprof)
            .env("MEMPROF_LOAD_TIMES", "1")
            .env("MEMPROF_TIMINGS", "1")
            .args(["trace", "-o", "/dev/null", "--"])
            .args(command))?;
        let stderr = String::from_utf8_lossy(&output.stderr);
        let (mut rows, mut ms, mut refreshes) = (0.0, 0.0, 0);
        for line in stderr
            .lines()
            .filter(|l| l.contains("unwind tables of pid"))
        {
            rows += field(line, "new_rows").unwrap_or(0.0);
            ms += field(line, "unwind_ms").unwrap_or(0.0);
            refreshes += 1;
        }
        let rss_kb = field(&stderr, "max_rss_kb").unwrap_or(f64::NAN);
        println!(
            "Unwind tables for {name}: {rows:.0} rows ({:.1} MiB in the kernel), {refreshes} refreshes, {ms:.0} ms in all (process waiting); daemon peak RSS {:.0} MiB.",
            rows * 8.0 / (1 << 20) as f64,
            rss_kb / 1024.0
        );
    }
    Ok(())
}
