//! USDT probes of programs that sample their own allocations (`--usdt`).
use aya_ebpf::{macros::uprobe, programs::ProbeContext};

use crate::accounting::usdt;

/// An allocation USDT probe: `accounting::usdt::alloc`.
#[uprobe]
pub fn usdt_alloc(ctx: ProbeContext) -> u32 {
    usdt::alloc(ctx)
}

/// A free USDT probe: `accounting::usdt::free`.
#[uprobe]
pub fn usdt_free(ctx: ProbeContext) -> u32 {
    usdt::free(ctx)
}
