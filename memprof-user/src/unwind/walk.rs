//! The frame-by-frame walk over [`UnwindTable`]s: the algorithm the BPF
//! walker will run (see the module documentation of `unwind` for the
//! steps), written plainly in user space, as its reference and test
//! oracle.
use super::table::{CfaKind, RbpKind, UnwindTable};

/// One executable mapping of a process: the BPF side's per-process
/// mapping table holds the same (start, end, file, bias).
#[derive(Clone, Copy, Debug)]
pub struct Mapping<'a> {
    /// Process addresses [start, end).
    pub start: u64,
    pub end: u64,
    /// Process address = file virtual address + bias.
    pub bias: u64,
    pub table: &'a UnwindTable,
}

/// The registers a walk starts from.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Regs {
    pub rip: u64,
    pub rsp: u64,
    pub rbp: u64,
}

/// Why a walk ended.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Stop {
    /// The return address is undefined: the stack is complete.
    Outermost,
    /// A return address of 0 (a stack some code ended by hand).
    ZeroReturnAddress,
    /// The address is in no executable mapping (for a caller frame: its
    /// return address; then it is not recorded).
    NotMapped,
    /// No row covers the address (a gap, or before the first row).
    NoUnwindInfo,
    /// The row's rule is one a row cannot express.
    Unsupported,
    /// The CFA is computed from rbp, whose value is unknown.
    RbpUnknown,
    /// A stack word could not be read.
    ReadFault,
    /// The caller's stack pointer (the CFA) is not above this frame's: a
    /// loop, or a corrupt stack.
    CfaNotGrowing,
    /// `max_frames` frames were recorded.
    MaxFrames,
}

/// A walk's result: the frames (frame 0 is `rip`, then one return
/// address per caller) and why it ended.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Unwound {
    pub frames: Vec<u64>,
    pub stop: Stop,
}

/// Walks the stack from `regs`: see the steps in the `unwind` module's
/// documentation. `mappings` must be sorted by `start` and not overlap;
/// `read_word` reads the 8-byte word at a stack address.
pub fn unwind(
    mappings: &[Mapping<'_>],
    regs: Regs,
    read_word: impl Fn(u64) -> Option<u64>,
    max_frames: usize,
) -> Unwound {
    debug_assert!(mappings.windows(2).all(|w| w[0].end <= w[1].start));
    let mut frames = Vec::new();
    if max_frames == 0 {
        return Unwound {
            frames,
            stop: Stop::MaxFrames,
        };
    }
    let (mut pc, mut sp, mut bp) = (regs.rip, regs.rsp, Some(regs.rbp));
    // Frame 0's rip is the instruction itself; a caller's return address
    // follows its call, which may be the last instruction of a function
    // (a call to a noreturn function): it is looked up one byte before.
    let mut lookup = pc;
    frames.push(pc);
    let stop = loop {
        if frames.len() >= max_frames {
            break Stop::MaxFrames;
        }
        let Some(mapping) = find(mappings, lookup) else {
            break Stop::NotMapped;
        };
        let Some(row) = mapping.table.lookup(lookup.wrapping_sub(mapping.bias)) else {
            break Stop::NoUnwindInfo;
        };
        let offset = row.cfa_offset() as u64;
        let cfa = match row.cfa_kind() {
            CfaKind::Gap => break Stop::NoUnwindInfo,
            CfaKind::Outermost => break Stop::Outermost,
            CfaKind::Unsupported => break Stop::Unsupported,
            CfaKind::Rsp => sp.wrapping_add(offset),
            CfaKind::Rbp => match bp {
                Some(bp) => bp.wrapping_add(offset),
                None => break Stop::RbpUnknown,
            },
            CfaKind::Plt => {
                let pushed = if pc & 15 >= row.aux as u64 { 8 } else { 0 };
                sp.wrapping_add(offset).wrapping_add(pushed)
            }
            CfaKind::DerefRbp => {
                let Some(bp) = bp else {
                    break Stop::RbpUnknown;
                };
                match read_word(bp.wrapping_add(offset)) {
                    Some(cfa) => cfa,
                    None => break Stop::ReadFault,
                }
            }
        };
        if cfa <= sp {
            break Stop::CfaNotGrowing;
        }
        let Some(ra) = read_word(cfa - 8) else {
            break Stop::ReadFault;
        };
        bp = match row.rbp_kind() {
            RbpKind::Unchanged => bp,
            // An unreadable slot makes rbp unknown, not the walk fail: only a
            // caller whose CFA needs rbp will stop.
            RbpKind::AtCfa => read_word(cfa.wrapping_add(row.rbp_offset() as u64)),
            RbpKind::Undefined => None,
        };
        if ra == 0 {
            break Stop::ZeroReturnAddress;
        }
        lookup = ra - 1;
        if find(mappings, lookup).is_none() {
            break Stop::NotMapped;
        }
        frames.push(ra);
        pc = ra;
        sp = cfa;
    };
    Unwound { frames, stop }
}

/// The mapping holding `address` (binary search).
fn find<'m, 'a>(mappings: &'m [Mapping<'a>], address: u64) -> Option<&'m Mapping<'a>> {
    let index = mappings.partition_point(|m| m.start <= address);
    let mapping = mappings.get(index.checked_sub(1)?)?;
    (address < mapping.end).then_some(mapping)
}
