//! Project tasks: `cargo xtask bench`, `cargo xtask fuzz` (see BENCHMARKS.md).
use std::{
    path::{Path, PathBuf},
    process::Command,
};

use anyhow::{bail, Context as _, Result};
use clap::{Parser, Subcommand};

mod budget;
mod churn;

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
        /// Only the malloc loop's rows of issue 15: --while (the function
        /// off the stack, and on it) and the timeline's sampling.
        #[arg(long)]
        regions_only: bool,
        /// Only the malloc loop's live-heap rows (issue 14's sampled live
        /// heap: session uprobes, in `trace` and under `monitor` of the
        /// whole host), against the floor.
        #[arg(long)]
        live_only: bool,
        /// Only the start and exit times (`trace -- /bin/true`, `attach`).
        #[arg(long)]
        start_exit_only: bool,
        /// Only the programs with 10,000 and 100,000 distinct stacks (a
        /// call's cost when its stack is new, the report's time, RSS).
        #[arg(long)]
        stacks_only: bool,
        /// Only `memprof monitor` under process churn for SECS seconds
        /// (short processes one after another): its CPU, memory and
        /// tables every 30 s.
        #[arg(long, value_name = "SECS")]
        monitor_churn_only: Option<u64>,
        /// Only four allocbench-like processes for SECS seconds, alone and
        /// under `memprof monitor`'s default budget (--runs rounds): their
        /// slowdowns, duty cycles and memprof's estimates.
        #[arg(long, value_name = "SECS")]
        monitor_budget_only: Option<u64>,
        /// With --monitor-budget-only or --monitor-churn-only: memprof
        /// monitors the whole host (under the budget, every process's
        /// probes in and out together), not the processes by name.
        #[arg(long)]
        whole_host: bool,
        /// With --monitor-churn-only: `monitor --live` (the pointer table
        /// swept of what ended processes left).
        #[arg(long)]
        live: bool,
        /// Then fuzz each reader of untrusted input this long (0: no fuzzing).
        #[arg(long, default_value_t = 60, value_name = "SECS")]
        fuzz_secs: u64,
    },
    /// Fuzz the readers of input memprof does not control (saved JSON
    /// reports; ELF and DWARF files of profiled processes) for SECS
    /// seconds each: fails on a panic or an error of more than one line,
    /// prints how many inputs each reader was given.
    Fuzz {
        #[arg(long, default_value_t = 60)]
        secs: u64,
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
            monitor_churn_only,
            monitor_budget_only,
            whole_host,
            live,
            fuzz_secs,
        } => {
            if let Some(secs) = monitor_churn_only {
                return churn::monitor_churn(secs, whole_host, live);
            }
            if let Some(secs) = monitor_budget_only {
                return budget::monitor_budget(secs, runs, whole_host);
            }
            if stacks_only {
                run(Command::new("cargo")
                    .args(["build", "--release", "--quiet"])
                    .current_dir(root()))?;
                let many_stacks = root().join("target/bench/many_stacks");
                std::fs::create_dir_all(root().join("target/bench"))?;
                compile("bench/many_stacks.c", &many_stacks)?;
                return distinct_stacks(&root().join("target/release/memprof"), &many_stacks);
            }
            if start_exit_only {
                run(Command::new("cargo")
                    .args(["build", "--release", "--quiet"])
                    .current_dir(root()))?;
                start_and_exit(&root().join("target/release/memprof"), runs)?;
                return Ok(());
            }
            let only = match (allocators_only, mappings_only, regions_only, live_only) {
                (true, _, _, _) => Only::Allocators,
                (_, true, _, _) => Only::Mappings,
                (_, _, true, _) => Only::Regions,
                (_, _, _, true) => Only::Live,
                _ => Only::All,
            };
            bench(allocations, runs, only)?;
            if fuzz_secs > 0 {
                println!();
                fuzz(fuzz_secs)?;
            }
            Ok(())
        }
        Task::Fuzz { secs } => fuzz(secs),
    }
}

