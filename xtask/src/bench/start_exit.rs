//! How long memprof takes around a program: from its start until the
//! program runs, and from the end until memprof exits.
use std::{
    io::{BufRead as _, BufReader},
    path::Path,
    process::{Command, Stdio},
    time::{Duration, Instant},
};

use anyhow::{bail, Context as _, Result};

use super::numbers::median;
use crate::process::run;

/// `trace -- /bin/true` wall time (plain, --live, --sample-bytes), and
/// `attach` to one process until it prints "attached", then from Ctrl-C
/// (SIGINT) to its exit. Medians of `runs`.
pub fn start_and_exit(memprof: &Path, runs: usize) -> Result<()> {
    trace_true(memprof, runs)?;
    attach_and_interrupt(memprof, runs)
}

fn trace_true(memprof: &Path, runs: usize) -> Result<()> {
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
    Ok(())
}

fn attach_and_interrupt(memprof: &Path, runs: usize) -> Result<()> {
    let mut times = Vec::new();
    let mut exits = Vec::new();
    for _ in 0..runs {
        let mut target = Command::new("sleep").arg("30").spawn()?;
        // Attached while still in the loader, memprof finds no allocator
        // yet and says so first: wait for its C library.
        let maps = format!("/proc/{}/maps", target.id());
        while !std::fs::read_to_string(&maps)?.contains("libc.so") {
            std::thread::sleep(Duration::from_millis(1));
        }
        let started = Instant::now();
        let mut child = Command::new(memprof)
            .args(["attach", "-o", "/dev/null", "--pid"])
            .arg(target.id().to_string())
            .stderr(Stdio::piped())
            .spawn()?;
        let mut line = String::new();
        BufReader::new(child.stderr.take().context("stderr")?).read_line(&mut line)?;
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
