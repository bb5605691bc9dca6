//! `monitor`'s budget: every call each process makes while it is counted,
//! and the bytes asked for, counted exactly, sampled or not. What its
//! traps cost in a window is that count times the cost per call; and its
//! totals are those counts, not its sampled sites' sums. Estimated from
//! the samples (a 16-byte call sampled at 512 KiB stands for 32,768) a
//! window's count was off by ±50%, and the budget's estimates with it.
use aya_ebpf::{bindings::BPF_F_NO_PREALLOC, macros::map, maps::PerCpuHashMap};
use memprof_common::ProcessCalls;

use crate::maps::{BPF_NOEXIST, THREADS};

/// Calls per process (tgid), per CPU; sized by user space when counted
/// (`--max-processes`), taken as processes trap.
#[map]
pub static CALLS: PerCpuHashMap<u32, ProcessCalls> =
    PerCpuHashMap::with_max_entries(1, BPF_F_NO_PREALLOC);

/// Set by user space before load under the budget.
#[unsafe(no_mangle)]
static COUNT_CALLS: u8 = 0;

#[inline(always)]
fn counting() -> bool {
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
    // SAFETY: the running thread's own storage.
    let nested = THREADS
        .current(false)
        .is_some_and(|thread| unsafe { (*thread).depth } > 0);
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
            };
            let _ = CALLS.insert(tgid, first, BPF_NOEXIST);
        }
    }
}
