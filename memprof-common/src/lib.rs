//! Types shared by the BPF programs and the `memprof` daemon.
//!
//! Everything here is `#[repr(C)]` plain data: the kernel copies these
//! structs in and out of BPF maps byte for byte, so both sides must agree
//! on their layout exactly.
#![no_std]

pub mod allocators;
pub mod dispatch;
pub mod mappings;
pub mod sampling;
pub mod usdt;

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
    /// hashed key: 0, or [`STACK_CUT`] when the walk cut the stack short.
    pub reserved: u32,
    /// Key of the stack in the stack map (a hash of its frames), or
    /// [`NO_STACK`] when no stack beyond the caller was recorded.
    pub stack: u64,
    /// Return address found at the stack pointer: the allocator's caller.
    /// Zero when it could not be read.
    pub caller: u64,
}

impl AllocKey {
    /// The process image the call site belongs to.
    pub fn image(&self) -> ProcessImage {
        ProcessImage {
            tgid: self.tgid,
            generation: self.generation,
        }
    }
}

/// `AllocKey::stack` when no stack could be recorded.
pub const NO_STACK: u64 = 0;

/// The image generation of the calls of a process the process table had
/// no room for (`--max-processes`): user space counts them as lost
/// (`LostCause::ProcessTableFull`), never as a process's.
pub const REFUSED_GENERATION: u32 = u32::MAX;

/// An image generation as a process's first, from the time it was first
/// seen in units of ~1 ms (`ktime >> 20`, so that a process that takes a
/// dead one's pid never shares its keys): never 0 (an attached process's
/// first image) nor [`REFUSED_GENERATION`]. As a u32 it wraps after ~50
/// days of uptime: compare generations with [`generation_order`].
pub const fn first_generation(ktime_ns: u64) -> u32 {
    match (ktime_ns >> 20) as u32 {
        0 | REFUSED_GENERATION => 1,
        generation => generation,
    }
}

/// The generation of the image a process execs next: one more, never 0
/// nor [`REFUSED_GENERATION`].
pub const fn next_generation(generation: u32) -> u32 {
    match generation.wrapping_add(1) {
        0 | REFUSED_GENERATION => 1,
        next => next,
    }
}

/// The order of two generations of one pid, as serial numbers (RFC 1982):
/// right across the u32's wrap for images first seen less than ~24 days
/// apart (the images of one pid memprof holds at once are those of the
/// processes that had it within one report interval; a process first
/// seen more than 24 days before one that took its pid within that
/// interval is ordered wrongly).
pub const fn generation_order(a: u32, b: u32) -> core::cmp::Ordering {
    let ahead = a.wrapping_sub(b) as i32;
    if ahead > 0 {
        core::cmp::Ordering::Greater
    } else if ahead < 0 {
        core::cmp::Ordering::Less
    } else {
        core::cmp::Ordering::Equal
    }
}

/// `WATCH_EXECS`: the execs of processes not watched yet are announced
/// (`monitor --comm/--exe/--cgroup`).
pub const WATCH_UNWATCHED: u8 = 1;
/// `WATCH_EXECS`: every exec is announced (`monitor` of the whole host).
pub const WATCH_EVERY: u8 = 2;

/// `GATING` (`monitor`'s budget): each process's probes go in and out
/// apart; while they do, its tgid is in `GATED_OUT`.
pub const GATING_PROCESSES: u8 = 1;
/// `GATING`: the whole host's probes go in and out together; while they
/// do, key 0 is in `GATED_OUT`.
pub const GATING_HOST: u8 = 2;

/// Frames kept per stack beyond the direct caller (a power of two). 64
/// cut 45% of the calls of a Python program importing a few stdlib
/// modules (each import nests ~20 frames of the interpreter); peers keep
/// 127 (the kernel's `perf_event_max_stack`).
pub const MAX_FRAMES: usize = 128;

/// A user stack as the BPF frame-pointer walk found it: return addresses,
/// innermost first; unused slots are zero.
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct StackFrames {
    pub len: u64,
    pub ips: [u64; MAX_FRAMES],
}

/// `AllocKey::reserved` bit: the stack walk (either `--unwind`) stopped
/// before the outermost frame for a reason counted as lost (`unwind_*`):
/// the stack is partial.
pub const STACK_CUT: u32 = 1;

/// `AllocKey::reserved` bit of a mapping notice: the call was made where
/// nothing is recorded (`--while`, paused); it still ends what it replaces
/// (MAP_FIXED), and is not counted.
pub const NOT_RECORDED: u32 = 2;

/// `--unwind`, as the BPF side reads it (global `UNWIND_MODE`).
pub const UNWIND_FP: u8 = 0;
pub const UNWIND_DWARF: u8 = 1;

/// One row of a file's unwind table: the rule for the addresses from `pc`
/// up to the next row's `pc` (see memprof-user's `unwind::table`). All
/// files' rows lie in the BPF array `UNWIND_ROWS`, each file's followed by
/// its page index ([`PAGE_INDEX`]).
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub struct Row {
    /// First address of the row, relative to the table's base (the file's
    /// lowest executable segment vaddr).
    pub pc: u32,
    /// The CFA's offset from its base register, in 8-byte words.
    pub cfa_words: i16,
    /// [`RBP_AT_CFA`]: the saved rbp's offset from the CFA in words;
    /// [`CFA_PLT`]: the `rip & 15` threshold. Otherwise 0.
    pub aux: i8,
    /// Bits 0-3: `CFA_*`; bits 4-7: `RBP_*`.
    pub kind: u8,
}

