//! Direct mappings: anonymous `mmap`/`mremap`/`munmap` and `brk` calls a
//! program makes itself, seen at the syscall tracepoints and reported as
//! allocators of their own.

/// `AllocKey::allocator` of a direct mapping's call site: above every
/// probed row (a probe cookie holds a `u8`), so the two never meet.
pub const MMAP: u32 = 0x100;
pub const MREMAP: u32 = 0x101;
pub const BRK: u32 = 0x102;

/// How reports name the calls of `allocator`, if it is a syscall.
pub fn syscall_name(allocator: u32) -> Option<&'static str> {
    match allocator {
        MMAP => Some("mmap"),
        MREMAP => Some("mremap"),
        BRK => Some("brk"),
        _ => None,
    }
}

/// Which call a [`MappingNotice`] reports.
#[repr(u32)]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum MappingCall {
    /// `mmap` returned `address`; `length` bytes (page-rounded).
    Map = 1,
    /// `munmap(address, length)`, at its entry (before any other thread
    /// can be given the range again).
    Unmap = 2,
    /// `mremap` moved or resized `[old_address, +old_length)` to
    /// `[address, +length)`.
    Remap = 3,
    /// `brk` returned `address`, the program break now.
    Brk = 4,
    /// A `brk` made inside an allocator whose return is probed: the break
    /// is at `address` now, by the allocator's doing (not counted).
    BreakMoved = 5,
}

/// Sent through the `NOTICES` ring buffer (`NoticeKind::Mapping`): user
/// space keeps the mappings, because an unmap may cut any part of one,
/// which takes an ordered index of ranges.
#[repr(C)]
#[derive(Clone, Copy, Debug)]
pub struct MappingNotice {
    /// `NoticeKind::Mapping`.
    pub kind: u32,
    /// A [`MappingCall`].
    pub call: u32,
    pub time_ns: u64,
    pub address: u64,
    pub length: u64,
    pub old_address: u64,
    pub old_length: u64,
    /// The call site (process image, stack, allocator `MMAP`/`MREMAP`/`BRK`);
    /// for `Unmap` only its process image.
    pub site: crate::AllocKey,
}

/// A syscall under way on a thread: what its entry saw, for its exit.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default)]
pub struct PendingSyscall {
    /// The [`MappingCall`] expected at the exit, or 0: none.
    pub call: u32,
    pub reserved: u32,
    pub old_address: u64,
    pub old_length: u64,
    pub length: u64,
}

/// The kernel rounds mapping lengths up to pages.
pub const PAGE_SIZE: u64 = 4096;

pub const fn page_rounded(length: u64) -> u64 {
    length.saturating_add(PAGE_SIZE - 1) & !(PAGE_SIZE - 1)
}
