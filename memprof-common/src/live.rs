//! `--live`: the pointer table's keys, blocks and slots, and each
//! process image's exact heap.
use crate::{
    images::ProcessImage,
    sites::{AllocKey, Weight},
};
/// Key of the pointer table (`--live`): one block of one process image.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub struct LiveKey {
    pub tgid: u32,
    pub generation: u32,
    /// The address the allocator returned.
    pub address: u64,
}

impl LiveKey {
    /// The process image the block belongs to.
    pub fn image(&self) -> ProcessImage {
        ProcessImage {
            tgid: self.tgid,
            generation: self.generation,
        }
    }
}

/// Value of the pointer table: where and when a live block was allocated.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct LiveBlock {
    /// The call site's key in the totals map.
    pub site: AllocKey,
    /// Bytes requested.
    pub size: u64,
    /// `bpf_ktime_get_ns()` (CLOCK_MONOTONIC) at the allocator's return.
    pub time_ns: u64,
    /// What the block counts for in the stats (see [`Weight`]).
    pub weight: Weight,
    /// Where its call site's stats are (`SITE_STATS`), or [`NO_SITE_ID`]
    /// when they are in `COUNTS`.
    pub site_id: u32,
    /// Its process's slot in `HEAPS` (see [`ProcHeap`]).
    pub heap_slot: u32,
}

/// `--live`: one process image's heap, kept exact in the kernel at every
/// allocation and free (a BPF array indexed by the image's slot; user
/// space maps it into memory). Slots are handed out in turn and reused
/// after [`HEAP_SLOTS`] images: `owner` says whose figures a slot holds.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct ProcHeap {
    /// [`ProcHeap::owner_of`] the image; 0 while the slot is unused.
    pub owner: u64,
    /// What the image holds now (in weighed units when sampling).
    pub live_bytes: u64,
    pub live_count: u64,
    /// The largest values `live_bytes` and `live_count` ever had: exact,
    /// each at its own moment.
    pub peak_bytes: u64,
    pub peak_count: u64,
    /// `bpf_ktime_get_ns()` when `peak_bytes` was reached.
    pub peak_time_ns: u64,
    /// `peak_bytes` when user space was last asked to capture the call
    /// sites holding the heap ([`NoticeKind::PeakGrown`]).
    pub snapshot_bytes: u64,
    pub reserved: u64,
}

/// Slots of the `HEAPS` array in live mode (a power of two): process
/// images alive at once beyond this share slots, and lose exact peaks.
pub const HEAP_SLOTS: u32 = 16384;

/// A block or thread whose process has no slot in `HEAPS`.
pub const NO_HEAP_SLOT: u32 = u32::MAX;

impl ProcHeap {
    #[inline(always)]
    pub const fn owner_of(tgid: u32, generation: u32) -> u64 {
        ((tgid as u64) << 32) | generation as u64
    }

    /// The peak has grown enough since the last capture of its call sites
    /// to ask for another: by 1/16, and by at least 4 KiB. A heap that
    /// grows from nothing to 1 GiB asks about 200 times.
    #[inline(always)]
    pub const fn snapshot_due(live_bytes: u64, snapshot_bytes: u64) -> bool {
        let step = if snapshot_bytes >> 4 > 4096 {
            snapshot_bytes >> 4
        } else {
            4096
        };
        live_bytes >= snapshot_bytes.saturating_add(step)
    }
}

/// `--live`: a call site without a slot of its own in `SITE_STATS` (the
/// table of ids was full); its stats are in `COUNTS`.
pub const NO_SITE_ID: u32 = u32::MAX;

/// One slot of the pointer table (`--live`): a BPF array used as an
/// open-addressing hash table, so that tracking a block takes no kernel
/// hash-map call. A block goes in the first free slot among
/// [`LIVE_WINDOW`] from [`LiveEntry::home`]; `key.address` says whether
/// a slot is free ([`LIVE_EMPTY`]), being written ([`LIVE_CLAIMED`]), or
/// holds that block. A block whose window is full goes to the overflow
/// map (BPF `LIVE_OVERFLOW`, a hash map of `--max-live` entries), so that
/// no block is lost below `--max-live`.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct LiveEntry {
    pub key: LiveKey,
    pub block: LiveBlock,
}

