//! `trace` stops the processes it profiles at times (at exec, at a
//! `dlopen`, at a fork: until their probes or unwind tables are in) and
//! lets them go itself. If memprof dies without doing so (SIGKILL, the OOM
//! killer, an error or a panic on the way), nothing else would: a stopped
//! child, and the shell or vfork parent waiting on it, would wait for
//! good. So `trace` starts a watchdog first: a second memprof process
//! (named `memprof-wd`, in a process group of its own: Ctrl-C does not
//! reach it), holding the maps that name the processes memprof may have
//! stopped. Once a profile has ended well memprof says so on the
//! watchdog's stdin; if the pipe closes without that word, the watchdog
//! waits until memprof is gone (its programs with it), then sends SIGCONT
//! to each of those processes that is stopped (to a held fork whatever
//! its state: its stop may still be pending), and exits.
use std::{
    ffi::CString,
    io::{Read as _, Write as _},
    os::{
        fd::{AsRawFd as _, FromRawFd as _, OwnedFd, RawFd},
        unix::process::CommandExt as _,
    },
    process::{Child, Command, Stdio},
    time::{Duration, Instant},
};

use anyhow::{Context as _, Result};
use aya::{
    maps::{HashMap, Map, MapData},
    Ebpf, Pod,
};
use memprof_common::images::ProcState;

use super::session_link::map_fd;
use crate::host::procfs::status::is_stopped;

/// The first argument that makes `memprof` the watchdog.
pub const CHILD_ARG: &str = "__watchdog";

/// Its name in `ps` (`killall memprof` leaves it; `pkill memprof`, a
/// pattern, matches it too).
const NAME: &str = "memprof-wd";

/// What memprof writes when the profile ended with everything let go.
const ALL_RELEASED: u8 = b'r';

/// The maps whose keys are the processes memprof may stop: every process
/// it profiles (`PROCS`), and the children held at their fork, not yet in
/// it (`HELD_FORKS`).
const MAPS: [&str; 2] = ["PROCS", "HELD_FORKS"];

/// Once memprof is gone: a program run under way as its links closed may
/// still stop a process (a raw tracepoint's link does not wait for it).
const SWEEPS_AFTER_EXIT: [Duration; 3] = [
    Duration::ZERO,
    Duration::from_millis(20),
    Duration::from_millis(200),
];

/// How long the watchdog waits for memprof to be gone after the pipe
/// closed (it closes the pipe itself just before it exits).
const EXIT_WAIT: Duration = Duration::from_secs(10);

/// The watchdog, running.
pub struct Watchdog {
    child: Child,
}

impl Watchdog {
    /// Starts the watchdog over `ebpf`'s maps (call before the programs
    /// can stop anything).
    pub fn start(ebpf: &Ebpf) -> Result<Self> {
        let fds = MAPS
            .iter()
            .map(|name| map_fd(ebpf.map(name).with_context(|| format!("map {name}"))?))
            .collect::<Result<Vec<RawFd>>>()?;
        // This very binary, even if the file was replaced or deleted since.
        let mut command = Command::new("/proc/self/exe");
        command
            .arg(CHILD_ARG)
            .arg(std::process::id().to_string())
            .args(fds.iter().map(RawFd::to_string))
            .stdin(Stdio::piped())
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .process_group(0);
        // SAFETY: system calls only, between fork and exec.
        unsafe {
            command.pre_exec(move || {
                // Nothing memprof inherited open goes on (a build's
                // jobserver pipe, say); the two maps do.
                const CLOSE_RANGE_CLOEXEC: libc::c_uint = 4;
                libc::syscall(
                    libc::SYS_close_range,
                    3,
                    libc::c_uint::MAX,
                    CLOSE_RANGE_CLOEXEC,
                );
                for &fd in &fds {
                    if libc::fcntl(fd, libc::F_SETFD, 0) != 0 {
                        return Err(std::io::Error::last_os_error());
                    }
                }
                Ok(())
            });
        }
        let child = command.spawn().context("starting the watchdog")?;
        Ok(Watchdog { child })
    }

    /// The profile ended and every process memprof stopped was let go:
    /// the watchdog exits without a look.
    pub fn all_released(mut self) {
        if let Some(mut stdin) = self.child.stdin.take() {
            let _ = stdin.write_all(&[ALL_RELEASED]);
        }
        // It exits at once; not waited for long (it may have been stopped).
        let deadline = Instant::now() + Duration::from_millis(100);
        while matches!(self.child.try_wait(), Ok(None)) && Instant::now() < deadline {
            std::thread::sleep(Duration::from_millis(1));
        }
    }
}

