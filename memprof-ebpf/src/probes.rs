//! The allocator probes: count each call's bytes under its call site.
use aya_ebpf::{
    helpers::{bpf_get_current_pid_tgid, generated::bpf_get_attach_cookie},
    macros::{uprobe, uretprobe},
    programs::{ProbeContext, RetProbeContext},
    EbpfContext,
};
use memprof_common::{AllocKey, AllocStats, LostCause, ProbeCookie, ThreadState, Weight};

use crate::{
    live,
    maps::{count_lost, COUNTS, THREADS},
    process::generation_of,
    sampler,
    stacks::{caller, stack},
};

const EEXIST: i32 = 17;

/// `--live`, set by user space before load: pair allocations with their
/// pointers and frees.
#[unsafe(no_mangle)]
static LIVE_MODE: u8 = 0;

#[inline(always)]
pub fn live_mode() -> bool {
    // SAFETY: a read-only global; volatile so the compiler keeps the read.
    unsafe { core::ptr::read_volatile(&LIVE_MODE) != 0 }
}

/// Entry of any hooked allocator function.
#[uprobe]
pub fn alloc_enter(ctx: ProbeContext) -> u32 {
    // SAFETY: the helper only reads the cookie of the running probe.
    let cookie = ProbeCookie::decode(unsafe { bpf_get_attach_cookie(ctx.as_ptr()) });
    let live = live_mode();
    let args = [arg(&ctx, 0), arg(&ctx, 1), arg(&ctx, 2)];
    let bytes = cookie.requested_bytes(args);
    // The fast path when sampling: most calls end here, before any
    // per-thread lookup. Only calls that cannot be nested inside another
    // hooked one may skip the nesting check.
    let fast = !live && !cookie.may_nest;
    let early = if fast {
        match sampler::weigh(bytes) {
            Some(weight) => Some(weight),
            None => return 0,
        }
    } else {
        None
    };
    let pid_tgid = bpf_get_current_pid_tgid();
    let tgid = (pid_tgid >> 32) as u32;
    let mut fallback = ThreadState::default();
    let (thread, has_state) = match thread_state(pid_tgid) {
        // SAFETY: the pointer comes from a successful lookup.
        Some(thread) => (unsafe { &mut *thread }, true),
        // The table could not take the thread: count the call anyway,
        // without nesting tracking for it.
        None => {
            fallback.generation = generation_of(tgid);
            (&mut fallback, false)
        }
    };
    let nested = thread.depth > 0;
    // In live mode every allocator has a return probe, which completes
    // the outermost call only.
    if cookie.may_nest || live {
        thread.depth += 1;
    }
    if nested {
        return 0;
    }
    let Some(weight) = early.or_else(|| sampler::weigh(bytes)) else {
        // Not sampled; a realloc still moves or frees a tracked block.
        if live && has_state {
            live::begin_unrecorded(&mut thread.pending, tgid, thread.generation, cookie, args);
        }
        return 0;
    };
    let site = AllocKey {
        tgid,
        generation: thread.generation,
        allocator: cookie.allocator as u32,
        reserved: 0,
        stack: stack(&ctx),
        caller: caller(&ctx),
    };
    if !live {
        add(&site, &counted(weight));
        return 0;
    }
    if !has_state {
        count_lost(LostCause::ThreadTableFull);
        let mut stats = counted(weight);
        stats.untracked_count = weight.unit;
        add(&site, &stats);
        return 0;
    }
    live::begin(&mut thread.pending, site, bytes, weight, cookie, args);
    0
}

/// Return of an allocator function: ends a nesting level and, in live
/// mode, pairs the outermost call with the block it returned.
#[uretprobe]
pub fn alloc_return(ctx: RetProbeContext) -> u32 {
    let Some(thread) = THREADS.get_ptr_mut(bpf_get_current_pid_tgid()) else {
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

/// Stats of one recorded call.
#[inline(always)]
pub fn counted(weight: Weight) -> AllocStats {
    AllocStats {
        bytes: weight.bytes,
        count: weight.unit,
        samples: 1,
        ..AllocStats::default()
    }
}

#[inline(always)]
fn arg(ctx: &ProbeContext, n: usize) -> u64 {
    ctx.arg::<u64>(n).unwrap_or(0)
}

/// This thread's state, created on its first allocator call.
#[inline(always)]
pub fn thread_state(pid_tgid: u64) -> Option<*mut ThreadState> {
    if let Some(thread) = THREADS.get_ptr_mut(pid_tgid) {
        return Some(thread);
    }
    let fresh = ThreadState {
        generation: generation_of((pid_tgid >> 32) as u32),
        ..ThreadState::default()
    };
    THREADS.insert(pid_tgid, fresh, 0).ok()?;
    THREADS.get_ptr_mut(pid_tgid)
}

/// Adds `delta` to a call site's stats, creating its entry if needed.
/// Returns false (and counts the loss) when the table is full.
#[inline(always)]
pub fn add(key: &AllocKey, delta: &AllocStats) -> bool {
    for _ in 0..2 {
        if let Some(stats) = COUNTS.get_ptr_mut(key) {
            // SAFETY: per-CPU value of a successful lookup.
            let stats = unsafe { &mut *stats };
            *stats = stats.merged(*delta);
            return true;
        }
        // BPF_NOEXIST: another CPU may insert the same key first; then add to it.
        match COUNTS.insert(key, delta, 1) {
            Ok(()) => return true,
            Err(err) if err == -EEXIST => continue,
            Err(_) => break,
        }
    }
    count_lost(LostCause::MapFull);
    false
}

/// Does nothing: attached instead of `alloc_enter` by the benchmark's
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
