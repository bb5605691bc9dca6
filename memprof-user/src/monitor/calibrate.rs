//! What memprof's probes cost a process per allocation on this host,
//! measured at `monitor`'s start for its budget (`--max-overhead`): a
//! child of memprof calls malloc and free in a loop, not probed, then
//! probed; the difference per call is the cost, programs and traps
//! together, as configured (sampling, --live).
use std::{
    io::{BufRead as _, BufReader, Write as _},
    process::{Child, ChildStdout, Command, Stdio},
};

use anyhow::{bail, Context as _, Result};

/// The hidden first argument that makes memprof the calibration child.
pub const CHILD_ARG: &str = "__calibrate";

/// Calls per timed loop, and loops per timing (the fastest counts: a
/// loop is slower, never faster, for what else the host does): long
/// enough to time (~0.1 s probed in all), short enough for the start.
const CALLS: u32 = 50_000;
const LOOPS: usize = 5;

/// The child: timed loops, a line on stdin, the loops again.
pub fn child_main() -> ! {
    // The thread's CPU time, not the clock's: the traps are charged to
    // it, and time the child spends preempted (memprof starting on a
    // busy host) is not.
    let cpu_ns = || {
        nix::time::clock_gettime(nix::time::ClockId::CLOCK_THREAD_CPUTIME_ID)
            .map_or(0.0, |t| t.tv_sec() as f64 * 1e9 + t.tv_nsec() as f64)
    };
    let time_loop = || {
        (0..LOOPS)
            .map(|_| {
                let started = cpu_ns();
                for _ in 0..CALLS {
                    // SAFETY: a plain allocation, freed at once.
                    unsafe {
                        let block = libc::malloc(std::hint::black_box(64));
                        libc::free(std::hint::black_box(block));
                    }
                }
                (cpu_ns() - started) / f64::from(CALLS)
            })
            .fold(f64::INFINITY, f64::min)
    };
    let mut out = std::io::stdout();
    // A first loop warms the allocator and the caches.
    time_loop();
    let _ = writeln!(out, "{}", time_loop());
    let _ = out.flush();
    let mut line = String::new();
    let _ = std::io::stdin().read_line(&mut line);
    // The probes' first calls are slower (seen: 0.52 for 0.42 µs, 1 start
    // in 5): warmed up first, as the unprobed loop was.
    time_loop();
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
