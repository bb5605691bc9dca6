//! Entries of the allocators other than malloc, tail-called by the
//! dispatch programs.
use aya_ebpf::{macros::uprobe, programs::ProbeContext};
use memprof_common::cookies::ProbeCookie;

use crate::accounting::{alloc::enter, session::Returns, site_table::site_cookie};

/// Entry of any other hooked allocator function: its site's cookie says
/// which and where its arguments are.
#[uprobe]
pub fn alloc_enter(ctx: ProbeContext) -> u32 {
    let cookie = ProbeCookie::decode(site_cookie(&ctx));
    enter(ctx, cookie, Returns::AsProbed);
    0
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
