//! Call-site counters: what each (process image, stack, caller,
//! allocator) allocated. Totals mode adds each call to a per-CPU slot the
//! site owns when it has one (no hash-map lookup), else to `COUNTS`;
//! user space adds both up. Live mode uses `site_ids` (and `COUNTS`).
use aya_ebpf::{macros::map, maps::PerCpuArray};
use memprof_common::{
    lost::LostCause,
    sites::{AllocKey, AllocStats, SiteSlot, Weight},
};

use crate::kernel::{
    atomics::fetch_add,
    maps::{count_lost, BPF_NOEXIST, COUNTS, EEXIST, SITE_SLOTS},
};

/// Where `add_to_table` builds the stats of a call: on the BPF stack they
/// would sit below the allocator entry's frame, which leaves its callees
/// only a few dozen bytes of the 512.
#[map]
static CALL_STATS: PerCpuArray<AllocStats> = PerCpuArray::with_max_entries(1, 0);

/// Stats of one recorded call.
#[inline(always)]
pub fn counted(weight: Weight) -> AllocStats {
    AllocStats {
        bytes: weight.bytes,
        count: weight.unit,
        samples: 1,
        ..AllocStats::default()
    }
}

/// Adds one recorded call to its site (totals mode): in a slot of this
/// CPU the site owns or takes, else in its `COUNTS` entry.
///
/// Live mode does not use the slots: a block's release often runs on
/// another CPU than its allocation, and user space reads `COUNTS` and the
/// slots at different moments; its sites keep per-CPU stats by id
/// (`site_ids`), whose CPUs are copied together.
#[inline(always)]
pub fn add_call(key: &AllocKey, weight: Weight) {
    if site_slots_off() {
        add_to_table(key, weight, false);
        return;
    }
    for index in SiteSlot::candidates(key) {
        let Some(slot) = SITE_SLOTS.get_ptr_mut(index) else {
            break;
        };
        // SAFETY: this CPU's slot; BPF programs do not nest on a CPU here.
        let slot = unsafe { &mut *slot };
        if slot.key.tgid == 0 {
            // Free: the site takes it for good. Key first, then counts
            // (user space skips a slot whose key changes while it reads).
            // SAFETY: a plain store, kept in this order.
            unsafe { core::ptr::write_volatile(&mut slot.key, *key) };
        } else if slot.key != *key {
            continue;
        }
        let stats = &mut slot.stats;
        stats.bytes = stats.bytes.wrapping_add(weight.bytes);
        stats.count = stats.count.wrapping_add(weight.unit);
        stats.samples = stats.samples.wrapping_add(1);
        return;
    }
    // Both slots belong to other sites.
    add_to_table(key, weight, false);
}

/// Non-zero in `monitor`, set by user space before load: slots are taken
/// for good, and a host's processes come and go; `COUNTS` entries of ended
/// processes can be removed.
#[unsafe(no_mangle)]
static SITE_SLOTS_OFF: u8 = 0;

#[inline(always)]
fn site_slots_off() -> bool {
    // SAFETY: a read-only global; volatile so the loader's value is used.
    unsafe { core::ptr::read_volatile(&SITE_SLOTS_OFF) != 0 }
}

/// Adds one recorded call to its site's `COUNTS` entry; `untracked`: in
/// live mode, its block is not tracked. Not inlined: inlined, the
/// compiler builds the stats value for the insert (with a call of the BPF
/// memset) before the slot check, on every call.
#[inline(never)]
pub fn add_to_table(key: &AllocKey, weight: Weight, untracked: bool) {
    let Some(stats) = CALL_STATS.get_ptr_mut(0) else {
        return;
    };
    // SAFETY: this CPU's slot; BPF programs do not nest on a CPU here.
    let stats = unsafe { &mut *stats };
    *stats = counted(weight);
    if untracked {
        stats.untracked_count = weight.unit;
    }
    add(key, stats);
}

/// Adds `delta` to a call site's entry in `COUNTS`, creating it if
/// needed. Returns false (and counts the loss) when the table is full.
#[inline(always)]
pub fn add(key: &AllocKey, delta: &AllocStats) -> bool {
    for _ in 0..2 {
        if let Some(stats) = COUNTS.get_ptr_mut(key) {
            // SAFETY: the value of a successful lookup, in map memory.
            unsafe { add_atomically(stats, delta) };
            return true;
        }
        // Another CPU may insert the same key first; then add to it.
        match COUNTS.insert(key, delta, BPF_NOEXIST) {
            Ok(()) => return true,
            Err(err) if err == -EEXIST => continue,
            Err(_) => break,
        }
    }
    count_lost(LostCause::MapFull);
    false
}

/// `*stats` += `delta`, field by field, atomically: a `COUNTS` entry is
/// shared by all CPUs. Fields with nothing to add are left alone.
///
/// # Safety
/// `stats` points at an `AllocStats` in map memory.
#[inline(always)]
pub unsafe fn add_atomically(stats: *mut AllocStats, delta: &AllocStats) {
    // SAFETY: the caller's pointer; each field is an aligned u64. Written
    // out, not a loop over the fields: the verifier must see each pointer.
    unsafe {
        add_field(&raw mut (*stats).bytes, delta.bytes);
        add_field(&raw mut (*stats).count, delta.count);
        add_field(&raw mut (*stats).live_bytes, delta.live_bytes);
        add_field(&raw mut (*stats).live_count, delta.live_count);
        add_field(&raw mut (*stats).temporary_count, delta.temporary_count);
        add_field(&raw mut (*stats).untracked_count, delta.untracked_count);
        add_field(&raw mut (*stats).samples, delta.samples);
    }
}

/// # Safety
/// As for [`add_atomically`].
#[inline(always)]
unsafe fn add_field(field: *mut u64, value: u64) {
    if value != 0 {
        // SAFETY: the caller's pointer.
        unsafe { fetch_add(field, value) };
    }
}
