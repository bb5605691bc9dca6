//! The maps shared with user space. Sizes here are defaults: user space
//! sets the real ones before loading (`--max-stacks`, `--stack-map-size`).
use aya_ebpf::{
    bindings::BPF_F_NO_PREALLOC,
    macros::{btf_map, map},
    maps::{Array, HashMap, LruHashMap, PerCpuArray, PerCpuHashMap, RingBuf},
};
use memprof_common::{
    images::{ProcState, ProcessImage},
    lost::LostCause,
    notices::PATH_MAX,
    sites::{AllocKey, AllocStats, SiteSlot},
    stacks::StackFrames,
    thread::ThreadState,
    unwind::{ProcMappings, Row},
};

use crate::kernel::task_storage::TaskStorage;

/// Bytes and calls per (process, stack, caller, allocator function), one
/// value for all CPUs, added to atomically (`sites::add`). Not
/// preallocated: most sites count in `SITE_SLOTS` (or `SITE_STATS`).
/// Not per CPU: a per-CPU entry made on a site's first call took ~10 us
/// (the kernel's per-CPU allocator refilling its cache), and gcc's cc1plus
/// makes 34,000 sites; preallocated, it would take `--max-stacks` x 56
/// bytes x every CPU.
#[map]
pub static COUNTS: HashMap<AllocKey, AllocStats> =
    HashMap::with_max_entries(65536, BPF_F_NO_PREALLOC);

/// Bumped by user space each time `monitor`'s budget has taken probes out
/// of processes or put them back: a thread inside an allocator call then
/// may never see its return, and its nesting depth from before is stale
/// (`ThreadState::depth_epoch`).
#[map]
pub static PROBE_EPOCH: Array<u32> = Array::with_max_entries(1, 0);

/// Per CPU: slots that call sites take for good, where totals mode adds
/// without a hash-map lookup (see `SiteSlot`).
#[map]
pub static SITE_SLOTS: PerCpuArray<SiteSlot> =
    PerCpuArray::with_max_entries(memprof_common::sites::SITE_SLOTS, 0);

/// `--live`: frees of blocks memprof never saw allocated (allocated before
/// it attached, or untracked), per process image.
#[map]
pub static UNKNOWN_FREES: PerCpuHashMap<ProcessImage, u64> =
    PerCpuHashMap::with_max_entries(4096, 0);

/// `--live`: frees the C library made, from its own code, of blocks
/// memprof never saw allocated: its own (see `live::called_from_library`).
#[map]
pub static INTERNAL_FREES: PerCpuHashMap<ProcessImage, u64> =
    PerCpuHashMap::with_max_entries(4096, 0);

/// User stacks by the hash of their frames (`AllocKey::stack`). Every
/// lookup compares the frames too, so a hash collision is detected and
/// counted, never merged. Not preallocated: an entry takes 2 KiB (1,032
/// bytes of frames and the kernel's header, in its 2 KiB size class), and
/// most runs store far fewer stacks than `--stack-map-size` (preallocated
/// at its default, 72 MiB at every start).
#[map]
pub static STACKS: HashMap<u64, StackFrames> = HashMap::with_max_entries(16384, BPF_F_NO_PREALLOC);

/// The stack walked last on a CPU and its key in `STACKS` (`NO_STACK`
/// until one is checked); the walk builds the next stack here too (too
/// large for the BPF stack).
#[repr(C)]
pub struct LastStack {
    pub key: u64,
    /// `STACK_EPOCH` when `key` was last found in `STACKS`.
    pub epoch: u64,
    pub frames: StackFrames,
}

#[map]
pub static LAST_STACK: PerCpuArray<LastStack> = PerCpuArray::with_max_entries(1, 0);

/// Raised by user space (`monitor`) each time it evicts stacks of ended
/// processes from `STACKS`: a CPU's last stack found before is looked up
/// again, and stored again if it was evicted.
#[map]
pub static STACK_EPOCH: Array<u64> = Array::with_max_entries(1, 0);

/// Words of user stack the walk copies at once (a power of two).
pub const WINDOW_WORDS: usize = 64;

/// Where the walk copies user stack: too large for the BPF stack.
#[map]
pub static STACK_WINDOW: PerCpuArray<[u64; WINDOW_WORDS]> = PerCpuArray::with_max_entries(1, 0);