/// [`Row::kind`] bits 0-3: how to find the CFA.
pub const CFA_GAP: u8 = 0;
pub const CFA_RSP: u8 = 1;
pub const CFA_RBP: u8 = 2;
pub const CFA_PLT: u8 = 3;
pub const CFA_DEREF_RBP: u8 = 4;
pub const CFA_OUTERMOST: u8 = 5;
pub const CFA_UNSUPPORTED: u8 = 6;
/// [`Row::kind`] bits 4-7: where the caller's rbp is.
pub const RBP_UNCHANGED: u8 = 0;
pub const RBP_AT_CFA: u8 = 1;
pub const RBP_UNDEFINED: u8 = 2;

/// After a file's rows in `UNWIND_ROWS` comes its page index, so that a
/// walk searches the rows of one page of code rather than the whole file
/// (gcc's cc1plus has 640,000 rows: 20 steps per frame through cold
/// memory, ~4 us a call of its 20-frame stacks): a header row whose
/// `kind` is `PAGE_INDEX`, `pc` the number of pages and `aux` the page
/// size's log2, then for each page a row whose `pc` is how many of the
/// file's rows start below that page.
pub const PAGE_INDEX: u8 = 0xff;

/// Executable mappings kept per process for the BPF walk (a power of two):
/// Debian's python3 maps 60 once a few stdlib modules are imported, large
/// applications hundreds. 8 KiB a process (`UNWIND_MAPS` allocates its
/// entries as processes come).
pub const MAX_MAPPINGS: usize = 256;

/// One executable mapping of a process with its file's rows.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct MappingEntry {
    /// Process addresses [start, end).
    pub start: u64,
    pub end: u64,
    /// The process address of the table's pc 0 (load bias + table base):
    /// an address `a` is looked up at `a - bias_plus_base`.
    pub bias_plus_base: u64,
    /// The file's rows in `UNWIND_ROWS`: `rows` rows from `first_row`.
    pub first_row: u32,
    pub rows: u32,
}

/// A process's executable mappings (BPF `UNWIND_MAPS`, by tgid), sorted by
/// `start`; only the first `len` entries count. A walk that reaches an
/// address outside them all (a library loaded since they were read, one
/// beyond `MAX_MAPPINGS`, a JIT's code) is cut there.
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ProcMappings {
    pub len: u32,
    pub reserved: u32,
    pub entries: [MappingEntry; MAX_MAPPINGS],
}

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

/// A process's calls of the probed allocator functions and the bytes they
/// asked for, counted exactly in the kernel (memprof-ebpf `calls`) while
/// `monitor` keeps its budget: its sampled call sites' sums are estimates.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct ProcessCalls {
    /// Outermost calls, as call sites count them.
    pub calls: u64,
    pub bytes: u64,
    /// Entry traps, nested calls' too (`operator new` calls malloc): what
    /// the probes cost is counted in these.
    pub traps: u64,
}

impl ProcessCalls {
    /// Both counts together (two CPUs' values of one process).
    pub fn plus(self, other: ProcessCalls) -> ProcessCalls {
        ProcessCalls {
            calls: self.calls.wrapping_add(other.calls),
            bytes: self.bytes.wrapping_add(other.bytes),
            traps: self.traps.wrapping_add(other.traps),
        }
    }
}

/// One image of one process: the key of per-process counters.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct ProcessImage {
    pub tgid: u32,
    pub generation: u32,
}

/// Key of the pointer table (`--live`): one block of one process image.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub struct LiveKey {
    pub tgid: u32,
    pub generation: u32,
    /// The address the allocator returned.
    pub address: u64,
}

impl LiveKey {
    /// The process image the block belongs to.
    pub fn image(&self) -> ProcessImage {
        ProcessImage {
            tgid: self.tgid,
            generation: self.generation,
        }
    }
}

/// Value of the pointer table: where and when a live block was allocated.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct LiveBlock {
    /// The call site's key in the totals map.
    pub site: AllocKey,
    /// Bytes requested.
    pub size: u64,
    /// `bpf_ktime_get_ns()` (CLOCK_MONOTONIC) at the allocator's return.
    pub time_ns: u64,
    /// What the block counts for in the stats (see [`Weight`]).
    pub weight: Weight,
    /// Where its call site's stats are (`SITE_STATS`), or [`NO_SITE_ID`]
    /// when they are in `COUNTS`.
    pub site_id: u32,
    /// Its process's slot in `HEAPS` (see [`ProcHeap`]).
    pub heap_slot: u32,
}

/// `--live`: one process image's heap, kept exact in the kernel at every
/// allocation and free (a BPF array indexed by the image's slot; user
/// space maps it into memory). Slots are handed out in turn and reused
/// after [`HEAP_SLOTS`] images: `owner` says whose figures a slot holds.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct ProcHeap {
    /// [`ProcHeap::owner_of`] the image; 0 while the slot is unused.
    pub owner: u64,
    /// What the image holds now (in weighed units when sampling).
    pub live_bytes: u64,
    pub live_count: u64,
    /// The largest values `live_bytes` and `live_count` ever had: exact,
    /// each at its own moment.
    pub peak_bytes: u64,
    pub peak_count: u64,
    /// `bpf_ktime_get_ns()` when `peak_bytes` was reached.
    pub peak_time_ns: u64,
    /// `peak_bytes` when user space was last asked to capture the call
    /// sites holding the heap ([`NoticeKind::PeakGrown`]).
    pub snapshot_bytes: u64,
    pub reserved: u64,
}

