//! Direct mappings: probes on the C library's `mmap`, `mremap`, `munmap`
//! and `sbrk`, scoped to the profiled processes like the allocators'. A
//! call the program makes itself goes to user space with its call site
//! (`MappingNotice`), where the mappings are kept: an unmap may cut any
//! part of one, which takes an ordered index of ranges. Calls made inside
//! a probed allocator whose return is probed (nesting depth), and those
//! the C library makes from its own code (malloc's), are the allocator's
//! business and skipped here; user space drops the others (another
//! allocator's) by their stacks.
//!
//! Not the syscall tracepoints: any of them puts every task of the host on
//! the slow syscall path while attached (getppid here: 290 → 550 ns with a
//! raw `sys_enter`/`sys_exit` program, → 350 ns with `syscalls:` events,
//! which took ~80 ms apiece to detach), and on x86-64 each return probe's
//! return is a syscall (`uretprobe`): `--live` paid 7-14% more per
//! allocation.
use aya_ebpf::{
    helpers::generated::bpf_ktime_get_ns,
    programs::{ProbeContext, RetProbeContext},
};
use memprof_common::{
    lost::LostCause,
    mappings::{
        page_rounded, MappingCall, MappingCookie, MappingNotice, PendingMapping,
        MAPPING_CALL_MAX_NS, WRAPPER_REACH,
    },
    notices::NoticeKind,
    sites::{AllocKey, NO_STACK},
    stacks::NOT_RECORDED,
};

use crate::{
    accounting::{
        regions,
        site_table::{return_address, site_cookie},
        stacks::{call_stack, CallStack},
        thread::thread_state,
    },
    kernel::maps::{count_lost, NOTICES, THREADS},
};

const MAP_ANONYMOUS: u64 = 0x20;

const PROT_NONE: u64 = 0;

const MAP_STACK: u64 = 0x20000;

/// Entry of a mapping function; the cookie is its `MappingCall`. An unmap
/// is reported now (before another thread can be given the range); the
/// others wait for their result.
#[inline(always)]
pub fn entered(ctx: ProbeContext) -> u32 {
    let cookie = MappingCookie::decode(site_cookie(&ctx));
    let call = cookie.call;
    let Some(thread) = thread_state() else {
        count_lost(LostCause::ThreadTableFull);
        return 0;
    };
    // SAFETY: the probe's registers (mapping functions are probed at their
    // first byte).
    let (rip, rsp) = unsafe { ((*ctx.regs).rip, (*ctx.regs).rsp) };
    let returns_to = return_address(&ctx).unwrap_or(0);
    // An unmap is never skipped: sent twice, it ends nothing more.
    if call != MappingCall::Unmap && inside_pending(&thread.mapping, rsp, returns_to) {
        return 0;
    }
    thread.mapping.call = 0;
    if thread.depth > 0 {
        // Inside an allocator: its memory, counted as its blocks.
        return 0;
    }
    let arg = |n: usize| ctx.arg::<u64>(n).unwrap_or(0);
    let mut site = AllocKey {
        tgid: thread.tgid,
        generation: thread.generation,
        allocator: call.allocator(),
        reserved: 0,
        stack: 0,
        caller: 0,
    };
    if call == MappingCall::Unmap {
        send(&MappingNotice {
            kind: NoticeKind::Mapping as u32,
            call: call as u32,
            // SAFETY: reads the clock.
            time_ns: unsafe { bpf_ktime_get_ns() },
            address: arg(0),
            length: page_rounded(arg(1)),
            old_address: 0,
            old_length: 0,
            site,
        });
        return 0;
    }
    // Memory that is not recorded is not followed either, nor what malloc
    // maps itself; a remap or a shrinking break moves or ends what may be
    // (as realloc and free do), and a mapping may replace one that is
    // (MAP_FIXED): sent unwalked.
    let recorded =
        regions::records(thread.region_depth) && !mallocs_own(&ctx, cookie, rip, returns_to);
    if !recorded && call == MappingCall::Sbrk && arg(0) as i64 > 0 {
        return 0;
    }
    let mut pending = PendingMapping::default();
    match call {
        MappingCall::Map => {
            // A file's pages are the file's; PROT_NONE reserves address
            // space (Go's arenas, thread stacks' guards) and holds no
            // memory until remapped.
            let (prot, flags) = (arg(2), arg(3));
            if flags & MAP_ANONYMOUS == 0 || prot == PROT_NONE {
                return 0;
            }
            pending.length = page_rounded(arg(1));
        }
        MappingCall::Remap => {
            pending.old_address = arg(0);
            pending.old_length = page_rounded(arg(1));
            pending.length = page_rounded(arg(2));
        }
        // The increment, signed.
        _ => pending.length = arg(0),
    }
    if recorded {
        let CallStack {
            caller,
            stack,
            flags,
        } = call_stack(&ctx, thread.tgid, regions::frames(thread));
        site.caller = caller;
        site.stack = stack;
        site.reserved = flags;
    } else {
        site.stack = NO_STACK;
        site.reserved = NOT_RECORDED;
    }
    pending.site = site;
    pending.call = call as u32;
    pending.entry_sp = rsp;
    pending.entry_ip = rip;
    // SAFETY: reads the clock.
    pending.entry_ns = unsafe { bpf_ktime_get_ns() };
    thread.mapping = pending;
    0
}

