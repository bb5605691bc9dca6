//! Direct mappings: the syscall tracepoints of `mmap`, `mremap`, `munmap`
//! and `brk`, in the processes memprof profiles. A call the program makes
//! itself goes to user space with its call site (`MappingNotice`), where
//! the mappings are kept: an unmap may cut any part of one, which takes an
//! ordered index of ranges. Calls made inside a probed allocator whose
//! return is probed (nesting depth) are its own business and skipped here;
//! user space drops the others by their stacks.
use aya_ebpf::{
    bindings::pt_regs,
    helpers::{bpf_get_current_pid_tgid, bpf_probe_read_kernel, generated::bpf_ktime_get_ns},
    macros::raw_tracepoint,
    programs::RawTracePointContext,
};
use memprof_common::{
    mappings::{page_rounded, MappingCall, MappingNotice, PendingSyscall, BRK, MMAP, MREMAP},
    AllocKey, LostCause, NoticeKind, ThreadState,
};

use crate::{
    maps::{count_lost, FORKS, NOTICES, PROCS, THREADS},
    probes::thread_state,
    stacks::{stack_at, CallStack},
};

/// x86-64 syscall numbers.
const SYS_MMAP: i64 = 9;
const SYS_MUNMAP: i64 = 11;
const SYS_BRK: i64 = 12;
const SYS_MREMAP: i64 = 25;

const MAP_ANONYMOUS: u64 = 0x20;
const PROT_NONE: u64 = 0;

/// Entry of `mmap`, `mremap`, `munmap` or `brk`: an unmap is reported now
/// (before another thread can be given the range); the others wait for
/// their result.
///
/// Raw `sys_enter` (every syscall: the first test lets the others go),
/// not the `syscalls:` events: detaching each of those waits for grace
/// periods (about 80 ms apiece here); a raw tracepoint link goes at once.
#[raw_tracepoint(tracepoint = "sys_enter")]
pub fn mapping_enter(ctx: RawTracePointContext) -> u32 {
    let nr: i64 = ctx.arg(1);
    if !matches!(nr, SYS_MMAP | SYS_MUNMAP | SYS_BRK | SYS_MREMAP) {
        return 0;
    }
    let Some(thread) = profiled_thread() else {
        return 0;
    };
    let regs: *const pt_regs = ctx.arg(0);
    // The syscall's arguments, from the user registers it was made with.
    let arg = |n: usize| -> u64 {
        // SAFETY: checked reads of the task's saved registers.
        unsafe {
            let field = match n {
                0 => &(*regs).rdi,
                1 => &(*regs).rsi,
                2 => &(*regs).rdx,
                _ => &(*regs).r10,
            };
            bpf_probe_read_kernel(field).unwrap_or(0)
        }
    };
    let mut pending = PendingSyscall::default();
    if thread.depth > 0 {
        // Inside an allocator: not the program's call. Only where the
        // break goes matters (the program's next brk grows it from there).
        if nr == SYS_BRK {
            pending.call = MappingCall::BreakMoved as u32;
        }
        thread.syscall = pending;
        return 0;
    }
    match nr {
        SYS_MMAP => {
            let (prot, flags) = (arg(2), arg(3));
            // A file's pages are the file's; PROT_NONE reserves address
            // space (Go's arenas) and holds no memory until remapped.
            if flags & MAP_ANONYMOUS != 0 && prot != PROT_NONE {
                pending.call = MappingCall::Map as u32;
                pending.length = page_rounded(arg(1));
            }
        }
        SYS_MREMAP => {
            pending.call = MappingCall::Remap as u32;
            pending.old_address = arg(0);
            pending.old_length = page_rounded(arg(1));
            pending.length = page_rounded(arg(2));
        }
        SYS_BRK => pending.call = MappingCall::Brk as u32,
        SYS_MUNMAP => {
            let unmap = MappingNotice {
                kind: NoticeKind::Mapping as u32,
                call: MappingCall::Unmap as u32,
                // SAFETY: reads the clock.
                time_ns: unsafe { bpf_ktime_get_ns() },
                address: arg(0),
                length: page_rounded(arg(1)),
                old_address: 0,
                old_length: 0,
                site: image_key(thread, 0),
            };
            send(&unmap);
        }
        _ => {}
    }
    thread.syscall = pending;
    0
}

