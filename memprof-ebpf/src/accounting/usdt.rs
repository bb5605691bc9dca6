//! Programs that sample their own allocations (`memprof_common::usdt`):
//! each `alloc(ptr, size, weight)` probe is one sampled call standing for
//! `weight` bytes (`weight / size` calls), counted under its call site as
//! a sampled allocator call is; `free(ptr)` (live mode) releases it.
use aya_ebpf::{helpers::bpf_probe_read_user, macros::map, maps::Array, programs::ProbeContext};
use memprof_common::{
    lost::LostCause,
    sampling::UNIT,
    sites::{AllocKey, Weight},
    usdt::{arg, UsdtArg, UsdtSpec},
};

use crate::{
    accounting::{
        live, mode::live_mode, regions, site_table::site_cookie, sites::add_call,
        stacks::probe_site_stack, thread::thread_state,
    },
    kernel::maps::count_lost,
};

/// Each probed USDT site's arguments, by the index its cookie holds
/// (written by user space before the site's events are enabled).
#[map]
pub static USDT_SPECS: Array<UsdtSpec> =
    Array::with_max_entries(memprof_common::usdt::USDT_SPECS, 0);

/// A sampled allocation, announced by the program itself.
#[inline(always)]
pub fn alloc(ctx: ProbeContext) -> u32 {
    let Some(spec) = spec_of(&ctx) else {
        return 0;
    };
    let pointer = argument(&ctx, &spec.args[0]);
    let size = argument(&ctx, &spec.args[1]);
    let bytes = argument(&ctx, &spec.args[2]);
    if bytes == 0 {
        return 0;
    }
    // The calls the sample stands for, in 1/65536 calls.
    let unit = match size {
        0 => UNIT,
        // No 128-bit division in BPF: exact below 2^48 bytes.
        _ if bytes < 1 << 48 => bytes * UNIT / size,
        _ => bytes / size * UNIT,
    };
    let weight = Weight { bytes, unit };
    let Some(thread) = thread_state() else {
        count_lost(LostCause::ThreadTableFull);
        return 0;
    };
    // --delay, --start-on, --toggle-on, --while: as for any allocation.
    if !regions::records(thread.region_depth) {
        return 0;
    }
    let tgid = thread.tgid;
    let stack = probe_site_stack(&ctx, tgid);
    let site = AllocKey {
        tgid,
        generation: thread.generation,
        allocator: spec.allocator,
        reserved: stack.flags,
        stack: stack.stack,
        caller: stack.caller,
    };
    if !live_mode() {
        add_call(&site, weight);
        return 0;
    }
    // The block is known at once: the call begins and completes here.
    live::begin(
        &mut thread.pending,
        thread.heap_slot,
        site,
        size,
        weight,
        live::CallPointers { out: 0, old: 0 },
    );
    live::complete(&thread.pending, pointer);
    thread.pending.active = 0;
    0
}

/// A sampled block freed (live mode).
#[inline(always)]
pub fn free(ctx: ProbeContext) -> u32 {
    let Some(spec) = spec_of(&ctx) else {
        return 0;
    };
    let pointer = argument(&ctx, &spec.args[0]);
    live::release_usdt(&ctx, pointer)
}

/// The spec of the USDT site whose probe runs (its cookie's index);
/// none (counted) when the table has no such entry.
#[inline(always)]
fn spec_of(ctx: &ProbeContext) -> Option<&'static UsdtSpec> {
    let spec = USDT_SPECS.get(site_cookie(ctx) as u32);
    if spec.is_none() {
        count_lost(LostCause::ProbeDispatch);
    }
    spec
}

/// The value of one argument, as its spec says.
#[inline(always)]
fn argument(ctx: &ProbeContext, spec: &UsdtArg) -> u64 {
    let raw = match spec.kind {
        arg::REGISTER => register(ctx, spec.register),
        arg::MEMORY => {
            let address = register(ctx, spec.register).wrapping_add(spec.value as u64);
            // SAFETY: a checked read of user memory.
            unsafe { bpf_probe_read_user(address as *const u64) }.unwrap_or_else(|_| {
                count_lost(LostCause::ReadFault);
                0
            })
        }
        arg::MEMORY_INDEXED => {
            let address = register(ctx, spec.register)
                .wrapping_add(register(ctx, spec.index).wrapping_mul(spec.scale as u64))
                .wrapping_add(spec.value as u64);
            // SAFETY: a checked read of user memory.
            unsafe { bpf_probe_read_user(address as *const u64) }.unwrap_or_else(|_| {
                count_lost(LostCause::ReadFault);
                0
            })
        }
        arg::CONSTANT => spec.value as u64,
        _ => 0,
    };
    sized(raw, spec.size)
}

/// `raw` cut to `size` bytes, sign-extended when `size` is negative.
#[inline(always)]
fn sized(raw: u64, size: i8) -> u64 {
    let bits = (size.unsigned_abs() as u32 * 8).clamp(8, 64);
    if bits == 64 {
        return raw;
    }
    let shift = 64 - bits;
    if size < 0 {
        (((raw << shift) as i64) >> shift) as u64
    } else {
        (raw << shift) >> shift
    }
}

/// Register `index` of the probe's `pt_regs` (see `UsdtArg::register`).
/// Each field is read at its own fixed offset: the verifier refuses a
/// context offset computed at run time.
#[inline(always)]
fn register(ctx: &ProbeContext, index: u8) -> u64 {
    let regs = ctx.regs;
    // SAFETY: reads of the probe's saved registers.
    unsafe {
        match index {
            0 => core::ptr::read_volatile(&(*regs).r15),
            1 => core::ptr::read_volatile(&(*regs).r14),
            2 => core::ptr::read_volatile(&(*regs).r13),
            3 => core::ptr::read_volatile(&(*regs).r12),
            4 => core::ptr::read_volatile(&(*regs).rbp),
            5 => core::ptr::read_volatile(&(*regs).rbx),
            6 => core::ptr::read_volatile(&(*regs).r11),
            7 => core::ptr::read_volatile(&(*regs).r10),
            8 => core::ptr::read_volatile(&(*regs).r9),
            9 => core::ptr::read_volatile(&(*regs).r8),
            10 => core::ptr::read_volatile(&(*regs).rax),
            11 => core::ptr::read_volatile(&(*regs).rcx),
            12 => core::ptr::read_volatile(&(*regs).rdx),
            13 => core::ptr::read_volatile(&(*regs).rsi),
            14 => core::ptr::read_volatile(&(*regs).rdi),
            16 => core::ptr::read_volatile(&(*regs).rip),
            19 => core::ptr::read_volatile(&(*regs).rsp),
            _ => 0,
        }
    }
}
