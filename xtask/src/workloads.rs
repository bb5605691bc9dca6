//! `cargo xtask bench --monitor-workloads-only ROUNDS`: what `memprof
//! monitor`'s default budget costs real workloads, measured from outside
//! as an operator would: each one timed untraced and under `monitor`,
//! rounds interleaved (this machine's speed drifts), and what memprof
//! reported of it against the truth.
//!
//! - churn: the whole host, 60 x (`sort -n` of 200,000 lines, then
//!   `python3 -c` dumping 20,000 ints to JSON): short processes, each
//!   new to memprof;
//! - sqlite3: Debian's sqlite3 inserting 1.5 M rows and indexing them,
//!   `--comm sqlite3`; its calls and bytes against `trace`'s exact count;
//! - alloc loop: `bench/alloc_loop.c` for about 10 s, `--comm alloc_loop`;
//!   its calls against the loop's own count.
use std::{
    path::Path,
    process::Command,
    time::{Duration, Instant},
};

use anyhow::{Context as _, Result};
use serde_json::Value;

use crate::{
    bench::numbers::median,
    process::{cpu_secs, run, start_monitor},
    workspace::{bench_dir, build_memprof, compile},
};

const SQL: &str = "CREATE TABLE t(a INTEGER, b TEXT);
WITH RECURSIVE c(x) AS (SELECT 1 UNION ALL SELECT x+1 FROM c WHERE x<1500000)
  INSERT INTO t SELECT x, hex(randomblob(8)) FROM c;
CREATE INDEX i ON t(b);
";

const CHURN_RUNS: usize = 60;

/// One workload: how to run it once, and what memprof should watch.
struct Workload {
    name: &'static str,
    selection: Vec<String>,
    run: Box<dyn Fn() -> Result<()>>,
    /// The exact calls and bytes, where known.
    truth: Option<(f64, f64)>,
    /// The processes of memprof's report that are the workload's.
    comm: &'static str,
}

/// What memprof said of one monitored run.
#[derive(Default, Clone)]
struct Said {
    secs: f64,
    calls: f64,
    bytes: f64,
    overhead: f64,
    duty: f64,
    partial: usize,
    processes: usize,
    memprof_cpu: f64,
    memprof_rss_mb: f64,
}

pub fn monitor_workloads(rounds: usize) -> Result<()> {
    let memprof = build_memprof()?;
    let dir = bench_dir()?;
    let workloads = workloads(&memprof, &dir)?;
    println!(
        "| workload | untraced (s) | under monitor (s) | slowdown | memprof's overhead (median) | duty cycle | calls reported / truth | bytes reported / truth | partial processes | memprof CPU (% of a core) | memprof max RSS (MB) |"
    );
    println!("|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|");
    for workload in &workloads {
        let mut alone = Vec::new();
        let mut said: Vec<Said> = Vec::new();
        for round in 0..rounds {
            eprintln!("{}: round {}/{rounds}", workload.name, round + 1);
            alone.push(timed(&*workload.run)?);
            said.push(monitored(&memprof, &dir, workload)?);
        }
        let base = median(alone);
        let with = median(said.iter().map(|s| s.secs).collect());
        let of = |f: fn(&Said) -> f64| median(said.iter().map(f).collect());
        let ratios = |f: fn(&Said) -> f64, truth: Option<f64>| match truth {
            Some(truth) => said
                .iter()
                .map(|s| format!("{:.2}", f(s) / truth))
                .collect::<Vec<_>>()
                .join(", "),
            None => format!("{:.0} (no truth)", of(f)),
        };
        println!(
            "| {} | {base:.2} | {with:.2} | {:+.1}% | {:.4} | {:.4} | {} | {} | {} of {} | {:.1}% | {:.0} |",
            workload.name,
            (with / base - 1.0) * 100.0,
            of(|s| s.overhead),
            of(|s| s.duty),
            ratios(|s| s.calls, workload.truth.map(|t| t.0)),
            ratios(|s| s.bytes, workload.truth.map(|t| t.1)),
            of(|s| s.partial as f64),
            of(|s| s.processes as f64),
            of(|s| s.memprof_cpu) * 100.0,
            of(|s| s.memprof_rss_mb),
        );
    }
    println!(
        "\nMedians of {rounds} rounds, untraced and under `memprof monitor` (default budget) interleaved; ratios per round."
    );
    Ok(())
}

