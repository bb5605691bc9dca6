//! `monitor`'s budget: every call each process makes while it is counted,
//! counted exactly, sampled or not. What its traps cost in a window is
//! that count times the cost per call; estimated from the samples (a
//! 16-byte call sampled at 512 KiB stands for 32,768) the count was off
//! by ±50% a window, and the budget's estimates with it.
use aya_ebpf::{bindings::BPF_F_NO_PREALLOC, macros::map, maps::PerCpuHashMap};

use crate::maps::BPF_NOEXIST;

/// Calls per process (tgid), per CPU; sized by user space when counted
/// (`--max-processes`), taken as processes trap.
#[map]
pub static CALLS: PerCpuHashMap<u32, u64> = PerCpuHashMap::with_max_entries(1, BPF_F_NO_PREALLOC);

/// Set by user space before load under the budget.
#[unsafe(no_mangle)]
static COUNT_CALLS: u8 = 0;

/// One call of process `tgid`, where calls are counted (a full map drops
/// it: user space then estimates the process's calls from its samples).
#[inline(always)]
pub fn count(tgid: u32) {
    // SAFETY: a read-only global; volatile so the loader's value is used.
    if unsafe { core::ptr::read_volatile(&COUNT_CALLS) } == 0 {
        return;
    }
    match CALLS.get_ptr_mut(tgid) {
        // SAFETY: this CPU's value of a successful lookup.
        Some(count) => unsafe { *count += 1 },
        None => {
            let _ = CALLS.insert(tgid, 1, BPF_NOEXIST);
        }
    }
}
