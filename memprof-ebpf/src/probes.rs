//! The allocator probes: count each call's bytes under its call site.
use aya_ebpf::programs::tracing::StackIdContext;
use aya_ebpf::{
    bindings::BPF_F_USER_STACK,
    helpers::{bpf_get_current_pid_tgid, bpf_probe_read_user, generated::bpf_get_attach_cookie},
    macros::{uprobe, uretprobe},
    programs::{ProbeContext, RetProbeContext},
    EbpfContext,
};
use memprof_common::{AllocKey, AllocStats, LostCause, ProbeCookie, NO_STACK};

use crate::{
    maps::{count_lost, COUNTS, NESTING, STACKS},
    process::generation_of,
};

const EEXIST: i32 = 17;
/// Skip the first frame of the kernel's walk: it is the allocator itself.
const STACK_FLAGS: u64 = BPF_F_USER_STACK as u64 | 1;

/// Entry of any hooked allocator function.
#[uprobe]
pub fn alloc_enter(ctx: ProbeContext) -> u32 {
    // SAFETY: the helper only reads the cookie of the running probe.
    let cookie = ProbeCookie::decode(unsafe { bpf_get_attach_cookie(ctx.as_ptr()) });
    let pid_tgid = bpf_get_current_pid_tgid();
    if enter_allocator(pid_tgid, cookie.may_nest) {
        return 0;
    }
    let args = [arg(&ctx, 0), arg(&ctx, 1), arg(&ctx, 2)];
    record(
        &ctx,
        pid_tgid,
        cookie.allocator as u32,
        cookie.requested_bytes(args),
    );
    0
}

/// Return of an allocator function that may call another hooked one.
#[uretprobe]
pub fn alloc_return(_ctx: RetProbeContext) -> u32 {
    let pid_tgid = bpf_get_current_pid_tgid();
    if let Some(depth) = NESTING.get_ptr_mut(pid_tgid) {
        // SAFETY: the pointer comes from a successful lookup.
        unsafe { *depth = (*depth).saturating_sub(1) };
    }
    0
}

#[inline(always)]
fn arg(ctx: &ProbeContext, n: usize) -> u64 {
    ctx.arg::<u64>(n).unwrap_or(0)
}

/// Tracks nesting; true when this call runs inside another hooked
/// allocator call of the same thread (and so must not be counted again).
#[inline(always)]
fn enter_allocator(pid_tgid: u64, may_nest: bool) -> bool {
    match NESTING.get_ptr_mut(pid_tgid) {
        Some(depth) => {
            // SAFETY: the pointer comes from a successful lookup.
            let depth = unsafe { &mut *depth };
            let nested = *depth > 0;
            if may_nest {
                *depth += 1;
            }
            nested
        }
        None => {
            if may_nest {
                let _ = NESTING.insert(pid_tgid, 1u32, 0);
            }
            false
        }
    }
}

#[inline(always)]
fn record(ctx: &ProbeContext, pid_tgid: u64, allocator: u32, bytes: u64) {
    let tgid = (pid_tgid >> 32) as u32;
    let key = AllocKey {
        tgid,
        generation: generation_of(tgid),
        stack_id: stack_id(ctx),
        allocator,
        caller: caller(ctx),
    };
    add(&key, bytes);
}

/// The return address at the stack pointer: at function entry this is
/// the allocator's direct caller, which the frame-pointer walk misses.
#[inline(always)]
fn caller(ctx: &ProbeContext) -> u64 {
    // SAFETY: regs points at the probe's saved registers.
    let sp = unsafe { (*ctx.regs).rsp };
    // SAFETY: a checked read of user memory.
    match unsafe { bpf_probe_read_user(sp as *const u64) } {
        Ok(ret) => ret,
        Err(_) => {
            count_lost(LostCause::ReadFault);
            0
        }
    }
}

#[inline(always)]
fn stack_id(ctx: &ProbeContext) -> u32 {
    match ctx.get_stackid(&STACKS, STACK_FLAGS) {
        Ok(id) => id as u32,
        Err(err) => {
            count_lost(if err == -EEXIST {
                LostCause::StackCollision
            } else {
                LostCause::StackError
            });
            NO_STACK
        }
    }
}

#[inline(always)]
fn add(key: &AllocKey, bytes: u64) {
    for _ in 0..2 {
        if let Some(stats) = COUNTS.get_ptr_mut(key) {
            // SAFETY: per-CPU value of a successful lookup.
            unsafe {
                (*stats).bytes += bytes;
                (*stats).count += 1;
            }
            return;
        }
        let first = AllocStats { bytes, count: 1 };
        // BPF_NOEXIST: another CPU may insert the same key first; then add to it.
        match COUNTS.insert(key, first, 1) {
            Ok(()) => return,
            Err(err) if err == -EEXIST => continue,
            Err(_) => break,
        }
    }
    count_lost(LostCause::MapFull);
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
