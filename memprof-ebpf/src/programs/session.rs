//! The session-uprobe programs of the malloc-like functions (`--live`
//! with sampling, kernel 6.13 and later): `alloc_session` at both ends,
//! `alloc_chosen` for the sampled entries (see `accounting::session`).
use core::ffi::c_void;

use aya_ebpf::{
    helpers::generated::bpf_get_func_ip,
    macros::map,
    maps::ProgramArray,
    programs::{ProbeContext, RetProbeContext},
    EbpfContext,
};
use memprof_common::{cookies::ProbeCookie, lost::LostCause};

use crate::{
    accounting::{
        alloc::{alloc_returned, args_of, enter},
        mode::ignored,
        regions, sampler,
        session::Returns,
        site_table::running_site,
    },
    kernel::maps::{count_lost, THREADS},
};

/// Whether the session program's return half runs: the kernel reads the
/// entry's result (0: it runs; 1: it does not).
const RUN_RETURN: u32 = 0;

const SKIP_RETURN: u32 = 1;

/// Both ends of a malloc-like function in a linked process. At a return
/// the kernel has set the instruction pointer to the return address; at
/// an entry it is the probed address, which `bpf_get_func_ip` gives at
/// both. The entry half is a program of its own (`alloc_chosen`, tail
/// called): inline, its frame exceeds the BPF stack.
///
/// Written out, not with `#[uprobe]`: that macro's wrapper returns 0
/// whatever the function returns, and 0 asks for the return. In a
/// `uprobe` section, so that aya's parser takes the object (user space
/// loads these programs itself, with the session attach type).
#[unsafe(no_mangle)]
#[unsafe(link_section = "uprobe")]
pub fn alloc_session(ctx: *mut c_void) -> u32 {
    let probe = ProbeContext::new(ctx);
    // SAFETY: the helper reads the running probe's address.
    let function = unsafe { bpf_get_func_ip(probe.as_ptr()) };
    // SAFETY: a read of the probe's registers.
    let rip = unsafe { (*probe.regs).rip };
    if rip != function {
        alloc_returned(&RetProbeContext::new(ctx));
        return RUN_RETURN;
    }
    // Most calls end here: not sampled, no return.
    if !regions::by_function() {
        let Some(site) = running_site(&probe) else {
            count_lost(LostCause::ProbeDispatch);
            return SKIP_RETURN;
        };
        let cookie = ProbeCookie::decode(site.cookie);
        if regions::paused() || sampler::skips(cookie.requested_bytes(args_of(&probe, cookie))) {
            return SKIP_RETURN;
        }
        // Checked only here, off the path of the unsampled calls.
        if ignored() {
            sampler::forgo();
            return SKIP_RETURN;
        }
    }
    // SAFETY: on success the call does not return; `alloc_chosen` takes
    // the same context, and its result is this program's.
    unsafe { SESSION_PROGRAMS.tail_call(&probe, 0) };
    count_lost(LostCause::ProbeDispatch);
    SKIP_RETURN
}

/// The entry half of `alloc_session` (its sampled calls, and every call
/// with `--while`): records the call, and asks for its return if it was
/// sampled.
#[unsafe(no_mangle)]
#[unsafe(link_section = "uprobe")]
pub fn alloc_chosen(ctx: *mut c_void) -> u32 {
    entered(ctx);
    // In the thread's state, not a per-CPU slot: the program may be
    // preempted, and another thread's call run meanwhile on this CPU.
    let Some(thread) = THREADS.current(false) else {
        return SKIP_RETURN;
    };
    // SAFETY: the running thread's own storage.
    let thread = unsafe { &mut *thread };
    match core::mem::take(&mut thread.session_return) {
        0 => SKIP_RETURN,
        _ => RUN_RETURN,
    }
}

/// `alloc_chosen`, for `alloc_session` to tail-call (a program array of
/// session programs: the kernel lets a program tail-call only programs
/// of its own attach type).
#[map]
pub static SESSION_PROGRAMS: ProgramArray = ProgramArray::with_max_entries(1, 0);

#[inline(always)]
fn entered(ctx: *mut c_void) {
    let ctx = ProbeContext::new(ctx);
    if ignored() {
        return;
    }
    let Some(site) = running_site(&ctx) else {
        count_lost(LostCause::ProbeDispatch);
        return;
    };
    enter(ctx, ProbeCookie::decode(site.cookie), Returns::Chosen);
}
