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
};

use perf_event_open_sys as sys;

/// Opens a perf event on tracepoint `tracepoint_id` for process `pid`.
pub fn open_tracepoint(tracepoint_id: u64, pid: i32, inherit: bool) -> io::Result<OwnedFd> {
    let mut attr = sys::bindings::perf_event_attr {
        type_: sys::bindings::PERF_TYPE_TRACEPOINT,
        size: std::mem::size_of::<sys::bindings::perf_event_attr>() as u32,
        config: tracepoint_id,
        sample_type: sys::bindings::PERF_SAMPLE_RAW as u64,
        ..Default::default()
    };
    attr.__bindgen_anon_1.sample_period = 1;
    attr.__bindgen_anon_2.wakeup_events = 1;
    attr.set_inherit(inherit as u64);
    // SAFETY: attr is a valid perf_event_attr; the kernel returns a new fd or -1.
    let fd = unsafe {
        sys::perf_event_open(
            &mut attr,
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
    let attr = LinkCreatePerfEvent {
        prog_fd: program.as_raw_fd() as u32,
        target_fd: event.as_raw_fd() as u32,
        attach_type: BPF_PERF_EVENT,
        bpf_cookie: cookie,
        ..Default::default()
    };
    super::bpf_call::bpf_fd(BPF_LINK_CREATE, &attr)
}
