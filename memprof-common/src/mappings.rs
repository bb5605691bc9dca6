//! Direct mappings: anonymous `mmap`/`mremap`/`munmap` and `sbrk` calls a
//! program makes itself, seen at the C library's functions and reported as
//! allocators of their own.

use crate::dispatch::LibraryCode;

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

/// Which call a [`MappingNotice`] reports (the low byte of its probe's
/// cookie, [`MappingCookie`]).
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

/// A mapping probe's cookie: the call, and where the C library's own code
/// lies around the probe (none when unknown, or the probe is not the C
/// library's). A call made from that code is malloc's (growing its heap,
/// mapping a big block or an arena), which user space could only tell from
/// the stack, and a new process's stack stops in the library until its
/// unwind tables are loaded.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct MappingCookie {
    pub call: MappingCall,
    pub library: LibraryCode,
}

impl MappingCookie {
    /// Bits each distance has in the cookie (256 MiB of code).
    const DISTANCE_BITS: u32 = 28;
    const DISTANCE_MASK: u64 = (1 << Self::DISTANCE_BITS) - 1;

    /// A cookie for `call`, with the library's code when both its
    /// distances fit (else none).
    pub const fn new(call: MappingCall, library: LibraryCode) -> MappingCookie {
        let fits = library.below as u64 <= Self::DISTANCE_MASK
            && library.above as u64 <= Self::DISTANCE_MASK;
        MappingCookie {
            call,
            library: if fits {
                library
            } else {
                LibraryCode { below: 0, above: 0 }
            },
        }
    }

    pub const fn encode(self) -> u64 {
        self.call as u64
            | (self.library.below as u64) << 8
            | (self.library.above as u64) << (8 + Self::DISTANCE_BITS)
    }

    pub const fn decode(cookie: u64) -> MappingCookie {
        MappingCookie {
            call: MappingCall::from_cookie(cookie & 0xff),
            library: LibraryCode {
                below: ((cookie >> 8) & Self::DISTANCE_MASK) as u32,
                above: ((cookie >> (8 + Self::DISTANCE_BITS)) & Self::DISTANCE_MASK) as u32,
            },
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
    pub site: crate::sites::AllocKey,
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
    pub site: crate::sites::AllocKey,
    /// The stack pointer, the probe's address and the time at its entry:
    /// a call made deeper while it is under way, from code near it, is a
    /// wrapper's passing it on.
    pub entry_sp: u64,
    pub entry_ip: u64,
    pub entry_ns: u64,
}

/// How far from a wrapper's entry its call to the function it wraps may
/// be (tcmalloc's `sbrk` calls `__sbrk` 0x1b-0x58 bytes in, libmemusage's
/// `mmap` the real one 0x26 in): a signal handler's code is farther.
pub const WRAPPER_REACH: u64 = 64 * 1024;

/// How long a mapping call may be under way (a wrapper's, with the one it
/// makes inside): a pending call older than this lost its return (its
/// probe detached meanwhile).
pub const MAPPING_CALL_MAX_NS: u64 = 1_000_000_000;

/// The kernel rounds mapping lengths up to pages.
pub const PAGE_SIZE: u64 = 4096;

pub const fn page_rounded(length: u64) -> u64 {
    length.saturating_add(PAGE_SIZE - 1) & !(PAGE_SIZE - 1)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_mapping_cookie_keeps_its_call_and_the_librarys_code() {
        let code = |below, above| LibraryCode { below, above };
        let cookie = MappingCookie::new(MappingCall::Sbrk, code(0x9_0000, 0x10_0000));
        let decoded = MappingCookie::decode(cookie.encode());
        assert_eq!(decoded, cookie);
        let probe = 0x7f00_0009_0000;
        let library = decoded.library;
        assert!(library.contains(probe, 0x7f00_0000_0000));
        assert!(library.contains(probe, probe + 0xf_ffff));
        assert!(!library.contains(probe, probe + 0x10_0000));
        assert!(!library.contains(probe, 0x5555_0000_1000));
        // Too far to say, or no range: never the library's.
        let far =
            MappingCookie::decode(MappingCookie::new(MappingCall::Map, code(1 << 30, 1)).encode());
        assert_eq!(far.call, MappingCall::Map);
        assert!(!far.library.contains(probe, probe));
        let none = MappingCookie::decode(MappingCall::Remap as u64);
        assert!(!none.library.contains(probe, probe));
        // Free's cookie keeps the whole range.
        assert_eq!(
            LibraryCode::decode(code(5, 1 << 30).encode()),
            code(5, 1 << 30)
        );
    }
}
