//! Running commands: to their end (an error if they fail), or as children
//! that end when their guard is dropped.
use std::{
    io::{BufRead as _, BufReader},
    path::Path,
    process::{Child, Command, Output, Stdio},
};

use anyhow::{bail, Context as _, Result};

/// Runs `command` to its end: its output, or an error with its stderr if
/// it failed.
pub fn run(command: &mut Command) -> Result<Output> {
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

/// Kills the child on drop (a failed run must not leave probes in).
pub struct Killed(pub Child);

impl Drop for Killed {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// A memprof asked to end (SIGTERM, so that it takes its probes out) and
/// waited for when dropped.
pub struct Terminated(pub Killed);

impl Drop for Terminated {
    fn drop(&mut self) {
        let _ = Command::new("kill")
            .args(["-TERM", &self.0 .0.id().to_string()])
            .status();
        let _ = self.0 .0.wait();
    }
}

/// `memprof monitor ARGS` once it says its probes are in ("attached");
/// stdout discarded. Killed when dropped (wrap it in [`Terminated`] for
/// SIGTERM).
pub fn start_monitor(memprof: &Path, args: &[&str]) -> Result<Killed> {
    let mut monitor = Killed(
        Command::new(memprof)
            .arg("monitor")
            .args(args)
            .stdout(Stdio::null())
            .stderr(Stdio::piped())
            .spawn()
            .context("starting memprof monitor")?,
    );
    let mut stderr = BufReader::new(monitor.0.stderr.take().context("no stderr")?);
    let mut seen = String::new();
    while !seen.contains("attached") {
        if stderr.read_line(&mut seen)? == 0 {
            bail!("memprof monitor ended: {seen}");
        }
    }
    Ok(monitor)
}

/// A process's CPU time (user and system, /proc/PID/stat), in s.
pub fn cpu_secs(pid: u32) -> f64 {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).unwrap_or_default();
    let fields: Vec<f64> = stat
        .rsplit(')')
        .next()
        .unwrap_or("")
        .split_whitespace()
        .map(|f| f.parse().unwrap_or(0.0))
        .collect();
    // utime and stime (fields 14 and 15), in clock ticks of 1/100 s.
    (fields.get(11).unwrap_or(&0.0) + fields.get(12).unwrap_or(&0.0)) / 100.0
}
