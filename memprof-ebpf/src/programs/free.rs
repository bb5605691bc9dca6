//! `free` and the other releasing functions (`--live`).
use aya_ebpf::{macros::uprobe, programs::ProbeContext};
use memprof_common::cookies::ProbeCookie;

use crate::accounting::{live::release_at, site_table::site_cookie};

/// Entry of another function that releases a block: operator delete,
/// `mi_free`, `sdallocx`, a `--free-fn`. The cookie holds the argument
/// that holds the block.
#[uprobe]
pub fn release_enter(ctx: ProbeContext) -> u32 {
    let index = site_cookie(&ctx) as u8;
    // Volatile: each register is read at its own fixed context offset
    // (the verifier refuses a context pointer the compiler computed).
    // SAFETY: reads of the probe's registers.
    let args = unsafe {
        let regs = ctx.regs;
        [
            core::ptr::read_volatile(&(*regs).rdi),
            core::ptr::read_volatile(&(*regs).rsi),
            core::ptr::read_volatile(&(*regs).rdx),
            core::ptr::read_volatile(&(*regs).rcx),
            core::ptr::read_volatile(&(*regs).r8),
            core::ptr::read_volatile(&(*regs).r9),
        ]
    };
    release_at(&ctx, ProbeCookie::pointer_arg(args, index), None)
}
