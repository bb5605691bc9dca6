//! `--live`: each process image's heap, exact at every allocation and
//! free, with its peaks (`ProcHeap`). A shared counter per process, moved
//! with atomic adds: the value each add returns is the heap at that
//! instant, so the largest of them is the exact peak, whichever CPUs the
//! threads run on. When the peak has grown enough, user space is asked to
//! capture the call sites holding it (`NoticeKind::PeakGrown`).
use aya_ebpf::{bindings::BPF_F_MMAPABLE, macros::map, maps::Array};
use memprof_common::{
    live::{ProcHeap, NO_HEAP_SLOT},
    lost::LostCause,
    notices::NoticeKind,
};

use crate::{
    accounting::{mode::live_mode, notices::notify},
    kernel::{
        atomics::{compare_and_swap, fetch_add},
        maps::count_lost,
    },
};

/// Heaps by slot. Sized by user space (`HEAP_SLOTS` in live mode), which
/// maps it into its memory.
#[map]
pub static HEAPS: Array<ProcHeap> = Array::with_max_entries(1, BPF_F_MMAPABLE);

/// How many slots were handed out (user space starts it past the slots
/// it gave attached processes).
#[map]
pub static NEXT_HEAP: Array<u64> = Array::with_max_entries(1, 0);

/// Slots in `HEAPS` minus one (a power of two minus one); set before load.
#[unsafe(no_mangle)]
static HEAP_SLOT_MASK: u32 = 0;

/// Tries at raising a peak against other CPUs raising it at once: each
/// failed try means another CPU succeeded.
const RAISE_TRIES: u32 = 8;

/// Slots a new image looks at for a free one (owner 0: never used, or
/// freed by user space when it evicted an ended image) before it takes
/// the last one looked at from whoever has it.
const FREE_SLOT_TRIES: u32 = 8;

/// A slot for a new process image, its figures zeroed: the round-robin
/// one, or a free one of the few after it first (user space frees the
/// slots of ended images, whose exact heaps it has read), so a running
/// image keeps its slot for at least [`HEAPS`]'s length of new images, and
/// longer while ended ones leave theirs.
#[inline(always)]
pub fn new_slot(tgid: u32, generation: u32) -> u32 {
    if !live_mode() {
        return NO_HEAP_SLOT;
    }
    let Some(next) = NEXT_HEAP.get_ptr_mut(0) else {
        return NO_HEAP_SLOT;
    };
    let owner = ProcHeap::owner_of(tgid, generation);
    // SAFETY: a read-only global; volatile so the compiler keeps the read.
    let mask = unsafe { core::ptr::read_volatile(&HEAP_SLOT_MASK) };
    // SAFETY: an aligned u64 in map memory.
    let taken = unsafe { fetch_add(next, 1) } as u32;
    for step in 0..FREE_SLOT_TRIES {
        let slot = taken.wrapping_add(step) & mask;
        let Some(heap) = HEAPS.get_ptr_mut(slot) else {
            return NO_HEAP_SLOT;
        };
        // SAFETY: map memory; an aligned u64.
        if unsafe { compare_and_swap(&raw mut (*heap).owner, 0, owner) } == 0 {
            // SAFETY: the slot is this image's now.
            unsafe { zero(heap) };
            return slot;
        }
    }
    let slot = taken & mask;
    let Some(heap) = HEAPS.get_ptr_mut(slot) else {
        return NO_HEAP_SLOT;
    };
    // SAFETY: map memory; the owner changes first, so updates of the
    // slot's previous owner stop matching before its figures are zeroed.
    unsafe {
        core::ptr::write_volatile(&raw mut (*heap).owner, owner);
        zero(heap);
    }
    slot
}

/// Zeroes a slot's figures.
///
/// # Safety
/// `heap` points at a slot of `HEAPS`.
#[inline(always)]
unsafe fn zero(heap: *mut ProcHeap) {
    // SAFETY: the caller's slot.
    unsafe {
        (*heap).live_bytes = 0;
        (*heap).live_count = 0;
        (*heap).peak_bytes = 0;
        (*heap).peak_count = 0;
        (*heap).peak_time_ns = 0;
        (*heap).snapshot_bytes = 0;
    }
}

/// The image's heap, if the slot is still its own.
#[inline(always)]
fn heap_of(slot: u32, tgid: u32, generation: u32) -> Option<*mut ProcHeap> {
    if slot == NO_HEAP_SLOT {
        count_lost(LostCause::HeapUntracked);
        return None;
    }
    let heap = HEAPS.get_ptr_mut(slot)?;
    // SAFETY: map memory.
    if unsafe { core::ptr::read_volatile(&(*heap).owner) } != ProcHeap::owner_of(tgid, generation) {
        count_lost(LostCause::HeapUntracked);
        return None;
    }
    Some(heap)
}

/// A block of `bytes` (`count` blocks, in weighed units when sampling)
/// became live at `now_ns`.
#[inline(always)]
pub fn grow(slot: u32, tgid: u32, generation: u32, bytes: u64, count: u64, now_ns: u64) {
    let Some(heap) = heap_of(slot, tgid, generation) else {
        return;
    };
    // SAFETY: aligned u64s in map memory.
    unsafe {
        let live_count = fetch_add(&raw mut (*heap).live_count, count).wrapping_add(count);
        raise(&raw mut (*heap).peak_count, live_count);
        let live_bytes = fetch_add(&raw mut (*heap).live_bytes, bytes).wrapping_add(bytes);
        if raise(&raw mut (*heap).peak_bytes, live_bytes) {
            (*heap).peak_time_ns = now_ns;
            let snapshot = core::ptr::read_volatile(&(*heap).snapshot_bytes);
            // One CPU asks for a given capture: the one that moves the mark.
            if ProcHeap::snapshot_due(live_bytes, snapshot)
                && compare_and_swap(&raw mut (*heap).snapshot_bytes, snapshot, live_bytes)
                    == snapshot
            {
                notify(NoticeKind::PeakGrown, tgid, generation, slot);
            }
        }
    }
}

/// A block of `bytes` (`count` blocks) was freed or left the process.
#[inline(always)]
pub fn shrink(slot: u32, tgid: u32, generation: u32, bytes: u64, count: u64) {
    let Some(heap) = heap_of(slot, tgid, generation) else {
        return;
    };
    // SAFETY: aligned u64s in map memory.
    unsafe {
        fetch_add(&raw mut (*heap).live_bytes, 0u64.wrapping_sub(bytes));
        fetch_add(&raw mut (*heap).live_count, 0u64.wrapping_sub(count));
    }
}

/// `*peak = value` if that raises it. True when this call raised it.
///
/// # Safety
/// `peak` points at an aligned u64 in map memory.
#[inline(always)]
unsafe fn raise(peak: *mut u64, value: u64) -> bool {
    for _ in 0..RAISE_TRIES {
        // SAFETY: the caller's pointer.
        let current = unsafe { core::ptr::read_volatile(peak) };
        // A heap figure is never near 2^63; a wrapped one (a free counted
        // before its allocation on another CPU) is not a peak.
        if value <= current || value >= 1 << 62 {
            return false;
        }
        // SAFETY: as above.
        if unsafe { compare_and_swap(peak, current, value) } == current {
            return true;
        }
    }
    false
}
