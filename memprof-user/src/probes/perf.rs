//! perf events on uprobe tracepoints, and the BPF links that hang the
//! programs off them.
//!
//! Two kinds of event per (uprobe, process):
//! - a *scope* event, opened on the target with `inherit`: it makes the
//!   kernel keep the breakpoint in that process and in every process it
//!   forks or execs, and nowhere else;
//! - one *anchor* event per uprobe, without `inherit`, that carries the
//!   BPF program and its cookie. A program runs for every process any
//!   event of the uprobe selects; attaching it to an inherited event would
//!   detach it when that child exits.
use std::{
    io,
    os::fd::{AsRawFd as _, BorrowedFd, FromRawFd as _, OwnedFd},
    sync::atomic::{AtomicBool, Ordering},
};

use perf_event_open_sys as sys;

/// Whether the kernel takes `PERF_SAMPLE_READ` on inherited events (6.12
/// and later); cleared at the first refusal.
static PINNED_CONTEXTS: AtomicBool = AtomicBool::new(true);

/// Opens a perf event on tracepoint `tracepoint_id` for process `pid`.
///
/// An inherited (scope) event asks for `PERF_SAMPLE_READ` (with
/// `PERF_SAMPLE_TID`, which the kernel then requires), never read: it
/// stops the kernel from swapping the perf contexts of a parent and its
/// child at a context switch, as it does for inherited clones. After such
/// a swap each process holds events whose target is the other; the
/// uprobe's filter finds a process's address space through its events'
/// targets, so once that child had ended, an exec in the parent mapped
/// its new program and libraries without breakpoints: `sh -c '(:); exec
/// prog'` as a child of the traced command lost every call of `prog`
/// (12 runs in 12 here before; tests/tests/trace.rs). Older kernels
/// refuse the flag: without it there, as before.
pub fn open_tracepoint(tracepoint_id: u64, pid: i32, inherit: bool) -> io::Result<OwnedFd> {
    let pinned = inherit && PINNED_CONTEXTS.load(Ordering::Relaxed);
    match open(tracepoint_id, pid, inherit, pinned) {
        Err(err) if pinned && err.raw_os_error() == Some(libc::EINVAL) => {
            let fd = open(tracepoint_id, pid, inherit, false)?;
            PINNED_CONTEXTS.store(false, Ordering::Relaxed);
            Ok(fd)
        }
        result => result,
    }
}

/// Which threads of a process its scope events go on.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Threads {
    /// Its main thread (the threads it starts later inherit them), or once
    /// the main thread has ended, each thread running on. Enough where the
    /// events are opened again within seconds (a window of `monitor`'s
    /// budget).
    Main,
    /// Each thread running: an event on a thread selects the address
    /// space while that thread lives, and what that thread forks inherits
    /// it. On the main thread alone, a main thread that ended after the
    /// events opened (pthread_exit) took every thread running then out
    /// of the profile, and what they forked was never profiled.
    Every,
}

/// The scope events of tracepoint `tracepoint_id` on process `pid`, on
/// the threads `threads` says. Where memprof would run out of files
/// (`fds_to_spare`, or the kernel says so), `Every` falls back to `Main`
/// with a warning.
pub fn open_scopes(tracepoint_id: u64, pid: i32, threads: Threads) -> io::Result<Vec<OwnedFd>> {
    if threads == Threads::Every {
        match open_on_threads(tracepoint_id, pid, Threads::Every) {
            // The events opened so far are closed with the error.
            Err(err) if out_of_files(&err) => warn_too_many_threads(pid),
            result => return result,
        }
    }
    open_on_threads(tracepoint_id, pid, Threads::Main)
}

/// `open_scopes` on `threads`. A thread that ended meanwhile is no
/// error, unless none is left; a thread started meanwhile by one whose
/// event was not open yet inherited none: the threads are read again
/// until no new one shows.
fn open_on_threads(tracepoint_id: u64, pid: i32, threads: Threads) -> io::Result<Vec<OwnedFd>> {
    let mut fds = Vec::new();
    let mut done: Vec<i32> = Vec::new();
    let mut ended = None;
    // Bounded: a process may start threads as fast as they are read.
    for _ in 0..8 {
        let fresh: Vec<i32> = scope_targets(pid, threads)
            .into_iter()
            .filter(|target| !done.contains(target))
            .collect();
        if fresh.is_empty() {
            break;
        }
        if threads == Threads::Every && !fds_to_spare(fresh.len()) {
            return Err(io::Error::from_raw_os_error(libc::EMFILE));
        }
        for target in fresh {
            done.push(target);
            match open_tracepoint(tracepoint_id, target, true) {
                // A thread that ended before its event opened may have
                // left its id to another process's thread.
                Ok(_) if target != pid && !is_thread_of(pid, target) => {}
                Ok(fd) => fds.push(fd),
                Err(err) if err.raw_os_error() == Some(libc::ESRCH) => ended = Some(err),
                Err(err) => return Err(err),
            }
        }
    }
    match (fds.is_empty(), ended) {
        (true, Some(err)) => Err(err),
        _ => Ok(fds),
    }
}

