//! `monitor`'s budget: every call each process makes while it is counted,
//! and the bytes asked for, counted exactly, sampled or not. What its
//! traps cost in a window is that count times the cost per call; and its
//! totals are those counts, not its sampled sites' sums. Estimated from
//! the samples (a 16-byte call sampled at 512 KiB stands for 32,768) a
//! window's count was off by ±50%, and the budget's estimates with it.
//!
//! Each trap also spends the process's allowance (`ALLOWANCES`): the one
//! that spends its last asks user space, at once, to take its probes out,
//! so that no process pays past its budget until the next period's read.
use core::ffi::c_void;

use aya_ebpf::{
    bindings::{BPF_F_NO_PREALLOC, BPF_RB_FORCE_WAKEUP},
    helpers::{bpf_probe_read_kernel, generated::bpf_map_lookup_percpu_elem},
    macros::map,
    maps::{Array, HashMap, LruHashMap, PerCpuHashMap, RingBuf},
};
use memprof_common::{
    images::{ProcessCalls, ProcessImage},
    lost::LostCause,
    notices::OverBudgetNotice,
};

use crate::kernel::{
    atomics::fetch_add,
    maps::{count_lost, BPF_NOEXIST, THREADS},
    offsets::{offset_of, SIGNAL_RUNTIME_OFFSET, TASK_RUNTIME_OFFSET, TASK_SIGNAL_OFFSET},
};

/// The traps each process (tgid) may still take before its probes must go
/// out: set by user space as its window opens (and each period while its
/// probes are in all along); a process without an entry starts with
/// `FIRST_ALLOWANCE`. Spent atomically (one value for all CPUs: a
/// process's threads on many CPUs share one allowance). LRU: one pushed
/// out starts afresh, with the first allowance.
#[map]
pub static ALLOWANCES: LruHashMap<u32, u64> = LruHashMap::with_max_entries(1, 0);

/// `[0]`: the traps a process first seen may take (its budget for one
/// period, at the calibrated cost); 0 until the calibration is done, and
/// without a budget: no allowance is kept.
#[map]
pub static FIRST_ALLOWANCE: Array<u64> = Array::with_max_entries(1, 0);

/// The processes that spent their allowance (`OverBudgetNotice`).
#[map]
pub static OVER_BUDGET: RingBuf = RingBuf::with_byte_size(4096, 0);

/// Calls per process (tgid), per CPU; sized by user space when counted
/// (`--max-processes`), taken as processes trap.
#[map]
pub static CALLS: PerCpuHashMap<u32, ProcessCalls> =
    PerCpuHashMap::with_max_entries(1, BPF_F_NO_PREALLOC);

/// The last count of each image exec'd over (tgid, generation), summed
/// over the CPUs at its exec: the exec clears its `CALLS` entry (the new
/// image counts from zero), which user space last read up to a period
/// before. User space takes each out as it reads it.
#[map]
pub static EXEC_CALLS: HashMap<ProcessImage, ProcessCalls> =
    HashMap::with_max_entries(1, BPF_F_NO_PREALLOC);

/// Set by user space before load under the budget.
#[unsafe(no_mangle)]
static COUNT_CALLS: u8 = 0;

/// The CPUs a per-CPU value has (the possible ones), set by user space.
#[unsafe(no_mangle)]
static POSSIBLE_CPUS: u32 = 0;

/// Bounds the verifier's view of the sum's loop.
const MAX_CPUS: u32 = 4096;

/// Whether calls are counted (under the budget).
#[inline(always)]
pub fn counting() -> bool {
    // SAFETY: a read-only global; volatile so the loader's value is used.
    unsafe { core::ptr::read_volatile(&COUNT_CALLS) != 0 }
}

/// A call on the probes' fast path, before any per-thread lookup: counted
/// unless it is inside another hooked call, as a call site counts it
/// (glibc's realloc(NULL, n) calls malloc: one call, the realloc).
#[inline(always)]
pub fn count_unless_nested(tgid: u32, bytes: u64) {
    if !counting() {
        return;
    }
    // SAFETY: the running thread's own storage; its programs do not nest.
    let nested = THREADS.current(false).is_some_and(|thread| {
        let thread = unsafe { &mut *thread };
        crate::accounting::thread::forget_stale_depth(thread);
        thread.depth > 0
    });
    add(tgid, u64::from(!nested), bytes * u64::from(!nested));
}

/// One outermost call of process `tgid` asking for `bytes`, where calls
/// are counted.
#[inline(always)]
pub fn count(tgid: u32, bytes: u64) {
    if counting() {
        add(tgid, 1, bytes);
    }
}

/// The trap of a call nested in another hooked one, off the fast path:
/// not a call of its own, but it costs.
#[inline(always)]
pub fn count_trap(tgid: u32) {
    if counting() {
        add(tgid, 0, 0);
    }
}

