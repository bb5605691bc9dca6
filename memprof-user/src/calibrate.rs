//! What memprof's probes cost a process per allocation on this host,
//! measured at `monitor`'s start for its budget (`--max-overhead`): a
//! child of memprof calls malloc and free in a loop, not probed, then
//! probed; the difference per call is the cost, programs and traps
//! together, as configured (sampling, --live).
use std::{
    io::{BufRead as _, BufReader, Write as _},
    process::{Child, ChildStdout, Command, Stdio},
    time::Instant,
};

use anyhow::{bail, Context as _, Result};

/// The hidden first argument that makes memprof the calibration child.
pub const CHILD_ARG: &str = "__calibrate";

/// Calls per timed loop: long enough to time (~0.1 s probed), short
/// enough for the start.
const CALLS: u32 = 100_000;

/// The child: a timed loop, a line on stdin, the loop again.
pub fn child_main() -> ! {
    let time_loop = || {
        let started = Instant::now();
        for _ in 0..CALLS {
            // SAFETY: a plain allocation, freed at once.
            unsafe {
                let block = libc::malloc(std::hint::black_box(64));
                libc::free(std::hint::black_box(block));
            }
        }
        started.elapsed().as_nanos() as f64 / f64::from(CALLS)
    };
    let mut out = std::io::stdout();
    // A first loop warms the allocator and the caches.
    time_loop();
    let _ = writeln!(out, "{}", time_loop());
    let _ = out.flush();
    let mut line = String::new();
    let _ = std::io::stdin().read_line(&mut line);
    let _ = writeln!(out, "{}", time_loop());
    std::process::exit(0)
}

/// A calibration under way: its child has timed its unprobed loop.
pub struct Calibration {
    child: Child,
    stdout: BufReader<ChildStdout>,
    pub pid: u32,
    unprobed_ns: f64,
}

impl Calibration {
    /// Starts the child and waits for its unprobed timing (before the
    /// probes go in: on the whole host they trap everywhere).
    pub fn start() -> Result<Calibration> {
        let mut child = Command::new("/proc/self/exe")
            .arg(CHILD_ARG)
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .spawn()
            .context("starting the calibration child")?;
        let mut stdout = BufReader::new(child.stdout.take().context("calibration stdout")?);
        let unprobed_ns = read_timing(&mut stdout)?;
        Ok(Calibration {
            pid: child.id(),
            child,
            stdout,
            unprobed_ns,
        })
    }

    /// Once the child is probed: its probed timing; the cost per call (ns).
    pub fn finish(mut self) -> Result<f64> {
        writeln!(self.child.stdin.as_mut().context("calibration stdin")?)?;
        let probed_ns = read_timing(&mut self.stdout)?;
        let _ = self.child.wait();
        Ok((probed_ns - self.unprobed_ns).max(0.0))
    }
}

fn read_timing(stdout: &mut BufReader<ChildStdout>) -> Result<f64> {
    let mut line = String::new();
    stdout.read_line(&mut line)?;
    match line.trim().parse() {
        Ok(ns) => Ok(ns),
        Err(_) => bail!("the calibration child said {line:?}"),
    }
}
