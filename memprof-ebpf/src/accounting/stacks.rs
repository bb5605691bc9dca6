//! The call stack of an allocator call: its direct caller from the
//! return address at the stack pointer, the rest by walking frame pointers
//! or the unwind tables (`unwind`), stored once per distinct stack
//! (`stack_store`).
use aya_ebpf::{helpers::generated::bpf_probe_read_user, programs::ProbeContext};
use memprof_common::{
    lost::LostCause,
    settings::UnwindMode,
    sites::NO_STACK,
    stacks::{MAX_FRAMES, STACK_CUT},
    thread::{RegionFrames, ReturnAddress},
};

use crate::{
    accounting::stack_store::store,
    kernel::maps::{count_lost, LAST_STACK, STACK_WINDOW, WINDOW_WORDS},
};

/// `--unwind`, set by user space before load: a `UnwindMode`.
#[unsafe(no_mangle)]
static UNWIND_MODE: u8 = 0;

#[inline(always)]
pub fn unwind_mode() -> u8 {
    // SAFETY: a read-only global; volatile so the compiler keeps the read.
    unsafe { core::ptr::read_volatile(&UNWIND_MODE) }
}

/// A call's stack: its direct caller (the return address at the stack
/// pointer: at function entry the frame-pointer walk misses it) and the
/// key in `STACKS` of the frames above it.
pub struct CallStack {
    pub caller: u64,
    pub stack: u64,
    /// 0, or `STACK_CUT` when the walk was cut short.
    pub flags: u32,
}

/// Reads the call stack of the allocator call being entered.
///
/// One read copies [`WINDOW_WORDS`] words of user stack from the stack
/// pointer, and the walk takes what it can from that copy: every read of
/// user memory pays a fixed cost (fault handling set-up and the kernel's
/// hardened-usercopy checks) that dwarfs copying a few hundred bytes, and
/// the innermost frames usually lie within a few hundred bytes of the
/// stack pointer. Frames beyond the copy are read one by one.
#[inline(always)]
pub fn call_stack(ctx: &ProbeContext, tgid: u32, regions: Option<&RegionFrames>) -> CallStack {
    // SAFETY: regs points at the probe's saved registers.
    let (sp, fp) = unsafe { ((*ctx.regs).rsp, (*ctx.regs).rbp) };
    let window = Window::copy(sp);
    let caller = match window.words_at(sp) {
        Some([ret, _]) => ret,
        None => {
            count_lost(LostCause::ReadFault);
            0
        }
    };
    let (stack, flags) = if unwind_mode() == UnwindMode::Dwarf as u8 && caller == 0 {
        (NO_STACK, 0)
    } else {
        beyond(&window, tgid, caller, sp + 8, fp, regions)
    };
    CallStack {
        caller,
        stack,
        flags,
    }
}

/// The frames beyond `pc` (the caller's, whose stack pointer is `sp` and
/// frame pointer `fp`): the unwind tables' walk or the frame-pointer
/// chain, as `--unwind` says; their key in `STACKS` and flags.
#[inline(always)]
fn beyond(
    window: &Window,
    tgid: u32,
    pc: u64,
    sp: u64,
    fp: u64,
    regions: Option<&RegionFrames>,
) -> (u64, u32) {
    if unwind_mode() == UnwindMode::Dwarf as u8 {
        crate::accounting::unwind::walk(tgid, pc, sp, fp, window.base, window.ok(), regions)
    } else {
        stack(window, fp, regions)
    }
}

/// The call stack at a probe inside a function (a USDT site): the site
/// itself stands as the caller (as a return address, one byte past it,
/// so that looking up the call finds the site), and the walk starts from
/// its function's frame.
#[inline(always)]
pub fn probe_site_stack(ctx: &ProbeContext, tgid: u32) -> CallStack {
    // SAFETY: regs points at the probe's saved registers.
    let (ip, sp, fp) = unsafe { ((*ctx.regs).rip, (*ctx.regs).rsp, (*ctx.regs).rbp) };
    let site = ip + 1;
    let window = Window::copy(sp);
    let (stack, flags) = beyond(&window, tgid, site, sp, fp, None);
    CallStack {
        caller: site,
        stack,
        flags,
    }
}

