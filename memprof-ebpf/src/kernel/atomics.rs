//! The BPF atomics memprof needs, written out: LLVM emits them only for
//! BPF CPU v3, and the toolchain links for v1 (`--cpu generic`); the
//! instructions themselves need kernel 5.12. The BPF target has no atomic
//! types with compare-and-swap or fetch-add either.
use core::arch::asm;

/// `*target = new` if `*target == expected`; returns what `*target` was.
///
/// # Safety
/// `target` points at an aligned u64 in map memory.
#[inline(always)]
pub unsafe fn compare_and_swap(target: *mut u64, expected: u64, new: u64) -> u64 {
    let previous: u64;
    // SAFETY: the caller's pointer; the instruction compares r0.
    unsafe {
        asm!(
            "r0 = cmpxchg_64({target} + 0, r0, {new})",
            target = in(reg) target,
            new = in(reg) new,
            inout("r0") expected => previous,
            options(nostack),
        );
    }
    previous
}

/// `*target += value`; returns what `*target` was.
///
/// # Safety
/// As for [`compare_and_swap`].
#[inline(always)]
pub unsafe fn fetch_add(target: *mut u64, value: u64) -> u64 {
    let mut value = value;
    // SAFETY: the caller's pointer.
    unsafe {
        asm!(
            "{value} = atomic_fetch_add((u64 *)({target} + 0), {value})",
            target = in(reg) target,
            value = inout(reg) value,
            options(nostack),
        );
    }
    value
}
