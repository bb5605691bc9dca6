//! `cargo xtask fuzz`: the fuzzers of the input memprof does not control:
//! the memprof-fuzz crate's (proptest, mutations of real inputs), and with
//! `--coverage` the coverage-guided targets of fuzz/coverage (libFuzzer).
use std::{
    io::{BufRead as _, BufReader},
    process::{Command, Stdio},
};

use anyhow::{bail, Context as _, Result};

use crate::workspace::root;

/// The ignored tests of memprof-fuzz, one after the other (each
/// gets a core to itself), for `secs` seconds each. The one-line warnings
/// memprof prints for each malformed file it leaves unsymbolized are
/// counted, not shown.
pub fn fuzz(secs: u64) -> Result<()> {
    let mut child = Command::new("cargo")
        .args(["test", "--release", "-p", "memprof-fuzz"])
        .args(["--", "--ignored", "--nocapture", "--test-threads", "1"])
        .env("MEMPROF_FUZZ_SECS", secs.to_string())
        .current_dir(root())
        .stderr(Stdio::piped())
        .spawn()
        .context("running cargo test")?;
    let stderr = child.stderr.take().context("no stderr")?;
    let mut warnings = 0u64;
    for line in BufReader::new(stderr).split(b'\n') {
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

/// The coverage-guided targets, and the real inputs each starts from.
const TARGETS: [(&str, &[&str]); 7] = [
    ("saved_report", &["fuzz/coverage/seeds/report.json"]),
    ("timeline", &["fuzz/coverage/seeds/report.json"]),
    (
        "elf_check",
        &["/bin/true", "/usr/lib/x86_64-linux-gnu/libc.so.6"],
    ),
    ("usdt_notes", &["/usr/lib/x86_64-linux-gnu/libc.so.6"]),
    (
        "unwind_tables",
        &["/bin/true", "/usr/lib/x86_64-linux-gnu/libstdc++.so.6"],
    ),
    ("proc_maps", &["/proc/self/maps"]),
    ("http_query", &["fuzz/coverage/seeds/query.txt"]),
];

/// Each coverage-guided target for `secs` seconds, its corpus kept under
/// target/fuzz-corpus/TARGET (a run goes on from the last one's). A crash
/// fails the task: libFuzzer prints it, and its input is left in
/// fuzz/coverage/artifacts/TARGET/, to be kept as a regression case.
pub fn coverage(secs: u64) -> Result<()> {
    let installed = Command::new("cargo")
        .args(["fuzz", "--version"])
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .status()
        .is_ok_and(|status| status.success());
    if !installed {
        let status = Command::new("cargo")
            .args(["install", "cargo-fuzz", "--locked"])
            .status()
            .context("installing cargo-fuzz")?;
        if !status.success() {
            bail!("cargo install cargo-fuzz failed");
        }
    }
    for (target, seeds) in TARGETS {
        let corpus = root().join("target/fuzz-corpus").join(target);
        std::fs::create_dir_all(&corpus)?;
        for seed in seeds {
            let from = root().join(seed);
            let name = seed.replace('/', "_");
            // /proc files read as 0 bytes long: read, not copied.
            if let Ok(bytes) = std::fs::read(&from) {
                std::fs::write(corpus.join(name), bytes)?;
            }
        }
        println!("{target}: {secs} s");
        let status = Command::new("cargo")
            .args([
                "+nightly",
                "fuzz",
                "run",
                "--fuzz-dir",
                "fuzz/coverage",
                "-O",
            ])
            .arg(target)
            .arg(&corpus)
            .arg("--")
            .arg(format!("-max_total_time={secs}"))
            .args(["-rss_limit_mb=4096", "-print_final_stats=1"])
            .current_dir(root())
            .status()
            .with_context(|| format!("running {target}"))?;
        if !status.success() {
            bail!("{target} found a failing input: see fuzz/coverage/artifacts/{target}/");
        }
    }
    Ok(())
}
