//! What is recorded, and when: `--delay`,
//! `--start-on` and `--toggle-on` pause recording for the whole profile
//! (`PAUSED`, written by user space); `--while FUNCTION` records only the
//! calls a thread makes inside FUNCTION (its entry and return probes keep
//! `ThreadState::region_depth`). A call that is not recorded takes the
//! path of a call sampling skipped: a realloc still moves its tracked
//! block, and frees still end tracked blocks.
use aya_ebpf::{
    helpers::{bpf_get_current_pid_tgid, bpf_probe_read_user},
    macros::map,
    maps::{Array, HashMap},
    programs::{ProbeContext, RetProbeContext},
};
use memprof_common::{
    settings::Gating,
    thread::{RegionFrames, ThreadState},
};

use crate::{
    accounting::{
        calls::{count_trap, counting},
        thread::thread_state,
    },
    kernel::maps::THREADS,
};

/// Non-zero while recording is paused.
#[map]
pub static PAUSED: Array<u32> = Array::with_max_entries(1, 0);

/// `monitor`'s budget: processes whose probes user space is putting in or
/// taking out (by tgid; on the whole host, key 0 for every process). Their
/// calls are not counted, so that what is counted falls in the windows
/// user space times (see `budget::windows`).
#[map]
pub static GATED_OUT: HashMap<u32, u8> = HashMap::with_max_entries(1, 0);

/// Set by user space before load when `GATED_OUT` is used: 1 per process,
/// 2 for the whole host (`memprof_common::GATING_*`).
#[unsafe(no_mangle)]
static GATING: u8 = 0;

/// `--while`, set by user space before load: only calls inside a region
/// function are recorded.
#[unsafe(no_mangle)]
static REGION_MODE: u8 = 0;

/// Set by user space before load when some calls may go unrecorded
/// (any of --while, --delay, --start-on, --toggle-on).
#[unsafe(no_mangle)]
static RECORDING_LIMITED: u8 = 0;

/// Whether every call is recorded: a free of a block never seen
/// allocated is then worth counting (see `live::unknown_free`).
#[inline(always)]
pub fn every_call() -> bool {
    // SAFETY: a read-only global; volatile so the compiler keeps the read.
    unsafe { core::ptr::read_volatile(&RECORDING_LIMITED) == 0 }
}

#[inline(always)]
pub fn by_function() -> bool {
    // SAFETY: a read-only global; volatile so the compiler keeps the read.
    unsafe { core::ptr::read_volatile(&REGION_MODE) != 0 }
}

/// Whether recording is paused, for all or for this process (an array
/// read the verifier inlines, and a hash lookup under the budget; none at
/// all when every call is recorded, a constant the verifier knows).
#[inline(always)]
pub fn paused() -> bool {
    !every_call() && (PAUSED.get(0).is_some_and(|paused| *paused != 0) || gated_out())
}

#[inline(always)]
fn gated_out() -> bool {
    // SAFETY: a read-only global; volatile so the compiler keeps the read.
    let key = match unsafe { core::ptr::read_volatile(&GATING) } {
        g if g == Gating::Processes as u8 => (bpf_get_current_pid_tgid() >> 32) as u32,
        g if g == Gating::Host as u8 => 0,
        _ => return false,
    };
    // SAFETY: the value is only tested for presence.
    unsafe { GATED_OUT.get(key) }.is_some()
}

/// Whether a call of a thread `region_depth` calls deep in the region
/// functions is recorded.
#[inline(always)]
pub fn records(region_depth: u32) -> bool {
    records_unless(paused(), region_depth)
}

/// [`records`], with `paused()` read already.
#[inline(always)]
pub fn records_unless(paused: bool, region_depth: u32) -> bool {
    every_call() || (!paused && (!by_function() || region_depth > 0))
}

/// A region probe's trap costs as an allocator's does: counted where calls
/// are (the budget), while its process is not paused (no lookup else).
#[inline(always)]
fn count_region_trap(tgid: u32) {
    if counting() && !paused() {
        count_trap(tgid);
    }
}

/// Entry of a `--while` function: the thread is inside; where its return
/// address lies, and what it is, before the return probe replaces it
/// (the innermost calls are kept, see `RegionFrames`).
#[inline(always)]
pub fn entered(ctx: ProbeContext) -> u32 {
    let Some(thread) = thread_state() else {
        return 0;
    };
    count_region_trap(thread.tgid);
    let depth = thread.region_depth;
    let regions = &mut thread.regions;
    if depth > 0 && regions.trampoline == 0 {
        // The enclosing call's slot holds the trampoline by now.
        let outer = regions.slots[RegionFrames::index(depth - 1)];
        if outer != 0 {
            // SAFETY: a checked read of user memory.
            regions.trampoline = unsafe { bpf_probe_read_user(outer as *const u64) }.unwrap_or(0);
        }
    }
    // SAFETY: a read of the probe's registers.
    let sp = unsafe { (*ctx.regs).rsp };
    // SAFETY: a checked read of user memory.
    let ret = unsafe { bpf_probe_read_user(sp as *const u64) }.unwrap_or(0);
    let index = RegionFrames::index(depth);
    regions.slots[index] = sp;
    regions.returns[index] = ret;
    thread.region_depth = depth.saturating_add(1);
    0
}

/// The thread's region calls, for a stack walk (`--while` only).
#[inline(always)]
pub fn frames(thread: &ThreadState) -> Option<&RegionFrames> {
    by_function().then_some(&thread.regions)
}

/// Return of a `--while` function.
#[inline(always)]
pub fn returned(_ctx: RetProbeContext) -> u32 {
    if let Some(thread) = THREADS.current(false) {
        // SAFETY: the running thread's own storage.
        let thread = unsafe { &mut *thread };
        count_region_trap(thread.tgid);
        if thread.region_depth > 0 {
            thread.region_depth -= 1;
            // Its slot may be reused by another frame from now on.
            thread.regions.slots[RegionFrames::index(thread.region_depth)] = 0;
        }
    }
    0
}
