//! Why an event was not recorded in full: every one is counted by cause
//! (`LOST`) and shown in the report.
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
