//! `cargo xtask fuzz`: the fuzzers of the input memprof does not control
//! (the memprof-fuzz crate).
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
