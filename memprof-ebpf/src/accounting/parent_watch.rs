//! Whether `trace` may stop a process (SIGSTOP, until its new code's
//! unwind tables and probes are in) without its parent taking the stop for
//! one of its own. A parent that waits for its children's stops does: a
//! job-control shell prints "Stopped" and takes the terminal back, su and
//! sudo stop themselves until someone continues them. A process is not
//! stopped when its parent would take the stop other than as its own, or
//! as its own with someone watching the parent in turn (what that costs
//! is counted: see `start_walk`).
use aya_ebpf::helpers::{bpf_probe_read_kernel, generated::bpf_get_current_task};

use crate::kernel::{
    maps::STOP_WATCHERS,
    offsets::{
        offset_of as global, SIGNAL_PGRP_OFFSET, SIGNAL_WAITERS_OFFSET, TASK_PARENT_OFFSET,
        TASK_SIGNAL_OFFSET, TASK_STATE_OFFSET, TASK_TGID_OFFSET, WAITER_FLAGS_FROM_NODE,
    },
};

/// `WUNTRACED` (= `WSTOPPED`): the wait reports stopped children.
const WUNTRACED: i32 = 2;

/// `__TASK_STOPPED` in `task_struct.__state`.
const TASK_STOPPED: u32 = 4;

/// Waiters looked at (one per thread of the parent blocked in a wait).
const MAX_WAITERS: u32 = 4;

/// A word of kernel memory.
#[inline(always)]
fn word(address: u64) -> Option<u64> {
    // SAFETY: a checked read of kernel memory.
    unsafe { bpf_probe_read_kernel(address as *const u64) }.ok()
}

/// How a process's parent would take a stop of it.
#[derive(PartialEq)]
enum StopSeen {
    /// It would not look.
    Not,
    /// As one of its own, like su and sudo: it stops itself and, once
    /// continued, continues the child.
    TakenAsOwn,
    /// Otherwise, or it cannot be told: a job-control shell prints
    /// "Stopped" and takes the terminal back.
    Otherwise,
}

/// How the parent of `task` (a `task_struct *`) would take a stop of
/// `task`, and the parent. Seen `Otherwise` when `task` is in another
/// process group (a shell's job, a new session, a daemon); `TakenAsOwn`
/// when the parent is blocked in a wait that reports stops, is stopped
/// (it stopped itself for one: memprof continues it once the child is
/// let go), or was seen to stop itself for one before (`STOP_WATCHERS`).
#[inline(always)]
fn stop_seen(task: u64) -> Option<(StopSeen, u64)> {
    let parent = word(task + global(&TASK_PARENT_OFFSET))?;
    // SAFETY: checked reads of kernel memory.
    let (parent_tgid, state) = unsafe {
        (
            bpf_probe_read_kernel((parent + global(&TASK_TGID_OFFSET)) as *const u32).ok()?,
            bpf_probe_read_kernel((parent + global(&TASK_STATE_OFFSET)) as *const u32).ok()?,
        )
    };
    let own = word(task + global(&TASK_SIGNAL_OFFSET))?;
    let parents = word(parent + global(&TASK_SIGNAL_OFFSET))?;
    let pgrp = global(&SIGNAL_PGRP_OFFSET);
    if word(own + pgrp)? != word(parents + pgrp)? {
        return Some((StopSeen::Otherwise, parent));
    }
    // SAFETY: a lookup; the value is not kept.
    if state & TASK_STOPPED != 0 || unsafe { STOP_WATCHERS.get(parent_tgid) }.is_some() {
        return Some((StopSeen::TakenAsOwn, parent));
    }
    let head = parents + global(&SIGNAL_WAITERS_OFFSET);
    let to_flags = global(&WAITER_FLAGS_FROM_NODE) as u32 as i32 as i64 as u64;
    let mut node = word(head)?;
    for _ in 0..MAX_WAITERS {
        if node == head {
            return Some((StopSeen::Not, parent));
        }
        // SAFETY: a checked read of kernel memory.
        let flags =
            unsafe { bpf_probe_read_kernel(node.wrapping_add(to_flags) as *const i32) }.ok()?;
        if flags & WUNTRACED != 0 {
            return Some((StopSeen::TakenAsOwn, parent));
        }
        node = word(node)?;
    }
    // More waiters than looked at.
    Some((StopSeen::Otherwise, parent))
}

/// Ancestors looked at up a chain of parents that each take their child's
/// stop as their own.
const MAX_LEVELS: u32 = 4;

/// True when the current process may not be stopped: its parent would
/// take the stop other than as its own, or as its own (su, sudo: it stops
/// itself) while the parent's parent would see that stop other than as
/// its own in turn, and so on up. A chain of parents that each take the
/// stop as their own, the last unwatched (su run by `trace`, or by a
/// script; sudo running su), is let stop: user space continues each once
/// its child is let go (`probes::stopped_parents`), and the child's stacks
/// are whole. (A parent that starts such a wait while memprof holds the
/// child is caught there too.) Unreadable, or a longer chain, it counts
/// as seen.
pub fn parent_may_see_stop() -> bool {
    // SAFETY: reads the current task's pointer.
    let mut task = unsafe { bpf_get_current_task() };
    for _ in 0..MAX_LEVELS {
        match stop_seen(task) {
            Some((StopSeen::Not, _)) => return false,
            Some((StopSeen::TakenAsOwn, parent)) => task = parent,
            Some((StopSeen::Otherwise, _)) | None => return true,
        }
    }
    true
}
