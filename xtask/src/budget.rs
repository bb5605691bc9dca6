//! `cargo xtask bench --monitor-budget-only SECS`: four allocbench-like
//! processes (`bench/allocbench.c`, from all allocation to mostly work of
//! their own) run together for SECS seconds, alone and under `memprof
//! monitor` with its default budget (1% of a CPU each, sampling at 512
//! KiB), rounds interleaved. For each: its slowdown (its operations per
//! second, monitored against alone), its duty cycle and the cost memprof
//! estimates, and the allocations memprof reports against those it made.
//! With `--whole-host`, memprof watches every process, not the four by
//! name: their probes go in and out together, as the costliest's budget
//! allows.
use std::{
    io::{BufRead as _, BufReader},
    path::{Path, PathBuf},
    process::{Command, Stdio},
    time::Duration,
};

use anyhow::{bail, Context as _, Result};

use crate::{
    process::{cpu_secs, run, start_monitor, Killed},
    workspace::{bench_dir, build_memprof, compile},
};

/// Work steps between allocations of each process (0: it only allocates).
const WORK: [u64; 4] = [0, 100, 500, 2000];

/// After its SECS, each monitored process stays this long without
/// allocating, so that the spans its probes were in for part of end (and
/// its figures are scaled) while it runs.
const LINGER_SECS: u64 = 12;

/// What one process of a round did, and (monitored) what memprof said.
#[derive(Clone, Copy, Default)]
struct Outcome {
    ops_per_sec: f64,
    /// After the first 5 s (a new process runs probed until it has spent
    /// its first allowance).
    steady_ops_per_sec: f64,
    allocations: f64,
    estimated: f64,
    duty: f64,
    overhead: f64,
}

pub fn monitor_budget(secs: u64, rounds: usize, whole_host: bool) -> Result<()> {
    let memprof = build_memprof()?;
    let dir = bench_dir()?;
    // One file per process: memprof selects them by name.
    let programs: Vec<PathBuf> = (0..WORK.len())
        .map(|i| dir.join(format!("allocbench-{i}")))
        .collect();
    for program in &programs {
        compile("bench/allocbench.c", program)?;
    }
    let mut memprof_cpu = Vec::new();
    let mut alone: Vec<Vec<Outcome>> = vec![Vec::new(); WORK.len()];
    let mut monitored: Vec<Vec<Outcome>> = vec![Vec::new(); WORK.len()];
    for round in 0..rounds {
        eprintln!("round {}/{rounds}: alone", round + 1);
        for (i, outcome) in run_four(&programs, secs, 0)?.into_iter().enumerate() {
            alone[i].push(outcome);
        }
        eprintln!("round {}/{rounds}: under memprof monitor", round + 1);
        let (outcomes, cpu) = monitored_four(&memprof, &programs, secs, whole_host)?;
        memprof_cpu.push(cpu);
        for (i, outcome) in outcomes.into_iter().enumerate() {
            monitored[i].push(outcome);
        }
    }
    println!(
        "| process (work steps per allocation) | ops/s alone | spread alone (max-min)/median | ops/s monitored | slowdown | slowdown after 5 s | budget | duty cycle | memprof's cost estimate | allocations made | memprof's estimate | error |"
    );
    println!("|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|");
    for (i, work) in WORK.iter().enumerate() {
        let median = |rows: &[Outcome], f: fn(&Outcome) -> f64| {
            let mut values: Vec<f64> = rows.iter().map(f).collect();
            values.sort_by(f64::total_cmp);
            values[values.len() / 2]
        };
        let base = median(&alone[i], |o| o.ops_per_sec);
        let with = median(&monitored[i], |o| o.ops_per_sec);
        let steady_base = median(&alone[i], |o| o.steady_ops_per_sec);
        let steady_with = median(&monitored[i], |o| o.steady_ops_per_sec);
        let made = median(&monitored[i], |o| o.allocations);
        let errors: Vec<String> = monitored[i]
            .iter()
            .map(|o| format!("{:+.1}%", (o.estimated / o.allocations - 1.0) * 100.0))
            .collect();
        println!(
            "| allocbench-{i} ({work}) | {base:.0} | {:.1}% | {with:.0} | {:.1}% | {:.1}% | 1% | {:.4} | {:.2}% | {made:.0} | {:.0} | {} |",
            spread(&alone[i]) * 100.0,
            (1.0 - with / base) * 100.0,
            (1.0 - steady_with / steady_base) * 100.0,
            median(&monitored[i], |o| o.duty),
            median(&monitored[i], |o| o.overhead) * 100.0,
            median(&monitored[i], |o| o.estimated),
            errors.join(", "),
        );
    }
    let cpu: Vec<String> = memprof_cpu
        .iter()
        .map(|c| format!("{:.1}%", c * 100.0))
        .collect();
    println!(
        "\nMedians of {rounds} rounds of {secs} s, alone and monitored ({}) interleaved; errors per round. memprof's own CPU while they allocated (% of one core): {}.",
        match whole_host {
            true => "the whole host",
            false => "by name",
        },
        cpu.join(", ")
    );
    Ok(())
}

