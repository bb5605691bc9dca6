//! Each thread's state in task storage (`THREADS`): nesting, the pending
//! live call, the `--while` region frames.
use crate::{
    live::LiveBlock,
    mappings,
    sites::{AllocKey, Weight},
};
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