/// `LiveEntry::key.address` of a free slot (no tracked block is at 0).
pub const LIVE_EMPTY: u64 = 0;

/// `LiveEntry::key.address` of a slot taken and not yet written.
pub const LIVE_CLAIMED: u64 = u64::MAX;

/// Slots a block may take, from its home slot on (wrapping).
pub const LIVE_WINDOW: u32 = 16;

/// Index in the BPF array `LIVE_USED` of the tracked blocks (in the table
/// and in the overflow map), counted against `--max-live`.
pub const LIVE_USED_BLOCKS: u32 = 0;

/// Index in `LIVE_USED` of the blocks in the overflow map: while it is 0,
/// a block not in its window is not tracked, and no hash-map lookup is
/// made.
pub const LIVE_USED_OVERFLOW: u32 = 1;

/// Entries of `LIVE_USED`.
pub const LIVE_USED_COUNTERS: u32 = 2;

/// Entries of the BPF array `LIVE_BUCKETS`: with sampling, the blocks
/// tracked, by [`LiveEntry::bucket`] of their keys. Most frees are then of
/// blocks never sampled, and one whose bucket holds none skips the search
/// of its window.
pub const LIVE_BUCKET_COUNT: u32 = 1 << 15;

impl LiveEntry {
    /// The first slot a block's key may take, in a table of `mask + 1`
    /// slots (a power of two). Heap addresses are far from random (arenas,
    /// size classes, page-aligned large blocks: arithmetic progressions of
    /// many strides), so the key is mixed with MurmurHash3's finalizer
    /// (every input bit flips each output bit with chance about 1/2)
    /// before its low bits are taken: homes then behave as random ones
    /// whatever the pattern. (A plain multiplicative hash spreads some
    /// strides well and piles others up: taking its bits 32.. lost
    /// blocks of a C++ program's heap at a third of the table's load;
    /// its top bits put blocks 64 KiB apart in a quarter of the slots.)
    #[inline(always)]
    pub fn home(key: &LiveKey, mask: u32) -> u32 {
        let mut mixed = key.address ^ (u64::from(key.tgid) << 32);
        mixed ^= mixed >> 33;
        mixed = mixed.wrapping_mul(0xff51_afd7_ed55_8ccd);
        mixed ^= mixed >> 33;
        mixed = mixed.wrapping_mul(0xc4ce_b9fe_1a85_ec53);
        mixed ^= mixed >> 33;
        mixed as u32 & mask
    }

    /// The entry of `LIVE_BUCKETS` that counts the block of `key`.
    #[inline(always)]
    pub fn bucket(key: &LiveKey) -> u32 {
        LiveEntry::home(key, LIVE_BUCKET_COUNT - 1)
    }

