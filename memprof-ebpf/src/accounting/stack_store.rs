//! Stacks stored once in `STACKS` under a hash of their frames, compared
//! frame by frame on every lookup.
use memprof_common::{
    lost::LostCause,
    sites::NO_STACK,
    stacks::{StackFrames, MAX_FRAMES},
};

use crate::kernel::maps::{count_lost, LastStack, STACKS, STACK_EPOCH};

/// Stores the first `len` frames of `last.frames` (their hash `hash`;
/// `differs` is 0 when they equal the last stack's) in `STACKS` unless
/// there, and returns their key.
#[inline(always)]
pub fn store(last: &mut LastStack, len: usize, hash: u64, differs: u64) -> u64 {
    let frames = &mut last.frames;
    // Read before the lookup: an eviction after it makes the next call
    // look again.
    let epoch = STACK_EPOCH
        .get_ptr(0)
        // SAFETY: an aligned u64 in map memory, written by user space.
        .map_or(0, |epoch| unsafe { core::ptr::read_volatile(epoch) });
    if differs == 0 && frames.len == len as u64 && last.key != NO_STACK && last.epoch == epoch {
        return last.key;
    }
    last.epoch = epoch;
    // Slots past `len` keep older frames: only the first `len` count.
    frames.len = len as u64;
    find_or_insert(last, hash)
}

/// The slow path of [`store`], not inlined: the BPF stack of the
/// programs that walk stacks is nearly full.
#[inline(never)]
fn find_or_insert(last: &mut LastStack, hash: u64) -> u64 {
    let frames = &mut last.frames;
    let key = if hash == NO_STACK { 1 } else { hash };
    // SAFETY: read-only look at a stored stack.
    last.key = match unsafe { STACKS.get(key) } {
        Some(stored) if same_frames(stored, frames) => key,
        Some(_) => {
            count_lost(LostCause::StackCollision);
            NO_STACK
        }
        // By reference: a copy (1 KiB) would not fit the BPF stack.
        #[allow(clippy::needless_borrows_for_generic_args)]
        None => match STACKS.insert(key, &*frames, 0) {
            Ok(()) => key,
            Err(_) => {
                count_lost(LostCause::StackCollision);
                NO_STACK
            }
        },
    };
    last.key
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
