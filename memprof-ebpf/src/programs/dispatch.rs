//! Shared probe events: the probes of a site group share one tracefs
//! event for entries and one for returns (detaching an event costs an RCU
//! grace period, see `memprof_common::dispatch`). The program on each
//! event finds the site that fired and tail-calls its program.
use aya_ebpf::{
    helpers::generated::{bpf_get_attach_cookie, bpf_get_func_ip},
    macros::{uprobe, uretprobe},
    programs::{ProbeContext, RetProbeContext},
    EbpfContext,
};
use memprof_common::{
    dispatch::{entry, ret},
    lost::LostCause,
};

use crate::{
    accounting::{
        alloc::{alloc_returned, malloc_entered},
        live::free_entered,
        mode::ignored,
        session::{linked, shared_returns, Returns},
        site_table::{site_at, ENTRY_PROGRAMS, RETURN_PROGRAMS},
    },
    kernel::maps::count_lost,
};

/// Entry of any site of a group.
#[uprobe]
pub fn site_enter(ctx: ProbeContext) -> u32 {
    dispatch_entry(ctx)
}

/// Entry of a site of a session group (malloc-like functions under
/// session probes): in a process with a session link its program counts
/// the call; this one runs in the others (children of linked processes).
/// Checked first: in a linked process every call of these sites comes
/// here.
#[uprobe]
pub fn session_group_enter(ctx: ProbeContext) -> u32 {
    // SAFETY: the helper reads the running probe's cookie.
    if linked(unsafe { bpf_get_attach_cookie(ctx.as_ptr()) }) {
        return 0;
    }
    dispatch_entry(ctx)
}

#[inline(always)]
fn dispatch_entry(ctx: ProbeContext) -> u32 {
    if ignored() {
        return 0;
    }
    // SAFETY: a read of the probe's registers.
    let rip = unsafe { (*ctx.regs).rip };
    let Some(site) = site_at(&ctx, rip) else {
        count_lost(LostCause::ProbeDispatch);
        return 0;
    };
    let mut program = site.entry;
    // (Only `session_group_enter` comes here with these sites: the running
    // process has no session link.)
    if site.ret == ret::SESSION_ALLOC && shared_returns() == Returns::Never {
        program = entry::UNRETURNED;
    }
    match program {
        // The calls made most run here: a tail call costs tens of ns.
        entry::MALLOC => return malloc_entered(ctx),
        entry::FREE => return free_entered(&ctx, site.cookie),
        0 => {}
        // SAFETY: on success the call does not return; the programs in
        // the array take the same context.
        program => unsafe { ENTRY_PROGRAMS.tail_call(&ctx, program - 1) },
    }
    count_lost(LostCause::ProbeDispatch);
    0
}

/// Return of any site of a group: the function's address comes from the
/// kernel (rip is the return address).
#[uretprobe]
pub fn site_return(ctx: RetProbeContext) -> u32 {
    if ignored() {
        return 0;
    }
    // SAFETY: the helper reads the running probe's address.
    let function = unsafe { bpf_get_func_ip(ctx.as_ptr()) };
    let Some(site) = site_at(&ctx, function) else {
        count_lost(LostCause::ProbeDispatch);
        return 0;
    };
    match site.ret {
        ret::ALLOC | ret::SESSION_ALLOC => {
            alloc_returned(&ctx);
            return 0;
        }
        0 => {}
        // SAFETY: as in `site_enter`.
        program => unsafe { RETURN_PROGRAMS.tail_call(&ctx, program - 1) },
    }
    count_lost(LostCause::ProbeDispatch);
    0
}
