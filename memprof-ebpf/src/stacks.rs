//! The call stack of an allocator call: its direct caller from the
//! return address at the stack pointer, the rest by walking frame pointers,
//! stored once per distinct stack.
use aya_ebpf::{helpers::bpf_probe_read_user, programs::ProbeContext};
use memprof_common::{LostCause, StackFrames, MAX_FRAMES, NO_STACK};

use crate::maps::{count_lost, STACKS, STACK_SCRATCH};

/// The return address at the stack pointer: at function entry this is
/// the allocator's direct caller, which the frame-pointer walk misses.
#[inline(always)]
pub fn caller(ctx: &ProbeContext) -> u64 {
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

/// Walks the frame-pointer chain from the allocator's caller's frame and
/// returns the stack's key in `STACKS`, storing the stack if it is new.
///
/// The walk is the kernel's (perf's) frame-pointer walk done here, which
/// measured ~3x cheaper than `bpf_get_stackid`, and the stacks are keyed by
/// a 64-bit hash checked against the stored frames, so they never collide
/// the way the kernel's stack-map buckets do.
#[inline(always)]
pub fn stack(ctx: &ProbeContext) -> u64 {
    let Some(frames) = STACK_SCRATCH.get_ptr_mut(0) else {
        return NO_STACK;
    };
    // SAFETY: the per-CPU scratch slot; BPF programs do not nest on a CPU here.
    let frames = unsafe { &mut *frames };
    // SAFETY: regs points at the probe's saved registers.
    let mut fp = unsafe { (*ctx.regs).rbp };
    let mut len = 0usize;
    let mut hash: u64 = 0xcbf2_9ce4_8422_2325;
    for slot in 0..MAX_FRAMES {
        // A frame record is [saved frame pointer, return address]; frames
        // lie at rising, aligned addresses: anything else ends the chain.
        if fp == 0 || fp & 7 != 0 {
            break;
        }
        // SAFETY: a checked read of user memory.
        let Ok([next, ret]) = (unsafe { bpf_probe_read_user(fp as *const [u64; 2]) }) else {
            break;
        };
        if ret == 0 {
            break;
        }
        frames.ips[slot] = ret;
        hash = (hash ^ ret).wrapping_mul(0x0100_0000_01b3);
        len = slot + 1;
        fp = if next > fp { next } else { 0 };
    }
    if len == 0 {
        count_lost(LostCause::StackError);
        return NO_STACK;
    }
    // Slots past `len` keep older frames: only the first `len` count.
    frames.len = len as u64;
    let key = if hash == NO_STACK { 1 } else { hash };
    // SAFETY: read-only look at a stored stack.
    match unsafe { STACKS.get(key) } {
        Some(stored) if same_frames(stored, frames) => key,
        Some(_) => {
            count_lost(LostCause::StackCollision);
            NO_STACK
        }
        // By reference: a copy (520 bytes) would not fit the BPF stack.
        #[allow(clippy::needless_borrows_for_generic_args)]
        None => match STACKS.insert(key, &*frames, 0) {
            Ok(()) => key,
            Err(_) => {
                count_lost(LostCause::StackCollision);
                NO_STACK
            }
        },
    }
}

#[inline(always)]
fn same_frames(a: &StackFrames, b: &StackFrames) -> bool {
    if a.len != b.len {
        return false;
    }
    for slot in 0..MAX_FRAMES {
        if slot as u64 >= a.len {
            break;
        }
        if a.ips[slot] != b.ips[slot] {
            return false;
        }
    }
    true
}
