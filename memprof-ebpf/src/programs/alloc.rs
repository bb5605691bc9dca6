//! Entries of the allocators other than malloc, tail-called by the
//! dispatch programs.
use aya_ebpf::{macros::uprobe, programs::ProbeContext};
use memprof_common::cookies::ProbeCookie;

use crate::accounting::{
    alloc::{enter, go_entered},
    session::Returns,
    site_table::site_cookie,
};

/// Entry of any other hooked allocator function: its site's cookie says
/// which and where its arguments are.
#[uprobe]
pub fn alloc_enter(ctx: ProbeContext) -> u32 {
    let cookie = ProbeCookie::decode(site_cookie(&ctx));
    if cookie.go_stack_check && grows_go_stack(&ctx) {
        return 0;
    }
    enter(ctx, cookie, Returns::AsProbed);
    0
}

/// Entry of Go's `runtime.mallocgc` in a Go program (see `go_entered`).
#[uprobe]
pub fn go_alloc_enter(ctx: ProbeContext) -> u32 {
    let cookie = ProbeCookie::decode(site_cookie(&ctx));
    if cookie.go_stack_check && grows_go_stack(&ctx) {
        return 0;
    }
    go_entered(ctx, cookie);
    0
}

/// At a Go prologue's `jbe`: whether it jumps to `morestack` (CF or ZF
/// set by the stack check), which re-enters the function from its start.
#[inline(always)]
fn grows_go_stack(ctx: &ProbeContext) -> bool {
    const CARRY: u64 = 1 << 0;
    const ZERO: u64 = 1 << 6;
    // SAFETY: a read of the probe's registers.
    let flags = unsafe { core::ptr::read_volatile(&(*ctx.regs).eflags) };
    flags & (CARRY | ZERO) != 0
}

/// Entry of a malloc-like function under session probes in a process
/// that has no return probe there yet (see `session`): counted, its block
/// untracked. A program of its own: `enter` with the choice made at run
/// time exceeds the BPF stack.
#[uprobe]
pub fn alloc_unreturned(ctx: ProbeContext) -> u32 {
    let cookie = ProbeCookie::decode(site_cookie(&ctx));
    enter(ctx, cookie, Returns::Never);
    0
}
