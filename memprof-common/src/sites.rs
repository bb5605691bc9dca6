//! Call sites: the key every call is counted under, its figures, and
//! the per-CPU slots totals mode counts in.
use crate::images::ProcessImage;
/// Key of the per-call-site totals map.
///
/// One entry per distinct (process image, stack, direct caller, allocator
/// function). The direct caller is kept apart from the stack because at a
/// function-entry uprobe the frame-pointer walk does not see it yet.
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct AllocKey {
    /// Process id (tgid).
    pub tgid: u32,
    /// Which program image of that process: bumped at each exec, so the
    /// shell that forked and the program it exec'd are told apart.
    pub generation: u32,
    /// Index into [`allocators::ALLOCATORS`].
    pub allocator: u32,
    /// Makes the padding explicit, so that no stray bytes end up in the
    /// hashed key: flags in its low bits ([`STACK_CUT`] when the walk cut
    /// the stack short), and above them ([`GO_TYPE_BITS`]) the low bits
    /// of the Go type a `runtime.mallocgc` call allocated, 0 for none.
    ///
    /// [`STACK_CUT`]: crate::stacks::STACK_CUT
    pub reserved: u32,
    /// Key of the stack in the stack map (a hash of its frames), or
    /// [`NO_STACK`] when no stack beyond the caller was recorded.
    pub stack: u64,
    /// Return address found at the stack pointer: the allocator's caller.
    /// Zero when it could not be read.
    pub caller: u64,
}

impl AllocKey {
    /// The Go type descriptor of the call's object, if it had one: the
    /// address in the same 4 GiB as the caller's code (the type data and
    /// the code that allocates lie in one binary, far less apart).
    pub fn go_type(&self) -> Option<u64> {
        let low = u64::from(self.reserved & GO_TYPE_BITS);
        if low == 0 {
            return None;
        }
        let span = 1u64 << 32;
        let base = self.caller & !(span - 1);
        [base.wrapping_sub(span), base, base.wrapping_add(span)]
            .into_iter()
            .map(|high| high | low)
            .min_by_key(|address| address.abs_diff(self.caller))
    }

    /// The process image the call site belongs to.
    pub fn image(&self) -> ProcessImage {
        ProcessImage {
            tgid: self.tgid,
            generation: self.generation,
        }
    }
}

/// The bits of `AllocKey::reserved` that hold a Go type's address: Go's
/// type descriptors are 8-aligned, leaving the flags their low 3 bits.
pub const GO_TYPE_BITS: u32 = !0b111;

/// `AllocKey::stack` when no stack could be recorded.
pub const NO_STACK: u64 = 0;

/// Slots per CPU of the site table (BPF `SITE_SLOTS`), a power of two.
pub const SITE_SLOTS: u32 = 512;

/// A call site's counters in a per-CPU slot of the site table, where the
/// hot path of totals mode adds without a hash-map lookup (a kernel call).
/// A slot is taken by the first site that lands on it and is never given
/// back, so a site's slots and its `COUNTS` entry add up without counting
/// anything twice; sites that find their slots taken go to `COUNTS`.
/// An empty slot has `key.tgid == 0`.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default)]
pub struct SiteSlot {
    pub key: AllocKey,
    pub stats: AllocStats,
}

impl SiteSlot {
    /// The two slots a site may take: a pair of neighbours (two ways keep
    /// the table useful as it fills up).
    pub fn candidates(key: &AllocKey) -> [u32; 2] {
        let mixed = (key.stack ^ key.caller.rotate_left(32))
            ^ ((key.tgid as u64) << 32 | key.generation as u64)
            ^ ((key.allocator as u64) << 56);
        let hash = mixed.wrapping_mul(0x9e37_79b9_7f4a_7c15);
        let first = (hash >> 32) as u32 & (SITE_SLOTS - 1);
        [first, first ^ 1]
    }
}

/// A call site's figures: in `COUNTS` (one value for all CPUs, added to
/// atomically), and per CPU in the site slots and `SITE_STATS` (summed
/// over CPUs by user space).
///
/// With `--sample-bytes`, only sampled calls are counted, each weighed by
/// the inverse of its chance to be sampled: `bytes` and `live_bytes` are
/// then estimates in bytes, and the count fields estimates in units of
/// 1/65536 call ([`sampling::UNIT`]).
///
/// The live fields are used with `--live` only. A block is often freed on
/// another CPU than the one that allocated it, so a per-CPU slot can go
/// "negative": they are updated with wrapping arithmetic and only their
/// (wrapping) sum over all CPUs means anything.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct AllocStats {
    /// Bytes requested by all calls.
    pub bytes: u64,
    /// Calls.
    pub count: u64,
    /// Bytes of the tracked blocks not freed yet.
    pub live_bytes: u64,
    /// Tracked blocks not freed yet.
    pub live_count: u64,
    /// Blocks freed within the `--temp-threshold` of their allocation.
    pub temporary_count: u64,
    /// Blocks that could not be tracked (the pointer table was full).
    pub untracked_count: u64,
    /// Calls recorded (sampled ones with `--sample-bytes`, else all).
    pub samples: u64,
}

impl AllocStats {
    /// The sum of two CPUs' slots.
    pub fn merged(self, other: AllocStats) -> AllocStats {
        AllocStats {
            bytes: self.bytes.wrapping_add(other.bytes),
            count: self.count.wrapping_add(other.count),
            live_bytes: self.live_bytes.wrapping_add(other.live_bytes),
            live_count: self.live_count.wrapping_add(other.live_count),
            temporary_count: self.temporary_count.wrapping_add(other.temporary_count),
            untracked_count: self.untracked_count.wrapping_add(other.untracked_count),
            samples: self.samples.wrapping_add(other.samples),
        }
    }
}

/// What one recorded call adds to its call site's stats: its bytes and
/// one call, or with sampling the estimates it stands for.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Weight {
    pub bytes: u64,
    /// 1, or with sampling 65536 / (chance to be sampled).
    pub unit: u64,
}

impl Default for AllocKey {
    fn default() -> Self {
        AllocKey {
            tgid: 0,
            generation: 0,
            allocator: 0,
            reserved: 0,
            stack: NO_STACK,
            caller: 0,
        }
    }
}
