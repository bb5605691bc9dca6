//! The pointer table of `--live`: every tracked block, in a BPF array used
//! as an open-addressing hash table (see `LiveEntry`). To a BPF program an
//! array slot is plain memory, so tracking and releasing a block take no
//! kernel call (a hash-map insert, lookup and delete cost ≈ 370 ns per
//! block here);
//! a compare-and-swap takes a free slot, so two CPUs never take the same.
//!
//! A block's own thread is the only one that writes its slot until it is
//! freed, and a free follows its allocation's return (the program had to
//! get the pointer), so only taking a free slot needs an atomic.
//!
//! A block whose window of slots is full goes to `LIVE_OVERFLOW`, a
//! preallocated BPF hash map with room for `--max-live` blocks: every
//! block `LIVE_USED` admits has a place, so none is lost below
//! `--max-live` whatever the addresses. The hash map is only looked in
//! while it holds blocks (`LIVE_USED[LIVE_USED_OVERFLOW]`), so the
//! common paths make no kernel call.
use core::{
    ptr,
    sync::atomic::{compiler_fence, Ordering},
};

use aya_ebpf::{
    bindings::BPF_F_MMAPABLE,
    macros::map,
    maps::{Array, HashMap},
};
use memprof_common::live::{
    LiveBlock, LiveEntry, LiveKey, LIVE_BUCKET_COUNT, LIVE_CLAIMED, LIVE_EMPTY, LIVE_USED_BLOCKS,
    LIVE_USED_COUNTERS, LIVE_USED_OVERFLOW, LIVE_WINDOW,
};

use crate::{
    accounting::sampler::sampling,
    kernel::{
        atomics::{compare_and_swap, fetch_add},
        maps::{BPF_EXIST, BPF_NOEXIST},
    },
};

/// The slots. User space sizes it (`LiveEntry::table_slots`) and maps it
/// into its memory to read ages and to drop what ended processes left.
#[map]
pub static LIVE: Array<LiveEntry> = Array::with_max_entries(1, BPF_F_MMAPABLE);

/// Blocks tracked (in `LIVE` and in `LIVE_OVERFLOW`), against
/// `--max-live`, and blocks in `LIVE_OVERFLOW` (`LIVE_USED_*`). User space
/// takes off the blocks it drops.
#[map]
pub static LIVE_USED: Array<u64> = Array::with_max_entries(LIVE_USED_COUNTERS, BPF_F_MMAPABLE);

/// Blocks whose window of `LIVE` was full. User space sizes it to
/// `--max-live` entries; preallocated (no allocation when a block goes
/// in), so it has room for every block `LIVE_USED` admits.
#[map]
pub static LIVE_OVERFLOW: HashMap<LiveKey, LiveBlock> = HashMap::with_max_entries(1, 0);

/// With sampling, the blocks tracked (in `LIVE` and in `LIVE_OVERFLOW`)
/// by bucket of their keys (`LiveEntry::bucket`): a free of a block never
/// sampled, most frees then, finds its bucket empty and reads one word,
/// not the 16 slots of its window. Counted in before the allocation
/// returns, so before any free of the block. User space takes off the
/// blocks it drops.
#[map]
pub static LIVE_BUCKETS: Array<u64> = Array::with_max_entries(LIVE_BUCKET_COUNT, BPF_F_MMAPABLE);

/// Slots in `LIVE` minus one (a power of two minus one); set before load.
#[unsafe(no_mangle)]
static LIVE_SLOT_MASK: u32 = 0;

/// `--max-live`; set before load.
#[unsafe(no_mangle)]
static MAX_LIVE: u64 = 1;

/// What [`insert`] did.
pub enum Inserted {
    New,
    /// The key was still in the table: the allocator handed out an address
    /// whose free memprof did not see. This block replaced that one.
    Replaced(LiveBlock),
    /// No room: `--max-live` blocks are tracked (or, which its room makes
    /// all but impossible, the kernel refused the overflow map's insert).
    Full,
}