/// Slots of the `HEAPS` array in live mode (a power of two): process
/// images alive at once beyond this share slots, and lose exact peaks.
pub const HEAP_SLOTS: u32 = 16384;

/// A block or thread whose process has no slot in `HEAPS`.
pub const NO_HEAP_SLOT: u32 = u32::MAX;

impl ProcHeap {
    #[inline(always)]
    pub const fn owner_of(tgid: u32, generation: u32) -> u64 {
        ((tgid as u64) << 32) | generation as u64
    }

    /// The peak has grown enough since the last capture of its call sites
    /// to ask for another: by 1/16, and by at least 4 KiB. A heap that
    /// grows from nothing to 1 GiB asks about 200 times.
    #[inline(always)]
    pub const fn snapshot_due(live_bytes: u64, snapshot_bytes: u64) -> bool {
        let step = if snapshot_bytes >> 4 > 4096 {
            snapshot_bytes >> 4
        } else {
            4096
        };
        live_bytes >= snapshot_bytes.saturating_add(step)
    }
}

/// `--live`: a call site without a slot of its own in `SITE_STATS` (the
/// table of ids was full); its stats are in `COUNTS`.
pub const NO_SITE_ID: u32 = u32::MAX;

/// One slot of the pointer table (`--live`): a BPF array used as an
/// open-addressing hash table, so that tracking a block takes no kernel
/// hash-map call. A block goes in the first free slot among
/// [`LIVE_WINDOW`] from [`LiveEntry::home`]; `key.address` says whether
/// a slot is free ([`LIVE_EMPTY`]), being written ([`LIVE_CLAIMED`]), or
/// holds that block. A block whose window is full goes to the overflow
/// map (BPF `LIVE_OVERFLOW`, a hash map of `--max-live` entries), so that
/// no block is lost below `--max-live`.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct LiveEntry {
    pub key: LiveKey,
    pub block: LiveBlock,
}

/// `LiveEntry::key.address` of a free slot (no tracked block is at 0).
pub const LIVE_EMPTY: u64 = 0;
/// `LiveEntry::key.address` of a slot taken and not yet written.
pub const LIVE_CLAIMED: u64 = u64::MAX;
/// Slots a block may take, from its home slot on (wrapping).
pub const LIVE_WINDOW: u32 = 16;

/// Index in the BPF array `LIVE_USED` of the tracked blocks (in the table
/// and in the overflow map), counted against `--max-live`.
pub const LIVE_USED_BLOCKS: u32 = 0;
/// Index in `LIVE_USED` of the blocks in the overflow map: while it is 0,
/// a block not in its window is not tracked, and no hash-map lookup is
/// made.
pub const LIVE_USED_OVERFLOW: u32 = 1;
/// Entries of `LIVE_USED`.
pub const LIVE_USED_COUNTERS: u32 = 2;

/// Entries of the BPF array `LIVE_BUCKETS`: with sampling, the blocks
/// tracked, by [`LiveEntry::bucket`] of their keys. Most frees are then of
/// blocks never sampled, and one whose bucket holds none skips the search
/// of its window.
pub const LIVE_BUCKET_COUNT: u32 = 1 << 15;

impl LiveEntry {
    /// The first slot a block's key may take, in a table of `mask + 1`
    /// slots (a power of two). Heap addresses are far from random (arenas,
    /// size classes, page-aligned large blocks: arithmetic progressions of
    /// many strides), so the key is mixed with MurmurHash3's finalizer
    /// (every input bit flips each output bit with chance about 1/2)
    /// before its low bits are taken: homes then behave as random ones
    /// whatever the pattern. (A plain multiplicative hash spreads some
    /// strides well and piles others up: taking its bits 32.. lost
    /// blocks of a C++ program's heap at a third of the table's load;
    /// its top bits put blocks 64 KiB apart in a quarter of the slots.)
    #[inline(always)]
    pub fn home(key: &LiveKey, mask: u32) -> u32 {
        let mut mixed = key.address ^ (u64::from(key.tgid) << 32);
        mixed ^= mixed >> 33;
        mixed = mixed.wrapping_mul(0xff51_afd7_ed55_8ccd);
        mixed ^= mixed >> 33;
        mixed = mixed.wrapping_mul(0xc4ce_b9fe_1a85_ec53);
        mixed ^= mixed >> 33;
        mixed as u32 & mask
    }

    /// The entry of `LIVE_BUCKETS` that counts the block of `key`.
    #[inline(always)]
    pub fn bucket(key: &LiveKey) -> u32 {
        LiveEntry::home(key, LIVE_BUCKET_COUNT - 1)
    }