/// Exit of `mmap`, `mremap` or `brk`: a call that succeeded is reported
/// with its call site.
#[raw_tracepoint(tracepoint = "sys_exit")]
pub fn mapping_exit(ctx: RawTracePointContext) -> u32 {
    let regs: *const pt_regs = ctx.arg(0);
    // SAFETY: a checked read of the task's saved registers.
    let nr = unsafe { bpf_probe_read_kernel(&(*regs).orig_rax) }.unwrap_or(0) as i64;
    if !matches!(nr, SYS_MMAP | SYS_BRK | SYS_MREMAP) {
        return 0;
    }
    let Some(thread) = THREADS.current(false) else {
        return 0;
    };
    // SAFETY: the running thread's own storage.
    let thread = unsafe { &mut *thread };
    let pending = thread.syscall;
    if pending.call == 0 {
        return 0;
    }
    thread.syscall.call = 0;
    let result: i64 = ctx.arg(1);
    if result < 0 && result > -4096 {
        return 0;
    }
    let allocator = match pending.call {
        c if c == MappingCall::Map as u32 => MMAP,
        c if c == MappingCall::Remap as u32 => MREMAP,
        _ => BRK,
    };
    let mut site = image_key(thread, allocator);
    let counted = pending.call != MappingCall::BreakMoved as u32;
    match user_registers(regs).filter(|_| counted) {
        None if !counted => {}
        Some((pc, sp, bp)) => {
            let CallStack {
                caller,
                stack,
                flags,
            } = stack_at(thread.tgid, pc, sp, bp);
            site.caller = caller;
            site.stack = stack;
            site.reserved = flags;
        }
        None => count_lost(LostCause::ReadFault),
    }
    let notice = MappingNotice {
        kind: NoticeKind::Mapping as u32,
        call: pending.call,
        // SAFETY: reads the clock.
        time_ns: unsafe { bpf_ktime_get_ns() },
        address: result as u64,
        length: pending.length,
        old_address: pending.old_address,
        old_length: pending.old_length,
        site,
    };
    send(&notice);
    0
}

/// This thread's state, if its process is profiled.
#[inline(always)]
fn profiled_thread() -> Option<&'static mut ThreadState> {
    let tgid = (bpf_get_current_pid_tgid() >> 32) as u32;
    // SAFETY: read-only lookups. A child of a profiled process counts
    // before its first allocation (its fork is in FORKS).
    let profiled = unsafe { PROCS.get(tgid).is_some() || FORKS.get(tgid).is_some() };
    if !profiled {
        return None;
    }
    thread_state()
}

#[inline(always)]
fn image_key(thread: &ThreadState, allocator: u32) -> AllocKey {
    AllocKey {
        tgid: thread.tgid,
        generation: thread.generation,
        allocator,
        reserved: 0,
        stack: 0,
        caller: 0,
    }
}

/// The user registers the kernel saved at the syscall: pc, sp, bp.
#[inline(always)]
fn user_registers(regs: *const pt_regs) -> Option<(u64, u64, u64)> {
    // SAFETY: checked reads of the task's saved registers.
    unsafe {
        Some((
            bpf_probe_read_kernel(&(*regs).rip).ok()?,
            bpf_probe_read_kernel(&(*regs).rsp).ok()?,
            bpf_probe_read_kernel(&(*regs).rbp).ok()?,
        ))
    }
}

#[inline(always)]
fn send(notice: &MappingNotice) {
    if NOTICES.output::<MappingNotice>(notice, 0).is_err() {
        count_lost(LostCause::NoticeDropped);
    }
}