#[inline(always)]
fn slot_mask() -> u32 {
    // SAFETY: a read-only global; volatile so the compiler keeps the read.
    unsafe { ptr::read_volatile(&LIVE_SLOT_MASK) }
}

#[inline(always)]
fn max_live() -> u64 {
    // SAFETY: as above.
    unsafe { ptr::read_volatile(&MAX_LIVE) }
}

/// Tracks `block` under `key`.
#[inline(always)]
pub fn insert(key: &LiveKey, block: &LiveBlock) -> Inserted {
    // (No block is at the address that marks a slot being written.)
    if key.address == LIVE_CLAIMED {
        return Inserted::Full;
    }
    let home = LiveEntry::home(key, slot_mask());
    if let Some(slot) = find(key, home) {
        let stale = slot.block;
        // Rewritten as a slot being taken, so that user space does not
        // read it half old, half new.
        // SAFETY: the slot of this key, written by this thread only.
        unsafe { ptr::write_volatile(&mut slot.key.address, LIVE_CLAIMED) };
        compiler_fence(Ordering::SeqCst);
        slot.block = *block;
        compiler_fence(Ordering::SeqCst);
        // SAFETY: as above.
        unsafe { ptr::write_volatile(&mut slot.key.address, key.address) };
        return Inserted::Replaced(stale);
    }
    if overflowed() {
        // SAFETY: copied at once; only this thread changes its key's entry.
        if let Some(stale) = LIVE_OVERFLOW.get_ptr(key).map(|stale| unsafe { *stale }) {
            // Replaced whole by the kernel: user space never reads it half
            // old, half new.
            if LIVE_OVERFLOW.insert(key, block, BPF_EXIST).is_ok() {
                return Inserted::Replaced(stale);
            }
        }
    }
    if !reserve() {
        return Inserted::Full;
    }
    for step in 0..LIVE_WINDOW {
        let Some(slot) = LIVE.get_ptr_mut(home.wrapping_add(step) & slot_mask()) else {
            break;
        };
        // SAFETY: a slot of the array; its address word is only changed
        // atomically or by the block's own thread.
        let address = unsafe { &raw mut (*slot).key.address };
        // SAFETY: as above.
        if unsafe { ptr::read_volatile(address) } != LIVE_EMPTY {
            continue;
        }
        // SAFETY: an aligned u64 of the array.
        if unsafe { compare_and_swap(address, LIVE_EMPTY, LIVE_CLAIMED) } != LIVE_EMPTY {
            continue;
        }
        // SAFETY: the slot is this program's until the address is stored.
        let slot = unsafe { &mut *slot };
        slot.key.tgid = key.tgid;
        slot.key.generation = key.generation;
        slot.block = *block;
        // Readers check the address, then the rest: the rest first.
        compiler_fence(Ordering::SeqCst);
        // SAFETY: as above.
        unsafe { ptr::write_volatile(address, key.address) };
        count_in_bucket(key, 1);
        return Inserted::New;
    }
    // The window is full: the overflow map has room for every block
    // `reserve` admits. Counted in first, so that a free that finds the
    // count at 0 may skip the lookup.
    add(LIVE_USED_OVERFLOW, 1);
    if LIVE_OVERFLOW.insert(key, block, BPF_NOEXIST).is_ok() {
        count_in_bucket(key, 1);
        return Inserted::New;
    }
    add(LIVE_USED_OVERFLOW, u64::MAX);
    unreserve();
    Inserted::Full
}

/// Takes the block of `key` out of the table.
#[inline(always)]
pub fn take(key: &LiveKey) -> Option<LiveBlock> {
    if !may_hold(key) {
        return None;
    }
    let Some(slot) = find(key, LiveEntry::home(key, slot_mask())) else {
        return take_overflowed(key);
    };
    let block = slot.block;
    compiler_fence(Ordering::SeqCst);
    // SAFETY: the block's slot, written by its own thread only.
    unsafe { ptr::write_volatile(&mut slot.key.address, LIVE_EMPTY) };
    unreserve();
    count_in_bucket(key, u64::MAX);
    Some(block)
}

