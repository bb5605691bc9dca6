//! The maps shared with user space. Sizes here are defaults: user space
//! sets the real ones before loading (`--max-stacks`, `--stack-map-size`).
use aya_ebpf::{
    macros::map,
    maps::{HashMap, LruHashMap, PerCpuArray, PerCpuHashMap, RingBuf, StackTrace},
};
use memprof_common::{AllocKey, AllocStats, LostCause, ProcState, PATH_MAX};

/// Bytes and calls per (process, stack, caller, allocator function).
#[map]
pub static COUNTS: PerCpuHashMap<AllocKey, AllocStats> = PerCpuHashMap::with_max_entries(65536, 0);

/// User stacks, deduplicated by the kernel; ids are keys of `COUNTS`.
#[map]
pub static STACKS: StackTrace = StackTrace::with_max_entries(16384, 0);

/// Events that could not be recorded in full, by [`LostCause`].
#[map]
pub static LOST: PerCpuArray<u64> = PerCpuArray::with_max_entries(LostCause::COUNT, 0);

/// Per thread (pid_tgid): how many allocator calls that may call another
/// hooked allocator are under way. Non-zero means an allocator entry is
/// nested and already counted by the outer call. LRU so that threads that
/// exit never fill it.
#[map]
pub static NESTING: LruHashMap<u64, u32> = LruHashMap::with_max_entries(16384, 0);

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

/// Child pid -> tgid of the traced process that forked it. Thread
/// creations land here too and are simply never looked up; LRU evicts them.
#[map]
pub static FORKS: LruHashMap<u32, u32> = LruHashMap::with_max_entries(4096, 0);

/// Scratch space for one path: too large for the BPF stack.
#[map]
pub static PATH_SCRATCH: PerCpuArray<[u8; PATH_MAX]> = PerCpuArray::with_max_entries(1, 0);

#[inline(always)]
pub fn count_lost(cause: LostCause) {
    if let Some(counter) = LOST.get_ptr_mut(cause as u32) {
        // SAFETY: per-CPU slot; BPF programs do not preempt each other on a CPU here.
        unsafe { *counter += 1 };
    }
}
