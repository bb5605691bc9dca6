//! The kernel's pointer table (`--live`) as user space sees it: the BPF
//! array `LIVE` mapped into memory (reading it slot by slot through the
//! bpf syscall would take a call per slot), and its block count
//! `LIVE_USED`, and the blocks that found no slot near their hash in
//! the BPF hash map `LIVE_OVERFLOW` (read through the syscall: it holds
//! few). The layout and the meaning of a slot's address word are in
//! `memprof_common::live::LiveEntry`.
//!
//! The kernel maps all pages of a mapping of a BPF array at once, and they
//! count in this process's RSS while mapped: the table (88 MiB by default)
//! is mapped a window at a time.
use std::{
    collections::HashMap,
    num::NonZeroUsize,
    os::fd::{AsFd as _, BorrowedFd},
    ptr::NonNull,
    sync::atomic::{fence, AtomicU64, Ordering},
};

use anyhow::{bail, Context as _, Result};
use aya::{
    maps::{HashMap as BpfHashMap, Map, MapData, MapError},
    Ebpf,
};
use memprof_common::live::{
    LiveBlock, LiveEntry, LiveKey, LIVE_BUCKET_COUNT, LIVE_CLAIMED, LIVE_EMPTY, LIVE_USED_BLOCKS,
    LIVE_USED_OVERFLOW,
};
use nix::{
    sys::mman::{mmap, munmap, MapFlags, ProtFlags},
    unistd::{sysconf, SysconfVar},
};

/// Words in a slot.
const SLOT_WORDS: usize = size_of::<LiveEntry>() / 8;
const SLOT_BYTES: usize = size_of::<LiveEntry>();
/// Bytes of the table mapped at a time.
const WINDOW_BYTES: usize = 1 << 20;

/// A shared, writable mapping of part of a BPF array map's values.
pub(crate) struct Mapping {
    address: NonNull<std::ffi::c_void>,
    length: usize,
}

impl Mapping {
    /// Maps `length` bytes from `offset` (a multiple of the page size).
    pub(crate) fn new(fd: BorrowedFd<'_>, offset: usize, length: usize) -> Result<Mapping> {
        let size = NonZeroUsize::new(length).context("empty mapping")?;
        // SAFETY: a new shared mapping of the map's memory; nothing else in
        // this process aliases it.
        let address = unsafe {
            mmap(
                None,
                size,
                ProtFlags::PROT_READ | ProtFlags::PROT_WRITE,
                MapFlags::MAP_SHARED,
                fd,
                offset as i64,
            )
        }
        .context("mapping a BPF array into memory")?;
        Ok(Mapping { address, length })
    }

    /// The u64 at `offset` bytes into the mapping.
    pub(crate) fn word(&self, offset: usize) -> &AtomicU64 {
        assert!(offset.is_multiple_of(8) && offset + 8 <= self.length);
        // SAFETY: in the mapping and 8-aligned (checked); the kernel's
        // memory, only changed whole or atomically.
        unsafe { AtomicU64::from_ptr(self.address.cast::<u8>().as_ptr().add(offset).cast()) }
    }
}

impl Drop for Mapping {
    fn drop(&mut self) {
        // SAFETY: the mapping made in `new`, unmapped once.
        let _ = unsafe { munmap(self.address, self.length) };
    }
}

/// One tracked block and where it was read from.
#[derive(Clone, Copy, Debug)]
pub struct Tracked {
    pub key: LiveKey,
    pub block: LiveBlock,
    place: Place,
}

#[derive(Clone, Copy, Debug)]
enum Place {
    /// A slot of `LIVE`.
    Slot(usize),
    /// `LIVE_OVERFLOW`, under its key.
    Overflow,
}

/// The part of the table one mapping covers: the slots that start in
/// `[start, start + WINDOW_BYTES)`, with room for the last one to end.
struct Window {
    mapping: Mapping,
    start: usize,
}

impl Window {
    fn address_word(&self, slot: usize) -> &AtomicU64 {
        self.mapping
            .word(slot * SLOT_BYTES - self.start + std::mem::offset_of!(LiveKey, address))
    }

    /// A copy of one slot, word by word (BPF programs write it meanwhile).
    fn read_slot(&self, slot: usize) -> LiveEntry {
        let mut words = [0u64; SLOT_WORDS];
        for (index, word) in words.iter_mut().enumerate() {
            *word = self
                .mapping
                .word(slot * SLOT_BYTES - self.start + index * 8)
                .load(Ordering::Relaxed);
        }
        // SAFETY: LiveEntry is plain integers, SLOT_WORDS words, align 8.
        unsafe { words.as_ptr().cast::<LiveEntry>().read() }
    }
}