/// Whether the table may hold the block of `key` (without sampling: yes).
#[inline(always)]
pub fn may_hold(key: &LiveKey) -> bool {
    if !sampling() {
        return true;
    }
    LIVE_BUCKETS
        .get_ptr(LiveEntry::bucket(key))
        // SAFETY: an aligned u64 of the array, changed atomically only.
        .is_none_or(|count| unsafe { ptr::read_volatile(count) } != 0)
}

/// Adds `value` to the count of `key`'s bucket (with sampling).
#[inline(always)]
fn count_in_bucket(key: &LiveKey, value: u64) {
    if !sampling() {
        return;
    }
    if let Some(count) = LIVE_BUCKETS.get_ptr_mut(LiveEntry::bucket(key)) {
        // SAFETY: an aligned u64 of the array, changed atomically only.
        unsafe { fetch_add(count, value) };
    }
}

/// Takes the block of `key` out of the overflow map, if it is there.
/// Looked up only while the map holds blocks: with sampling most frees
/// are of blocks never tracked, and they stay without a kernel call.
#[inline(always)]
fn take_overflowed(key: &LiveKey) -> Option<LiveBlock> {
    if !overflowed() {
        return None;
    }
    // SAFETY: copied before the entry is removed (a preallocated map
    // reuses it at once); only this thread changes its key's entry.
    let block = unsafe { *LIVE_OVERFLOW.get_ptr(key)? };
    LIVE_OVERFLOW.remove(key).ok()?;
    add(LIVE_USED_OVERFLOW, u64::MAX);
    unreserve();
    count_in_bucket(key, u64::MAX);
    Some(block)
}

/// Whether the overflow map holds blocks.
#[inline(always)]
fn overflowed() -> bool {
    LIVE_USED
        .get_ptr(LIVE_USED_OVERFLOW)
        // SAFETY: an aligned u64 of the array, changed atomically only.
        .is_some_and(|count| unsafe { ptr::read_volatile(count) } != 0)
}

/// The slot holding `key`, searched in its whole window: a freed slot
/// leaves a hole, so a free one does not end the search.
#[inline(always)]
fn find(key: &LiveKey, home: u32) -> Option<&'static mut LiveEntry> {
    // A free of this address would match a slot being written.
    if key.address == LIVE_CLAIMED {
        return None;
    }
    for step in 0..LIVE_WINDOW {
        let slot = LIVE.get_ptr_mut(home.wrapping_add(step) & slot_mask())?;
        // SAFETY: a slot of the array, read field by field.
        let slot = unsafe { &mut *slot };
        // SAFETY: as above.
        let address = unsafe { ptr::read_volatile(&slot.key.address) };
        if address == key.address
            && slot.key.tgid == key.tgid
            && slot.key.generation == key.generation
        {
            return Some(slot);
        }
    }
    None
}

/// Counts a block in against `--max-live`; false when the table is full.
#[inline(always)]
fn reserve() -> bool {
    let Some(used) = LIVE_USED.get_ptr_mut(LIVE_USED_BLOCKS) else {
        return false;
    };
    // SAFETY: an aligned u64 of the array, changed atomically only.
    let before = unsafe { fetch_add(used, 1) };
    if before >= max_live() {
        unreserve();
        return false;
    }
    true
}

#[inline(always)]
fn unreserve() {
    add(LIVE_USED_BLOCKS, u64::MAX);
}

/// Adds `value` to the counter `LIVE_USED[index]` (2^64 - 1 takes one off).
#[inline(always)]
fn add(index: u32, value: u64) {
    if let Some(counter) = LIVE_USED.get_ptr_mut(index) {
        // SAFETY: an aligned u64 of the array, changed atomically only.
        unsafe { fetch_add(counter, value) };
    }
}
