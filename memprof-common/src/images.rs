//! Process images: (tgid, generation), one program run by one process;
//! each image's entry in `PROCS` and its call counts under the budget.
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
    /// The process's CPU time (ns, its threads' and its ended threads')
    /// when the image ended, at its last thread's exit or at its exec; 0
    /// while it runs. Its figures are scaled to its end by it: /proc has
    /// nothing of a process once it is reaped.
    pub end_cpu_ns: u64,
}

impl ProcessCalls {
    /// Both counts together (two CPUs' values of one process).
    pub fn plus(self, other: ProcessCalls) -> ProcessCalls {
        ProcessCalls {
            calls: self.calls.wrapping_add(other.calls),
            bytes: self.bytes.wrapping_add(other.bytes),
            traps: self.traps.wrapping_add(other.traps),
            end_cpu_ns: self.end_cpu_ns.max(other.end_cpu_ns),
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

#[cfg(test)]
mod tests {
    use super::*;

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
}
