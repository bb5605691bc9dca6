//! `--live`: the pointer table. Each block an allocator returns is kept
//! with its call site and time until it is freed; the call site's stats
//! carry the live bytes and count, and how many blocks died young.
//!
//! Data path: allocator entry -> `begin` (per-thread pending call) ->
//! allocator return -> `complete` (table insert, stats) -> `free` entry ->
//! `release` (table take, stats). The table itself: `live_table`; where
//! the stats are: `site_ids`.
use aya_ebpf::{
    helpers::{bpf_get_current_pid_tgid, bpf_probe_read_user, generated::bpf_ktime_get_ns},
    maps::PerCpuHashMap,
    programs::ProbeContext,
};
use memprof_common::{
    allocators::NO_ARG,
    cookies::{Args, ProbeCookie},
    dispatch::LibraryCode,
    images::ProcessImage,
    live::{LiveBlock, LiveKey, NO_SITE_ID},
    lost::LostCause,
    sites::{AllocKey, AllocStats, Weight},
    thread::PendingCall,
};

use crate::{
    accounting::{
        heap, live_table,
        live_table::Inserted,
        sampler::sampling,
        site_ids,
        site_table::return_address,
        sites::{add, counted},
        thread::thread_state,
    },
    kernel::maps::{count_lost, BPF_NOEXIST, COUNTS, INTERNAL_FREES, UNKNOWN_FREES},
};

/// Blocks freed sooner than this after their allocation are "temporary"
/// (`--temp-threshold`); set by user space before load.
#[unsafe(no_mangle)]
static TEMP_THRESHOLD_NS: u64 = 1_000_000;

#[inline(always)]
fn temp_threshold_ns() -> u64 {
    // SAFETY: a read-only global; volatile so the compiler keeps the read.
    unsafe { core::ptr::read_volatile(&TEMP_THRESHOLD_NS) }
}

/// Allocator entry: remember the call for its return probe. A block
/// given to realloc leaves the table now, before the allocator can hand
/// its address to another thread; the return puts it back if the call
/// failed.
#[inline(always)]
pub fn begin(
    pending: &mut PendingCall,
    heap_slot: u32,
    site: AllocKey,
    size: u64,
    weight: Weight,
    pointers: CallPointers,
) {
    pending.record = 1;
    pending.heap_slot = heap_slot;
    pending.site_id = site_ids::site_id(&site);
    pending.site = site;
    pending.size = size;
    pending.weight = weight;
    pending.out_pointer = pointers.out;
    take_old(pending, pointers.old);
}

/// The pointers an allocator call takes: where it stores its block
/// (posix_memalign), and the block it resizes (realloc); 0 for none.
/// Taken at the entry, kept instead of the six arguments (fewer bytes of
/// BPF stack across the stack walk).
#[derive(Clone, Copy)]
pub struct CallPointers {
    pub out: u64,
    pub old: u64,
}

impl CallPointers {
    #[inline(always)]
    pub fn of(cookie: ProbeCookie, args: Args) -> CallPointers {
        CallPointers {
            out: ProbeCookie::pointer_arg(args, cookie.out_pointer_arg),
            old: ProbeCookie::pointer_arg(args, cookie.old_pointer_arg),
        }
    }
}

/// Allocator entry of a call that is not sampled: its new block is not
/// recorded, but a block it moves or frees must still leave the table.
#[inline(always)]
pub fn begin_unrecorded(
    pending: &mut PendingCall,
    tgid: u32,
    generation: u32,
    cookie: ProbeCookie,
    size: u64,
    pointers: CallPointers,
) {
    if cookie.old_pointer_arg == NO_ARG {
        return;
    }
    pending.record = 0;
    pending.site_id = NO_SITE_ID;
    pending.site.tgid = tgid;
    pending.site.generation = generation;
    pending.size = size;
    pending.out_pointer = 0;
    take_old(pending, pointers.old);
}

#[inline(always)]
fn take_old(pending: &mut PendingCall, old_address: u64) {
    pending.active = 1;
    pending.old_address = old_address;
    pending.has_old = 0;
    if pending.old_address == 0 {
        return;
    }
    if let Some(old) = live_table::take(&live_key(&pending.site, pending.old_address)) {
        pending.old = old;
        pending.has_old = 1;
    }
}