/// Where process `pid`'s scope events go (see [`Threads`]): on the
/// process, or on each thread running on.
fn scope_targets(pid: i32, threads: Threads) -> Vec<i32> {
    let live = match threads == Threads::Every
        || crate::host::procfs::status::main_thread_ended(pid as u32)
    {
        true => crate::host::procfs::status::live_threads(pid as u32),
        false => Vec::new(),
    };
    match live.is_empty() {
        true => vec![pid],
        false => live.into_iter().map(|tid| tid as i32).collect(),
    }
}

fn is_thread_of(pid: i32, tid: i32) -> bool {
    std::path::Path::new(&format!("/proc/{pid}/task/{tid}")).exists()
}

fn out_of_files(err: &io::Error) -> bool {
    matches!(err.raw_os_error(), Some(libc::EMFILE | libc::ENFILE))
}

/// Whether `more` events can be opened while half of memprof's open-file
/// limit stays free: the libraries it reads and the maps it makes need
/// files too. Not counted for a few threads (reading /proc/self/fd
/// costs): running out then is caught as the kernel refuses.
fn fds_to_spare(more: usize) -> bool {
    const FEW: usize = 8;
    if more <= FEW {
        return true;
    }
    let open = std::fs::read_dir("/proc/self/fd").map_or(0, |fds| fds.count());
    let limit = nix::sys::resource::getrlimit(nix::sys::resource::Resource::RLIMIT_NOFILE)
        .map_or(1024, |(soft, _)| soft);
    ((open + more) as u64) < limit / 2
}

/// Said once a run: a process with more threads than memprof can hold
/// events for has them (some of them) on its main thread alone.
fn warn_too_many_threads(pid: i32) {
    static SAID: AtomicBool = AtomicBool::new(false);
    if !SAID.swap(true, Ordering::Relaxed) {
        eprintln!(
            "memprof: warning: process {pid} has too many threads to give each its events \
             within the open-file limit (ulimit -n): its probes follow its main thread (the \
             others are profiled while it lives; what they fork is not)"
        );
    }
}

fn open(tracepoint_id: u64, pid: i32, inherit: bool, pinned: bool) -> io::Result<OwnedFd> {
    let read = match pinned {
        true => sys::bindings::PERF_SAMPLE_READ | sys::bindings::PERF_SAMPLE_TID,
        false => 0,
    };
    let mut attr = sys::bindings::perf_event_attr {
        type_: sys::bindings::PERF_TYPE_TRACEPOINT,
        size: std::mem::size_of::<sys::bindings::perf_event_attr>() as u32,
        config: tracepoint_id,
        sample_type: (sys::bindings::PERF_SAMPLE_RAW | read) as u64,
        ..Default::default()
    };
    attr.__bindgen_anon_1.sample_period = 1;
    attr.__bindgen_anon_2.wakeup_events = 1;
    attr.set_inherit(inherit as u64);
    match open_attr(&mut attr, pid) {
        // A process whose main thread has ended (pthread_exit) takes no
        // event on its pid; one of its threads that runs on does, as well:
        // the uprobe selects by address space. Its calls are seen while
        // that thread (or one it starts) lives. (Scope events go on every
        // thread, `open_scopes`: this serves a main thread ending as its
        // event opens.)
        Err(err) if pid > 0 && err.raw_os_error() == Some(libc::ESRCH) => {
            match crate::host::procfs::status::live_thread(pid as u32) {
                Some(thread) if thread as i32 != pid => open_attr(&mut attr, thread as i32),
                _ => Err(err),
            }
        }
        result => result,
    }
}

fn open_attr(attr: &mut sys::bindings::perf_event_attr, pid: i32) -> io::Result<OwnedFd> {
    // SAFETY: attr is a valid perf_event_attr; the kernel returns a new fd or -1.
    let fd = unsafe {
        sys::perf_event_open(
            attr,
            pid,
            // A process's events count on any CPU; an event of every
            // process is opened on CPU 0 (a uprobe's programs run on
            // every CPU all the same).
            if pid == -1 { 0 } else { -1 },
            -1,
            sys::bindings::PERF_FLAG_FD_CLOEXEC as u64,
        )
    };
    if fd < 0 {
        return Err(io::Error::last_os_error());
    }
    // SAFETY: fd was just returned by the kernel and is owned by nobody else.
    Ok(unsafe { OwnedFd::from_raw_fd(fd) })
}

/// `union bpf_attr` for `BPF_LINK_CREATE` with a perf event target.
#[repr(C)]
#[derive(Default)]
struct LinkCreatePerfEvent {
    prog_fd: u32,
    target_fd: u32,
    attach_type: u32,
    flags: u32,
    bpf_cookie: u64,
    /// The rest of `union bpf_attr`, zeroed as the kernel requires.
    _rest: [u64; 12],
}

const BPF_LINK_CREATE: libc::c_long = 28;
const BPF_PERF_EVENT: u32 = 41;

/// Attaches `program` to the perf event with a BPF cookie; the link lives
/// as long as the returned fd.
pub fn link_program(program: BorrowedFd<'_>, event: &OwnedFd, cookie: u64) -> io::Result<OwnedFd> {
    let mut attr = LinkCreatePerfEvent {
        prog_fd: program.as_raw_fd() as u32,
        target_fd: event.as_raw_fd() as u32,
        attach_type: BPF_PERF_EVENT,
        bpf_cookie: cookie,
        ..Default::default()
    };
    super::bpf_call::bpf_fd(BPF_LINK_CREATE, &mut attr)
}