/// One trap; `calls` (0 or 1) call asking for `bytes`. A full map drops
/// it: user space then estimates the process's calls from its samples.
#[inline(always)]
fn add(tgid: u32, calls: u64, bytes: u64) {
    match CALLS.get_ptr_mut(tgid) {
        // SAFETY: this CPU's value of a successful lookup.
        Some(counted) => unsafe {
            (*counted).calls += calls;
            (*counted).bytes = (*counted).bytes.wrapping_add(bytes);
            (*counted).traps += 1;
        },
        None => {
            let first = ProcessCalls {
                calls,
                bytes,
                traps: 1,
                end_cpu_ns: 0,
            };
            let _ = CALLS.insert(tgid, first, BPF_NOEXIST);
        }
    }
    spend_allowance(tgid);
}

/// One trap off `tgid`'s allowance; the one that spends its last sends
/// an `OverBudgetNotice` (once: the count goes on below zero, as a u64
/// that wrapped, until user space sets a new allowance).
#[inline(always)]
fn spend_allowance(tgid: u32) {
    let Some(&first) = FIRST_ALLOWANCE.get(0) else {
        return;
    };
    if first == 0 {
        return;
    }
    let left = match ALLOWANCES.get_ptr_mut(tgid) {
        // SAFETY: a value of the map, aligned; other CPUs add atomically.
        Some(left) => unsafe { fetch_add(left, u64::MAX) },
        None => {
            let _ = ALLOWANCES.insert(tgid, first - 1, BPF_NOEXIST);
            first
        }
    };
    if left == 1 {
        let notice = OverBudgetNotice { tgid, _reserved: 0 };
        if OVER_BUDGET
            .output::<OverBudgetNotice>(&notice, BPF_RB_FORCE_WAKEUP as u64)
            .is_err()
        {
            count_lost(LostCause::NoticeDropped);
        }
    }
}

/// The current process's CPU time so far, in ns: its running thread's
/// and those of its threads already reaped (`signal_struct`); 0 if
/// unreadable. At the last thread's exit or at an exec (the other threads
/// gone), that is all of it, up to the last scheduler tick.
#[inline(always)]
fn process_cpu_ns() -> u64 {
    // SAFETY: reads the current task's pointer.
    let task = unsafe { aya_ebpf::helpers::generated::bpf_get_current_task() };
    // SAFETY: checked reads of kernel memory.
    unsafe {
        let own = bpf_probe_read_kernel((task + offset_of(&TASK_RUNTIME_OFFSET)) as *const u64)
            .unwrap_or(0);
        let reaped = bpf_probe_read_kernel((task + offset_of(&TASK_SIGNAL_OFFSET)) as *const u64)
            .and_then(|signal| {
                bpf_probe_read_kernel((signal + offset_of(&SIGNAL_RUNTIME_OFFSET)) as *const u64)
            })
            .unwrap_or(0);
        own.wrapping_add(reaped)
    }
}

/// The last thread of process `tgid` exits: its CPU time goes with its
/// count, for user space to scale its figures to its end; its allowance
/// goes. Only a process that trapped since counting began has either.
#[inline(always)]
pub fn ended(tgid: u32) {
    if !counting() || ALLOWANCES.remove(tgid).is_err() {
        return;
    }
    let cpu = process_cpu_ns();
    match CALLS.get_ptr_mut(tgid) {
        // SAFETY: this CPU's value of a successful lookup.
        Some(counted) => unsafe { (*counted).end_cpu_ns = cpu },
        None => {
            let end = ProcessCalls {
                end_cpu_ns: cpu,
                ..ProcessCalls::default()
            };
            let _ = CALLS.insert(tgid, end, BPF_NOEXIST);
        }
    }
}

/// At an exec of process `tgid` at image `generation`, before its
/// `CALLS` entry goes: keeps the old image's count whole in `EXEC_CALLS`.
/// Every other thread of the process has ended by now (the kernel's
/// de_thread), so no CPU's value is changing.
#[inline(always)]
pub fn keep_before_exec(tgid: u32, generation: u32) {
    if !counting() {
        return;
    }
    // SAFETY: a read-only global; volatile so the loader's value is used.
    let cpus = unsafe { core::ptr::read_volatile(&POSSIBLE_CPUS) }.min(MAX_CPUS);
    let map = core::ptr::addr_of!(CALLS) as *mut c_void;
    let key = core::ptr::addr_of!(tgid) as *const c_void;
    let mut sum = ProcessCalls::default();
    for cpu in 0..cpus {
        // SAFETY: `CALLS` is a per-CPU hash (its definition is the map,
        // `repr(transparent)`), keyed by u32; a miss is null.
        let value = unsafe { bpf_map_lookup_percpu_elem(map, key, cpu) } as *const ProcessCalls;
        if value.is_null() {
            // No entry (on any CPU): nothing counted.
            return;
        }
        // SAFETY: non-null, from the lookup.
        sum = sum.plus(unsafe { *value });
    }
    sum.end_cpu_ns = process_cpu_ns();
    let image = ProcessImage { tgid, generation };
    if EXEC_CALLS.insert(image, sum, 0).is_err() {
        count_lost(LostCause::ExecCountDropped);
    }
}