    /// Slots of the table for `max_live` blocks: twice as many, so that a
    /// full table is half empty and a block almost always finds a free slot
    /// in its window (random homes, 500,000 blocks in 2^20 slots: one
    /// insert in a thousand finds none under churn, at a third of that
    /// load a few in a million); a power of two, at least twice the window.
    /// A block that finds none goes to the overflow map.
    pub fn table_slots(max_live: u32) -> u32 {
        max_live
            .saturating_mul(2)
            .max(2 * LIVE_WINDOW)
            .checked_next_power_of_two()
            .unwrap_or(1 << 31)
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

/// Why an event could not be recorded in full. Indexes the `LOST` array.
#[repr(u32)]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum LostCause {
    /// The totals map was full: the allocation was not counted at all.
    MapFull = 0,
    /// The stack table was full, or another stack had the same 64-bit
    /// hash: only the direct caller was kept.
    StackCollision = 1,
    /// The stack walk failed for another reason: only the direct caller
    /// was kept.
    StackError = 2,
    /// The return address at the stack pointer could not be read: the
    /// caller is unknown (the stack, if any, was kept).
    ReadFault = 3,
    /// The ring buffer that announces new processes was full: the process
    /// is symbolized from a later snapshot of its memory map, if any.
    NoticeDropped = 4,
    /// `--live`: the pointer table was full (`--max-live`): the block was
    /// counted in the totals but is not tracked (`untracked_count`).
    LiveTableFull = 5,
    /// `--live`: the allocator returned an address memprof still held as
    /// live: its free went unseen. The old block was released then.
    MissedFree = 6,
    /// `--live`: the kernel could not give a thread's state (no memory, or
    /// its task-storage lock busy; the name is from when that was a
    /// table): an allocation was counted in the totals but could not be
    /// paired with its pointer.
    ThreadTableFull = 7,
    /// `--live`: an allocation or free of a process image whose exact heap
    /// figures could not be kept (no slot: more than `HEAP_SLOTS` images
    /// since it started, and its slot went to a newer one). Its peak is
    /// then not exact.
    HeapUntracked = 8,
    /// `--unwind dwarf`: an address with no unwind table loaded (its
    /// file's tables not loaded yet, no CFI covers it, or it lies in no
    /// file: a JIT's code): the stack was cut there (shown as partial).
    UnwindNoInfo = 9,
    /// `--unwind dwarf`: a frame whose unwind rule the tables cannot
    /// express (signal trampolines, hand-written assembly), or whose CFA
    /// needs an unknown rbp: the stack was cut there.
    UnwindUnsupported = 10,
    /// `--unwind dwarf`: a stack word could not be read, or the stack
    /// pointer did not grow: the stack was cut there.
    UnwindReadFault = 11,
    /// More frames than a stack keeps (`MAX_FRAMES`): the outermost ones
    /// were dropped.
    UnwindTooDeep = 12,
    /// `--unwind dwarf`: the kernel's row table (`--unwind-rows`) was
    /// full: a file's tables could not be loaded (counted once per file
    /// and process by user space).
    UnwindTableFull = 13,
    /// A shared probe fired where memprof had no site, or its site's
    /// program could not be reached (see `dispatch`): the call was not
    /// counted. Never expected.
    ProbeDispatch = 14,
    /// The process table (`--max-processes`) was full when a process
    /// first allocated: its calls were not recorded (user space counts
    /// them from the [`REFUSED_GENERATION`] sites).
    ProcessTableFull = 15,
    /// `monitor`: a call site whose stack memprof had just evicted (it
    /// belonged to processes that had ended), counted with its caller
    /// only. Counted by user space; a race of microseconds.
    StackEvicted = 16,
    /// `--live` with session probes: a process forked from a profiled one
    /// allocated before memprof gave it return probes (milliseconds): the
    /// block was counted in the totals but is not tracked.
    NoReturnProbe = 17,
    /// `trace` with session probes: a process forked by a profiled one
    /// was not held until its own probes were in: its parent ignores
    /// SIGTSTP (a job-control shell, which would take the stop for its
    /// job's), or it could not be (the table of held processes full, the
    /// kernel refused the stop; never expected). Its calls until then
    /// (milliseconds) went unseen. Or its probes could not be made
    /// (counted by user space; never expected): its calls went unseen.
    ForkUnheld = 18,
    /// `monitor`'s budget: the whole count of a process image exec'd over
    /// could not be kept (more execs in one period than
    /// `--max-processes`): its totals lack the calls after its count was
    /// last read (at most a period's). Never expected.
    ExecCountDropped = 19,
    /// A library with allocators that a running process loaded (a
    /// dlopen; its C library, attached during its start) got its probes
    /// for that process only after it had run on (`attach`, `monitor`:
    /// only `trace` holds a process at its loader's notices): its calls
    /// in between, milliseconds, went unseen. Counted by user space, once
    /// per process and file.
    ProbedLate = 20,
}

impl LostCause {
    pub const COUNT: u32 = 21;
    pub const ALL: [LostCause; Self::COUNT as usize] = [
        LostCause::MapFull,
        LostCause::StackCollision,
        LostCause::StackError,
        LostCause::ReadFault,
        LostCause::NoticeDropped,
        LostCause::LiveTableFull,
        LostCause::MissedFree,
        LostCause::ThreadTableFull,
        LostCause::HeapUntracked,
        LostCause::UnwindNoInfo,
        LostCause::UnwindUnsupported,
        LostCause::UnwindReadFault,
        LostCause::UnwindTooDeep,
        LostCause::UnwindTableFull,
        LostCause::ProbeDispatch,
        LostCause::ProcessTableFull,
        LostCause::StackEvicted,
        LostCause::NoReturnProbe,
        LostCause::ForkUnheld,
        LostCause::ExecCountDropped,
        LostCause::ProbedLate,
    ];

