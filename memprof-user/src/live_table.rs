//! The kernel's pointer table (`--live`) as user space sees it: the BPF
//! array `LIVE` mapped into memory (reading it slot by slot through the
//! bpf syscall would take a call per slot), and its block count
//! `LIVE_USED`. The layout and the meaning of a slot's address word are
//! in `memprof_common::LiveEntry`.
//!
//! The kernel maps all pages of a mapping of a BPF array at once, and they
//! count in this process's RSS while mapped: the table (88 MiB by default)
//! is mapped a window at a time.
use std::{
    num::NonZeroUsize,
    os::fd::{AsFd as _, BorrowedFd},
    ptr::NonNull,
    sync::atomic::{fence, AtomicU64, Ordering},
};

use anyhow::{bail, Context as _, Result};
use aya::{
    maps::{Map, MapData},
    Ebpf,
};
use memprof_common::{LiveBlock, LiveEntry, LiveKey, LIVE_CLAIMED, LIVE_EMPTY};
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
struct Mapping {
    address: NonNull<std::ffi::c_void>,
    length: usize,
}

impl Mapping {
    /// Maps `length` bytes from `offset` (a multiple of the page size).
    fn new(fd: BorrowedFd<'_>, offset: usize, length: usize) -> Result<Mapping> {
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
        .context("mapping the pointer table into memory")?;
        Ok(Mapping { address, length })
    }

    /// The u64 at `offset` bytes into the mapping.
    fn word(&self, offset: usize) -> &AtomicU64 {
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

/// One tracked block and the slot it was read from.
#[derive(Clone, Copy, Debug)]
pub struct Tracked {
    pub key: LiveKey,
    pub block: LiveBlock,
    slot: usize,
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
    slots: usize,
    page: usize,
    used: Mapping,
}

impl<'a> LiveTable<'a> {
    pub fn open(ebpf: &'a Ebpf) -> Result<LiveTable<'a>> {
        let (fd, slots) = array(ebpf, "LIVE", SLOT_BYTES)?;
        let (used_fd, _) = array(ebpf, "LIVE_USED", size_of::<u64>())?;
        let page = sysconf(SysconfVar::PAGE_SIZE)
            .ok()
            .flatten()
            .context("page size")? as usize;
        Ok(LiveTable {
            fd,
            slots,
            page,
            used: Mapping::new(used_fd, 0, page)?,
        })
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
                        slot,
                    });
                }
            }
        }
        Ok(blocks)
    }

    /// Drops blocks found by [`blocks`](Self::blocks) (of process images
    /// that ended: no thread of theirs can free them meanwhile).
    pub fn drop_blocks(&self, blocks: &[Tracked]) -> Result<()> {
        let mut slots: Vec<(usize, u64)> = blocks.iter().map(|t| (t.slot, t.key.address)).collect();
        slots.sort_unstable();
        let mut dropped = 0;
        let result = self.drop_sorted(&slots, &mut dropped);
        // Even when a window could not be mapped: what was dropped is gone.
        self.used.word(0).fetch_sub(dropped, Ordering::AcqRel);
        result
    }

    fn drop_sorted(&self, slots: &[(usize, u64)], dropped: &mut u64) -> Result<()> {
        let mut window: Option<Window> = None;
        for &(slot, address) in slots {
            let start = slot * SLOT_BYTES / WINDOW_BYTES * WINDOW_BYTES;
            if window.as_ref().is_none_or(|window| window.start != start) {
                window = Some(self.window(start)?);
            }
            let window = window.as_ref().expect("just mapped");
            // Only if it still holds that block.
            *dropped += u64::from(
                window
                    .address_word(slot)
                    .compare_exchange(address, LIVE_EMPTY, Ordering::AcqRel, Ordering::Relaxed)
                    .is_ok(),
            );
        }
        Ok(())
    }
}

/// A BPF array's fd and entry count, checked to hold values of `size`
/// bytes laid out `size` apart (the kernel strides by the value size
/// rounded up to 8).
fn array<'a>(ebpf: &'a Ebpf, name: &str, size: usize) -> Result<(BorrowedFd<'a>, usize)> {
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
