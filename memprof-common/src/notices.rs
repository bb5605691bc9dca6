//! Notices from the kernel to user space, on the `NOTICES` ring buffer.
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
    /// The sending thread's name (`comm`, NUL-padded) at that moment: for
    /// `FirstSeen`, the image's name even if it execs or ends before user
    /// space reads /proc (a shell's subshell lives milliseconds).
    pub comm: [u8; 16],
}

/// `monitor`'s budget: process `tgid` has taken the traps its allowance
/// let it (`ALLOWANCES`), on the `OVER_BUDGET` ring buffer; user space
/// takes its probes out at once rather than at the period's end.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default)]
pub struct OverBudgetNotice {
    pub tgid: u32,
    pub _reserved: u32,
}