    /// Name used in reports and JSON.
    pub const fn name(self) -> &'static str {
        match self {
            LostCause::MapFull => "map_full",
            LostCause::StackCollision => "stack_collision",
            LostCause::StackError => "stack_error",
            LostCause::ReadFault => "read_fault",
            LostCause::NoticeDropped => "notice_dropped",
            LostCause::LiveTableFull => "live_table_full",
            LostCause::MissedFree => "missed_free",
            LostCause::ThreadTableFull => "thread_table_full",
            LostCause::HeapUntracked => "heap_untracked",
            LostCause::UnwindNoInfo => "unwind_no_info",
            LostCause::UnwindUnsupported => "unwind_unsupported",
            LostCause::UnwindReadFault => "unwind_read_fault",
            LostCause::UnwindTooDeep => "unwind_too_deep",
            LostCause::UnwindTableFull => "unwind_table_full",
            LostCause::ProbeDispatch => "probe_dispatch",
            LostCause::ProcessTableFull => "process_table_full",
            LostCause::StackEvicted => "stack_evicted",
            LostCause::NoReturnProbe => "no_return_probe",
            LostCause::ForkUnheld => "fork_unheld",
            LostCause::ExecCountDropped => "exec_count_dropped",
            LostCause::ProbedLate => "probed_late",
        }
    }
}

/// What a [`ProcessNotice`] says happened.
#[repr(u32)]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum NoticeKind {
    /// First allocation seen from this (tgid, generation): its memory map
    /// should be captured now, while the process is alive.
    FirstSeen = 1,
    /// The process exited.
    Exited = 2,
    /// One object the dynamic loader has loaded: a [`LibraryNotice`].
    Library = 3,
    /// The process exec'd: the image `generation` is gone (the process
    /// lives on as the next, [`next_generation`]).
    Replaced = 4,
    /// `--live`: the image's heap reached a new peak, grown enough since
    /// the last capture (`ProcHeap::snapshot_due`) that user space should
    /// capture which call sites hold it, now. `parent` holds the image's
    /// slot in `HEAPS`.
    PeakGrown = 5,
    /// `trace`: the process is stopped (SIGSTOP) until user space has
    /// read its memory map, loaded its unwind tables and probed its new
    /// libraries; user space sends SIGCONT. Sent after the `Library`
    /// notices of a loader's announcement, and at the exec of a static
    /// program (no loader will announce its code, and it may be done
    /// before /proc is read).
    Held = 6,
    /// A direct mapping call: a [`mappings::MappingNotice`].
    Mapping = 7,
    /// `monitor`: a process memprof does not watch exec'd; user space
    /// decides whether to watch it (`--comm`, `--exe`).
    Exec = 8,
    /// `--live` with session probes: profiled process `parent` (in a
    /// tree of `TREES`) forked `tgid`, which has no return probes on the
    /// malloc-like functions (a child of a linked process: its parent's
    /// come from a session link, not inherited). User space gives it some.
    Forked = 9,
    /// `trace` with session links: a thread of linked process `tgid`
    /// other than its main one exec'd. The links name the old main thread
    /// and put no breakpoint in the new image: user space makes them
    /// again. `parent` is 1 when the process waits, stopped, until then
    /// (a `Held` notice follows), 0 where its parent would see the stop.
    Relink = 10,
}

/// Longest path memprof keeps for a loaded object.
pub const PATH_MAX: usize = 256;

/// Sent through the `NOTICES` ring buffer when the dynamic loader reports
/// a consistent list of loaded objects: one notice per object. With the
/// object's load base and path, user space knows where its code lies even
/// if the process has exited before it could read /proc.
#[repr(C)]
#[derive(Clone, Copy, Debug)]
pub struct LibraryNotice {
    /// [`NoticeKind::Library`].
    pub kind: u32,
    pub tgid: u32,
    pub generation: u32,
    /// Position in the loader's list; 0 is the program itself.
    pub index: u32,
    /// Non-zero when the process waits, stopped, until user space has
    /// read the walk's notices (`trace`; not where its parent would see
    /// the stop): its new allocators' probes are in before it calls them.
    pub held: u32,
    pub _reserved: u32,
    /// Load bias (`l_addr`): file virtual address + base = address in memory.
    pub base: u64,
    /// NUL-terminated path; for index 0, the path the program was exec'd
    /// with (possibly relative), or empty when unknown.
    pub path: [u8; PATH_MAX],
}

/// Sent through the `NOTICES` ring buffer.
#[repr(C)]
#[derive(Clone, Copy, Debug)]
pub struct ProcessNotice {
    pub kind: u32,
    pub tgid: u32,
    pub generation: u32,
    /// For `FirstSeen`: the traced process that forked this one (its
    /// address space is a copy of the parent's), or 0.
    pub parent: u32,
    /// `bpf_ktime_get_ns()` when it happened: for `Exited`, the time the
    /// ages of what the process left allocated are measured at.
    pub time_ns: u64,
}

