//! `--live`: each call site's stats in a per-CPU array slot of its own,
//! found by an id the site gets on its first call. The allocation's
//! return counts the block there and the block's table entry keeps the
//! id, so its free finds the stats without hashing the site's key (each
//! `COUNTS` lookup costs ≈ 50 ns here). The entry finds the id: the last
//! site seen on the CPU, else `SITE_IDS`.
//!
//! A block's allocation and free may run on different CPUs: a site's
//! figures are the sum of its CPUs' slots, read in one go like a
//! `COUNTS` entry. A site that gets no id (the ids ran out) keeps its
//! stats in `COUNTS`, and so do its blocks.
use core::ptr;

use aya_ebpf::{
    macros::map,
    maps::{Array, HashMap, PerCpuArray},
};
use memprof_common::{
    live::NO_SITE_ID,
    sites::{AllocKey, AllocStats},
};

use crate::kernel::{
    atomics::fetch_add,
    maps::{BPF_NOEXIST, EEXIST},
};

/// Call site -> its id. Sized by user space (`--max-stacks` in live mode).
#[map]
pub static SITE_IDS: HashMap<AllocKey, u32> = HashMap::with_max_entries(1, 0);

/// Stats by site id, per CPU.
#[map]
pub static SITE_STATS: PerCpuArray<AllocStats> = PerCpuArray::with_max_entries(1, 0);

/// The next id to hand out.
#[map]
static NEXT_SITE_ID: Array<u64> = Array::with_max_entries(1, 0);

/// The site seen last on a CPU, and its id: a loop allocating from one
/// place finds its id without a lookup.
#[repr(C)]
pub struct LastSite {
    key: AllocKey,
    id: u32,
}

#[map]
static LAST_SITE: PerCpuArray<LastSite> = PerCpuArray::with_max_entries(1, 0);

/// Slots in `SITE_STATS`; set before load.
#[unsafe(no_mangle)]
static SITE_ID_COUNT: u32 = 1;

/// The id of `key`'s stats, given now if it has none; [`NO_SITE_ID`] when
/// the ids have run out.
#[inline(always)]
pub fn site_id(key: &AllocKey) -> u32 {
    let Some(last) = LAST_SITE.get_ptr_mut(0) else {
        return NO_SITE_ID;
    };
    // SAFETY: this CPU's entry; BPF programs do not nest on a CPU here.
    let last = unsafe { &mut *last };
    // A zeroed entry never matches: no call site has tgid 0.
    if last.key == *key {
        return last.id;
    }
    let id = lookup_or_assign(key);
    // Cached even when there is no id: a site left in COUNTS is not
    // looked up again on every call.
    last.key = *key;
    last.id = id;
    id
}

#[inline(never)]
fn lookup_or_assign(key: &AllocKey) -> u32 {
    // SAFETY: the value is copied out at once.
    if let Some(id) = unsafe { SITE_IDS.get(key) } {
        return *id;
    }
    let Some(next) = NEXT_SITE_ID.get_ptr_mut(0) else {
        return NO_SITE_ID;
    };
    // SAFETY: a read-only global; volatile so the compiler keeps the read.
    let count = u64::from(unsafe { ptr::read_volatile(&SITE_ID_COUNT) });
    // Once the ids have run out, no atomic on the shared counter.
    // SAFETY: an aligned u64 of the array.
    if unsafe { ptr::read_volatile(next) } >= count {
        return NO_SITE_ID;
    }
    // SAFETY: as above, changed atomically only.
    let id = unsafe { fetch_add(next, 1) };
    if id >= count {
        return NO_SITE_ID;
    }
    let id = id as u32;
    match SITE_IDS.insert(key, id, BPF_NOEXIST) {
        Ok(()) => id,
        // Another CPU gave the site an id first (this one stays unused).
        // SAFETY: as above.
        Err(err) if err == -EEXIST => unsafe { SITE_IDS.get(key) }.copied().unwrap_or(NO_SITE_ID),
        Err(_) => NO_SITE_ID,
    }
}

/// This CPU's stats of site `id`, if it has an id.
#[inline(always)]
pub fn stats_of(id: u32) -> Option<&'static mut AllocStats> {
    if id == NO_SITE_ID {
        return None;
    }
    let stats = SITE_STATS.get_ptr_mut(id)?;
    // SAFETY: this CPU's slot; BPF programs do not nest on a CPU here.
    Some(unsafe { &mut *stats })
}
