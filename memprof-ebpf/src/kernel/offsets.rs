//! Where kernel struct fields lie, set by user space before load from
//! the kernel's BTF: the tracepoints and `parent_watch` read
//! `task_struct`, `signal_struct` and `linux_binprm` through them.
/// Byte offsets of `task_struct.pid` and `linux_binprm.filename` in the
/// running kernel, from its BTF; set by user space before load (raw
/// tracepoints get the tracepoints' arguments, not a record).
#[unsafe(no_mangle)]
pub static TASK_PID_OFFSET: u32 = 0;

#[unsafe(no_mangle)]
pub(crate) static TASK_TGID_OFFSET: u32 = 0;

/// `task_struct.signal`, `signal_struct.live`: whether a process's last
/// thread is exiting.
#[unsafe(no_mangle)]
pub(crate) static TASK_SIGNAL_OFFSET: u32 = 0;

#[unsafe(no_mangle)]
pub static SIGNAL_LIVE_OFFSET: u32 = 0;

/// `task_struct.se.sum_exec_runtime` and `signal_struct.sum_sched_runtime`:
/// a thread's CPU time, and its process's reaped threads'.
#[unsafe(no_mangle)]
pub(crate) static TASK_RUNTIME_OFFSET: u32 = 0;

#[unsafe(no_mangle)]
pub(crate) static SIGNAL_RUNTIME_OFFSET: u32 = 0;

#[unsafe(no_mangle)]
pub static BPRM_FILENAME_OFFSET: u32 = 0;

#[inline(always)]
pub(crate) fn offset_of(global: &u32) -> u64 {
    // SAFETY: a read-only global; volatile so the compiler keeps the read.
    u64::from(unsafe { core::ptr::read_volatile(global) })
}

/// Byte offsets in the running kernel, from its BTF; set by user space
/// before load. `task_struct.real_parent`, `task_struct.__state`.
#[unsafe(no_mangle)]
pub static TASK_PARENT_OFFSET: u32 = 0;

#[unsafe(no_mangle)]
pub static TASK_STATE_OFFSET: u32 = 0;

/// `signal_struct.pids[PIDTYPE_PGID]`: the process group, a `struct pid *`.
#[unsafe(no_mangle)]
pub static SIGNAL_PGRP_OFFSET: u32 = 0;

/// `signal_struct.wait_chldexit.head`: the list of the process's threads
/// blocked in a wait for their children.
#[unsafe(no_mangle)]
pub static SIGNAL_WAITERS_OFFSET: u32 = 0;

/// From a waiter's list node (`wait_opts.child_wait.entry`) back to its
/// `wait_opts.wo_flags` (negative, as two's complement).
#[unsafe(no_mangle)]
pub static WAITER_FLAGS_FROM_NODE: u32 = 0;