/// Not told all was let go (an error, a panic): the pipe closes, and the
/// watchdog looks once memprof has exited. Not waited for: it waits for
/// memprof.
impl Drop for Watchdog {
    fn drop(&mut self) {
        drop(self.child.stdin.take());
    }
}

/// The watchdog process: waits for memprof to end; if it did not say all
/// was let go, lets go every stopped process the maps name once memprof
/// is gone.
pub fn child_main() -> ! {
    if let Ok(name) = CString::new(NAME) {
        // SAFETY: PR_SET_NAME reads a NUL-terminated string.
        unsafe { libc::prctl(libc::PR_SET_NAME, name.as_ptr()) };
    }
    let args: Vec<u32> = std::env::args()
        .skip(2)
        .filter_map(|arg| arg.parse().ok())
        .collect();
    // memprof's pid, then the maps' fds in the order of `MAPS`.
    let &[memprof, procs, held_forks] = args.as_slice() else {
        std::process::exit(2)
    };
    // Opened now, while memprof surely runs (pid reuse cannot mislead it).
    let memprof = crate::host::pidfd::pidfd_open(memprof as i32).ok();
    let procs = inherited_map::<ProcState>(procs);
    let held_forks = inherited_map::<u64>(held_forks);
    let mut word = [0u8; 1];
    let said = loop {
        match std::io::stdin().read(&mut word) {
            Ok(0) => break false,
            Ok(_) => break word[0] == ALL_RELEASED,
            Err(err) if err.kind() == std::io::ErrorKind::Interrupted => continue,
            Err(_) => break false,
        }
    };
    if !said {
        // Every file memprof held (its programs' links) closes before it
        // is reported gone.
        if let Some(memprof) = memprof {
            wait_readable(&memprof, EXIT_WAIT);
        }
        let mut slept = Duration::ZERO;
        for after in SWEEPS_AFTER_EXIT {
            std::thread::sleep(after - slept);
            slept = after;
            // A held child's stop may still be pending (it has not run
            // yet): a SIGCONT cancels it, so those get one whatever their
            // state.
            let held = keys(held_forks.as_ref());
            let profiled = keys(procs.as_ref())
                .into_iter()
                .filter(|&pid| is_stopped(pid));
            for pid in held.into_iter().chain(profiled) {
                // Key 0 is HELD_FORKS's mark, no process (kill(0) would
                // signal the watchdog's own group).
                if pid != 0 {
                    // SAFETY: sends a signal, nothing else.
                    unsafe { libc::kill(pid as i32, libc::SIGCONT) };
                }
            }
        }
    }
    std::process::exit(0)
}

/// The hash map (u32 keys, `V` values) whose fd memprof passed down.
fn inherited_map<V: Pod>(fd: u32) -> Option<HashMap<MapData, u32, V>> {
    // SAFETY: an fd memprof left open for the watchdog alone.
    let fd = unsafe { OwnedFd::from_raw_fd(fd as RawFd) };
    HashMap::try_from(Map::HashMap(MapData::from_fd(fd).ok()?)).ok()
}

/// The map's keys now (none without the map).
fn keys<V: Pod>(map: Option<&HashMap<MapData, u32, V>>) -> Vec<u32> {
    map.map_or_else(Vec::new, |map| map.keys().filter_map(Result::ok).collect())
}

/// Waits until `fd` is readable (a pidfd: its process has exited), at
/// most `limit`.
fn wait_readable(fd: &OwnedFd, limit: Duration) {
    let deadline = Instant::now() + limit;
    loop {
        let left = deadline.saturating_duration_since(Instant::now());
        let mut poll = libc::pollfd {
            fd: fd.as_raw_fd(),
            events: libc::POLLIN,
            revents: 0,
        };
        // SAFETY: one pollfd, ours.
        let ready = unsafe { libc::poll(&mut poll, 1, left.as_millis() as i32) };
        let interrupted =
            ready < 0 && std::io::Error::last_os_error().kind() == std::io::ErrorKind::Interrupted;
        if !interrupted || left.is_zero() {
            return;
        }
    }
}
