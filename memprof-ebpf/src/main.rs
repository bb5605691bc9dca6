//! memprof's BPF programs.
//!
//! One program serves every allocator function: each site's cookie says
//! which function fired and which argument holds the size; the probes of
//! many sites share an event, whose program finds the site (`dispatch`).
//! Data path: uprobe at allocator entry -> `COUNTS[(process, stack, caller, fn)] += bytes`
//! in the kernel; user space reads the maps when it reports.
#![cfg_attr(target_arch = "bpf", no_std)]
#![cfg_attr(target_arch = "bpf", no_main)]
// Compare-and-swap and fetch-add on map memory (see `atomics`).
#![cfg_attr(target_arch = "bpf", feature(asm_experimental_arch))]

#[cfg(target_arch = "bpf")]
mod accounting;
#[cfg(target_arch = "bpf")]
mod kernel;
#[cfg(target_arch = "bpf")]
mod programs;

#[cfg(target_arch = "bpf")]
#[panic_handler]
fn panic(_info: &core::panic::PanicInfo) -> ! {
    // The verifier rejects any reachable panic; this is never called.
    loop {}
}

#[cfg(target_arch = "bpf")]
#[unsafe(link_section = "license")]
#[unsafe(no_mangle)]
static LICENSE: [u8; 13] = *b"Dual MIT/GPL\0";

#[cfg(not(target_arch = "bpf"))]
fn main() {}