/// Return of `mmap`, `mremap` or `sbrk`: a call that succeeded is
/// reported with its call site.
#[inline(always)]
pub fn returned(ctx: RetProbeContext) -> u32 {
    let Some(thread) = THREADS.current(false) else {
        return 0;
    };
    // SAFETY: the running thread's own storage.
    let thread = unsafe { &mut *thread };
    let pending = thread.mapping;
    // SAFETY: the return probe's registers.
    let rsp = unsafe { (*ctx.regs).rsp };
    // None pending, or the return of a call made inside it (at or below
    // its entry's stack pointer; its own returns above).
    if pending.call == 0 || rsp <= pending.entry_sp {
        return 0;
    }
    thread.mapping.call = 0;
    // MAP_FAILED and sbrk's failure are both (void *)-1.
    let result: u64 = ctx.ret();
    if result == u64::MAX {
        return 0;
    }
    send(&MappingNotice {
        kind: NoticeKind::Mapping as u32,
        call: pending.call,
        // SAFETY: reads the clock.
        time_ns: unsafe { bpf_ktime_get_ns() },
        address: result,
        length: pending.length,
        old_address: pending.old_address,
        old_length: pending.old_length,
        site: pending.site,
    });
    0
}

/// Whether the C library made this call itself, for malloc: growing its
/// heap (sbrk), mapping a big block or an arena (mmap), moving one
/// (mremap); counted as malloc's blocks. Told by the return address, not
/// left to the stack in user space: until a new process's unwind tables
/// are loaded its stacks stop in the library, and these were counted
/// twice. A thread's stack (`MAP_STACK`, pthread_create's) is the
/// program's. (A program's callback that libc runs and that tail-calls
/// mmap or sbrk would read as the library's: a signal handler compiled
/// to `jmp sbrk`.)
#[inline(always)]
fn mallocs_own(ctx: &ProbeContext, cookie: MappingCookie, rip: u64, returns_to: u64) -> bool {
    let stack = cookie.call == MappingCall::Map && ctx.arg::<u64>(3).unwrap_or(0) & MAP_STACK != 0;
    !stack && cookie.library.contains(rip, returns_to)
}

/// Whether a mapping call is made inside another still under way on its
/// thread: a wrapper passing it on to the C library's (tcmalloc's `sbrk`,
/// glibc's libmemusage's `mmap`). The outer call reports it, from the
/// program's call site; the inner one, from the wrapper, would read as the
/// allocator's and take the outer's place. This call is deeper on the
/// stack, made from code near the outer function (a signal handler's call
/// is not), and the outer one is recent: one whose return was never seen
/// (its probe detached meanwhile) ages out. The outer's return address
/// cannot tell: its return probe replaced it. (A wrapper that tail-calls
/// the real function is not seen: the inner call takes its place.)
#[inline(always)]
fn inside_pending(pending: &PendingMapping, rsp: u64, returns_to: u64) -> bool {
    if pending.call == 0 || rsp >= pending.entry_sp {
        return false;
    }
    // SAFETY: reads the clock.
    let now_ns = unsafe { bpf_ktime_get_ns() };
    now_ns.wrapping_sub(pending.entry_ns) < MAPPING_CALL_MAX_NS
        && returns_to.abs_diff(pending.entry_ip) < WRAPPER_REACH
}

#[inline(always)]
fn send(notice: &MappingNotice) {
    if NOTICES.output::<MappingNotice>(notice, 0).is_err() {
        count_lost(LostCause::NoticeDropped);
    }
}