/// A copy of the user stack from `base`; empty when it could not be read
/// (the window ran past the end of the stack's mapping).
pub struct Window {
    words: Option<&'static [u64; WINDOW_WORDS]>,
    base: u64,
}

impl Window {
    #[inline(always)]
    fn copy(base: u64) -> Window {
        let words = STACK_WINDOW.get_ptr_mut(0).and_then(|words| {
            // SAFETY: a checked read of user memory into this CPU's
            // window; BPF programs do not nest on a CPU here.
            let status = unsafe {
                bpf_probe_read_user(words.cast(), (WINDOW_WORDS * 8) as u32, base as *const _)
            };
            // SAFETY: the per-CPU window, filled just now.
            (status == 0).then(|| unsafe { &*words })
        });
        Window { words, base }
    }

    #[inline(always)]
    fn ok(&self) -> bool {
        self.words.is_some()
    }

    /// The two words at user address `addr`.
    #[inline(always)]
    fn words_at(&self, addr: u64) -> Option<[u64; 2]> {
        let offset = addr.wrapping_sub(self.base);
        match self.words {
            Some(words) if offset <= (WINDOW_WORDS as u64 - 2) * 8 && offset & 7 == 0 => {
                // The mask changes nothing; it shows the verifier that
                // both indices are in bounds.
                let index = (offset / 8) as usize & (WINDOW_WORDS - 1);
                Some([words[index], words[(index + 1) & (WINDOW_WORDS - 1)]])
            }
            // SAFETY: a checked read of user memory.
            _ => unsafe { aya_ebpf::helpers::bpf_probe_read_user(addr as *const [u64; 2]) }.ok(),
        }
    }
}

/// Walks the frame-pointer chain from the allocator's caller's frame and
/// returns the stack's key in `STACKS`, storing the stack if it is new.
///
/// The walk is the kernel's (perf's) frame-pointer walk done here, which
/// measured ~3x cheaper than `bpf_get_stackid`, and the stacks are keyed by
/// a 64-bit hash checked against the stored frames, so they never collide
/// the way the kernel's stack-map buckets do. A stack equal to the last one
/// walked on this CPU (an allocation loop) reuses its checked key without
/// a lookup.
#[inline(always)]
pub fn stack(window: &Window, mut fp: u64, regions: Option<&RegionFrames>) -> (u64, u32) {
    let Some(last) = LAST_STACK.get_ptr_mut(0) else {
        return (NO_STACK, 0);
    };
    // SAFETY: the per-CPU slot; BPF programs do not nest on a CPU here.
    let last = unsafe { &mut *last };
    let frames = &mut last.frames;
    let mut len = 0usize;
    let mut hash: u64 = 0xcbf2_9ce4_8422_2325;
    // Non-zero once a frame differs from the last stack's. A number, not
    // a flag: the verifier would follow each flag value as its own path.
    let mut differs: u64 = 0;
    let mut flags = 0;
    for slot in 0..MAX_FRAMES {
        // A frame record is [saved frame pointer, return address]; frames
        // lie at rising, aligned addresses: anything else ends the chain.
        if fp == 0 || fp & 7 != 0 {
            break;
        }
        let Some([next, ret]) = window.words_at(fp) else {
            break;
        };
        let ret = match regions.map(|r| r.real_return(fp + 8, ret)) {
            None => ret,
            Some(ReturnAddress::Real(ret)) => ret,
            Some(ReturnAddress::Lost) => {
                count_lost(LostCause::UnwindNoInfo);
                flags = STACK_CUT;
                break;
            }
        };
        if ret == 0 {
            break;
        }
        differs |= frames.ips[slot] ^ ret;
        frames.ips[slot] = ret;
        hash = (hash ^ ret).wrapping_mul(0x0100_0000_01b3);
        len = slot + 1;
        fp = if next > fp { next } else { 0 };
    }
    if len == MAX_FRAMES && flags == 0 && fp != 0 && fp & 7 == 0 {
        if let Some([_, ret]) = window.words_at(fp) {
            if ret != 0 {
                // The chain goes on: its outermost frames are dropped.
                count_lost(LostCause::UnwindTooDeep);
                flags = STACK_CUT;
            }
        }
    }
    if len == 0 {
        count_lost(LostCause::StackError);
        return (NO_STACK, flags);
    }
    (store(last, len, hash, differs), flags)
}
