//! `cargo xtask bench --go-only`: what counting a Go program's heap costs
//! per allocation, side by side in one run on `bench/go_alloc` (a loop of
//! 1,000,000 `make([]byte, 64)`): untraced, Go's own profile of every
//! allocation (`MemProfileRate = 1`), the bare uprobe on
//! `runtime.mallocgc` (a program that does nothing: the floor), and
//! `memprof trace` exact and with `--sample-bytes 512K`.
use std::process::Command;

use anyhow::{Context as _, Result};

use super::numbers::timed;
use crate::{
    process::run,
    workspace::{bench_dir, build_memprof, root},
};

/// Allocations the loop makes.
const ALLOCATIONS: u64 = 1_000_000;

pub fn go_allocations(runs: usize) -> Result<()> {
    let memprof = build_memprof()?;
    let program = build_go_alloc()?;
    let n = ALLOCATIONS.to_string();
    let untraced = timed(runs, || {
        run(Command::new(&program).arg(&n))?;
        Ok(None)
    })?;
    println!(
        "| run | wall (s, median of {runs}) | × untraced | added per allocation (ns) | allocations counted |"
    );
    println!("|---|---:|---:|---:|---:|");
    row("untraced", untraced, untraced);
    let go_profile = timed(runs, || {
        run(Command::new(&program)
            .arg(&n)
            .env("GO_BENCH_MEMPROFILE", "1"))?;
        Ok(None)
    })?;
    row("Go's own profile, MemProfileRate = 1", go_profile, untraced);
    for (name, flags) in [
        (
            "bare uprobe on runtime.mallocgc (floor)",
            &["--bench-probe", "runtime.mallocgc"][..],
        ),
        ("memprof trace", &[][..]),
        (
            "memprof trace --sample-bytes 512K",
            &["--sample-bytes", "512K"][..],
        ),
    ] {
        let traced = timed(runs, || {
            let output = run(Command::new(&memprof)
                .args(["trace", "--format", "json"])
                .args(flags)
                .arg("--")
                .arg(&program)
                .arg(&n))?;
            Ok(counted(&output.stdout))
        })?;
        row(name, traced, untraced);
    }
    Ok(())
}

/// Builds bench/go_alloc with the installed go.
fn build_go_alloc() -> Result<std::path::PathBuf> {
    let out = bench_dir()?;
    let program = out.join("go_alloc");
    run(Command::new("go")
        .args(["build", "-o"])
        .arg(&program)
        .arg(".")
        .current_dir(root().join("bench/go_alloc"))
        .env("GOCACHE", out.join("go-cache"))
        .env("GOPATH", out.join("go-path"))
        .env("GOFLAGS", "-mod=mod")
        .env("GOPROXY", "off"))
    .context("go build (apt install golang-go)")?;
    Ok(program)
}

fn row(name: &str, (wall, count): (f64, Option<u64>), (untraced, _): (f64, Option<u64>)) {
    println!(
        "| {name} | {wall:.3} | {:.1} | {:.0} | {} |",
        wall / untraced,
        (wall - untraced) * 1e9 / ALLOCATIONS as f64,
        count.map_or(String::new(), |c| c.to_string())
    );
}

/// The calls a memprof JSON report counted (None for the floor's run,
/// which counts nothing), after the program's own line.
fn counted(stdout: &[u8]) -> Option<u64> {
    let text = std::str::from_utf8(stdout).ok()?;
    let (_, report) = text.split_once('\n')?;
    let value: serde_json::Value = serde_json::from_str(report).ok()?;
    value["count"].as_u64().filter(|&count| count > 0)
}