/// The ignored `fuzz::` tests of memprof-user, one after the other (each
/// gets a core to itself), for `secs` seconds each. The one-line warnings
/// memprof prints for each malformed file it leaves unsymbolized are
/// counted, not shown.
fn fuzz(secs: u64) -> Result<()> {
    use std::io::BufRead as _;
    let mut child = Command::new("cargo")
        .args(["test", "--release", "-p", "memprof-user", "fuzz::"])
        .args(["--", "--ignored", "--nocapture", "--test-threads", "1"])
        .env("MEMPROF_FUZZ_SECS", secs.to_string())
        .current_dir(root())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .context("running cargo test")?;
    let stderr = child.stderr.take().context("no stderr")?;
    let mut warnings = 0u64;
    for line in std::io::BufReader::new(stderr).split(b'\n') {
        let line = line?;
        if line.starts_with(b"memprof: warning: ") {
            warnings += 1;
        } else {
            eprintln!("{}", String::from_utf8_lossy(&line));
        }
    }
    let status = child.wait()?;
    println!("({warnings} one-line warnings for files left unsymbolized, not shown)");
    if !status.success() {
        bail!("a fuzzer failed: its smallest failing input is printed above");
    }
    Ok(())
}

/// Kills the child on drop (a failed run must not leave probes in).
/// `memprof monitor` of the whole host with `flags`, its probes in; it
/// ends (SIGTERM: its probes go) when the guard is dropped.
fn monitor_host(memprof: &Path, flags: &[&str]) -> Result<Terminated> {
    use std::io::BufRead as _;
    let mut monitor = Killed(
        Command::new(memprof)
            .arg("monitor")
            .args(flags)
            .args(["--listen", "127.0.0.1:19473", "-o", "/dev/null"])
            .stdout(std::process::Stdio::null())
            .stderr(std::process::Stdio::piped())
            .spawn()
            .context("starting memprof monitor")?,
    );
    let mut stderr = std::io::BufReader::new(monitor.0.stderr.take().context("no stderr")?);
    let mut seen = String::new();
    while !seen.contains("attached") {
        if stderr.read_line(&mut seen)? == 0 {
            bail!("memprof monitor ended: {seen}");
        }
    }
    Ok(Terminated(monitor))
}

/// A memprof asked to end (SIGTERM) and waited for when dropped.
struct Terminated(Killed);

impl Drop for Terminated {
    fn drop(&mut self) {
        let _ = Command::new("kill")
            .args(["-TERM", &self.0 .0.id().to_string()])
            .status();
        let _ = self.0 .0.wait();
    }
}

struct Killed(std::process::Child);

impl Drop for Killed {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
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
    compile_with(source, out, "-fno-omit-frame-pointer")
}

