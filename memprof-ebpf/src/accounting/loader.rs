//! The loader's list of objects, walked at `_dl_debug_state`: each
//! object's base and path go to user space as `Library` notices.
use aya_ebpf::{
    bindings::BPF_RB_FORCE_WAKEUP,
    helpers::{bpf_get_current_pid_tgid, bpf_probe_read_user, bpf_probe_read_user_str_bytes},
    macros::map,
    maps::PerCpuArray,
    programs::ProbeContext,
};
use memprof_common::{
    dispatch::entry,
    lost::LostCause,
    notices::{LibraryNotice, NoticeKind},
};

use crate::{
    accounting::{
        images::generation_of,
        notices::notify,
        parent_watch::parent_may_see_stop,
        process::{hold_for_tables, SIGCONT, SIGSTOP},
        site_table::ENTRY_PROGRAMS,
    },
    kernel::maps::{count_lost, EXEC_PATHS, NOTICES},
};

/// glibc's `struct r_debug`: r_map at 8, r_state at 24.
const R_MAP: u64 = 8;

const R_STATE: u64 = 24;

const RT_CONSISTENT: i32 = 0;

/// `struct link_map`: l_addr at 0, l_name at 8, l_next at 24.
const L_NAME: u64 = 8;

const L_NEXT: u64 = 24;

const MAX_OBJECTS: u32 = 128;

/// How far `on_libraries` has walked the loader's list, on this CPU: it
/// announces `LOADER_CHUNK` objects per run and tail-calls itself for the
/// next ones. One run over all `MAX_OBJECTS` took the verifier 82 ms at
/// every start, 4 per run 22 ms; the kernel allows 33 tail calls in a
/// row, room for 4 × 32. A chain of tail calls runs to its end on one CPU.
#[repr(C)]
pub struct LoaderWalk {
    object: u64,
    tgid: u32,
    generation: u32,
    index: u32,
    hold: u32,
    /// Non-zero while a walk is under way (its next run continues it).
    active: u32,
}

#[map]
static LOADER_WALK: PerCpuArray<LoaderWalk> = PerCpuArray::with_max_entries(1, 0);

const LOADER_CHUNK: u32 = 4;

/// The dynamic loader's `_dl_debug_state`, called after each change to its
/// list of loaded objects: send each object's base and path to user space.
/// The site's cookie is the distance from this function to `_r_debug`.
#[inline(always)]
pub fn walk(ctx: ProbeContext) -> u32 {
    let Some(walk) = LOADER_WALK.get_ptr_mut(0) else {
        return 0;
    };
    // SAFETY: this CPU's entry; BPF programs do not nest on a CPU here.
    let walk = unsafe { &mut *walk };
    if walk.active == 0 && !start_walk(&ctx, walk) {
        return 0;
    }
    for _ in 0..LOADER_CHUNK {
        if walk.object == 0 || walk.index >= MAX_OBJECTS {
            end_walk(walk);
            return 0;
        }
        if !announce(walk) {
            return 0;
        }
    }
    // SAFETY: on success the call does not return; the program at
    // `LOADER` is this one, with the same context.
    unsafe { ENTRY_PROGRAMS.tail_call(&ctx, entry::LOADER - 1) };
    // Too many tail calls in a row: the rest go unannounced.
    end_walk(walk);
    0
}

/// Begins a walk of the list, if the loader's list is consistent; stops
/// the process in `trace` (see below).
fn start_walk(ctx: &ProbeContext, walk: &mut LoaderWalk) -> bool {
    let tgid = (bpf_get_current_pid_tgid() >> 32) as u32;
    let delta = crate::accounting::site_table::site_cookie(ctx) as i64;
    // At a uprobe, rip is the probed instruction: `_dl_debug_state` itself.
    // SAFETY: a read of the probe's registers.
    let r_debug = unsafe { (*ctx.regs).rip }.wrapping_add(delta as u64);
    // SAFETY: checked reads of user memory.
    let object = unsafe {
        if bpf_probe_read_user((r_debug + R_STATE) as *const i32) != Ok(RT_CONSISTENT) {
            return false;
        }
        let Ok(object) = bpf_probe_read_user((r_debug + R_MAP) as *const u64) else {
            return false;
        };
        object
    };
    // `trace`: the command memprof started waits, stopped, until user
    // space has loaded the new libraries' unwind tables and probed their
    // allocators (it sends SIGCONT once it has read the `Held` notice that
    // ends the walk), or its first calls could not be walked, or seen. An
    // attached process is never stopped, nor one whose parent would see
    // the stop: its walks in that window are cut and counted, as are the
    // files probed late. A SIGCONT sent before the stop takes effect
    // cancels it.
    let hold = hold_for_tables() && !parent_may_see_stop();
    if hold {
        // SAFETY: signals the current task.
        unsafe { aya_ebpf::helpers::generated::bpf_send_signal(SIGSTOP) };
    }
    *walk = LoaderWalk {
        object,
        tgid,
        generation: generation_of(tgid),
        index: 0,
        hold: hold.into(),
        active: 1,
    };
    true
}

/// Sends the notice of the walk's next object and steps to the one after;
/// false (the walk ended) if the ring buffer is full.
pub fn announce(walk: &mut LoaderWalk) -> bool {
    let object = walk.object;
    let Some(mut entry) = NOTICES.reserve::<LibraryNotice>(0) else {
        count_lost(LostCause::NoticeDropped);
        walk.active = 0;
        if walk.hold != 0 {
            // No notice may come: never leave it stopped.
            // SAFETY: signals the current task.
            unsafe { aya_ebpf::helpers::generated::bpf_send_signal(SIGCONT) };
        }
        return false;
    };
    // SAFETY: a reserved record of the right size; checked reads of user
    // memory.
    unsafe {
        let notice = &mut *entry.as_mut_ptr();
        notice.kind = NoticeKind::Library as u32;
        notice.tgid = walk.tgid;
        notice.generation = walk.generation;
        notice.index = walk.index;
        notice.held = walk.hold;
        notice._reserved = 0;
        notice.base = bpf_probe_read_user(object as *const u64).unwrap_or(0);
        notice.path[0] = 0;
        if walk.index == 0 {
            // The program itself: the loader lists it with an empty name.
            if let Some(path) = EXEC_PATHS.get(walk.tgid) {
                notice.path = *path;
            }
        } else if let Ok(name) = bpf_probe_read_user((object + L_NAME) as *const u64) {
            let _ = bpf_probe_read_user_str_bytes(name as *const u8, &mut notice.path);
        }
        entry.submit(BPF_RB_FORCE_WAKEUP as u64);
        walk.object = bpf_probe_read_user((object + L_NEXT) as *const u64).unwrap_or(0);
    }
    walk.index += 1;
    true
}

/// The walk is over. The last notice says the process waits: user space
/// may have read the first ones before the rest were sent, and a SIGCONT
/// after those would cancel the stop while libraries are still unprobed.
fn end_walk(walk: &mut LoaderWalk) {
    walk.active = 0;
    if walk.hold != 0 && !notify(NoticeKind::Held, walk.tgid, walk.generation, 0) {
        // No notice says it waits: never leave it stopped.
        // SAFETY: signals the current task.
        unsafe { aya_ebpf::helpers::generated::bpf_send_signal(SIGCONT) };
    }
}
