//! The site table: every probed site by group and page offset, and the
//! programs a site's entry and return run (see `programs::dispatch`).
use aya_ebpf::{
    helpers::{bpf_probe_read_user, generated::bpf_get_attach_cookie},
    macros::map,
    maps::{Array, ProgramArray},
    programs::ProbeContext,
    EbpfContext,
};
use memprof_common::dispatch::{entry, ret, site_index, SiteEntry, SITE_TABLE_LEN};

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
