//! Shared probe events: the probes of a site group share one tracefs
//! event for entries and one for returns (detaching an event costs an RCU
//! grace period, see `memprof_common::dispatch`). The program on each
//! event finds the site that fired and tail-calls its program.
use aya_ebpf::{
    helpers::{
        bpf_get_current_pid_tgid, bpf_probe_read_user,
        generated::{bpf_get_attach_cookie, bpf_get_func_ip},
    },
    macros::{map, uprobe, uretprobe},
    maps::{Array, ProgramArray},
    programs::{ProbeContext, RetProbeContext},
    EbpfContext,
};
use memprof_common::{
    dispatch::{entry, ret, site_index, SiteEntry, SITE_TABLE_LEN},
    LostCause,
};

use crate::{
    live::free_entered,
    maps::count_lost,
    probes::{alloc_returned, malloc_entered},
    session::{linked, shared_returns, Returns},
};

/// Every probed site, by group and page offset (written by user space
/// before the group's events are enabled).
#[map]
pub static SITE_TABLE: Array<SiteEntry> = Array::with_max_entries(SITE_TABLE_LEN, 0);

/// The programs a site's entry runs, by `SiteEntry::entry - 1`.
#[map]
pub static ENTRY_PROGRAMS: ProgramArray = ProgramArray::with_max_entries(entry::COUNT, 0);

/// The programs a site's return runs, by `SiteEntry::ret - 1`.
#[map]
pub static RETURN_PROGRAMS: ProgramArray = ProgramArray::with_max_entries(ret::COUNT, 0);

/// The site of the probe at `address`, in the group of the running probe
/// (its cookie).
#[inline(always)]
pub(crate) fn site_at<C: EbpfContext>(ctx: &C, address: u64) -> Option<&'static SiteEntry> {
    // SAFETY: the helper reads the running probe's cookie.
    let group = unsafe { bpf_get_attach_cookie(ctx.as_ptr()) };
    SITE_TABLE.get(site_index(group, address))
}

/// The cookie of the site whose entry probe is running (at a uprobe, rip
/// is the probed instruction).
#[inline(always)]
pub fn site_cookie(ctx: &ProbeContext) -> u64 {
    running_site(ctx).map_or(0, |site| site.cookie)
}

/// The site whose entry probe is running.
#[inline(always)]
pub fn running_site(ctx: &ProbeContext) -> Option<&'static SiteEntry> {
    // SAFETY: a read of the probe's registers.
    let rip = unsafe { (*ctx.regs).rip };
    site_at(ctx, rip)
}

/// The return address of a function probed at its first byte (free's and
/// the mapping functions' probes: before any push, the stack pointer is at
/// it).
#[inline(always)]
pub fn return_address(ctx: &ProbeContext) -> Option<u64> {
    // SAFETY: the probe's registers; a checked read of user memory.
    unsafe { bpf_probe_read_user((*ctx.regs).rsp as *const u64) }.ok()
}

/// memprof's own process, set by user space before load when its probes
/// cover every process (`monitor` of the whole host): never profiled.
#[unsafe(no_mangle)]
static IGNORED_TGID: u32 = 0;

#[inline(always)]
pub(crate) fn ignored() -> bool {
    // SAFETY: a read-only global; volatile so the loader's value is used.
    let ignored = unsafe { core::ptr::read_volatile(&IGNORED_TGID) };
    ignored != 0 && (bpf_get_current_pid_tgid() >> 32) as u32 == ignored
}

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
