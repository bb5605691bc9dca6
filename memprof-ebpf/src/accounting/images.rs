//! Process images, (tgid, generation): each process's entry in `PROCS`,
//! made and announced at the first call memprof sees.
use memprof_common::{
    images::{first_generation, ProcState, REFUSED_GENERATION},
    live::NO_HEAP_SLOT,
    notices::NoticeKind,
};

use crate::{
    accounting::{heap, notices::notify},
    kernel::maps::{BPF_NOEXIST, FORKS, PROCS},
};

/// The image generation of `tgid`, announcing the process to user space
/// the first time memprof sees it.
#[inline(always)]
pub fn generation_of(tgid: u32) -> u32 {
    image_of(tgid).0
}

/// The image generation of `tgid` and its slot in `HEAPS`, announcing the
/// process to user space the first time memprof sees it.
#[inline(always)]
pub fn image_of(tgid: u32) -> (u32, u32) {
    match PROCS.get_ptr_mut(tgid) {
        Some(state) => {
            // SAFETY: the pointer comes from a successful lookup.
            let state = unsafe { &mut *state };
            if state.announced == 0 {
                state.announced = 1;
                notify(NoticeKind::FirstSeen, tgid, state.generation, 0);
            }
            (state.generation, state.heap_slot)
        }
        None => {
            // First sight: the generation starts at the time in ms, so a
            // later process that reuses the pid (pids wrap at 32,768 on
            // many hosts) never shares keys with this one. Each exec adds 1.
            // SAFETY: reads the clock.
            let first =
                first_generation(unsafe { aya_ebpf::helpers::generated::bpf_ktime_get_ns() });
            let mut state = ProcState {
                generation: first,
                announced: 1,
                heap_slot: NO_HEAP_SLOT,
                ..ProcState::default()
            };
            if PROCS.insert(tgid, state, BPF_NOEXIST).is_err() {
                // Another thread of it inserted it first: that entry holds.
                if let Some(state) = PROCS.get_ptr(tgid) {
                    // SAFETY: the pointer comes from a successful lookup.
                    return unsafe { ((*state).generation, (*state).heap_slot) };
                }
                // No room (`--max-processes`): its calls are counted apart,
                // and user space counts them as lost. No heap slot taken.
                return (REFUSED_GENERATION, NO_HEAP_SLOT);
            }
            // The slot once the entry is in: a refused process takes none.
            state.heap_slot = heap::new_slot(tgid, first);
            if let Some(entry) = PROCS.get_ptr_mut(tgid) {
                // SAFETY: the pointer comes from a successful lookup.
                unsafe { (*entry).heap_slot = state.heap_slot };
            }
            // SAFETY: read once.
            let parent = unsafe { FORKS.get(tgid) }.copied().unwrap_or(0);
            notify(NoticeKind::FirstSeen, tgid, first, parent);
            (first, state.heap_slot)
        }
    }
}