/// Allocator return: count the call, track the block it returned, and
/// settle the block a realloc was given.
#[inline(always)]
pub fn complete(pending: &PendingCall, returned: u64) {
    let site = &pending.site;
    let address = if pending.out_pointer == 0 {
        returned
    } else if returned == 0 {
        // posix_memalign returns 0 on success, the block through its argument.
        // SAFETY: a checked read of user memory.
        unsafe { bpf_probe_read_user(pending.out_pointer as *const u64) }.unwrap_or_else(|_| {
            count_lost(LostCause::ReadFault);
            0
        })
    } else {
        0
    };
    // SAFETY: reads the clock.
    let now = unsafe { bpf_ktime_get_ns() };
    // The old block is settled first: a block realloc moved must not
    // count twice in the process's heap (and its peak).
    if pending.old_address != 0 {
        // realloc moved or freed the old block unless it failed (NULL for
        // a non-zero size), in which case the old block stays as it was.
        let released = address != 0 || pending.size == 0;
        if pending.has_old == 0 {
            if released {
                unknown_free(site.tgid, site.generation);
            }
        } else if released {
            // Moved, the block lives on under the realloc's call site (and
            // keeps its age): not a temporary. realloc(p, 0) freed it.
            let moved = address != 0;
            release(&pending.old, now, !moved);
        } else if !track(&live_key(site, pending.old_address), &pending.old, now) {
            // Its room went to another block meanwhile: the block stays
            // allocated, untracked from now on.
            release(&pending.old, now, false);
        }
    }
    if pending.record != 0 {
        record(pending, address, now);
    }
}

/// Counts a recorded call and tracks the block it returned, if any.
#[inline(always)]
fn record(pending: &PendingCall, address: u64, now: u64) {
    let site = &pending.site;
    let weight = pending.weight;
    let mut stats = counted(weight);
    if address != 0 {
        // A block realloc moved is the same block to its owner: it keeps the
        // time it was first allocated, so a buffer grown for an hour is an
        // hour old (and shows under --min-age).
        let born = if pending.has_old != 0 {
            pending.old.time_ns
        } else {
            now
        };
        let block = LiveBlock {
            site: *site,
            size: pending.size,
            time_ns: born,
            weight,
            site_id: pending.site_id,
            heap_slot: pending.heap_slot,
        };
        if track(&live_key(site, address), &block, now) {
            stats.live_bytes = weight.bytes;
            stats.live_count = weight.unit;
        } else {
            stats.untracked_count = weight.unit;
        }
    }
    if let Some(current) = site_ids::stats_of(pending.site_id) {
        *current = current.merged(stats);
    } else if !add(site, &stats) && stats.live_count != 0 {
        // Not counted, so not tracked either: the stats would never match.
        let _ = live_table::take(&live_key(site, address));
        return;
    }
    if stats.live_count != 0 {
        let slot = pending.heap_slot;
        heap::grow(
            slot,
            site.tgid,
            site.generation,
            weight.bytes,
            weight.unit,
            now,
        );
    }
}

/// Puts a block in the table. False when the table is full.
#[inline(always)]
fn track(key: &LiveKey, block: &LiveBlock, now: u64) -> bool {
    match live_table::insert(key, block) {
        Inserted::New => true,
        Inserted::Replaced(stale) => {
            // The allocator handed out an address memprof still holds: the
            // block that was there was freed unseen. Settle it, count it.
            count_lost(LostCause::MissedFree);
            release(&stale, now, false);
            true
        }
        Inserted::Full => {
            count_lost(LostCause::LiveTableFull);
            false
        }
    }
}

/// A tracked block was freed (or moved): take it off its call site's live
/// figures; a freed one is temporary if it lived less than the threshold.
#[inline(always)]
fn release(block: &LiveBlock, now: u64, freed: bool) {
    let (bytes, count) = (block.weight.bytes, block.weight.unit);
    heap::shrink(
        block.heap_slot,
        block.site.tgid,
        block.site.generation,
        bytes,
        count,
    );
    let mut stats = AllocStats {
        live_bytes: 0u64.wrapping_sub(block.weight.bytes),
        live_count: 0u64.wrapping_sub(block.weight.unit),
        ..AllocStats::default()
    };
    if freed && now.wrapping_sub(block.time_ns) < temp_threshold_ns() {
        stats.temporary_count = block.weight.unit;
    }
    if let Some(current) = site_ids::stats_of(block.site_id) {
        *current = current.merged(stats);
    } else if let Some(current) = COUNTS.get_ptr_mut(block.site) {
        // SAFETY: the value of a successful lookup, in map memory.
        unsafe { crate::accounting::sites::add_atomically(current, &stats) };
    }
}

