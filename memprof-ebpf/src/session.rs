//! Session uprobes (`--live` with sampling, kernel 6.13 and later): one
//! program runs at both ends of the malloc-like functions, and its entry
//! decides whether the return runs. An unsampled call then pays one trap,
//! not a trap and a return trampoline.
//!
//! The kernel runs a session link's program only in the process it was
//! made for (pid 0: in every process). User space makes one per profiled
//! process and file (`LINKED`); in those processes the shared events'
//! program leaves the malloc-like sites to this one. Their children
//! inherit the shared entry events only: user space gives each child
//! return events after its `Forked` notice (`RETURNING`), and until then
//! its sampled blocks are counted but untracked (`NoReturnProbe`).
use aya_ebpf::{
    helpers::{bpf_get_current_pid_tgid, generated::bpf_get_func_ip},
    macros::map,
    maps::{HashMap, LruHashMap, ProgramArray},
    programs::{ProbeContext, RetProbeContext},
    EbpfContext,
};
use core::ffi::c_void;

use memprof_common::{dispatch::SITE_GROUPS, LostCause, ProbeCookie, ThreadState};

use crate::{
    dispatch::{ignored, running_site},
    maps::{count_lost, THREADS},
    probes::{alloc_returned, args_of, enter},
    regions, sampler,
};

/// Processes with session links, by tgid: a bit per site group the links
/// cover (user space writes them as it links).
#[map]
pub static LINKED: HashMap<u32, u64> = HashMap::with_max_entries(1, 0);

/// Processes whose malloc-like sites have return probes from the shared
/// events (children of linked processes, once user space scoped them,
/// and the processes they fork from then on).
#[map]
pub static RETURNING: LruHashMap<u32, u8> = LruHashMap::with_max_entries(1, 0);

/// `trace`: processes a linked process forked, each stopped before its
/// first instruction by the fork-holding program (user space assembles
/// and loads it: it calls a kfunc) until user space has linked it too:
/// child tgid → its parent's `LINKED` bits. User space empties it. Key 0
/// is there while the program is attached.
#[map]
pub static HELD_FORKS: HashMap<u32, u64> = HashMap::with_max_entries(4097, 0);

/// Whether the fork-holding program runs (it clears a new process's
/// `LINKED` entry itself: see `process::on_fork`).
#[inline(always)]
pub fn forks_held() -> bool {
    HELD_FORKS.get_ptr(0).is_some()
}

/// Whether the session program's return half runs: the kernel reads the
/// entry's result (0: it runs; 1: it does not).
const RUN_RETURN: u32 = 0;
const SKIP_RETURN: u32 = 1;

/// Both ends of a malloc-like function in a linked process. At a return
/// the kernel has set the instruction pointer to the return address; at
/// an entry it is the probed address, which `bpf_get_func_ip` gives at
/// both. The entry half is a program of its own (`alloc_chosen`, tail
/// called): inline, its frame exceeds the BPF stack.
///
/// Written out, not with `#[uprobe]`: that macro's wrapper returns 0
/// whatever the function returns, and 0 asks for the return. In a
/// `uprobe` section, so that aya's parser takes the object (user space
/// loads these programs itself, with the session attach type).
#[unsafe(no_mangle)]
#[unsafe(link_section = "uprobe")]
pub fn alloc_session(ctx: *mut c_void) -> u32 {
    let probe = ProbeContext::new(ctx);
    // SAFETY: the helper reads the running probe's address.
    let function = unsafe { bpf_get_func_ip(probe.as_ptr()) };
    // SAFETY: a read of the probe's registers.
    let rip = unsafe { (*probe.regs).rip };
    if rip != function {
        alloc_returned(&RetProbeContext::new(ctx));
        return RUN_RETURN;
    }
    // Most calls end here: not sampled, no return.
    if !regions::by_function() {
        let Some(site) = running_site(&probe) else {
            count_lost(LostCause::ProbeDispatch);
            return SKIP_RETURN;
        };
        let cookie = ProbeCookie::decode(site.cookie);
        if regions::paused() || sampler::skips(cookie.requested_bytes(args_of(&probe))) {
            return SKIP_RETURN;
        }
        // Checked only here, off the path of the unsampled calls.
        if ignored() {
            sampler::forgo();
            return SKIP_RETURN;
        }
    }
    // SAFETY: on success the call does not return; `alloc_chosen` takes
    // the same context, and its result is this program's.
    unsafe { SESSION_PROGRAMS.tail_call(&probe, 0) };
    count_lost(LostCause::ProbeDispatch);
    SKIP_RETURN
}