pub struct LiveTable<'a> {
    fd: BorrowedFd<'a>,
    /// `LIVE_BUCKETS` (mapped when blocks are dropped).
    buckets: BorrowedFd<'a>,
    slots: usize,
    page: usize,
    used: Mapping,
    overflow: BpfHashMap<MapData, LiveKey, LiveBlock>,
    /// Entries `LIVE_OVERFLOW` holds at most.
    overflow_entries: usize,
}

impl<'a> LiveTable<'a> {
    pub fn open(ebpf: &'a Ebpf) -> Result<LiveTable<'a>> {
        let (fd, slots) = array(ebpf, "LIVE", SLOT_BYTES)?;
        let (used_fd, _) = array(ebpf, "LIVE_USED", size_of::<u64>())?;
        let (buckets, _) = array(ebpf, "LIVE_BUCKETS", size_of::<u64>())?;
        let page = page_size()?;
        let Some(Map::HashMap(overflow)) = ebpf.map("LIVE_OVERFLOW") else {
            bail!("map LIVE_OVERFLOW is not a BPF hash map");
        };
        // A map of its own (a second fd): removing entries needs one.
        let overflow = MapData::from_fd(overflow.fd().as_fd().try_clone_to_owned()?)
            .context("map LIVE_OVERFLOW")?;
        let overflow_entries = overflow.info()?.max_entries() as usize;
        Ok(LiveTable {
            fd,
            buckets,
            slots,
            page,
            used: Mapping::new(used_fd, 0, page)?,
            overflow: BpfHashMap::try_from(Map::HashMap(overflow))?,
            overflow_entries,
        })
    }

    /// The blocks the table holds now (its slots and the overflow map).
    pub fn used_blocks(&self) -> u64 {
        self.used
            .word(8 * LIVE_USED_BLOCKS as usize)
            .load(Ordering::Acquire)
    }

    /// Maps the window of the table that holds slots starting at `start`
    /// (a multiple of WINDOW_BYTES).
    fn window(&self, start: usize) -> Result<Window> {
        let table_end = (self.slots * SLOT_BYTES).next_multiple_of(self.page);
        let end = (start + WINDOW_BYTES + self.page).min(table_end);
        Ok(Window {
            mapping: Mapping::new(self.fd, start, end - start)?,
            start,
        })
    }

    /// The slots that start in the window at `start`.
    fn slots_from(&self, start: usize) -> std::ops::Range<usize> {
        start.div_ceil(SLOT_BYTES)..(start + WINDOW_BYTES).div_ceil(SLOT_BYTES).min(self.slots)
    }

    /// Every block in the table. BPF programs change slots while this
    /// reads: a slot is taken only if two copies of it agree and hold a
    /// block, so a block being written or freed is left out of this scan
    /// rather than read half-written.
    pub fn blocks(&self) -> Result<Vec<Tracked>> {
        let mut blocks = Vec::new();
        for start in (0..self.slots * SLOT_BYTES).step_by(WINDOW_BYTES) {
            let window = self.window(start)?;
            for slot in self.slots_from(start) {
                let address = window.address_word(slot).load(Ordering::Acquire);
                if address == LIVE_EMPTY || address == LIVE_CLAIMED {
                    continue;
                }
                let first = window.read_slot(slot);
                fence(Ordering::Acquire);
                let second = window.read_slot(slot);
                if first == second && first.key.address == address {
                    blocks.push(Tracked {
                        key: first.key,
                        block: first.block,
                        place: Place::Slot(slot),
                    });
                }
            }
        }
        blocks.extend(self.overflowed()?);
        Ok(blocks)
    }

    /// The blocks in the overflow map. Its keys are walked while BPF
    /// programs add and remove entries: a walk whose key was removed
    /// starts over (so a block can be read twice: kept once), and an
    /// entry removed and reused meanwhile could be read half old, half
    /// new: each is read twice and kept if both copies agree.
    fn overflowed(&self) -> Result<Vec<Tracked>> {
        if self
            .used
            .word(8 * LIVE_USED_OVERFLOW as usize)
            .load(Ordering::Acquire)
            == 0
        {
            return Ok(Vec::new());
        }
        let mut blocks = HashMap::new();
        // Bounded: a walk that starts over again and again ends.
        let most = 4 * self.overflow_entries + 1024;
        for key in self.overflow.keys().take(most) {
            let key = key.context("reading map LIVE_OVERFLOW")?;
            let read = |key: &LiveKey| match self.overflow.get(key, 0) {
                Ok(block) => Ok(Some(block)),
                Err(MapError::KeyNotFound) => Ok(None),
                Err(error) => Err(error).context("reading map LIVE_OVERFLOW"),
            };
            if let (Some(first), Some(second)) = (read(&key)?, read(&key)?) {
                if first == second {
                    blocks.insert(key, first);
                }
            }
        }
        Ok(blocks
            .into_iter()
            .map(|(key, block)| Tracked {
                key,
                block,
                place: Place::Overflow,
            })
            .collect())
    }

    /// Drops blocks found by [`blocks`](Self::blocks) (of process images
    /// that ended: no thread of theirs can free them meanwhile).
    pub fn drop_blocks(&mut self, blocks: &[Tracked]) -> Result<()> {
        let mut slots = Vec::new();
        let mut overflowed = Vec::new();
        for tracked in blocks {
            match tracked.place {
                Place::Slot(slot) => slots.push((slot, tracked.key)),
                Place::Overflow => overflowed.push(tracked.key),
            }
        }
        slots.sort_unstable_by_key(|&(slot, _)| slot);
        let mut dropped = Vec::new();
        let result = self.drop_sorted(&slots, &mut dropped);
        // Only if it is still there (the program that put it may have taken
        // it out since); no thread of an ended image puts it back.
        let mut dropped_overflowed = 0;
        for key in overflowed {
            if self.overflow.remove(&key).is_ok() {
                dropped_overflowed += 1;
                dropped.push(key);
            }
        }
        // Even when a window could not be mapped: what was dropped is gone.
        let counter = |index: u32| self.used.word(8 * index as usize);
        counter(LIVE_USED_OVERFLOW).fetch_sub(dropped_overflowed, Ordering::AcqRel);
        counter(LIVE_USED_BLOCKS).fetch_sub(dropped.len() as u64, Ordering::AcqRel);
        result.and(self.take_out_of_buckets(&dropped))
    }

    /// Takes dropped blocks off their buckets' counts (kept with sampling
    /// only: a count already 0 stays so).
    fn take_out_of_buckets(&self, dropped: &[LiveKey]) -> Result<()> {
        if dropped.is_empty() {
            return Ok(());
        }
        let buckets = Mapping::new(self.buckets, 0, LIVE_BUCKET_COUNT as usize * 8)?;
        for key in dropped {
            let count = buckets.word(8 * LiveEntry::bucket(key) as usize);
            let _ = count.fetch_update(Ordering::AcqRel, Ordering::Acquire, |count| {
                count.checked_sub(1)
            });
        }
        Ok(())
    }

    fn drop_sorted(&self, slots: &[(usize, LiveKey)], dropped: &mut Vec<LiveKey>) -> Result<()> {
        let mut window: Option<Window> = None;
        for &(slot, key) in slots {
            let start = slot * SLOT_BYTES / WINDOW_BYTES * WINDOW_BYTES;
            if window.as_ref().is_none_or(|window| window.start != start) {
                window = Some(self.window(start)?);
            }
            let window = window.as_ref().expect("just mapped");
            // Only if it still holds that block.
            if window
                .address_word(slot)
                .compare_exchange(key.address, LIVE_EMPTY, Ordering::AcqRel, Ordering::Relaxed)
                .is_ok()
            {
                dropped.push(key);
            }
        }
        Ok(())
    }
}

pub(crate) fn page_size() -> Result<usize> {
    Ok(sysconf(SysconfVar::PAGE_SIZE)
        .ok()
        .flatten()
        .context("page size")? as usize)
}

/// A BPF array's fd and entry count, checked to hold values of `size`
/// bytes laid out `size` apart (the kernel strides by the value size
/// rounded up to 8).
pub(crate) fn array<'a>(
    ebpf: &'a Ebpf,
    name: &str,
    size: usize,
) -> Result<(BorrowedFd<'a>, usize)> {
    let Some(Map::Array(data)) = ebpf.map(name) else {
        bail!("map {name} is not a BPF array");
    };
    let data: &MapData = data;
    let info = data.info().with_context(|| format!("map {name}"))?;
    if info.value_size() as usize != size || !size.is_multiple_of(8) {
        bail!("map {name}: values of {} bytes", info.value_size());
    }
    Ok((data.fd().as_fd(), info.max_entries() as usize))
}