/// Per-process state kept in the BPF `PROCS` map.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default)]
pub struct ProcState {
    pub generation: u32,
    /// Non-zero once a `FirstSeen` notice went out for this generation.
    pub announced: u32,
    /// `--live`: the image's slot in `HEAPS`, or [`NO_HEAP_SLOT`].
    pub heap_slot: u32,
    pub reserved: u32,
    /// Non-zero once the image's `Exited` notice went out (set with an
    /// atomic compare-and-swap: the main thread's exit and the process's
    /// last thread's may race; one of them sends it).
    pub exit_announced: u64,
}

/// Per-thread state of the allocator probes (BPF `THREADS` map).
#[repr(C)]
#[derive(Clone, Copy, Debug, Default)]
pub struct ThreadState {
    /// Hooked allocator calls under way that may call another one; while
    /// non-zero, an allocator entry is nested and already counted.
    pub depth: u32,
    /// Image generation of the thread's process, cached here so that the
    /// hot path needs one map lookup, not two.
    pub generation: u32,
    /// The thread's process id, cached here: a thread's process never
    /// changes, and the hot path saves a helper call.
    pub tgid: u32,
    /// Non-zero once `tgid` and `generation` are filled in (a new state
    /// is zeroed; 0 is a valid generation, that of attached processes).
    pub ready: u32,
    /// `--live`: the process image's slot in `HEAPS`, cached as the
    /// generation is.
    pub heap_slot: u32,
    /// `--while`: how many calls of the region functions the thread is
    /// inside; its allocations are recorded only while non-zero.
    pub region_depth: u32,
    /// Session probes: set by the entry of a sampled call, which asks for
    /// its return (read and cleared by `alloc_chosen`).
    pub session_return: u32,
    /// `PROBE_EPOCH` when `depth` last rose from 0: a depth from an
    /// older epoch is stale (`monitor`'s budget took the probes out since,
    /// and the return that would have brought it down with them).
    pub depth_epoch: u32,
    /// `--live`: the block an operator delete (or another releaser that
    /// may call free) just released, until this thread's next allocator
    /// call: free's call for it is the same release, not an unknown block.
    pub last_released: u64,
    /// The stack pointer at that releaser's entry: free called from
    /// inside it runs deeper (or, jumped to, at the same depth).
    pub last_released_sp: u64,
    /// A mapping call (`mmap`, `mremap`, `sbrk`) between its entry and
    /// its return.
    pub mapping: mappings::PendingMapping,
    /// `--live`: the outermost allocator call under way, completed by its
    /// return probe.
    pub pending: PendingCall,
    /// `--while`: the return addresses the region functions' return
    /// probes replaced on the stack.
    pub regions: RegionFrames,
}

/// Region calls (the innermost) whose return addresses a stack walk can
/// restore; a walk that meets an older one's trampoline is cut (and
/// counted).
pub const REGION_FRAMES: usize = 4;

/// `--while`: a return probe replaces its function's return address on
/// the user stack with the kernel's trampoline, outside every mapped file;
/// the walks read the real one from here, by the slot it was read from.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default)]
pub struct RegionFrames {
    /// The stack slots (the stack pointer at each region call's entry),
    /// by depth modulo [`REGION_FRAMES`]; 0 once the call returned.
    pub slots: [u64; REGION_FRAMES],
    pub returns: [u64; REGION_FRAMES],
    /// The trampoline's address (learned at a nested region call's entry,
    /// from an outer call's slot); 0 while unknown.
    pub trampoline: u64,
}

/// What a walk makes of a return address it read.
pub enum ReturnAddress {
    /// Its own, or a region call's real one in its place.
    Real(u64),
    /// A region call's trampoline whose real address was not kept.
    Lost,
}

impl RegionFrames {
    /// Where the region call entered at `depth` keeps its frame.
    #[inline(always)]
    pub fn index(depth: u32) -> usize {
        depth as usize % REGION_FRAMES
    }

    /// The return address read from `slot`.
    #[inline(always)]
    pub fn real_return(&self, slot: u64, read: u64) -> ReturnAddress {
        let mut real = read;
        let mut restored = false;
        for i in 0..REGION_FRAMES {
            if self.slots[i] == slot && slot != 0 {
                // SAFETY: a plain read of a field; volatile so that the
                // value, not a pointer to it, is chosen (the BPF verifier
                // rejects arithmetic on a pointer LLVM carries further).
                real = unsafe { core::ptr::read_volatile(&self.returns[i]) };
                restored = true;
            }
        }
        if !restored && read == self.trampoline && read != 0 {
            return ReturnAddress::Lost;
        }
        ReturnAddress::Real(real)
    }
}

/// `--live`: what an allocator's entry probe leaves for its return probe.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default)]
pub struct PendingCall {
    /// Non-zero while a call waits for its return.
    pub active: u32,
    /// Non-zero when the call is recorded (always, unless sampling).
    pub record: u32,
    /// Non-zero when `old` holds the block a realloc was given.
    pub has_old: u32,
    /// The call site's id (see [`LiveBlock::site_id`]).
    pub site_id: u32,
    /// The process image's slot in `HEAPS`.
    pub heap_slot: u32,
    pub reserved: u32,
    pub site: AllocKey,
    /// Bytes requested.
    pub size: u64,
    pub weight: Weight,
    /// posix_memalign: where the allocator stores the pointer, else 0.
    pub out_pointer: u64,
    /// realloc/reallocarray: the block given, taken out of the pointer
    /// table at entry so that no other thread can be handed its address
    /// before the return probe decides its fate.
    pub old_address: u64,
    pub old: LiveBlock,
}

