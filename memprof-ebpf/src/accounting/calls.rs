//! `monitor`'s budget: every call each process makes while it is counted,
//! and the bytes asked for, counted exactly, sampled or not. What its
//! traps cost in a window is that count times the cost per call; and its
//! totals are those counts, not its sampled sites' sums. Estimated from
//! the samples (a 16-byte call sampled at 512 KiB stands for 32,768) a
//! window's count was off by ±50%, and the budget's estimates with it.
use core::ffi::c_void;

use aya_ebpf::{
    bindings::BPF_F_NO_PREALLOC,
    helpers::generated::bpf_map_lookup_percpu_elem,
    macros::map,
    maps::{HashMap, PerCpuHashMap},
};
use memprof_common::{
    images::{ProcessCalls, ProcessImage},
    lost::LostCause,
};

use crate::kernel::maps::{count_lost, BPF_NOEXIST, THREADS};

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
            };
            let _ = CALLS.insert(tgid, first, BPF_NOEXIST);
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
    let image = ProcessImage { tgid, generation };
    if EXEC_CALLS.insert(image, sum, 0).is_err() {
        count_lost(LostCause::ExecCountDropped);
    }
}
