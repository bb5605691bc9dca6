//! The allocator probes: count each call's bytes under its call site.
use aya_ebpf::{
    helpers::bpf_get_current_pid_tgid,
    macros::{uprobe, uretprobe},
    programs::{ProbeContext, RetProbeContext},
};
use memprof_common::{
    allocators::{ALLOCATORS, MALLOC},
    AllocKey, Args, LostCause, ProbeCookie, RegionFrames, ThreadState, Weight, NO_HEAP_SLOT,
    REFUSED_GENERATION,
};

use crate::{
    calls,
    dispatch::site_cookie,
    live,
    maps::{count_lost, PROBE_EPOCH, THREADS},
    process::{generation_of, image_of},
    regions, sampler,
    session::{self, Returns},
    sites::{add_call, add_to_table},
    stacks::{call_stack, CallStack},
};

/// `--live`, set by user space before load: pair allocations with their
/// pointers and frees.
#[unsafe(no_mangle)]
static LIVE_MODE: u8 = 0;

#[inline(always)]
pub fn live_mode() -> bool {
    // SAFETY: a read-only global; volatile so the compiler keeps the read.
    unsafe { core::ptr::read_volatile(&LIVE_MODE) != 0 }
}

/// Entry of any other hooked allocator function: its site's cookie says
/// which and where its arguments are.
#[uprobe]
pub fn alloc_enter(ctx: ProbeContext) -> u32 {
    let cookie = ProbeCookie::decode(site_cookie(&ctx));
    enter(ctx, cookie, Returns::AsProbed);
    0
}

/// Entry of a malloc-like function under session probes in a process
/// that has no return probe there yet (see `session`): counted, its block
/// untracked. A program of its own: `enter` with the choice made at run
/// time exceeds the BPF stack.
#[uprobe]
pub fn alloc_unreturned(ctx: ProbeContext) -> u32 {
    let cookie = ProbeCookie::decode(site_cookie(&ctx));
    enter(ctx, cookie, Returns::Never);
    0
}

/// Entry of malloc, with its cookie known when compiling: malloc makes
/// most of the calls. Runs inside `site_enter` (no tail call); the other
/// allocators' path stays a program of its own (`alloc_enter`): both in
/// one program exceed the BPF stack.
#[inline(always)]
pub fn malloc_entered(ctx: ProbeContext) -> u32 {
    enter(ctx, ALLOCATORS[MALLOC].cookie(MALLOC), Returns::AsProbed);
    0
}

/// Records an allocator call's entry. With `Returns::Chosen`, a sampled
/// call (its block is to be tracked) asks for its return
/// (`session::arm_return`).
#[inline(always)]
pub fn enter(ctx: ProbeContext, cookie: ProbeCookie, returns: Returns) {
    let live = live_mode();
    let args = args_of(&ctx);
    let bytes = cookie.requested_bytes(args);
    let pointers = live::CallPointers::of(cookie, args);
    // The fast path when sampling: most calls end here, before any
    // per-thread lookup. Only calls that cannot be nested inside another
    // hooked one may skip the nesting check; --while needs the thread's
    // region depth. In live mode, session probes only: an unsampled call
    // then has no return that would need the thread's state (and its
    // release check, see `live::release_at`, counts nothing when
    // sampling).
    let fast = (!live || returns == Returns::Chosen) && !cookie.may_nest && !regions::by_function();
    let early = if fast {
        if regions::paused() {
            return;
        }
        calls::count_unless_nested((bpf_get_current_pid_tgid() >> 32) as u32, bytes);
        match sampler::weigh(bytes) {
            Some(weight) => Some(weight),
            None => return,
        }
    } else {
        None
    };
    // A call no return will complete is counted as a thread without state
    // is (without nesting: such calls are rare, and brief).
    let state = match returns {
        Returns::Never => None,
        _ => thread_state(),
    };
    let Some(thread) = state else {
        let tgid = (bpf_get_current_pid_tgid() >> 32) as u32;
        let cause = match returns {
            Returns::Never => LostCause::NoReturnProbe,
            _ => LostCause::ThreadTableFull,
        };
        without_thread_state(&ctx, tgid, cookie, bytes, early, live, cause);
        return;
    };
    let tgid = thread.tgid;
    if live {
        // A release before this call is over (see `live::release_at`).
        thread.last_released = 0;
    }
    let nested = thread.depth > 0;
    // In live mode every allocator has a return probe, which completes
    // the outermost call only. Under session probes a call has one only
    // if its entry asks (below).
    if returns == Returns::AsProbed && (cookie.may_nest || live) {
        deepen(thread);
    }
    if nested {
        // Its trap costs all the same (the fast path counted its own).
        if early.is_none() {
            calls::count_trap(tgid);
        }
        return;
    }
    let paused = !fast && regions::paused();
    let recorded = fast || regions::records_unless(paused, thread.region_depth);
    if recorded && !fast {
        calls::count(tgid, bytes);
    } else if !recorded && !paused {
        // Outside every region (--while): its trap costs all the same.
        calls::count_trap(tgid);
    }
    let Some(weight) = early.or_else(|| recorded.then(|| sampler::weigh(bytes)).flatten()) else {
        // Not sampled (or not recorded); a realloc still moves or frees a
        // tracked block.
        if live {
            live::begin_unrecorded(
                &mut thread.pending,
                tgid,
                thread.generation,
                cookie,
                bytes,
                pointers,
            );
        }
        return;
    };
    // Sampled (so in live mode): its return is to pair it with its block.
    if returns == Returns::Chosen {
        deepen(thread);
        session::arm_return(thread);
    }
    let site = site_key(
        &ctx,
        tgid,
        thread.generation,
        cookie,
        regions::frames(thread),
    );
    if !live {
        add_call(&site, weight);
        return;
    }
    live::begin(
        &mut thread.pending,
        thread.heap_slot,
        site,
        bytes,
        weight,
        pointers,
    );
}

