//! Process events: a new generation at exec, forks followed into the
//! profile, exits reported; and when `trace` holds a process stopped.
use aya_ebpf::{
    helpers::{bpf_get_current_pid_tgid, bpf_probe_read_kernel, bpf_probe_read_kernel_str_bytes},
    programs::RawTracePointContext,
};
use memprof_common::{
    images::next_generation,
    notices::NoticeKind,
    settings::{UnwindMode, WatchExecs},
};

use crate::{
    accounting::{
        heap, mode::live_mode, notices::notify, parent_watch::parent_may_see_stop, session,
        stacks::unwind_mode,
    },
    kernel::{
        atomics::compare_and_swap,
        maps::{
            EXEC_PATHS, EXEC_PENDING, FORKS, HOLDS_OFF, PATH_SCRATCH, PROCS, THREADS, TREES,
            UNWIND_MAPS,
        },
        offsets::{
            offset_of, BPRM_FILENAME_OFFSET, SIGNAL_LIVE_OFFSET, TASK_PID_OFFSET,
            TASK_SIGNAL_OFFSET, TASK_TGID_OFFSET,
        },
    },
};

pub const SIGSTOP: u32 = 19;

pub const SIGCONT: u32 = 18;

/// Non-zero in `trace` (set by user space before load): processes wait
/// while their new libraries' unwind tables load and their allocators get
/// probes (`on_libraries`).
#[no_mangle]
static HOLD_FOR_TABLES: u8 = 0;

#[inline(always)]
pub fn hold_for_tables() -> bool {
    // SAFETY: a read-only global; volatile so the loader's value is used.
    let trace = unsafe { core::ptr::read_volatile(&HOLD_FOR_TABLES) != 0 };
    trace && notices_read()
}

/// User space still reads notices: a process stopped for one will be
/// resumed (`HOLDS_OFF`).
#[inline(always)]
fn notices_read() -> bool {
    HOLDS_OFF.get(0).is_none_or(|&off| off == 0)
}

/// Non-zero in `trace` of a static program with unwind tables: no loader
/// announces its code, so the traced process waits at its exec instead.
#[no_mangle]
static HOLD_AT_EXEC: u8 = 0;

#[inline(always)]
fn hold_at_exec() -> bool {
    // SAFETY: as `hold_for_tables`.
    let static_trace = unsafe { core::ptr::read_volatile(&HOLD_AT_EXEC) != 0 };
    static_trace && notices_read()
}