/// `--unwind dwarf`: every loaded file's unwind rows, each followed by its
/// page index (user space appends each new file's; `--unwind-rows` sizes
/// it; 1 entry in frame-pointer mode).
#[map]
pub static UNWIND_ROWS: Array<Row> = Array::with_max_entries(1, 0);

/// Non-zero once user space stops reading notices (the end of `trace`):
/// from then on no process is stopped to wait for it.
#[map]
pub static HOLDS_OFF: Array<u32> = Array::with_max_entries(1, 0);

/// `--unwind dwarf`: each process's executable mappings and where their
/// files' rows are, by tgid (written by user space on process notices).
#[map]
pub static UNWIND_MAPS: HashMap<u32, ProcMappings> =
    HashMap::with_max_entries(1, BPF_F_NO_PREALLOC);

/// Events that could not be recorded in full, by [`LostCause`].
#[map]
pub static LOST: PerCpuArray<u64> = PerCpuArray::with_max_entries(LostCause::COUNT, 0);

/// Per thread: nesting depth and process generation, in task-local
/// storage (no hashing on the hot path; freed with the thread).
#[btf_map]
pub static THREADS: TaskStorage<ThreadState> = TaskStorage::new();

/// Per process (tgid): its image generation and whether user space heard
/// about it.
#[map]
pub static PROCS: HashMap<u32, ProcState> = HashMap::with_max_entries(16384, 0);

/// New and exited processes, for user space to capture memory maps while
/// the process is still alive.
#[map]
pub static NOTICES: RingBuf = RingBuf::with_byte_size(256 * 1024, 0);

/// The path each process last exec'd, for every process on the host (the
/// exec tracepoint cannot tell traced from untraced ones): the loader's
/// list names the program itself with an empty string.
#[map]
pub static EXEC_PATHS: LruHashMap<u32, [u8; PATH_MAX]> = LruHashMap::with_max_entries(4096, 0);

/// `monitor` with a selection: processes whose exec was announced
/// (`NoticeKind::Exec`) and that user space has not decided on yet, and
/// the processes they fork meanwhile (announced too, as if they had
/// exec'd: they run their parent's program, unprobed: a process forked
/// before its parent got its scope events inherits none). User space
/// removes each once it has decided.
#[map]
pub static EXEC_PENDING: LruHashMap<u32, u8> = LruHashMap::with_max_entries(4096, 0);

/// `trace`: processes seen to stop themselves when memprof stopped a child
/// of theirs (su, sudo: once continued they continue the child, which
/// would cancel a stop of memprof's): their children are stopped again
/// only while nothing watches their own stops, and are let go through
/// them (`stopped_parents`). User space enters each before it continues
/// it (`parent_watch`).
#[map]
pub static STOP_WATCHERS: LruHashMap<u32, u8> = LruHashMap::with_max_entries(1024, 0);

/// Child pid -> tgid of the traced process that forked it. Thread
/// creations land here too and are simply never looked up; LRU evicts them.
#[map]
pub static FORKS: LruHashMap<u32, u32> = LruHashMap::with_max_entries(4096, 0);

/// Processes with scope events of their own (user space writes them,
/// each as its own *tree*), and every process forked since from one of
/// them, with the tree it is in. When a tree's head ends, user space gives
/// the processes of its tree still running events of their own before it
/// closes the head's (which the kernel then drops in its descendants too).
#[map]
pub static TREES: LruHashMap<u32, u32> = LruHashMap::with_max_entries(4096, 0);

/// Scratch space for one path: too large for the BPF stack.
#[map]
pub static PATH_SCRATCH: PerCpuArray<[u8; PATH_MAX]> = PerCpuArray::with_max_entries(1, 0);

/// `-EEXIST` is what a map insert with [`BPF_NOEXIST`] returns when the
/// key is there already.
pub const EEXIST: i32 = 17;

/// Map insert flag: only if the key is not there yet.
pub const BPF_NOEXIST: u64 = 1;

/// Map insert flag: only if the key is there (its value replaced whole).
pub const BPF_EXIST: u64 = 2;

#[inline(always)]
pub fn count_lost(cause: LostCause) {
    if let Some(counter) = LOST.get_ptr_mut(cause as u32) {
        // SAFETY: per-CPU slot; BPF programs do not preempt each other on a CPU here.
        unsafe { *counter += 1 };
    }
}
