//! `cargo xtask bench --monitor-churn-only`: `memprof monitor` watching a
//! host where short processes come and go for minutes (it must run for
//! days without growing): memprof's CPU and resident memory, its tables'
//! fill and evictions, its open files and the events it lost, sampled
//! every 30 s (every minute in runs of 20 minutes or more). By name
//! (`--comm`), or watching the whole host (`--whole-host`: every process's
//! allocations, memprof's own probes in memprof's address space too), with
//! or without `--live`, counting every call (`--exact`) or under the
//! default budget (`--budget`, as a daemon left on runs).
use std::{
    process::{Command, Stdio},
    time::{Duration, Instant},
};

use anyhow::{Context as _, Result};

use crate::{
    process::{cpu_secs, run, Killed},
    workspace::{bench_dir, build_memprof, compile},
};

pub fn monitor_churn(secs: u64, whole_host: bool, live: bool, budget: bool) -> Result<()> {
    let memprof = build_memprof()?;
    let dir = bench_dir()?;
    let short = dir.join("churn-short");
    compile("tests/fixtures/short.c", &short)?;
    let port = 19470;
    let monitor = Killed(
        Command::new(&memprof)
            .arg("monitor")
            .args((!budget).then_some("--exact"))
            .args(["--interval", "10"])
            .args(match whole_host {
                true => &[][..],
                false => &["--comm", "^churn-short$"][..],
            })
            .args(live.then_some("--live"))
            .args(["--listen", &format!("127.0.0.1:{port}"), "-o", "/dev/null"])
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .context("starting memprof monitor")?,
    );
    std::thread::sleep(Duration::from_secs(3));
    // Short processes, one after another, for the whole run.
    let churner = Killed(
        Command::new("/bin/sh")
            .args(["-c", "while :; do \"$0\"; done"])
            .arg(&short)
            .spawn()?,
    );
    let pid = monitor.0.id();
    let rss_kib = || -> u64 {
        std::fs::read_to_string(format!("/proc/{pid}/status"))
            .unwrap_or_default()
            .lines()
            .find_map(|l| l.strip_prefix("VmRSS:"))
            .and_then(|v| v.trim().trim_end_matches(" kB").parse().ok())
            .unwrap_or(0)
    };
    let open_files = || std::fs::read_dir(format!("/proc/{pid}/fd")).map_or(0, |d| d.count());
    // The sum of every series of a family (0 when absent).
    let metric = |text: &str, series: &str| -> f64 {
        text.lines()
            .filter(|line| line.starts_with(series))
            .filter_map(|line| line.rsplit(' ').next()?.parse::<f64>().ok())
            .sum()
    };
    let every = Duration::from_secs(if secs >= 1200 { 60 } else { 30 });
    println!(
        "| minute | memprof CPU (% of a core, last {} s) | RSS (MiB) | open files | events lost | processes evicted | sites | stacks | processes in table |",
        every.as_secs()
    );
    println!("|---:|---:|---:|---:|---:|---:|---:|---:|---:|");
    let started = Instant::now();
    let mut last_cpu = cpu_secs(pid);
    let mut last_at = Instant::now();
    let mut metrics = String::new();
    while started.elapsed() < Duration::from_secs(secs) {
        std::thread::sleep(every);
        metrics = Command::new("curl")
            .args(["-s", &format!("http://127.0.0.1:{port}/metrics")])
            .output()
            .map(|o| String::from_utf8_lossy(&o.stdout).into_owned())
            .unwrap_or_default();
        let cpu = cpu_secs(pid);
        let share = (cpu - last_cpu) / last_at.elapsed().as_secs_f64() * 100.0;
        (last_cpu, last_at) = (cpu, Instant::now());
        println!(
            "| {:.1} | {share:.1} | {:.1} | {} | {} | {} | {} | {} | {} |",
            started.elapsed().as_secs_f64() / 60.0,
            rss_kib() as f64 / 1024.0,
            open_files(),
            metric(&metrics, "memprof_lost_events_total"),
            metric(&metrics, "memprof_evicted_total{what=\"processes\"}"),
            metric(&metrics, "memprof_table_entries{table=\"sites\"}"),
            metric(&metrics, "memprof_table_entries{table=\"stacks\"}"),
            metric(&metrics, "memprof_table_entries{table=\"processes\"}"),
        );
    }
    drop(churner);
    println!("\nLost events at the end, by cause:");
    for line in metrics.lines() {
        if line.starts_with("memprof_lost_events_total{") && !line.ends_with(" 0") {
            println!("    {line}");
        }
    }
    // SIGTERM: memprof takes its probes out (a kill would leave its
    // tracefs events until the next memprof starts), within 2 s with
    // its tables full.
    let asked = Instant::now();
    run(Command::new("kill").args(["-TERM", &pid.to_string()]))?;
    let mut monitor = monitor;
    let status = monitor.0.wait()?;
    println!(
        "\nmemprof exited {:.2} s after SIGTERM ({status})",
        asked.elapsed().as_secs_f64()
    );
    Ok(())
}