/// A process replaced its image. Remember the path it exec'd (any
/// process: it may turn out to be traced); a traced one gets a new
/// generation, as what it allocates from now on belongs to a new address
/// space.
#[inline(always)]
pub fn exec(ctx: RawTracePointContext) -> u32 {
    let tgid = (bpf_get_current_pid_tgid() >> 32) as u32;
    // TP_PROTO(struct task_struct *p, pid_t old_pid, struct linux_binprm *bprm)
    remember_exec_path(ctx.arg::<u64>(2), tgid);
    let traced = PROCS.get_ptr_mut(tgid);
    if let Some(state) = traced {
        // SAFETY: the pointer comes from a successful lookup.
        crate::accounting::calls::keep_before_exec(tgid, unsafe { (*state).generation });
    }
    // The new image counts its calls from zero: the old one's (a shell's
    // subshell before its exec, rarely sampled) are not the program's.
    let _ = crate::accounting::calls::CALLS.remove(tgid);
    // `trace` of a static program with unwind tables: it waits at its exec.
    let mut static_hold = false;
    let mut generation = 0;
    if let Some(state) = traced {
        // SAFETY: the pointer comes from a successful lookup.
        let state = unsafe { &mut *state };
        notify(NoticeKind::Replaced, tgid, state.generation, 0);
        state.generation = next_generation(state.generation);
        state.announced = 1;
        state.exit_announced = 0;
        state.heap_slot = heap::new_slot(tgid, state.generation);
        notify(NoticeKind::FirstSeen, tgid, state.generation, 0);
        generation = state.generation;
        static_hold = unwind_mode() == UnwindMode::Dwarf as u8 && hold_at_exec();
        if unwind_mode() == UnwindMode::Dwarf as u8 {
            // The old image's mappings (or its parent's) no longer hold.
            // By reference: a copy (2 KiB) would not fit the BPF stack.
            #[allow(clippy::needless_borrows_for_generic_args)]
            let _ = UNWIND_MAPS.insert(tgid, &crate::accounting::unwind::NO_MAPPINGS, 0);
        }
    } else if watch_execs() == WatchExecs::Unwatched as u8 && FORKS.get_ptr(tgid).is_none() {
        // `monitor`: user space may watch it from now on (a child of a
        // watched process, before its first allocation, is watched
        // already: it inherited its parent's probes).
        let _ = EXEC_PENDING.insert(tgid, 1, 0);
        notify(NoticeKind::Exec, tgid, 0, 0);
    }
    if watch_execs() == WatchExecs::Every as u8 {
        // `monitor` of the whole host: the new image may map files no
        // probe covers yet (a container's C library and loader).
        notify(NoticeKind::Exec, tgid, 0, 0);
    }
    // A session link names the main thread it was made for: after an exec
    // by another thread (which becomes the main thread) it puts no
    // breakpoint in the new image. User space links it again, while the
    // process waits where it can. (Linked at its fork, a process may have
    // no `PROCS` entry yet: none of its calls was sampled.)
    let old_tid = ctx.arg::<u64>(1) as u32;
    // SAFETY: read once.
    let linked = unsafe { crate::accounting::session::LINKED.get(tgid) }.is_some();
    let relink = old_tid != tgid && linked && hold_for_tables();
    let hold = (static_hold || relink) && !parent_may_see_stop();
    if relink {
        notify(NoticeKind::Relink, tgid, generation, u32::from(hold));
    }
    if hold {
        // Stops it before the new image's first instruction; with no
        // notice to say so, never (a later SIGCONT cancels the stop).
        // SAFETY: signals the current task.
        unsafe { aya_ebpf::helpers::generated::bpf_send_signal(SIGSTOP) };
        if !notify(NoticeKind::Held, tgid, generation, 0) {
            // SAFETY: as above.
            unsafe { aya_ebpf::helpers::generated::bpf_send_signal(SIGCONT) };
        }
    }
    // The new image is no copy of its parent's address space: a first
    // allocation from now on must not announce it as the parent's fork
    // (user space named it after the parent, with the parent's mappings),
    // nor unwind it with the parent's tables.
    let _ = FORKS.remove(tgid);
    // Nothing of the old image is under way any more, and the exec'ing
    // thread's next call finds its image's generation afresh (the new
    // one: the entry stays while any thread runs, also after the main
    // thread's pthread_exit).
    THREADS.remove_current();
    0
}

/// `monitor`, set by user space before load: which execs are announced
/// (`NoticeKind::Exec`): none, those of processes not watched yet
/// (--comm, --exe, --cgroup), or every one (the whole host).
#[unsafe(no_mangle)]
static WATCH_EXECS: u8 = 0;

#[inline(always)]
fn watch_execs() -> u8 {
    // SAFETY: a read-only global; volatile so the compiler keeps the read.
    unsafe { core::ptr::read_volatile(&WATCH_EXECS) }
}

/// `--live` with session probes in named processes, set by user space
/// before load: children of linked processes are announced (`Forked`).
#[unsafe(no_mangle)]
static SESSION_SCOPED: u8 = 0;

/// A process forked: if it is traced, remember the child's parent, whose
/// memory map the child starts with (it may exit before /proc is read).
#[inline(always)]
pub fn fork(ctx: RawTracePointContext) -> u32 {
    // TP_PROTO(struct task_struct *parent, struct task_struct *child)
    let child_task = ctx.arg::<u64>(1);
    // SAFETY: a checked read of kernel memory.
    let Ok(child) = (unsafe {
        bpf_probe_read_kernel((child_task + offset_of(&TASK_PID_OFFSET)) as *const u32)
    }) else {
        return 0;
    };
    // A new task never inherits the state of a dead process that had its
    // id (process entries outlive their exit until user space drops them).
    let _ = PROCS.remove(child);
    // Nor the unwind mappings of one (a dead process's entry may linger),
    // nor its count of calls.
    let _ = UNWIND_MAPS.remove(child);
    let _ = crate::accounting::calls::CALLS.remove(child);
    let parent = (bpf_get_current_pid_tgid() >> 32) as u32;
    if PROCS.get_ptr(parent).is_some() {
        let _ = FORKS.insert(child, parent, 0);
    }
    // SAFETY: a checked read of kernel memory.
    let child_tgid =
        unsafe { bpf_probe_read_kernel((child_task + offset_of(&TASK_TGID_OFFSET)) as *const u32) };
    // A new thread shares its process's tree and probes.
    if child_tgid != Ok(child) {
        return 0;
    }
    let _ = TREES.remove(child);
    // SAFETY: a read-only global; volatile so the loader's value is used.
    let sessions = unsafe { core::ptr::read_volatile(&SESSION_SCOPED) } != 0;
    // (While `trace` holds forks, the holding program did, before user
    // space could link the child.)
    if sessions && !session::forks_held() {
        session::forget(child);
    }
    if watch_execs() == WatchExecs::Unwatched as u8 && EXEC_PENDING.get_ptr(parent).is_some() {
        // Forked while user space decides on its parent, or opens its
        // scope events one by one (a daemon's start forks and exits at
        // once): it inherited none or some of them. Announced as its
        // parent was, to get them all.
        let _ = EXEC_PENDING.insert(child, 1, 0);
        notify(NoticeKind::Exec, child, 0, parent);
    }
    // Only what profiled processes fork goes on.
    // SAFETY: read once.
    let Some(&tree) = (unsafe { TREES.get(parent) }) else {
        return 0;
    };
    let _ = TREES.insert(child, tree, 0);
    if sessions && session::inherit(parent, child) {
        notify(NoticeKind::Forked, child, 0, parent);
    }
    0
}