fn compile_with(source: &str, out: &Path, frame_pointers: &str) -> Result<()> {
    run(Command::new("gcc")
        .args(["-O2", "-g", frame_pointers, "-o"])
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

/// Allocator libraries the malloc loop is also linked with (issue 13).
const ALLOCATOR_LIBRARIES: [&str; 3] = ["jemalloc", "tcmalloc", "mimalloc"];

/// One way of running a malloc loop.
struct Config {
    name: &'static str,
    runner: Runner,
    /// Which loop; ratios are to the floor row of the same workload.
    workload: Workload,
    /// The issues' targets, as multiples of the floor (the core and live
    /// issues set one, the overhead issue a tighter one).
    targets: &'static [f64],
}

#[derive(Clone, Copy, PartialEq, Eq)]
enum Workload {
    /// bench/alloc_loop.c with frame pointers: 6 frames at malloc.
    AllocLoop,
    /// bench/deep_loop.c without frame pointers, this many frames at malloc.
    DeepNoFp(u32),
    /// bench/new_loop.cpp: new long[8] + delete[] (libstdc++).
    NewLoop,
    /// bench/alloc_loop.c linked with this allocator library (-lNAME).
    Linked(&'static str),
}

enum Runner {
    Untraced,
    Memprof(&'static [&'static str]),
    /// The loop runs alone under `memprof monitor` of the whole host with
    /// these flags.
    MonitorHost(&'static [&'static str]),
    /// bpftrace with this program (LIBC stands for the C library's path).
    Bpftrace(&'static str),
}

/// Which rows `cargo xtask bench` runs.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Only {
    All,
    Allocators,
    Mappings,
    Regions,
    Live,
}

/// Issue 15's rows: what --while costs where nothing is recorded (the
/// loop never runs inside printf) and where all is (inside churn), and a
/// timeline sampled every 100 ms, against the floor and plain totals.
const REGION_ROWS: [&[&str]; 5] = [
    &["--empty-programs"],
    &[],
    &["--while", "printf"],
    &["--while", "churn"],
    &["--format", "timeline"],
];

/// The rows that compare direct-mapping tracking on and off.
const MAPPING_ROWS: [&[&str]; 5] = [
    &["--empty-programs"],
    &[],
    &["--no-mmap"],
    &["--live"],
    &["--live", "--no-mmap"],
];

fn bench(allocations: u64, runs: usize, only: Only) -> Result<()> {
    let allocators_only = only == Only::Allocators;
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
    let deep_loop = dir.join("deep_loop_nofp");
    compile_with("bench/deep_loop.c", &deep_loop, "-fomit-frame-pointer")?;
    let new_loop = dir.join("new_loop");
    run(Command::new("g++")
        .args(["-O2", "-g", "-fno-omit-frame-pointer", "-o"])
        .arg(&new_loop)
        .arg(root.join("bench/new_loop.cpp")))?;
    let mut linked = std::collections::HashMap::new();
    for library in ALLOCATOR_LIBRARIES {
        let program = dir.join(format!("alloc_loop_{library}"));
        run(Command::new("gcc")
            .args(["-O2", "-g", "-fno-omit-frame-pointer", "-o"])
            .arg(&program)
            .arg(root.join("bench/alloc_loop.c"))
            .arg(format!("-l{library}")))?;
        linked.insert(library, program);
    }
    let n = allocations.to_string();
    let libc = std::fs::canonicalize("/lib/x86_64-linux-gnu/libc.so.6")?;
    let has_bpftrace = Command::new("bpftrace").arg("--version").output().is_ok();

    let mut configs = vec![
        config("untraced", Runner::Untraced, &[]),
        config(
            "floor: same uprobes, empty BPF programs",
            Runner::Memprof(&["--empty-programs"]),
            &[],
        ),
        config(
            "memprof totals (exact, --unwind auto: CFI tables)",
            Runner::Memprof(&[]),
            &[],
        ),
        config(
            "memprof totals, --no-mmap (direct mappings not tracked)",
            Runner::Memprof(&["--no-mmap"]),
            &[],
        ),
        config(
            "memprof totals (exact, --unwind fp)",
            Runner::Memprof(&["--unwind", "fp"]),
            &[1.3, 1.26],
        ),
        config(
            "memprof --sample-bytes 512K",
            Runner::Memprof(&["--sample-bytes", "512K"]),
            &[1.05],
        ),
        config(
            "memprof --while printf (off the loop's stack: nothing recorded)",
            Runner::Memprof(&["--while", "printf"]),
            &[],
        ),
        config(
            "memprof --while churn (the loop's function: every call recorded)",
            Runner::Memprof(&["--while", "churn"]),
            &[],
        ),
        config(
            "memprof --format timeline (heap sampled every 100 ms)",
            Runner::Memprof(&["--format", "timeline"]),
            &[],
        ),
        config(
            "live floor: live's uprobes (+ returns, + free), empty programs",
            Runner::Memprof(&["--live", "--empty-programs"]),
            &[],
        ),
        config(
            "memprof --live (exact)",
            Runner::Memprof(&["--live"]),
            &[3.0, 2.5],
        ),
        config(
            "memprof --live, --no-mmap",
            Runner::Memprof(&["--live", "--no-mmap"]),
            &[],
        ),
        config(
            "memprof --live --sample-bytes 512K (session uprobes: returns only where sampled)",
            Runner::Memprof(&["--live", "--sample-bytes", "512K"]),
            &[2.1],
        ),
        config(
            "memprof --live --sample-bytes 512K, children not held at fork: the parent keeps a shared entry event (--no-fork-hold)",
            Runner::Memprof(&["--live", "--sample-bytes", "512K", "--no-fork-hold"]),
            &[],
        ),
        config(
            "memprof --live --sample-bytes 512K, a return on every call (--no-session-probes)",
            Runner::Memprof(&["--live", "--sample-bytes", "512K", "--no-session-probes"]),
            &[],
        ),
        config(
            "memprof monitor --live (whole host; sampling at 512K)",
            Runner::MonitorHost(&["--live"]),
            &[2.1],
        ),
        config(
            "memprof --live --no-probe-offsets",
            Runner::Memprof(&["--live", "--no-probe-offsets"]),
            &[],
        ),
        config(
            "one empty probe: malloc",
            Runner::Memprof(&["--bench-probe", "malloc"]),
            &[],
        ),
        config(
            "one empty probe: free (at its first emulated instruction)",
            Runner::Memprof(&["--bench-probe", "free"]),
            &[],
        ),
        config(
            "one empty probe: free at +0 (--no-probe-offsets)",
            Runner::Memprof(&["--bench-probe", "free", "--no-probe-offsets"]),
            &[],
        ),
    ];
    // Issue 12: a program without frame pointers, 11 frames at malloc
    // (and 31, for the cost per frame).
    configs.extend([
        deep(
            11,
            "no frame pointers, 11 frames: floor (empty programs)",
            Runner::Memprof(&["--empty-programs"]),
            &[],
        ),
        deep(
            11,
            "no frame pointers, 11 frames: memprof totals (exact, full stacks)",
            Runner::Memprof(&[]),
            &[2.5],
        ),
        deep(
            11,
            "no frame pointers, 11 frames: memprof --sample-bytes 512K",
            Runner::Memprof(&["--sample-bytes", "512K"]),
            &[1.1],
        ),
        deep(
            11,
            "no frame pointers, 11 frames: memprof --unwind fp (cut stacks)",
            Runner::Memprof(&["--unwind", "fp"]),
            &[],
        ),
        deep(
            31,
            "no frame pointers, 31 frames: memprof totals (exact, full stacks)",
            Runner::Memprof(&[]),
            &[],
        ),
    ]);
    // Issue 13: C++'s operators and other allocators, each to its own floor.
    let workloads = std::iter::once(Workload::NewLoop).chain(
        ALLOCATOR_LIBRARIES
            .iter()
            .map(|&library| Workload::Linked(library)),
    );
    for workload in workloads {
        let name = match workload {
            Workload::NewLoop => "new[]+delete[] (libstdc++)".to_string(),
            Workload::Linked(library) => format!("{library}'s malloc+free"),
            _ => unreachable!(),
        };
        let name: &'static str = Box::leak(name.into_boxed_str());
        // The 1.3 target is the probes' own cost: frame-pointer stacks, as
        // for glibc's row (CFI unwinding costs the same whatever the
        // allocator: see the rows without frame pointers).
        for (what, runner, targets) in [
            (
                "floor (empty programs)",
                Runner::Memprof(&["--empty-programs"]),
                &[][..],
            ),
            (
                "memprof totals (exact, --unwind auto)",
                Runner::Memprof(&[]),
                &[][..],
            ),
            (
                "memprof totals (exact, --unwind fp)",
                Runner::Memprof(&["--unwind", "fp"]),
                &[1.3][..],
            ),
        ] {
            let row: &'static str = Box::leak(format!("{name}: {what}").into_boxed_str());
            configs.push(Config {
                workload,
                ..config(row, runner, targets)
            });
        }
    }
    if has_bpftrace {
        configs.push(config(
            "bpftrace: count malloc hits",
            Runner::Bpftrace("uprobe:LIBC:malloc { @calls = count(); }"),
            &[],
        ));
        configs.push(config(
            "bpftrace: count malloc calls by user stack",
            Runner::Bpftrace("uprobe:LIBC:malloc { @[ustack] = count(); }"),
            &[],
        ));
    }

    if allocators_only {
        configs.retain(|c| matches!(c.workload, Workload::NewLoop | Workload::Linked(_)));
    }
    let rows: &[&[&str]] = match only {
        Only::Mappings => &MAPPING_ROWS,
        Only::Regions => &REGION_ROWS,
        _ => &[],
    };
    if only == Only::Live {
        configs.retain(|c| {
            c.workload == Workload::AllocLoop
                && match c.runner {
                    Runner::Memprof(flags) => {
                        flags.contains(&"--live") || flags == ["--empty-programs"]
                    }
                    Runner::MonitorHost(_) => true,
                    _ => false,
                }
        });
    }
    if !rows.is_empty() {
        configs.retain(|c| {
            c.workload == Workload::AllocLoop
                && matches!(c.runner, Runner::Memprof(flags) if rows.contains(&flags))
        });
    }
    // Interleaved, so that machine noise hits every configuration alike.
    let mut samples = vec![Vec::new(); configs.len()];
    for _ in 0..runs {
        for (index, config) in configs.iter().enumerate() {
            let (program, depth) = match config.workload {
                Workload::AllocLoop => (&alloc_loop, None),
                Workload::NewLoop => (&new_loop, None),
                Workload::Linked(library) => (&linked[library], None),
                // deep_loop's DEPTH argument: frames minus main's 5.
                Workload::DeepNoFp(frames) => (&deep_loop, Some((frames - 5).to_string())),
            };
            let output = match &config.runner {
                Runner::Untraced => run(Command::new(program).arg(&n))?,
                Runner::Memprof(flags) => run(Command::new(&memprof)
                    .args(["trace", "-o", "/dev/null"])
                    .args(*flags)
                    .arg("--")
                    .arg(program)
                    .arg(&n)
                    .args(depth.as_ref()))?,
                Runner::MonitorHost(flags) => {
                    let _monitor = monitor_host(&memprof, flags)?;
                    run(Command::new(program).arg(&n).args(depth.as_ref()))?
                }
                Runner::Bpftrace(program) => run(Command::new("bpftrace")
                    .arg("-e")
                    .arg(program.replace("LIBC", &libc.display().to_string()))
                    .arg("-c")
                    .arg(format!("{} {n}", alloc_loop.display())))?,
            };
            let stdout = String::from_utf8_lossy(&output.stdout);
            let ns = field(&stdout, "ns_per_op")
                .with_context(|| format!("{}: no ns_per_op in {stdout}", config.name))?;
            samples[index].push(ns);
        }
    }
    let medians: Vec<f64> = samples.into_iter().map(median).collect();
    // The median of the memprof row of `workload` run with `wanted` flags.
    let median_of = |workload: Workload, wanted: &[&str]| {
        configs
            .iter()
            .zip(&medians)
            .find(|(c, _)| {
                c.workload == workload
                    && matches!(c.runner, Runner::Memprof(flags) if flags == wanted)
            })
            .map_or(f64::NAN, |(_, &ns)| ns)
    };
    let floor_of = |workload: Workload| median_of(workload, &["--empty-programs"]);
    let deep_floor = floor_of(Workload::DeepNoFp(11));
    // The rows' table, then (unless only the allocators' rows are asked
    // for) the other measurements.
    print_rows(&configs, &medians, deep_floor, floor_of);
    let with_and_without = |flags: &[&str], without: &[&str]| {
        median_of(Workload::AllocLoop, flags) / median_of(Workload::AllocLoop, without)
    };
    if matches!(only, Only::All | Only::Mappings) {
        println!();
        println!(
            "Direct-mapping tracking on / off (--no-mmap), malloc loop: totals {:.3}x, --live {:.3}x.",
            with_and_without(&[], &["--no-mmap"]),
            with_and_without(&["--live"], &["--live", "--no-mmap"]),
        );
    }
    if matches!(only, Only::All | Only::Regions) {
        println!();
        println!(
            "Regions, malloc loop: --while off the stack / floor {:.3}x; --while on it / totals {:.3}x; timeline / totals {:.3}x.",
            with_and_without(&["--while", "printf"], &["--empty-programs"]),
            with_and_without(&["--while", "churn"], &[]),
            with_and_without(&["--format", "timeline"], &[]),
        );
    }
    if only != Only::All {
        return Ok(());
    }

    let total_at = |frames: u32| median_of(Workload::DeepNoFp(frames), &[]);
    println!();
    println!(
        "Cost per unwound frame (CFI tables, in the kernel): {:.0} ns ((31 frames - 11 frames) / 20).",
        (total_at(31) - total_at(11)) / 20.0
    );
    println!();
    println!("Median of {runs} runs of {allocations} malloc(64)+free pairs, one call site.");
    if !has_bpftrace {
        println!("(bpftrace is not installed: its rows are left out.)");
    }

    // The daemon's own CPU: the difference between a short and a long run
    // leaves out start-up (loading and verifying the BPF programs).
    for (name, flags) in [("totals", &[][..]), ("--live", &["--live"][..])] {
        let cpu_at = |count: u64| -> Result<f64> {
            let output = run(Command::new(&memprof)
                .env("MEMPROF_TIMINGS", "1")
                .args(["trace", "-o", "/dev/null"])
                .args(flags)
                .arg("--")
                .arg(&alloc_loop)
                .arg(count.to_string()))?;
            field(&String::from_utf8_lossy(&output.stderr), "cpu_ms").context("no cpu_ms")
        };
        let (short, long) = (cpu_at(100_000)?, cpu_at(2_100_000)?);
        println!(
            "Daemon CPU time per million allocations ({name}): {:.1} ms (start-up and report: {short:.0} ms).",
            (long - short) / 2.0
        );
    }

    start_and_exit(&memprof, runs)?;

    // Issue 12: preparing unwind tables (compile each file's CFI, write
    // its rows to the kernel) for a process the first time memprof sees
    // its files: python3 with modules, and a C++ program.
    let cpp = dir.join("heap_patterns");
    run(Command::new("g++")
        .args(["-O2", "-g", "-o"])
        .arg(&cpp)
        .arg(root.join("tests/fixtures/heap_patterns.cpp")))?;
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
        let output = run(Command::new(&memprof)
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

    distinct_stacks(&memprof, &many_stacks)
}

/// Programs making 10,000 and 100,000 distinct stacks, one call each: what
/// a new stack costs a call, the report's time and the daemon's RSS.
fn distinct_stacks(memprof: &Path, many_stacks: &Path) -> Result<()> {
    for (stacks, table, top) in [
        (10_000u32, "16384", "1000000"),
        (100_000, "131072", "1000000"),
        (100_000, "131072", "10"),
    ] {
        let output = run(Command::new(memprof)
            .env("MEMPROF_TIMINGS", "1")
            .args(["trace", "--top", top, "-o", "/dev/null"])
            .args(["--max-stacks", "262144", "--stack-map-size", table])
            .arg("--")
            .arg(many_stacks)
            .arg(stacks.to_string()))?;
        let stderr = String::from_utf8_lossy(&output.stderr);
        let report_ms = field(&stderr, "report_ms").context("no report timing")?;
        let reported = field(&stderr, "stacks").context("no stack count")?;
        let rss_kb = field(&stderr, "max_rss_kb").context("no max_rss_kb")?;
        // Each call the first of its stack: a new stack and site entry.
        let ns_per_call = field(&String::from_utf8_lossy(&output.stdout), "ns_per_call")
            .context("no ns_per_call")?;
        println!(
            "{stacks} distinct stacks ({reported:.0} reported), --top {top}: {:.1} us per call (each a new stack); report (read maps, symbolize, render text) {report_ms:.0} ms; daemon peak RSS {:.0} MiB.",
            ns_per_call / 1000.0,
            rss_kb / 1024.0
        );
    }
    Ok(())
}

/// The table of medians, each with its ratio to its workload's floor.
fn print_rows(
    configs: &[Config],
    medians: &[f64],
    deep_floor: f64,
    floor_of: impl Fn(Workload) -> f64,
) {
    println!("| what | ns per malloc+free | × floor | target |");
    println!("|---|---:|---:|---:|");
    for (config, ns) in configs.iter().zip(medians) {
        let floor = match config.workload {
            Workload::DeepNoFp(_) => deep_floor,
            workload => floor_of(workload),
        };
        let ratio = ns / floor;
        let target = config
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
        println!("| {} | {ns:.0} | {ratio:.2} | {target} |", config.name);
    }
}

fn config(name: &'static str, runner: Runner, targets: &'static [f64]) -> Config {
    Config {
        name,
        runner,
        workload: Workload::AllocLoop,
        targets,
    }
}

fn deep(frames: u32, name: &'static str, runner: Runner, targets: &'static [f64]) -> Config {
    Config {
        workload: Workload::DeepNoFp(frames),
        ..config(name, runner, targets)
    }
}

/// Issue 16: how long memprof takes around a program: `trace -- /bin/true`
/// wall time (plain, --live, --sample-bytes), and `attach` to one
/// process until it prints "attached", then from Ctrl-C (SIGINT) to its
/// exit. Medians of `runs`.
fn start_and_exit(memprof: &Path, runs: usize) -> Result<()> {
    use std::io::BufRead as _;
    use std::time::Instant;
    for (name, flags) in [
        ("trace -- /bin/true", &[][..]),
        ("trace --live -- /bin/true", &["--live"][..]),
        (
            "trace --sample-bytes 512K -- /bin/true",
            &["--sample-bytes", "512K"][..],
        ),
    ] {
        let mut times = Vec::new();
        for _ in 0..runs {
            let started = Instant::now();
            run(Command::new(memprof)
                .args(["trace", "-o", "/dev/null"])
                .args(flags)
                .args(["--", "/bin/true"]))?;
            times.push(started.elapsed().as_secs_f64());
        }
        println!(
            "Start and exit, {name}: {:.2} s wall (median of {runs}).",
            median(times)
        );
    }
    let mut times = Vec::new();
    let mut exits = Vec::new();
    for _ in 0..runs {
        let mut target = Command::new("sleep").arg("30").spawn()?;
        // Attached while still in the loader, memprof finds no allocator
        // yet and says so first: wait for its C library.
        let maps = format!("/proc/{}/maps", target.id());
        while !std::fs::read_to_string(&maps)?.contains("libc.so") {
            std::thread::sleep(std::time::Duration::from_millis(1));
        }
        let started = Instant::now();
        let mut child = Command::new(memprof)
            .args(["attach", "-o", "/dev/null", "--pid"])
            .arg(target.id().to_string())
            .stderr(std::process::Stdio::piped())
            .spawn()?;
        let mut line = String::new();
        std::io::BufReader::new(child.stderr.take().context("stderr")?).read_line(&mut line)?;
        let attached = started.elapsed().as_secs_f64();
        if !line.contains("attached") {
            bail!("memprof attach printed {line:?}");
        }
        let interrupted = Instant::now();
        run(Command::new("kill").args(["-INT", &child.id().to_string()]))?;
        child.wait()?;
        exits.push(interrupted.elapsed().as_secs_f64());
        target.kill()?;
        target.wait()?;
        times.push(attached);
    }
    println!(
        "attach --pid (one process) until \"attached\": {:.2} s, from Ctrl-C to exit: {:.2} s (medians of {runs}).",
        median(times),
        median(exits)
    );
    Ok(())
}
