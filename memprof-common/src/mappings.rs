//! Direct mappings: anonymous `mmap`/`mremap`/`munmap` and `sbrk` calls a
//! program makes itself, seen at the C library's functions and reported as
//! allocators of their own.

/// `AllocKey::allocator` of a direct mapping's call site: above every
/// probed row (a probe cookie holds a `u8`), so the two never meet.
pub const MMAP: u32 = 0x100;
pub const MREMAP: u32 = 0x101;
pub const BRK: u32 = 0x102;

/// How reports name the calls of `allocator`, if it is a direct
/// mapping's.
pub fn mapping_name(allocator: u32) -> Option<&'static str> {
    match allocator {
        MMAP => Some("mmap"),
        MREMAP => Some("mremap"),
        BRK => Some("brk"),
        _ => None,
    }
}

/// Which call a [`MappingNotice`] reports (also the probe's cookie).
#[repr(u32)]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum MappingCall {
    /// `mmap` returned `address`; `length` bytes (page-rounded).
    Map = 1,
    /// `munmap(address, length)`, at its entry (before any other thread
    /// can be given the range).
    Unmap = 2,
    /// `mremap` moved or resized `[old_address, +old_length)` to
    /// `[address, +length)`.
    Remap = 3,
    /// `sbrk(length)` (an increment, two's complement) returned the old
    /// break, `address`.
    Sbrk = 4,
}

impl MappingCall {
    pub const fn from_cookie(cookie: u64) -> MappingCall {
        match cookie {
            1 => MappingCall::Map,
            2 => MappingCall::Unmap,
            3 => MappingCall::Remap,
            _ => MappingCall::Sbrk,
        }
    }

    /// The allocator a call counts as (`AllocKey::allocator`).
    pub const fn allocator(self) -> u32 {
        match self {
            MappingCall::Map | MappingCall::Unmap => MMAP,
            MappingCall::Remap => MREMAP,
            MappingCall::Sbrk => BRK,
        }
    }
}

/// The C library's functions memprof probes for direct mappings (glibc's
/// `mmap64` is `mmap`; `sbrk` is what malloc and programs grow the break
/// with: it returns the old break, so the growth is known without a
/// baseline). Aliases at one address get one probe.
pub const MAPPING_FUNCTIONS: [(&str, MappingCall); 9] = [
    ("mmap", MappingCall::Map),
    ("mmap64", MappingCall::Map),
    ("__mmap", MappingCall::Map),
    ("munmap", MappingCall::Unmap),
    ("__munmap", MappingCall::Unmap),
    ("mremap", MappingCall::Remap),
    ("__mremap", MappingCall::Remap),
    ("sbrk", MappingCall::Sbrk),
    ("__sbrk", MappingCall::Sbrk),
];

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

/// A mapping call under way on a thread: what its entry saw, for its
/// return.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default)]
pub struct PendingMapping {
    /// The [`MappingCall`] expected at the return, or 0: none.
    pub call: u32,
    pub reserved: u32,
    pub old_address: u64,
    pub old_length: u64,
    pub length: u64,
    pub site: crate::AllocKey,
}

/// The kernel rounds mapping lengths up to pages.
pub const PAGE_SIZE: u64 = 4096;

pub const fn page_rounded(length: u64) -> u64 {
    length.saturating_add(PAGE_SIZE - 1) & !(PAGE_SIZE - 1)
}