/// The entry half of `alloc_session` (its sampled calls, and every call
/// with `--while`): records the call, and asks for its return if it was
/// sampled.
#[unsafe(no_mangle)]
#[unsafe(link_section = "uprobe")]
pub fn alloc_chosen(ctx: *mut c_void) -> u32 {
    entered(ctx);
    // In the thread's state, not a per-CPU slot: the program may be
    // preempted, and another thread's call run meanwhile on this CPU.
    let Some(thread) = THREADS.current(false) else {
        return SKIP_RETURN;
    };
    // SAFETY: the running thread's own storage.
    let thread = unsafe { &mut *thread };
    match core::mem::take(&mut thread.session_return) {
        0 => SKIP_RETURN,
        _ => RUN_RETURN,
    }
}

/// `alloc_chosen`, for `alloc_session` to tail-call (a program array of
/// session programs: the kernel lets a program tail-call only programs
/// of its own attach type).
#[map]
pub static SESSION_PROGRAMS: ProgramArray = ProgramArray::with_max_entries(1, 0);

#[inline(always)]
fn entered(ctx: *mut c_void) {
    let ctx = ProbeContext::new(ctx);
    if ignored() {
        return;
    }
    let Some(site) = running_site(&ctx) else {
        count_lost(LostCause::ProbeDispatch);
        return;
    };
    enter(ctx, ProbeCookie::decode(site.cookie), Returns::Chosen);
}

/// The running call was sampled: its return is to pair it with its block.
#[inline(always)]
pub fn arm_return(thread: &mut ThreadState) {
    thread.session_return = 1;
}

/// Whether the running process has a session link on site `group`.
#[inline(always)]
pub fn linked(group: u64) -> bool {
    let tgid = (bpf_get_current_pid_tgid() >> 32) as u32;
    // SAFETY: read once.
    unsafe { LINKED.get(tgid) }
        .is_some_and(|groups| groups & (1 << (group % SITE_GROUPS as u64)) != 0)
}

/// Whether an allocator call's return probe runs.
#[derive(Clone, Copy, PartialEq, Eq)]
pub enum Returns {
    /// As the site's probes say: on functions that may nest, and on all
    /// in live mode.
    AsProbed,
    /// Session probes: if the entry says so (`arm_return`).
    Chosen,
    /// Never: a child of a session-linked process that has no return
    /// probes yet.
    Never,
}

/// How the shared events' program handles a malloc-like site of a session
/// group in a process without a session link (a child of a linked one):
/// with the return probes user space gave it, or without any yet.
#[inline(always)]
pub fn shared_returns() -> Returns {
    let tgid = (bpf_get_current_pid_tgid() >> 32) as u32;
    // SAFETY: read once.
    match unsafe { RETURNING.get(tgid) } {
        Some(_) => Returns::AsProbed,
        None => Returns::Never,
    }
}

/// A new process `child`: it never inherits what a dead one with its id
/// had.
#[inline(always)]
pub fn forget(child: u32) {
    let _ = LINKED.remove(child);
    let _ = RETURNING.remove(child);
}

/// Process `parent`, profiled, forked process `child`. The child
/// inherited its parent's return events if the parent had any; a child of
/// a linked process has none yet. Whether user space must give it some.
#[inline(always)]
pub fn inherit(parent: u32, child: u32) -> bool {
    // SAFETY: read once.
    if unsafe { RETURNING.get(parent) }.is_some() {
        let _ = RETURNING.insert(child, 1, 0);
        return false;
    }
    true
}