/// A thread exited: its state goes (it would go with the task anyway,
/// later). When it is a traced process's main thread, the process may
/// have exited.
/// The process's entry stays while other threads run on (pthread_exit),
/// so that they keep its image generation, every one of them (a thread
/// whose first call came after the main thread's end would otherwise
/// start a new image, and the process's calls be split between two), and
/// an exec from one of them starts a new one. In live mode user space checks that no other thread runs on
/// before it drops the process's blocks, and removes the entry then;
/// otherwise the process's last thread does, here.
#[inline(always)]
pub fn exit(_ctx: RawTracePointContext) -> u32 {
    let pid_tgid = bpf_get_current_pid_tgid();
    let tgid = (pid_tgid >> 32) as u32;
    THREADS.remove_current();
    // Its place in a tree, once its last thread exits (the main thread or
    // not): only running members matter (a tree's heirs, children to
    // announce), and `TREES` is an LRU map that would push running ones
    // out for ended ones.
    let last = last_thread_exiting();
    if last {
        crate::accounting::calls::ended(tgid);
        let _ = TREES.remove(tgid);
        // Nothing more to fork (user space may not settle it: its
        // notice may have been dropped).
        let _ = EXEC_PENDING.remove(tgid);
    }
    let removes = last && !live_mode();
    if pid_tgid as u32 != tgid && !removes {
        return 0;
    }
    let Some(state) = PROCS.get_ptr_mut(tgid) else {
        return 0;
    };
    // The end is announced once: at the main thread's exit; or by the
    // last thread when it gets here first (threads exiting together, an
    // exit_group: the main thread may find the entry gone).
    // SAFETY: the pointer comes from a successful lookup.
    if unsafe { compare_and_swap(&raw mut (*state).exit_announced, 0, 1) } == 0 {
        // SAFETY: as above.
        notify(NoticeKind::Exited, tgid, unsafe { (*state).generation }, 0);
    }
    if removes {
        let _ = PROCS.remove(tgid);
    }
    0
}

/// The exiting thread is its process's last (the kernel counts the
/// threads left down before this tracepoint); false if unknown.
#[inline(always)]
fn last_thread_exiting() -> bool {
    // SAFETY: reads the current task's pointer.
    let task = unsafe { aya_ebpf::helpers::generated::bpf_get_current_task() };
    // SAFETY: checked reads of kernel memory.
    unsafe {
        let Ok(signal) =
            bpf_probe_read_kernel((task + offset_of(&TASK_SIGNAL_OFFSET)) as *const u64)
        else {
            return false;
        };
        bpf_probe_read_kernel((signal + offset_of(&SIGNAL_LIVE_OFFSET)) as *const i32) == Ok(0)
    }
}

/// Keeps the path `bprm` (a `struct linux_binprm *`) exec'd.
fn remember_exec_path(bprm: u64, tgid: u32) {
    let Some(scratch) = PATH_SCRATCH.get_ptr_mut(0) else {
        return;
    };
    // SAFETY: checked reads of kernel memory; the scratch slot is per CPU.
    unsafe {
        let Ok(filename) =
            bpf_probe_read_kernel((bprm + offset_of(&BPRM_FILENAME_OFFSET)) as *const u64)
        else {
            return;
        };
        if bpf_probe_read_kernel_str_bytes(filename as *const u8, &mut *scratch).is_ok() {
            // By reference: a copy would take half of the 512-byte BPF stack.
            #[allow(clippy::needless_borrows_for_generic_args)]
            let _ = EXEC_PATHS.insert(tgid, &*scratch, 0);
        }
    }
}