fn workloads(memprof: &Path, dir: &Path) -> Result<Vec<Workload>> {
    let python = ["/usr/bin/python3.11", "/usr/bin/python3"]
        .into_iter()
        .find(|p| Path::new(p).exists())
        .context("no python3")?;
    let lines = dir.join("lines.txt");
    let text: String = (0..200_000u64)
        .map(|i| format!("{}\n", (i * 7_919) % 1_000_003))
        .collect();
    std::fs::write(&lines, text)?;
    let sql = dir.join("insert.sql");
    std::fs::write(&sql, SQL)?;
    let db = dir.join("bench.db");
    let alloc_loop = dir.join("alloc_loop");
    compile("bench/alloc_loop.c", &alloc_loop)?;
    // About 10 s untraced.
    let t = Instant::now();
    run(Command::new(&alloc_loop).arg("20000000"))?;
    let pairs = (20_000_000.0 * 10.0 / t.elapsed().as_secs_f64()) as u64;

    let churn = {
        let lines = lines.clone();
        move || -> Result<()> {
            for _ in 0..CHURN_RUNS {
                run(Command::new("sort")
                    .args(["-n", "-o", "/dev/null"])
                    .arg(&lines))?;
                run(Command::new(python)
                    .args(["-c", "import json; json.dumps(list(range(20000)))"]))?;
            }
            Ok(())
        }
    };
    let sqlite = {
        let (sql, db) = (sql.clone(), db.clone());
        move || -> Result<()> {
            let _ = std::fs::remove_file(&db);
            let status = Command::new("sqlite3")
                .arg(&db)
                .stdin(std::fs::File::open(&sql)?)
                .status()?;
            anyhow::ensure!(status.success(), "sqlite3 failed");
            Ok(())
        }
    };
    let sqlite_truth = exact_of(memprof, &db, &sql)?;
    let looping = {
        let alloc_loop = alloc_loop.clone();
        move || -> Result<()> {
            run(Command::new(&alloc_loop).arg(pairs.to_string()))?;
            Ok(())
        }
    };
    Ok(vec![
        Workload {
            name: "whole host: 60 x (sort -n, python3 json)",
            selection: vec![],
            run: Box::new(churn),
            truth: None,
            comm: "",
        },
        Workload {
            name: "sqlite3, 1.5 M rows (--comm sqlite3)",
            selection: vec!["--comm".into(), "^sqlite3$".into()],
            run: Box::new(sqlite),
            truth: Some(sqlite_truth),
            comm: "sqlite3",
        },
        Workload {
            name: "alloc loop, ~10 s (--comm alloc_loop)",
            selection: vec!["--comm".into(), "^alloc_loop$".into()],
            run: Box::new(looping),
            // Its mallocs, and the C library's few before main.
            truth: Some((pairs as f64, pairs as f64 * 64.0)),
            comm: "alloc_loop",
        },
    ])
}

/// sqlite3's calls and bytes as `trace` counts them, exactly.
fn exact_of(memprof: &Path, db: &Path, sql: &Path) -> Result<(f64, f64)> {
    let _ = std::fs::remove_file(db);
    let out = db.with_extension("trace.json");
    run(Command::new(memprof)
        .args(["trace", "--format", "json", "-o"])
        .arg(&out)
        .arg("--")
        .arg("sqlite3")
        .arg(db)
        .stdin(std::fs::File::open(sql)?))?;
    let report: Value = serde_json::from_slice(&std::fs::read(&out)?)?;
    Ok((
        report["count"].as_f64().unwrap_or(f64::NAN),
        report["bytes"].as_f64().unwrap_or(f64::NAN),
    ))
}

fn timed(run: &dyn Fn() -> Result<()>) -> Result<f64> {
    let t = Instant::now();
    run()?;
    Ok(t.elapsed().as_secs_f64())
}

/// The workload under `memprof monitor`: its time, and what memprof's
/// final report said of it.
fn monitored(memprof: &Path, dir: &Path, workload: &Workload) -> Result<Said> {
    let out = dir.join("workload-monitor.json");
    let mut args: Vec<&str> = workload.selection.iter().map(String::as_str).collect();
    let out_arg = out.to_string_lossy().into_owned();
    args.extend(["--listen", "none", "--format", "json", "-o", &out_arg]);
    let mut monitor = start_monitor(memprof, &args)?;
    let pid = monitor.0.id();
    let cpu_before = cpu_secs(pid);
    let started = Instant::now();
    let secs = timed(&*workload.run)?;
    let memprof_cpu = (cpu_secs(pid) - cpu_before) / started.elapsed().as_secs_f64();
    let memprof_rss_mb = rss_mb(pid);
    // The spans under way end; then SIGTERM: the final report.
    std::thread::sleep(Duration::from_secs(3));
    run(Command::new("kill").args(["-TERM", &pid.to_string()]))?;
    let _ = monitor.0.wait();
    let report: Value = serde_json::from_slice(&std::fs::read(&out)?)?;
    let mut said = Said {
        secs,
        memprof_cpu,
        memprof_rss_mb,
        ..Said::default()
    };
    let mut overheads = Vec::new();
    let mut duties = Vec::new();
    for process in report["processes"].as_array().into_iter().flatten() {
        let comm = process["command"].as_str().unwrap_or("");
        if !workload.comm.is_empty() && comm != workload.comm {
            continue;
        }
        said.processes += 1;
        said.calls += process["count"].as_f64().unwrap_or(0.0);
        said.bytes += process["bytes"].as_f64().unwrap_or(0.0);
        said.partial += usize::from(process["partial"].as_bool().unwrap_or(false));
        overheads.extend(process["overhead"].as_f64());
        duties.extend(process["duty_cycle"].as_f64());
    }
    if !overheads.is_empty() {
        said.overhead = median(overheads);
    }
    if !duties.is_empty() {
        said.duty = median(duties);
    }
    Ok(said)
}

/// A process's peak resident memory, in MB.
fn rss_mb(pid: u32) -> f64 {
    std::fs::read_to_string(format!("/proc/{pid}/status"))
        .unwrap_or_default()
        .lines()
        .find_map(|line| line.strip_prefix("VmHWM:"))
        .and_then(|kb| kb.trim().trim_end_matches("kB").trim().parse::<f64>().ok())
        .map_or(f64::NAN, |kb| kb / 1024.0)
}