/// A free of a block memprof never saw allocated. Not counted when
/// sampling or recording only some calls (--while, --delay...): most
/// blocks are not recorded, so most frees are unknown.
#[inline(always)]
fn unknown_free(tgid: u32, generation: u32) {
    if sampling() || !crate::accounting::regions::every_call() {
        return;
    }
    count_per_image(&UNKNOWN_FREES, tgid, generation);
}

#[inline(always)]
fn count_per_image(map: &PerCpuHashMap<ProcessImage, u64>, tgid: u32, generation: u32) {
    let image = ProcessImage { tgid, generation };
    if let Some(count) = map.get_ptr_mut(image) {
        // SAFETY: per-CPU value of a successful lookup.
        unsafe { *count += 1 };
    } else {
        let _ = map.insert(image, 1, BPF_NOEXIST);
    }
}

#[inline(always)]
fn live_key(site: &AllocKey, address: u64) -> LiveKey {
    LiveKey {
        tgid: site.tgid,
        generation: site.generation,
        address,
    }
}

/// Entry of `free`: the block leaves the table. Runs inside `site_enter`
/// (no tail call), which passes the site's cookie: the library's code
/// range (see `called_from_library`).
#[inline(always)]
pub fn free_entered(ctx: &ProbeContext, library_code: u64) -> u32 {
    let address: u64 = ctx.arg(0).unwrap_or(0);
    release_at(ctx, address, Some(library_code))
}

/// A USDT `free(ptr)`: the program frees a block it sampled.
#[inline(always)]
pub fn release_usdt(ctx: &ProbeContext, address: u64) -> u32 {
    release_at(ctx, address, None)
}

/// `address` leaves the table. `free_library_code`: the call is free, and
/// this is its library's code range; `None`: the call is not free itself
/// and may go on to call free with the same block (libstdc++'s operator
/// delete does): that free is the same release.
#[inline(always)]
pub fn release_at(ctx: &ProbeContext, address: u64, free_library_code: Option<u64>) -> u32 {
    let releaser = free_library_code.is_none();
    if address == 0 {
        return 0;
    }
    // With sampling, most frees are of blocks never tracked: they end here,
    // before the thread's state is looked up (what it keeps for the next
    // free only tells apart frees of unknown blocks, not counted then).
    let probe = LiveKey {
        tgid: (bpf_get_current_pid_tgid() >> 32) as u32,
        generation: 0,
        address,
    };
    if !live_table::may_hold(&probe) {
        return 0;
    }
    let Some(thread) = thread_state() else {
        count_lost(LostCause::ThreadTableFull);
        return 0;
    };
    // glibc's realloc(p, 0) frees p through free: the realloc settles it.
    if thread.depth > 0 {
        return 0;
    }
    let key = LiveKey {
        tgid: thread.tgid,
        generation: thread.generation,
        address,
    };
    // SAFETY: the probe's registers.
    let sp = unsafe { (*ctx.regs).rsp };
    let inner_call = thread.last_released == address && sp <= thread.last_released_sp;
    thread.last_released = if releaser { address } else { 0 };
    thread.last_released_sp = sp;
    match live_table::take(&key) {
        Some(block) => {
            // SAFETY: reads the clock.
            release(&block, unsafe { bpf_ktime_get_ns() }, true);
        }
        // A call made inside (or jumped to from) the releaser that just
        // released this block, with no allocator call between (that
        // clears it): the same release, not an unknown block.
        None if inner_call => {}
        // Sampling: most blocks are not tracked, so most frees are unknown.
        None if sampling() || !crate::accounting::regions::every_call() => {}
        None if free_library_code.is_some_and(|code| called_from_library(ctx, code)) => {
            count_per_image(&INTERNAL_FREES, key.tgid, key.generation)
        }
        None => unknown_free(key.tgid, key.generation),
    }
    0
}

/// Whether free was called from the C library's own code. A block memprof
/// never saw that the library frees itself is one it took without going
/// through malloc's entry: glibc's per-thread cache (allocated with its
/// internal `_int_malloc`), and at a thread's exit the cached blocks it
/// hands back (`tcache_thread_shutdown`), which the program freed before.
/// Not the program's. `library_code`, free's site cookie, holds the
/// library's code around the probe ([`LibraryCode`], 0: unknown).
#[inline(always)]
fn called_from_library(ctx: &ProbeContext, library_code: u64) -> bool {
    let code = LibraryCode::decode(library_code);
    // SAFETY: the probe's registers.
    let rip = unsafe { (*ctx.regs).rip };
    code.above != 0 && return_address(ctx).is_some_and(|address| code.contains(rip, address))
}
