//! The unwind tables the BPF walk reads: each file's rows and page index
//! (`UNWIND_ROWS`) and each process's executable mappings (`UNWIND_MAPS`).
/// One row of a file's unwind table: the rule for the addresses from `pc`
/// up to the next row's `pc`. 8 bytes. memprof-user's `unwind::table`
/// compiles them; all files' rows lie in the BPF array `UNWIND_ROWS`, each
/// file's followed by its page index ([`PAGE_INDEX`]).
///
/// x86-64 code keeps rsp 8-byte aligned, so every CFA offset seen is a
/// multiple of 8, and a word count reaches frames of 256 KiB (glibc's
/// `buffered_vfprintf` has a 32 KiB frame, python3 64 KiB ones).
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub struct Row {
    /// First address of the row, relative to the table's base (the file's
    /// lowest executable segment's vaddr).
    pub pc: u32,
    /// The CFA's offset from its base register (see [`CfaKind`]), in
    /// 8-byte words.
    pub cfa_words: i16,
    /// [`RbpKind::AtCfa`]: the saved rbp's offset from the CFA in words;
    /// [`CfaKind::Plt`]: the `rip & 15` threshold. Otherwise 0.
    pub aux: i8,
    /// Bits 0-3: [`CfaKind`]; bits 4-7: [`RbpKind`].
    pub kind: u8,
}

/// How a row finds the canonical frame address (CFA): the value of rsp
/// in the caller right after the call returns; the return address is the
/// word at CFA-8.
#[repr(u8)]
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum CfaKind {
    /// No FDE covers the address (or the file has no CFI): the walk stops.
    /// Zero, so that zeroed memory reads as "no information".
    Gap = 0,
    /// CFA = rsp + `cfa_offset()`.
    Rsp = 1,
    /// CFA = rbp + `cfa_offset()`.
    Rbp = 2,
    /// A lazy-binding PLT stub (`.plt`), whose CFI is the expression ld
    /// emits for every stub at once: CFA = rsp + `cfa_offset()`, plus 8 when
    /// `(rip & 15) >= aux` (past the stub's `push`). `aux` is 11 for the
    /// classic 16-byte stubs, 10 for the IBT ones.
    Plt = 3,
    /// CFA = the word at rbp + `cfa_offset()` (`DW_OP_breg6 N; DW_OP_deref`:
    /// gcc's stack realignment, where the CFA is saved below rbp).
    DerefRbp = 4,
    /// The return address is undefined (`DW_CFA_undefined rip`): the
    /// outermost frame, such as `_start` or a new thread's `clone`. The
    /// walk ends there, complete.
    Outermost = 5,
    /// Any other rule (another CFA register, another expression, a return
    /// address not at CFA-8, an offset that is not a multiple of 8 or
    /// beyond 256 KiB): the walk stops.
    Unsupported = 6,
}

/// Where the caller's rbp is.
#[repr(u8)]
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum RbpKind {
    /// rbp still holds the caller's value.
    Unchanged = 0,
    /// The caller's rbp is saved at CFA + 8 × `aux`.
    AtCfa = 1,
    /// Unknown: rbp was not preserved, or saved where a row cannot say
    /// (a walk that later needs it to find a CFA stops).
    Undefined = 2,
}

impl Row {
    pub const fn rule(cfa: CfaKind, cfa_words: i16, rbp: RbpKind, aux: i8) -> Row {
        Row {
            pc: 0,
            cfa_words,
            aux,
            kind: cfa as u8 | (rbp as u8) << 4,
        }
    }

    /// A row whose walk stops (no offsets).
    pub const fn stop(cfa: CfaKind) -> Row {
        Row::rule(cfa, 0, RbpKind::Unchanged, 0)
    }

    pub const fn cfa_kind(&self) -> CfaKind {
        match self.kind & 0xf {
            0 => CfaKind::Gap,
            1 => CfaKind::Rsp,
            2 => CfaKind::Rbp,
            3 => CfaKind::Plt,
            4 => CfaKind::DerefRbp,
            5 => CfaKind::Outermost,
            _ => CfaKind::Unsupported,
        }
    }

    pub const fn rbp_kind(&self) -> RbpKind {
        match self.kind >> 4 {
            0 => RbpKind::Unchanged,
            1 => RbpKind::AtCfa,
            _ => RbpKind::Undefined,
        }
    }

    /// The CFA's offset from its base register, in bytes.
    pub const fn cfa_offset(&self) -> i64 {
        self.cfa_words as i64 * 8
    }

    /// [`RbpKind::AtCfa`]: where the caller's rbp is saved, from the CFA.
    pub const fn rbp_offset(&self) -> i64 {
        self.aux as i64 * 8
    }

    /// The same rule (everything but the address).
    pub const fn same_rule(&self, other: &Row) -> bool {
        self.cfa_words == other.cfa_words && self.aux == other.aux && self.kind == other.kind
    }
}

const _: () = assert!(core::mem::size_of::<Row>() == 8);

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