/// How far apart the rounds' rates are: (max - min) / median, the noise
/// the slowdowns are read against.
fn spread(rows: &[Outcome]) -> f64 {
    let mut rates: Vec<f64> = rows.iter().map(|o| o.ops_per_sec).collect();
    rates.sort_by(f64::total_cmp);
    (rates[rates.len() - 1] - rates[0]) / rates[rates.len() / 2]
}

/// Runs the four together for `secs` (then `linger` s more): their pids,
/// and what each printed.
fn spawn_four(programs: &[PathBuf], secs: u64, linger: u64) -> Result<Vec<Killed>> {
    programs
        .iter()
        .zip(WORK)
        .map(|(program, work)| {
            Ok(Killed(
                Command::new(program)
                    .args([secs.to_string(), work.to_string(), linger.to_string()])
                    .stdout(Stdio::piped())
                    .spawn()
                    .with_context(|| format!("starting {}", program.display()))?,
            ))
        })
        .collect()
}

/// Each process's first line: its operations per second, and its
/// allocations in all.
fn read_outcome(child: &mut Killed) -> Result<Outcome> {
    let mut line = String::new();
    BufReader::new(child.0.stdout.take().context("no stdout")?).read_line(&mut line)?;
    let mut fields = line.split_whitespace().map(str::parse::<f64>);
    match (fields.next(), fields.next(), fields.next()) {
        (Some(Ok(ops_per_sec)), Some(Ok(steady_ops_per_sec)), Some(Ok(allocations))) => {
            Ok(Outcome {
                ops_per_sec,
                steady_ops_per_sec,
                allocations,
                ..Outcome::default()
            })
        }
        _ => bail!("allocbench printed {line:?}"),
    }
}

fn run_four(programs: &[PathBuf], secs: u64, linger: u64) -> Result<Vec<Outcome>> {
    let mut children = spawn_four(programs, secs, linger)?;
    children.iter_mut().map(read_outcome).collect()
}

/// The four under `memprof monitor`: what each did, and memprof's share
/// of a core meanwhile.
fn monitored_four(
    memprof: &Path,
    programs: &[PathBuf],
    secs: u64,
    whole_host: bool,
) -> Result<(Vec<Outcome>, f64)> {
    let port = 19471;
    let selection: &[&str] = match whole_host {
        true => &[],
        false => &["--comm", "^allocbench-[0-9]$"],
    };
    let listen = format!("127.0.0.1:{port}");
    let args: Vec<&str> = selection
        .iter()
        .copied()
        .chain(["--listen", &listen, "-o", "/dev/null"])
        .collect();
    let mut monitor = start_monitor(memprof, &args)?;
    let mut children = spawn_four(programs, secs, LINGER_SECS)?;
    let started = (std::time::Instant::now(), cpu_secs(monitor.0.id()));
    let pids: Vec<u32> = children.iter().map(|c| c.0.id()).collect();
    let scrape = || -> Result<String> {
        let output = Command::new("curl")
            .args(["-s", &format!("http://127.0.0.1:{port}/metrics")])
            .output()?;
        Ok(String::from_utf8_lossy(&output.stdout).into_owned())
    };
    let value = |metrics: &str, name: &str, pid: u32| -> f64 {
        let series = format!("{name}{{pid=\"{pid}\"");
        metrics
            .lines()
            .find(|line| line.starts_with(&series))
            .and_then(|line| line.rsplit(' ').next()?.parse().ok())
            .unwrap_or(f64::NAN)
    };
    // Duty cycles and costs while they allocate (idle, they cost nothing
    // and their probes are in all along).
    std::thread::sleep(Duration::from_secs(secs.saturating_sub(3).max(1)));
    let running = scrape()?;
    let mut outcomes: Vec<Outcome> = children
        .iter_mut()
        .map(read_outcome)
        .collect::<Result<_>>()?;
    let cpu = (cpu_secs(monitor.0.id()) - started.1) / started.0.elapsed().as_secs_f64();
    // Allocations, once their last spans with a window have ended.
    std::thread::sleep(Duration::from_secs(LINGER_SECS - 1));
    let lingering = scrape()?;
    for (outcome, &pid) in outcomes.iter_mut().zip(&pids) {
        outcome.estimated = value(&lingering, "memprof_allocations_total", pid);
        outcome.overhead = value(&running, "memprof_overhead_ratio", pid);
        outcome.duty = value(&running, "memprof_duty_cycle_ratio", pid);
    }
    drop(children);
    // SIGTERM: memprof takes its probes out.
    run(Command::new("kill").args(["-TERM", &monitor.0.id().to_string()]))?;
    let _ = monitor.0.wait();
    Ok((outcomes, cpu))
}
