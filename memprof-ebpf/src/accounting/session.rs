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
    helpers::bpf_get_current_pid_tgid,
    macros::map,
    maps::{HashMap, LruHashMap},
};
use memprof_common::{dispatch::SITE_GROUPS, thread::ThreadState};

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
