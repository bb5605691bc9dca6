//! Each thread's state (`THREADS`, task storage): created on its first
//! allocator call, with its nesting depth.
use aya_ebpf::helpers::bpf_get_current_pid_tgid;
use memprof_common::{images::REFUSED_GENERATION, live::NO_HEAP_SLOT, thread::ThreadState};

use crate::{
    accounting::{images::image_of, mode::live_mode},
    kernel::maps::{PROBE_EPOCH, THREADS},
};

/// This thread's state, created on its first allocator call.
#[inline(always)]
pub fn thread_state() -> Option<&'static mut ThreadState> {
    // SAFETY: the running thread's own storage; its programs do not nest.
    let thread = unsafe { &mut *THREADS.current(true)? };
    if thread.ready == 0 {
        thread.tgid = (bpf_get_current_pid_tgid() >> 32) as u32;
        (thread.generation, thread.heap_slot) = image_of(thread.tgid);
        // A refused process (table full) asks again at its next call; so
        // does a thread that found its process's entry before the thread
        // creating it had given it its heap slot (live mode).
        let slotless = live_mode() && thread.heap_slot == NO_HEAP_SLOT;
        thread.ready = u32::from(thread.generation != REFUSED_GENERATION && !slotless);
    }
    forget_stale_depth(thread);
    Some(thread)
}

/// One more hooked call under way on the thread, which its return ends.
#[inline(always)]
pub fn deepen(thread: &mut ThreadState) {
    if thread.depth == 0 {
        thread.depth_epoch = probe_epoch();
    }
    thread.depth += 1;
}

/// A nesting depth from before `monitor`'s budget last took probes out is
/// dropped: the returns that would have ended it went with them (before,
/// a thread inside a realloc at a window's end saw every later call as
/// nested: not counted, never sampled). Looked up only while nested.
#[inline(always)]
pub fn forget_stale_depth(thread: &mut ThreadState) {
    if thread.depth > 0 && thread.depth_epoch != probe_epoch() {
        thread.depth = 0;
    }
}

#[inline(always)]
fn probe_epoch() -> u32 {
    PROBE_EPOCH.get(0).copied().unwrap_or(0)
}
