//! Which processes user space must look at: announce each process image
//! on its first allocation, bump the generation at exec, report exits.
use aya_ebpf::{
    helpers::bpf_get_current_pid_tgid, macros::tracepoint, programs::TracePointContext,
};
use memprof_common::{LostCause, NoticeKind, ProcState, ProcessNotice};

use crate::maps::{count_lost, NOTICES, PROCS};

/// The image generation of `tgid`, announcing the process to user space
/// the first time it allocates.
#[inline(always)]
pub fn generation_of(tgid: u32) -> u32 {
    match PROCS.get_ptr_mut(tgid) {
        Some(state) => {
            // SAFETY: the pointer comes from a successful lookup.
            let state = unsafe { &mut *state };
            if state.announced == 0 {
                state.announced = 1;
                notify(NoticeKind::FirstSeen, tgid, state.generation);
            }
            state.generation
        }
        None => {
            let state = ProcState {
                generation: 0,
                announced: 1,
            };
            if PROCS.insert(tgid, state, 0).is_err() {
                count_lost(LostCause::NoticeDropped);
                return 0;
            }
            notify(NoticeKind::FirstSeen, tgid, 0);
            0
        }
    }
}

#[inline(always)]
fn notify(kind: NoticeKind, tgid: u32, generation: u32) {
    let notice = ProcessNotice {
        kind: kind as u32,
        tgid,
        generation,
        _pad: 0,
    };
    if NOTICES.output::<ProcessNotice>(&notice, 0).is_err() {
        count_lost(LostCause::NoticeDropped);
    }
}

/// A traced process replaced its image: what it allocates from now on
/// belongs to a new address space, so it gets a new generation.
#[tracepoint]
pub fn on_exec(_ctx: TracePointContext) -> u32 {
    let tgid = (bpf_get_current_pid_tgid() >> 32) as u32;
    if let Some(state) = PROCS.get_ptr_mut(tgid) {
        // SAFETY: the pointer comes from a successful lookup.
        let state = unsafe { &mut *state };
        state.generation += 1;
        state.announced = 0;
    }
    0
}

/// A traced process exited (its main thread did).
#[tracepoint]
pub fn on_exit(_ctx: TracePointContext) -> u32 {
    let pid_tgid = bpf_get_current_pid_tgid();
    let tgid = (pid_tgid >> 32) as u32;
    if pid_tgid as u32 != tgid {
        return 0;
    }
    // SAFETY: read once, the entry is removed right after.
    if let Some(state) = unsafe { PROCS.get(tgid) } {
        let generation = state.generation;
        let _ = PROCS.remove(tgid);
        notify(NoticeKind::Exited, tgid, generation);
    }
    0
}
