//! What user space sets in the BPF object's globals before load, where a
//! global takes one of a few values.

/// `UNWIND_MODE`: how the kernel walks stacks (`--unwind`).
#[repr(u8)]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum UnwindMode {
    /// Frame pointers.
    FramePointers = 0,
    /// The CFI tables user space loads (`UNWIND_ROWS`, `UNWIND_MAPS`).
    Dwarf = 1,
}

/// `WATCH_EXECS`: which execs are announced (`monitor`).
#[repr(u8)]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum WatchExecs {
    /// None beyond the profiled processes'.
    Off = 0,
    /// Those of processes not watched yet (`monitor --comm/--exe/--cgroup`).
    Unwatched = 1,
    /// Every exec (`monitor` of the whole host).
    Every = 2,
}

/// `GATING` (`monitor`'s budget): whose probes go in and out, and where
/// the kernel looks to know that they are going (`GATED_OUT`).
#[repr(u8)]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Gating {
    /// Probes stay in.
    Off = 0,
    /// Each process's apart; while they go, its tgid is in `GATED_OUT`.
    Processes = 1,
    /// The whole host's together; while they go, key 0 is in `GATED_OUT`.
    Host = 2,
}
