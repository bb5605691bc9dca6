//! `--sample-bytes N`: which calls to record, and what each recorded call
//! stands for (see memprof_common::sampling for the method).
use aya_ebpf::{helpers::generated::bpf_get_prandom_u32, macros::map, maps::PerCpuArray};
use memprof_common::{
    sampling::{sampled, skipped},
    sites::Weight,
};

/// Mean sampling interval in bytes; 0 records every call. Set by user
/// space before load.
#[unsafe(no_mangle)]
static SAMPLE_BYTES: u64 = 0;

/// Bytes left until the next sample, per CPU (0: not drawn yet). Sample
/// points fall on bytes independently of each other, so which thread
/// allocates them does not matter, and a per-CPU countdown needs no
/// per-thread lookup on the fast path.
#[map]
static COUNTDOWN: PerCpuArray<u64> = PerCpuArray::with_max_entries(1, 0);

/// Non-zero with --usdt, set by user space before load: every call is
/// recorded, in the 1/65536-call units of sampled ones (the programs'
/// own samples count in those).
#[unsafe(no_mangle)]
static UNIT_COUNTS: u8 = 0;

#[inline(always)]
pub fn sampling() -> bool {
    mean() != 0
}

#[inline(always)]
fn mean() -> u64 {
    // SAFETY: a read-only global; volatile so the compiler keeps the read.
    unsafe { core::ptr::read_volatile(&SAMPLE_BYTES) }
}

/// Whether a call of `bytes` is recorded, and with what weight.
#[inline(always)]
pub fn weigh(bytes: u64) -> Option<Weight> {
    let mean = mean();
    if mean == 0 {
        // SAFETY: a read-only global; volatile so the loader's value is used.
        let units = unsafe { core::ptr::read_volatile(&UNIT_COUNTS) } != 0;
        let unit = if units {
            memprof_common::sampling::UNIT
        } else {
            1
        };
        return Some(Weight { bytes, unit });
    }
    let left = COUNTDOWN.get_ptr_mut(0)?;
    // SAFETY: this CPU's slot; a rare lost update only perturbs the draw.
    let left = unsafe { &mut *left };
    if skipped(left, bytes, mean, random) {
        return None;
    }
    Some(sampled(left, bytes, mean, random))
}

/// Whether a call of `bytes` is not sampled, counting it down if so; a
/// call it does not skip is left for [`weigh`] (on this CPU, before any
/// other call is weighed: the next thing the running program does).
#[inline(always)]
pub fn skips(bytes: u64) -> bool {
    let mean = mean();
    let Some(left) = COUNTDOWN.get_ptr_mut(0) else {
        return false;
    };
    // SAFETY: as in `weigh`.
    let left = unsafe { &mut *left };
    if mean == 0 {
        return false;
    }
    skipped(left, bytes, mean, random)
}

/// A call [`skips`] did not skip that is not weighed after all
/// (memprof's own): its sample point goes with it, and the next gap is
/// drawn afresh. Left pending, the point fell on the next call of any
/// process on this CPU, sampled then for sure where its weight assumes a
/// chance: +19% calls for a process under the whole-host monitor while
/// memprof allocated much (symbolizing processes that came and went).
#[inline(always)]
pub fn forgo() {
    if let Some(left) = COUNTDOWN.get_ptr_mut(0) {
        // SAFETY: this CPU's slot.
        unsafe { *left = 0 };
    }
}

#[inline(always)]
fn random() -> u32 {
    // SAFETY: the helper only returns a random number.
    unsafe { bpf_get_prandom_u32() }
}
