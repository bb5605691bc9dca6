//! Project tasks: `cargo xtask bench` (see BENCHMARKS.md).
use std::{
    path::{Path, PathBuf},
    process::Command,
};

use anyhow::{bail, Context as _, Result};
use clap::{Parser, Subcommand};

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
    },
}

fn main() -> Result<()> {
    match Cli::parse().task {
        Task::Bench { allocations, runs } => bench(allocations, runs),
    }
}

fn root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .unwrap()
        .to_path_buf()
}

fn run(command: &mut Command) -> Result<std::process::Output> {
    let output = command
        .output()
        .with_context(|| format!("running {command:?}"))?;
    if !output.status.success() {
        bail!(
            "{command:?} failed: {}",
            String::from_utf8_lossy(&output.stderr)
        );
    }
    Ok(output)
}

fn compile(source: &str, out: &Path) -> Result<()> {
    run(Command::new("gcc")
        .args(["-O2", "-g", "-fno-omit-frame-pointer", "-o"])
        .arg(out)
        .arg(root().join(source)))?;
    Ok(())
}

/// Value of `key` in "key value" / "key=value" output.
fn field(text: &str, key: &str) -> Option<f64> {
    let start = text.find(key)? + key.len();
    text[start..]
        .trim_start_matches([' ', '='])
        .split(|c: char| c.is_whitespace())
        .next()?
        .parse()
        .ok()
}

fn median(mut values: Vec<f64>) -> f64 {
    values.sort_by(f64::total_cmp);
    values[values.len() / 2]
}

fn bench(allocations: u64, runs: usize) -> Result<()> {
    let root = root();
    run(Command::new("cargo")
        .args(["build", "--release", "--quiet"])
        .current_dir(&root))?;
    let memprof = root.join("target/release/memprof");
    let dir = root.join("target/bench");
    std::fs::create_dir_all(&dir)?;
    let alloc_loop = dir.join("alloc_loop");
    let many_stacks = dir.join("many_stacks");
    compile("bench/alloc_loop.c", &alloc_loop)?;
    compile("bench/many_stacks.c", &many_stacks)?;
    let n = allocations.to_string();

    // Interleaved, so that machine noise hits every configuration alike.
    let configs: [(&str, &[&str]); 8] = [
        ("untraced", &[]),
        (
            "floor: same uprobes, empty BPF programs",
            &["--empty-programs"],
        ),
        ("memprof totals", &[]),
        ("memprof --sample-bytes 512K", &["--sample-bytes", "512K"]),
        (
            "live floor: live's uprobes (+ returns, + free), empty programs",
            &["--live", "--empty-programs"],
        ),
        ("memprof --live", &["--live"]),
        (
            "live floor, --no-probe-offsets (free probed at +0)",
            &["--live", "--empty-programs", "--no-probe-offsets"],
        ),
        (
            "memprof --live --no-probe-offsets",
            &["--live", "--no-probe-offsets"],
        ),
    ];
    let mut samples = vec![Vec::new(); configs.len()];
    for _ in 0..runs {
        for (index, (name, flags)) in configs.iter().enumerate() {
            let output = if index == 0 {
                run(Command::new(&alloc_loop).arg(&n))?
            } else {
                run(Command::new(&memprof)
                    .args(["trace", "-o", "/dev/null"])
                    .args(*flags)
                    .arg("--")
                    .arg(&alloc_loop)
                    .arg(&n))?
            };
            let stdout = String::from_utf8_lossy(&output.stdout);
            let ns = field(&stdout, "ns_per_op")
                .with_context(|| format!("{name}: no ns_per_op in {stdout}"))?;
            samples[index].push(ns);
        }
    }
    let medians: Vec<f64> = samples.into_iter().map(median).collect();
    let floor = medians[1];

    let output = run(Command::new(&memprof)
        .env("MEMPROF_TIMINGS", "1")
        .args(["trace", "--top", "10000", "-o", "/dev/null", "--"])
        .arg(&many_stacks))?;
    let stderr = String::from_utf8_lossy(&output.stderr);
    let report_ms = field(&stderr, "report_ms").context("no report timing")?;
    let stacks = field(&stderr, "stacks").context("no stack count")?;

    println!("| what | ns per malloc+free | × floor |");
    println!("|---|---:|---:|");
    for ((name, _), ns) in configs.iter().zip(&medians) {
        println!("| {name} | {ns:.0} | {:.2} |", ns / floor);
    }
    println!();
    println!("Median of {runs} runs of {allocations} malloc(64)+free pairs, one call site.");
    println!("Report of {stacks:.0} distinct stacks (read maps, symbolize, render text): {report_ms:.0} ms.");
    Ok(())
}
