//! Probes that share a tracefs event: which site fired, from its address.
//!
//! Detaching a tracefs uprobe event waits for an RCU grace period (~88 ms
//! here), one event after another under the kernel's `event_mutex`; with
//! an event per probed function, `memprof trace -- /bin/true` spent 1.9 s
//! detaching. So the probes of a *site group* share two events, one for
//! entries and one for returns, and one program runs at each: it finds
//! the site in [`SITE_TABLE_LEN`] entries by the group (the probe's BPF
//! cookie) and the probe address's offset in its page, which equals the
//! probed file offset's (ELF maps file offsets page-aligned), then
//! tail-calls the site's program. Sites whose page offsets collide go to
//! another group.

/// Site groups the kernel's table holds: the targets' libraries at the
/// start take one or two, each library loaded later one more.
pub const SITE_GROUPS: u32 = 64;

/// Entries per group: one per page offset.
pub const GROUP_ENTRIES: u32 = 4096;

pub const SITE_TABLE_LEN: u32 = SITE_GROUPS * GROUP_ENTRIES;

/// Where in its page `address` (or a file offset) lies: equal for a probe's
/// file offset and its address in any process.
#[inline(always)]
pub const fn page_offset(address: u64) -> u64 {
    address % GROUP_ENTRIES as u64
}

/// The table index of a probe at `address` (or file offset) in `group`.
#[inline(always)]
pub const fn site_index(group: u64, address: u64) -> u32 {
    ((group % SITE_GROUPS as u64) * GROUP_ENTRIES as u64 + page_offset(address)) as u32
}

/// Where the C library's code lies around one of its probes, as distances
/// below and above the probe (both 0: unknown). A return address in there,
/// read at the probe, is a call the library made itself: free's cookie
/// (blocks it took without malloc's entry), and part of a mapping
/// function's (`mappings::MappingCookie`: malloc mapping its memory).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct LibraryCode {
    pub below: u32,
    pub above: u32,
}

impl LibraryCode {
    /// Whether `address`, seen at the probe at `probe`, lies in the code.
    #[inline(always)]
    pub const fn contains(self, probe: u64, address: u64) -> bool {
        let distance = address.wrapping_sub(probe) as i64;
        self.above != 0 && distance >= -(self.below as i64) && distance < self.above as i64
    }

    /// As free's cookie.
    pub const fn encode(self) -> u64 {
        self.below as u64 | (self.above as u64) << 32
    }

    pub const fn decode(cookie: u64) -> LibraryCode {
        LibraryCode {
            below: cookie as u32,
            above: (cookie >> 32) as u32,
        }
    }
}

/// One probed site: the programs its probes run (1-based indices into
/// `ENTRY_PROGRAMS` / `RETURN_PROGRAMS`, 0 for none) and the cookie its
/// entry program reads.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct SiteEntry {
    pub cookie: u64,
    pub entry: u32,
    pub ret: u32,
}

/// Programs at a site's entry, by `SiteEntry::entry`. `MALLOC` and `FREE`,
/// the calls made most, run in the dispatcher itself (no tail call).
pub mod entry {
    /// malloc: its cookie is known when compiling.
    pub const MALLOC: u32 = 1;
    /// Any other allocator function (cookie: `ProbeCookie`).
    pub const ALLOC: u32 = 2;
    /// free (cookie: the library's own code, [`LibraryCode`], or 0).
    pub const FREE: u32 = 3;
    /// Other functions releasing blocks (cookie: the pointer argument).
    pub const RELEASE: u32 = 4;
    /// mmap, munmap, mremap, sbrk (cookie: `MappingCall`).
    pub const MAPPING: u32 = 5;
    /// The loader's `_dl_debug_state` (cookie: distance to `_r_debug`).
    pub const LOADER: u32 = 6;
    /// A `--while` function: its thread enters the recorded region.
    pub const REGION: u32 = 7;
    /// A USDT `alloc` probe (cookie: its `USDT_SPECS` index).
    pub const USDT_ALLOC: u32 = 8;
    /// A USDT `free` probe (cookie: its `USDT_SPECS` index).
    pub const USDT_FREE: u32 = 9;
    /// A malloc-like function under session probes, in a process with no
    /// return probe on it yet (see `SESSION_ALLOC`): chosen at run time.
    pub const UNRETURNED: u32 = 10;
    /// `runtime.mallocgc` in a Go program (cookie: `ProbeCookie`):
    /// counted with the type it allocates, never live.
    pub const GO_ALLOC: u32 = 11;
    pub const COUNT: u32 = 11;
}

/// Programs at a site's return, by `SiteEntry::ret`. `ALLOC` runs in the
/// dispatcher itself.
pub mod ret {
    pub const ALLOC: u32 = 1;
    pub const MAPPING: u32 = 2;
    /// A `--while` function's return: its thread leaves the region.
    pub const REGION: u32 = 3;
    /// A malloc-like function (not `may_nest`) under session probes
    /// (`--live` with sampling): in a process with a session link its
    /// entry and return run `alloc_session`, and the shared events'
    /// programs leave it alone; in its children (no link) it is `ALLOC`.
    /// Runs in the dispatcher itself (never tail-called).
    pub const SESSION_ALLOC: u32 = 4;
    pub const COUNT: u32 = 3;
}
