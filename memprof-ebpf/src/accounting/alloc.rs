//! An allocator call: its entry counts the call's bytes under its call
//! site (or, in live mode, leaves it pending), its return pairs the
//! outermost call with the block it returned.
use aya_ebpf::{
    helpers::bpf_get_current_pid_tgid,
    programs::{ProbeContext, RetProbeContext},
};
use memprof_common::{
    allocators::MALLOC,
    cookies::{Args, ProbeCookie},
    lost::LostCause,
    sites::{AllocKey, Weight, GO_TYPE_BITS},
    thread::RegionFrames,
};

use crate::{
    accounting::{
        calls,
        images::generation_of,
        live,
        mode::live_mode,
        regions, sampler, session,
        session::Returns,
        sites::{add_call, add_to_table},
        stacks::{call_stack, CallStack},
        thread::{deepen, thread_state},
    },
    kernel::maps::{count_lost, THREADS},
};

/// Entry of malloc, with its cookie known when compiling: malloc makes
/// most of the calls. Runs inside `site_enter` (no tail call); the other
/// allocators' path stays a program of its own (`alloc_enter`): both in
/// one program exceed the BPF stack.
#[inline(always)]
pub fn malloc_entered(ctx: ProbeContext) -> u32 {
    enter(ctx, ProbeCookie::of_allocator(MALLOC), Returns::AsProbed);
    0
}

/// Records an allocator call's entry. With `Returns::Chosen`, a sampled
/// call (its block is to be tracked) asks for its return
/// (`session::arm_return`).
#[inline(always)]
pub fn enter(ctx: ProbeContext, cookie: ProbeCookie, returns: Returns) {
    enter_call(ctx, cookie, returns, false);
}

/// Records the entry of Go's `runtime.mallocgc`, its key with the type
/// allocated. Never in live mode (what Go frees, its collector frees
/// unseen): without that path, the type fits the BPF stack.
#[inline(always)]
pub fn go_entered(ctx: ProbeContext, cookie: ProbeCookie) {
    enter_call(ctx, cookie, Returns::AsProbed, true);
}

/// [`enter`]; `go`: a `runtime.mallocgc` call ([`go_entered`]).
#[inline(always)]
fn enter_call(ctx: ProbeContext, cookie: ProbeCookie, returns: Returns, go: bool) {
    let live = !go && live_mode();
    let args = args_of(&ctx, cookie);
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
        let call = Call { cookie, bytes, go };
        without_thread_state(&ctx, tgid, call, early, live, cause);
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
        go,
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

/// The call's six argument registers, C's or (`cookie.go_abi`) Go's.
#[inline(always)]
pub fn args_of(ctx: &ProbeContext, cookie: ProbeCookie) -> Args {
    if cookie.go_abi {
        // Volatile: each register is read at its own fixed context
        // offset (the verifier refuses a context pointer the compiler
        // computed).
        // SAFETY: reads of the probe's registers.
        return unsafe {
            let regs = ctx.regs;
            [
                core::ptr::read_volatile(&(*regs).rax),
                core::ptr::read_volatile(&(*regs).rbx),
                core::ptr::read_volatile(&(*regs).rcx),
                core::ptr::read_volatile(&(*regs).rdi),
                core::ptr::read_volatile(&(*regs).rsi),
                core::ptr::read_volatile(&(*regs).r8),
            ]
        };
    }
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
    call: Call,
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
        calls::count(tgid, call.bytes);
    }
    let Some(weight) = early.or_else(|| sampler::weigh(call.bytes)) else {
        return;
    };
    let generation = generation_of(tgid);
    let site = site_key(ctx, tgid, generation, call.cookie, call.go, None);
    if live {
        count_lost(untracked);
    }
    add_to_table(&site, weight, live);
}

/// An allocator call, as [`without_thread_state`] is told of it.
#[derive(Clone, Copy)]
struct Call {
    cookie: ProbeCookie,
    bytes: u64,
    go: bool,
}

/// The key a call is counted under: its process image, call stack,
/// allocator function and (`go`) the Go type it allocated.
#[inline(always)]
fn site_key(
    ctx: &ProbeContext,
    tgid: u32,
    generation: u32,
    cookie: ProbeCookie,
    go: bool,
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
        reserved: if go { flags | go_type_of(ctx) } else { flags },
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

/// The low bits of the Go type a `runtime.mallocgc` call allocated, 0 for
/// none: its second argument in Go's registers (RBX).
#[inline(always)]
fn go_type_of(ctx: &ProbeContext) -> u32 {
    // SAFETY: a read of the probe's registers.
    let typ = unsafe { core::ptr::read_volatile(&(*ctx.regs).rbx) };
    typ as u32 & GO_TYPE_BITS
}

#[inline(always)]
fn arg(ctx: &ProbeContext, n: usize) -> u64 {
    ctx.arg::<u64>(n).unwrap_or(0)
}