/// What one probe passes to the shared BPF program, packed in its BPF
/// cookie so that the program needs no table lookup: the allocator's row
/// index and where its size and pointer arguments are.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ProbeCookie {
    pub allocator: u8,
    pub size_arg: u8,
    pub count_arg: u8,
    pub may_nest: bool,
    /// Argument holding a block the call may free or move, or NO_ARG.
    pub old_pointer_arg: u8,
    /// Argument pointing where the call stores the new block, or NO_ARG.
    pub out_pointer_arg: u8,
}

/// The argument registers of a probed call (x86-64: rdi, rsi, rdx, rcx,
/// r8, r9).
pub type Args = [u64; 6];

impl ProbeCookie {
    #[inline(always)]
    pub const fn encode(self) -> u64 {
        (self.allocator as u64)
            | (self.size_arg as u64) << 8
            | (self.count_arg as u64) << 16
            | (self.may_nest as u64) << 24
            | (self.old_pointer_arg as u64) << 32
            | (self.out_pointer_arg as u64) << 40
    }

    #[inline(always)]
    pub const fn decode(cookie: u64) -> Self {
        ProbeCookie {
            allocator: cookie as u8,
            size_arg: (cookie >> 8) as u8,
            count_arg: (cookie >> 16) as u8,
            may_nest: (cookie >> 24) & 1 == 1,
            old_pointer_arg: (cookie >> 32) as u8,
            out_pointer_arg: (cookie >> 40) as u8,
        }
    }

    /// The value of argument `index` (NO_ARG gives 0).
    #[inline(always)]
    pub fn pointer_arg(args: Args, index: u8) -> u64 {
        if index == allocators::NO_ARG {
            0
        } else {
            arg_value(args, index)
        }
    }

    /// Bytes requested by a call, from its first three arguments: the
    /// size, times the element count when there is one. Saturates instead
    /// of wrapping, as the allocator itself fails such a request.
    #[inline(always)]
    pub fn requested_bytes(self, args: Args) -> u64 {
        let size = arg_value(args, self.size_arg);
        if self.count_arg == allocators::NO_ARG {
            size
        } else {
            saturating_mul(size, arg_value(args, self.count_arg))
        }
    }
}

/// `a * b`, saturating. Written out in 32-bit halves because BPF has no
/// 128-bit multiply, which LLVM uses for any overflow check it recognises.
#[inline(always)]
pub fn saturating_mul(a: u64, b: u64) -> u64 {
    let (big, small) = if a >= b { (a, b) } else { (b, a) };
    if small >> 32 != 0 {
        return u64::MAX;
    }
    let high = (big >> 32) * small;
    if high >> 32 != 0 {
        return u64::MAX;
    }
    let low = (big & 0xffff_ffff) * small;
    let product = (high << 32).wrapping_add(low);
    if product < low {
        u64::MAX
    } else {
        product
    }
}

#[inline(always)]
fn arg_value(args: Args, index: u8) -> u64 {
    match index {
        0 => args[0],
        1 => args[1],
        2 => args[2],
        3 => args[3],
        4 => args[4],
        _ => args[5],
    }
}

#[cfg(feature = "user")]
mod pod {
    use super::*;
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
    unsafe impl aya::Pod for dispatch::SiteEntry {}
    unsafe impl aya::Pod for usdt::UsdtSpec {}
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::allocators::ALLOCATORS;

    /// Generations are u32 times in ~ms: they wrap after ~50 days of
    /// uptime, and must never be 0 (an attached process's) nor refused.
    #[test]
    fn generations_skip_the_reserved_values_and_order_across_the_wrap() {
        assert_eq!(first_generation(0), 1);
        assert_eq!(first_generation((u32::MAX as u64) << 20), 1);
        assert_eq!(first_generation(5 << 20), 5);
        // The same instant after the u32 wrapped.
        assert_eq!(first_generation((1u64 << 52) + (5 << 20)), 5);
        assert_eq!(next_generation(6), 7);
        assert_eq!(next_generation(u32::MAX - 1), 1);
        assert_eq!(next_generation(u32::MAX), 1);
        use core::cmp::Ordering::*;
        assert_eq!(generation_order(7, 6), Greater);
        assert_eq!(generation_order(6, 7), Less);
        assert_eq!(generation_order(6, 6), Equal);
        // First seen 10 s before the wrap, and 10 s after.
        assert_eq!(generation_order(10_000, u32::MAX - 10_000), Greater);
        assert_eq!(generation_order(u32::MAX - 10_000, 10_000), Less);
    }

    #[test]
    fn cookie_round_trips_every_allocator() {
        for (index, spec) in ALLOCATORS.iter().enumerate() {
            let cookie = spec.cookie(index);
            assert_eq!(ProbeCookie::decode(cookie.encode()), cookie);
        }
    }