/// The call's six argument registers.
#[inline(always)]
pub fn args_of(ctx: &ProbeContext) -> Args {
    [
        arg(ctx, 0),
        arg(ctx, 1),
        arg(ctx, 2),
        arg(ctx, 3),
        arg(ctx, 4),
        arg(ctx, 5),
    ]
}

/// A call of a thread the thread table could not take, or that no return
/// will complete: counted anyway, without nesting tracking; in live mode
/// its block is untracked (`untracked` says why).
#[inline(always)]
fn without_thread_state(
    ctx: &ProbeContext,
    tgid: u32,
    cookie: ProbeCookie,
    bytes: u64,
    early: Option<Weight>,
    live: bool,
    untracked: LostCause,
) {
    // Without its state the thread's region is unknown: not recorded.
    if !regions::records(0) {
        return;
    }
    // The fast path counted it already.
    if early.is_none() {
        calls::count(tgid, bytes);
    }
    let Some(weight) = early.or_else(|| sampler::weigh(bytes)) else {
        return;
    };
    let site = site_key(ctx, tgid, generation_of(tgid), cookie, None);
    if live {
        count_lost(untracked);
    }
    add_to_table(&site, weight, live);
}

/// The key a call is counted under: its process image, call stack and
/// allocator function.
#[inline(always)]
fn site_key(
    ctx: &ProbeContext,
    tgid: u32,
    generation: u32,
    cookie: ProbeCookie,
    regions: Option<&RegionFrames>,
) -> AllocKey {
    let CallStack {
        caller,
        stack,
        flags,
    } = call_stack(ctx, tgid, regions);
    AllocKey {
        tgid,
        generation,
        allocator: cookie.allocator as u32,
        reserved: flags,
        stack,
        caller,
    }
}

/// Return of an allocator function: ends a nesting level and, in live
/// mode, pairs the outermost call with the block it returned. Runs inside
/// `site_return` (no tail call).
#[inline(always)]
pub fn alloc_returned(ctx: &RetProbeContext) -> u32 {
    let Some(thread) = THREADS.current(false) else {
        return 0;
    };
    // SAFETY: the pointer comes from a successful lookup.
    let thread = unsafe { &mut *thread };
    thread.depth = thread.depth.saturating_sub(1);
    if thread.depth == 0 && thread.pending.active != 0 {
        thread.pending.active = 0;
        live::complete(&thread.pending, ctx.ret::<u64>());
    }
    0
}

#[inline(always)]
fn arg(ctx: &ProbeContext, n: usize) -> u64 {
    ctx.arg::<u64>(n).unwrap_or(0)
}

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
fn deepen(thread: &mut ThreadState) {
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

/// Does nothing: attached instead of `site_enter` by the benchmark's
/// floor run (`--empty-programs`), to measure what the traps alone cost.
#[uprobe]
pub fn noop_enter(_ctx: ProbeContext) -> u32 {
    0
}

/// The return-probe counterpart of [`noop_enter`].
#[uretprobe]
pub fn noop_return(_ctx: RetProbeContext) -> u32 {
    0
}