    /// Slots of the table for `max_live` blocks: twice as many, so that a
    /// full table is half empty and a block almost always finds a free slot
    /// in its window (random homes, 500,000 blocks in 2^20 slots: one
    /// insert in a thousand finds none under churn, at a third of that
    /// load a few in a million); a power of two, at least twice the window.
    /// A block that finds none goes to the overflow map.
    pub fn table_slots(max_live: u32) -> u32 {
        max_live
            .saturating_mul(2)
            .max(2 * LIVE_WINDOW)
            .checked_next_power_of_two()
            .unwrap_or(1 << 31)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_pointer_table_has_twice_the_slots_as_a_power_of_two() {
        assert_eq!(LiveEntry::table_slots(1), 2 * LIVE_WINDOW);
        assert_eq!(LiveEntry::table_slots(10), 2 * LIVE_WINDOW);
        assert_eq!(LiveEntry::table_slots(500_000), 1 << 20);
        assert_eq!(LiveEntry::table_slots(524_288), 1 << 20);
        assert_eq!(LiveEntry::table_slots(524_289), 1 << 21);
        assert_eq!(LiveEntry::table_slots(u32::MAX), 1 << 31);
        // A block's home slot is in the table.
        let key = LiveKey {
            tgid: 7,
            generation: 1,
            address: 0x7f00_dead_beef,
        };
        assert!(LiveEntry::home(&key, 31) < 32);
    }

    /// Window-full inserts when `addresses` go into the table for
    /// `max_live` blocks, one after the other (no frees).
    fn window_full_inserts(addresses: impl Iterator<Item = u64>, max_live: u32) -> usize {
        extern crate std;
        let slots = LiveEntry::table_slots(max_live);
        let mut taken = std::vec![false; slots as usize];
        let mut full = 0;
        for address in addresses {
            let key = LiveKey {
                tgid: 4242,
                generation: 1,
                address,
            };
            let home = LiveEntry::home(&key, slots - 1);
            match (0..LIVE_WINDOW)
                .map(|step| (home + step) as usize & (slots as usize - 1))
                .find(|&slot| !taken[slot])
            {
                Some(slot) => taken[slot] = true,
                None => full += 1,
            }
        }
        full
    }

    #[test]
    fn homes_of_real_heap_addresses_spread_as_random_ones() {
        extern crate std;
        use std::{alloc, vec::Vec};
        // 0.9 x 500,000 blocks in 2^20 slots: with random homes, a few
        // dozen inserts find their window full (the overflow map takes
        // them); a hash that piles up a pattern's addresses, thousands.
        let blocks = 450_000usize;
        let bound = blocks / 1000;
        // glibc's malloc (the test's allocator): a third list nodes of 24
        // bytes back to back (std::list<int>), then small blocks of mixed
        // sizes, as C++ nodes and strings are; a tenth freed and taken
        // again.
        let layout = |i: usize| {
            let size = if i < blocks / 3 {
                24
            } else {
                16 + (i % 7) * 24
            };
            alloc::Layout::from_size_align(size, 8).unwrap()
        };
        // SAFETY: non-zero sizes; each block freed once, with its layout.
        let mut held: Vec<*mut u8> = (0..blocks)
            .map(|i| unsafe { alloc::alloc(layout(i)) })
            .collect();
        for i in (0..blocks).step_by(10) {
            // SAFETY: as above.
            unsafe { alloc::dealloc(held[i], layout(i)) };
        }
        for i in (0..blocks).step_by(10) {
            // SAFETY: as above.
            held[i] = unsafe { alloc::alloc(layout(i)) };
        }
        let glibc = window_full_inserts(held.iter().map(|&p| p as u64), 500_000);
        for (i, &p) in held.iter().enumerate() {
            // SAFETY: as above.
            unsafe { alloc::dealloc(p, layout(i)) };
        }
        // Large blocks (mmap'd: page-aligned, 16 bytes in), 64 KiB apart.
        let pages = window_full_inserts(
            (0..blocks as u64).map(|i| 0x7f12_3400_0010 + i * 65536),
            500_000,
        );
        // jemalloc-like: each size class carved from its own run.
        const CLASSES: [u64; 12] = [8, 16, 32, 48, 64, 80, 96, 128, 160, 256, 512, 1024];
        let mut next = CLASSES.map(|_| 0u64);
        let slabs = window_full_inserts(
            (0..blocks).map(|i| {
                let class = i * 7 % CLASSES.len();
                next[class] += CLASSES[class];
                0x7f00_0000_0000 + ((class as u64) << 30) + next[class]
            }),
            500_000,
        );
        assert!(
            glibc <= bound && pages <= bound && slabs <= bound,
            "window-full inserts: glibc {glibc}, pages {pages}, slabs {slabs}"
        );
    }

    #[test]
    fn a_slot_is_whole_words() {
        // The kernel strides an array's values by their size rounded up
        // to 8 bytes; user space reads slots word by word.
        assert_eq!(size_of::<LiveEntry>() % 8, 0);
    }
}