    #[test]
    fn requested_bytes_follow_the_table() {
        let calloc = ALLOCATORS[1].cookie(1);
        assert_eq!(calloc.requested_bytes([3, 40, 0, 0, 0, 0]), 120);
        let reallocarray = ALLOCATORS[3].cookie(3);
        assert_eq!(reallocarray.requested_bytes([0, 6, 50, 0, 0, 0]), 300);
        let posix_memalign = ALLOCATORS[4].cookie(4);
        assert_eq!(
            posix_memalign.requested_bytes([0x1000, 64, 1000, 0, 0, 0]),
            1000
        );
    }

    #[test]
    fn multiplication_saturates() {
        assert_eq!(saturating_mul(u64::MAX, 2), u64::MAX);
        assert_eq!(saturating_mul(1 << 32, 1 << 32), u64::MAX);
        assert_eq!(saturating_mul((1 << 40) + 7, 3), ((1 << 40) + 7) * 3);
        assert_eq!(saturating_mul(0, u64::MAX), 0);
        assert_eq!(saturating_mul(u64::MAX / 3, 3), u64::MAX / 3 * 3);
    }

    #[test]
    fn the_pointer_table_has_twice_the_slots_as_a_power_of_two() {
        assert_eq!(LiveEntry::table_slots(1), 2 * LIVE_WINDOW);
        assert_eq!(LiveEntry::table_slots(10), 2 * LIVE_WINDOW);
        assert_eq!(LiveEntry::table_slots(500_000), 1 << 20);
        assert_eq!(LiveEntry::table_slots(524_288), 1 << 20);
        assert_eq!(LiveEntry::table_slots(524_289), 1 << 21);
        assert_eq!(LiveEntry::table_slots(u32::MAX), 1 << 31);
        // A block's home slot is in the table.
        let key = LiveKey {
            tgid: 7,
            generation: 1,
            address: 0x7f00_dead_beef,
        };
        assert!(LiveEntry::home(&key, 31) < 32);
    }

    /// Window-full inserts when `addresses` go into the table for
    /// `max_live` blocks, one after the other (no frees).
    fn window_full_inserts(addresses: impl Iterator<Item = u64>, max_live: u32) -> usize {
        extern crate std;
        let slots = LiveEntry::table_slots(max_live);
        let mut taken = std::vec![false; slots as usize];
        let mut full = 0;
        for address in addresses {
            let key = LiveKey {
                tgid: 4242,
                generation: 1,
                address,
            };
            let home = LiveEntry::home(&key, slots - 1);
            match (0..LIVE_WINDOW)
                .map(|step| (home + step) as usize & (slots as usize - 1))
                .find(|&slot| !taken[slot])
            {
                Some(slot) => taken[slot] = true,
                None => full += 1,
            }
        }
        full
    }

    #[test]
    fn homes_of_real_heap_addresses_spread_as_random_ones() {
        extern crate std;
        use std::{alloc, vec::Vec};
        // 0.9 x 500,000 blocks in 2^20 slots: with random homes, a few
        // dozen inserts find their window full (the overflow map takes
        // them); a hash that piles up a pattern's addresses, thousands.
        let blocks = 450_000usize;
        let bound = blocks / 1000;
        // glibc's malloc (the test's allocator): a third list nodes of 24
        // bytes back to back (std::list<int>), then small blocks of mixed
        // sizes, as C++ nodes and strings are; a tenth freed and taken
        // again.
        let layout = |i: usize| {
            let size = if i < blocks / 3 {
                24
            } else {
                16 + (i % 7) * 24
            };
            alloc::Layout::from_size_align(size, 8).unwrap()
        };
        // SAFETY: non-zero sizes; each block freed once, with its layout.
        let mut held: Vec<*mut u8> = (0..blocks)
            .map(|i| unsafe { alloc::alloc(layout(i)) })
            .collect();
        for i in (0..blocks).step_by(10) {
            // SAFETY: as above.
            unsafe { alloc::dealloc(held[i], layout(i)) };
        }
        for i in (0..blocks).step_by(10) {
            // SAFETY: as above.
            held[i] = unsafe { alloc::alloc(layout(i)) };
        }
        let glibc = window_full_inserts(held.iter().map(|&p| p as u64), 500_000);
        for (i, &p) in held.iter().enumerate() {
            // SAFETY: as above.
            unsafe { alloc::dealloc(p, layout(i)) };
        }
        // Large blocks (mmap'd: page-aligned, 16 bytes in), 64 KiB apart.
        let pages = window_full_inserts(
            (0..blocks as u64).map(|i| 0x7f12_3400_0010 + i * 65536),
            500_000,
        );
        // jemalloc-like: each size class carved from its own run.
        const CLASSES: [u64; 12] = [8, 16, 32, 48, 64, 80, 96, 128, 160, 256, 512, 1024];
        let mut next = CLASSES.map(|_| 0u64);
        let slabs = window_full_inserts(
            (0..blocks).map(|i| {
                let class = i * 7 % CLASSES.len();
                next[class] += CLASSES[class];
                0x7f00_0000_0000 + ((class as u64) << 30) + next[class]
            }),
            500_000,
        );
        assert!(
            glibc <= bound && pages <= bound && slabs <= bound,
            "window-full inserts: glibc {glibc}, pages {pages}, slabs {slabs}"
        );
    }

    #[test]
    fn a_slot_is_whole_words() {
        // The kernel strides an array's values by their size rounded up
        // to 8 bytes; user space reads slots word by word.
        assert_eq!(size_of::<LiveEntry>() % 8, 0);
    }
}
