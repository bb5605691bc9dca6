//! The kernel's pointer table (`--live`) as user space sees it: the BPF
//! array `LIVE` mapped into memory (reading it slot by slot through the
//! bpf syscall would take a call per slot), and its block count
//! `LIVE_USED`. The layout and the meaning of a slot's address word are
//! in `memprof_common::LiveEntry`.
use std::{
    num::NonZeroUsize,
    os::fd::AsFd as _,
    ptr::NonNull,
    sync::atomic::{fence, AtomicU64, Ordering},
};

use anyhow::{bail, Context as _, Result};
use aya::{
    maps::{Map, MapData},
    Ebpf,
};
use memprof_common::{LiveBlock, LiveEntry, LiveKey, LIVE_CLAIMED, LIVE_EMPTY};
use nix::sys::mman::{mmap, munmap, MapFlags, ProtFlags};

/// A shared, writable mapping of one BPF array map.
struct Mapping {
    address: NonNull<std::ffi::c_void>,
    length: usize,
    entries: usize,
}

impl Mapping {
    fn new<T>(ebpf: &Ebpf, name: &str) -> Result<Mapping> {
        let Some(Map::Array(data)) = ebpf.map(name) else {
            bail!("map {name} is not a BPF array");
        };
        let data: &MapData = data;
        let info = data.info().with_context(|| format!("map {name}"))?;
        // The kernel lays an array's values out every value size rounded
        // up to 8 bytes: the stride is size_of::<T>() only if that is exact.
        if info.value_size() as usize != size_of::<T>() || !size_of::<T>().is_multiple_of(8) {
            bail!("map {name}: values of {} bytes", info.value_size());
        }
        let entries = info.max_entries() as usize;
        let length = NonZeroUsize::new(entries * size_of::<T>()).context("empty map")?;
        // SAFETY: a new shared mapping of the map's memory; nothing else in
        // this process aliases it.
        let address = unsafe {
            mmap(
                None,
                length,
                ProtFlags::PROT_READ | ProtFlags::PROT_WRITE,
                MapFlags::MAP_SHARED,
                data.fd().as_fd(),
                0,
            )
        }
        .with_context(|| format!("mapping {name} into memory"))?;
        Ok(Mapping {
            address,
            length: length.get(),
            entries,
        })
    }
}

impl Drop for Mapping {
    fn drop(&mut self) {
        // SAFETY: the mapping made in `new`, unmapped once.
        let _ = unsafe { munmap(self.address, self.length) };
    }
}

/// Words in a slot.
const SLOT_WORDS: usize = size_of::<LiveEntry>() / 8;

/// One tracked block and the slot it was read from.
#[derive(Clone, Copy, Debug)]
pub struct Tracked {
    pub key: LiveKey,
    pub block: LiveBlock,
    slot: usize,
}

pub struct LiveTable {
    slots: Mapping,
    used: Mapping,
}

impl LiveTable {
    pub fn open(ebpf: &Ebpf) -> Result<LiveTable> {
        Ok(LiveTable {
            slots: Mapping::new::<LiveEntry>(ebpf, "LIVE")?,
            used: Mapping::new::<u64>(ebpf, "LIVE_USED")?,
        })
    }

    fn address_word(&self, slot: usize) -> &AtomicU64 {
        let entry = self.slots.address.cast::<LiveEntry>().as_ptr();
        // SAFETY: `slot` < entries; the word is 8-aligned in the mapping
        // (the kernel's array) and only changed atomically or whole.
        unsafe { AtomicU64::from_ptr(&raw mut (*entry.add(slot)).key.address) }
    }

    /// A copy of one slot, word by word (BPF programs write it meanwhile).
    fn read_slot(&self, slot: usize) -> LiveEntry {
        let base = self.slots.address.cast::<u64>().as_ptr();
        let mut words = [0u64; SLOT_WORDS];
        for (index, word) in words.iter_mut().enumerate() {
            // SAFETY: a word of slot `slot` < entries, 8-aligned in the mapping.
            let shared = unsafe { AtomicU64::from_ptr(base.add(slot * SLOT_WORDS + index)) };
            *word = shared.load(Ordering::Relaxed);
        }
        // SAFETY: LiveEntry is plain integers, SLOT_WORDS words, align 8.
        unsafe { words.as_ptr().cast::<LiveEntry>().read() }
    }

    /// Every block in the table. BPF programs change slots while this
    /// reads: a slot is taken only if two copies of it agree and hold a
    /// block, so a block being written or freed is left out of this scan
    /// rather than read half-written.
    pub fn blocks(&self) -> Vec<Tracked> {
        let mut blocks = Vec::new();
        for slot in 0..self.slots.entries {
            let address = self.address_word(slot).load(Ordering::Acquire);
            if address == LIVE_EMPTY || address == LIVE_CLAIMED {
                continue;
            }
            let first = self.read_slot(slot);
            fence(Ordering::Acquire);
            let second = self.read_slot(slot);
            if first == second && first.key.address == address {
                blocks.push(Tracked {
                    key: first.key,
                    block: first.block,
                    slot,
                });
            }
        }
        blocks
    }

    /// Drops a block found by [`blocks`](Self::blocks) (of a process image
    /// that ended: no thread of it can free it meanwhile).
    pub fn drop_block(&self, tracked: &Tracked) {
        let dropped = self
            .address_word(tracked.slot)
            .compare_exchange(
                tracked.key.address,
                LIVE_EMPTY,
                Ordering::AcqRel,
                Ordering::Relaxed,
            )
            .is_ok();
        if dropped {
            // SAFETY: the one u64 of LIVE_USED, changed atomically only.
            let used = unsafe { AtomicU64::from_ptr(self.used.address.cast::<u64>().as_ptr()) };
            used.fetch_sub(1, Ordering::AcqRel);
        }
    }
}
