//! Types shared by the BPF programs and the `memprof` daemon.
//!
//! Everything here is `#[repr(C)]` plain data: the kernel copies these
//! structs in and out of BPF maps byte for byte, so both sides must agree
//! on their layout exactly.
#![no_std]

pub mod allocators;
pub mod cookies;
pub mod dispatch;
pub mod images;
pub mod live;
pub mod lost;
pub mod mappings;
pub mod notices;
pub mod python;
pub mod sampling;
pub mod settings;
pub mod sites;
pub mod stacks;
pub mod thread;
pub mod unwind;
pub mod usdt;

#[cfg(feature = "user")]
mod pod {
    use crate::{
        dispatch::SiteEntry,
        images::{ProcState, ProcessCalls, ProcessImage},
        live::{LiveBlock, LiveEntry, LiveKey, ProcHeap},
        notices::{LibraryNotice, ProcessNotice},
        sites::{AllocKey, AllocStats, SiteSlot},
        stacks::StackFrames,
        unwind::{MappingEntry, ProcMappings, Row},
        usdt::UsdtSpec,
    };
    // SAFETY: all are repr(C) plain integers without padding holes that
    // the kernel could leave uninitialized in a way that matters.
    unsafe impl aya::Pod for AllocKey {}
    unsafe impl aya::Pod for AllocStats {}
    unsafe impl aya::Pod for SiteSlot {}
    unsafe impl aya::Pod for ProcessNotice {}
    unsafe impl aya::Pod for ProcState {}
    unsafe impl aya::Pod for LibraryNotice {}
    unsafe impl aya::Pod for StackFrames {}
    unsafe impl aya::Pod for LiveKey {}
    unsafe impl aya::Pod for LiveBlock {}
    unsafe impl aya::Pod for LiveEntry {}
    unsafe impl aya::Pod for ProcessImage {}
    unsafe impl aya::Pod for ProcessCalls {}
    unsafe impl aya::Pod for ProcHeap {}
    unsafe impl aya::Pod for Row {}
    unsafe impl aya::Pod for MappingEntry {}
    unsafe impl aya::Pod for ProcMappings {}
    unsafe impl aya::Pod for SiteEntry {}
    unsafe impl aya::Pod for UsdtSpec {}
}
