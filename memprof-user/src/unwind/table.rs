//! Compiles an x86-64 ELF file's call frame information (`.eh_frame`,
//! and `.debug_frame` where present) into a compact [`UnwindTable`]: one
//! 8-byte [`Row`] per address range, sorted by address, the form the BPF
//! walker will binary-search.
//!
//! Each FDE's CFI program is evaluated with gimli (`UnwindTable`,
//! `UnwindContext`); each resulting row is reduced to what the walk needs
//! on x86-64: how to find the CFA (from rsp, from rbp, a PLT stub's
//! expression, the word at rbp+N), whether the return address is defined
//! (it must be at CFA-8 when it is), and where the caller's rbp is.
//! Everything else is marked unsupported, so a walk stops there rather
//! than guessing.
use std::collections::HashMap;

use anyhow::{bail, Context as _, Result};
use gimli::{
    BaseAddresses, CfaRule, CieOrFde, CommonInformationEntry, DebugFrame, EhFrame, EndianSlice,
    LittleEndian, Operation, Register, RegisterRule, UnwindContext, UnwindOffset, UnwindSection,
};
use object::{Object as _, ObjectSection as _, ObjectSegment as _, SegmentFlags};

use crate::host::gopclntab::go_functions_of;

type Reader<'a> = EndianSlice<'a, LittleEndian>;

/// DWARF register numbers on x86-64.
const RBP: Register = Register(6);
const RSP: Register = Register(7);
/// The return address column (rip).
const RA: Register = Register(16);

pub use memprof_common::unwind::{CfaKind, RbpKind, Row};

/// What compiling a file found.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct TableStats {
    /// FDEs whose rows are in the table (`.eh_frame` and `.debug_frame`).
    pub fdes: usize,
    /// Of them, from `.debug_frame`.
    pub debug_frame_fdes: usize,
    /// FDEs left out: empty, outside the executable segments, or not
    /// parseable.
    pub skipped_fdes: usize,
    /// Rows in the table, gaps included.
    pub rows: usize,
    /// Of them, [`CfaKind::Unsupported`].
    pub unsupported_rows: usize,
    /// Bytes of rows (`rows` × 8).
    pub bytes: usize,
    /// Why CFI rows (before merging) were unsupported: an unrecognised
    /// CFA expression, a CFA from another register, an offset that does
    /// not fit a row, a return address not at CFA-8.
    pub unsupported_expressions: usize,
    pub unsupported_registers: usize,
    pub unsupported_offsets: usize,
    pub unsupported_return_address: usize,
    /// CFI rows whose rbp rule cannot be encoded (kept as undefined).
    pub rbp_lost: usize,
    /// A `.debug_frame` section was present but not read (compressed
    /// beyond `MAX_DEBUG_FRAME`, or corrupt).
    pub debug_frame_compressed: bool,
}

/// An executable PT_LOAD segment, as in the file.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ExecSegment {
    pub vaddr: u64,
    pub memsz: u64,
    pub offset: u64,
    pub filesz: u64,
}

/// A file's unwind rows, sorted by address.
#[derive(Clone, Debug)]
pub struct UnwindTable {
    /// The file virtual address `Row::pc` counts from: the lowest
    /// executable segment's. A process address `a` in a mapping with load
    /// bias `b` is looked up at `a - b - base`.
    pub base: u64,
    /// Sorted by `pc`, strictly rising; consecutive rows have different
    /// rules; the last row is a [`CfaKind::Gap`] (the end of the last FDE).
    pub rows: Vec<Row>,
    /// The file's executable segments (to find load biases).
    pub segments: Vec<ExecSegment>,
    pub stats: TableStats,
}

impl UnwindTable {
    /// The row for file virtual address `vaddr`, or None below the first
    /// row (past the last FDE the row is a gap).
    pub fn lookup(&self, vaddr: u64) -> Option<Row> {
        let relative = u32::try_from(vaddr.checked_sub(self.base)?).ok()?;
        let index = self.rows.partition_point(|row| row.pc <= relative);
        index.checked_sub(1).map(|index| self.rows[index])
    }

    /// The load bias of a mapping of this file at `start` from file
    /// offset `offset` (as in /proc/PID/maps), if that offset lies in an
    /// executable segment: process address = file virtual address + bias.
    pub fn load_bias(&self, start: u64, offset: u64) -> Option<u64> {
        const PAGE: u64 = 4096;
        self.segments.iter().find_map(|segment| {
            let first_page = segment.offset & !(PAGE - 1);
            (first_page..segment.offset + segment.filesz.max(1))
                .contains(&offset)
                .then(|| {
                    // File offset `segment.offset` is at vaddr
                    // `segment.vaddr`, and at `start + (segment.offset -
                    // offset)` in the process.
                    start
                        .wrapping_add(segment.offset)
                        .wrapping_sub(offset)
                        .wrapping_sub(segment.vaddr)
                })
        })
    }
}

/// An address range and its rule, before the rows are laid out.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
struct Span {
    start: u64,
    end: u64,
    rule: Row,
}

/// Compiles the CFI of an x86-64 ELF file (executable, PIE or shared
/// library) into an [`UnwindTable`].
///
/// `.eh_frame` FDEs are all evaluated (no `.eh_frame_hdr` needed);
/// `.debug_frame` adds what `.eh_frame` does not cover. FDEs outside the
/// executable segments are skipped. A file without CFI gives a table of
/// gaps only (every walk stops there). A compressed `.debug_frame` is not
/// read (counted in the stats).
pub fn compile(data: &[u8]) -> Result<UnwindTable> {
    let file = object::File::parse(data).context("not an ELF file")?;
    if file.architecture() != object::Architecture::X86_64 || !file.is_64() {
        bail!("not an x86-64 ELF file ({:?})", file.architecture());
    }
    let segments = exec_segments(&file);
    let mut exec: Vec<(u64, u64)> = segments
        .iter()
        .map(|s| (s.vaddr, s.vaddr.saturating_add(s.memsz)))
        .collect();
    exec.sort_unstable();
    let (Some(&(base, _)), Some(top)) = (exec.first(), exec.iter().map(|r| r.1).max()) else {
        bail!("no executable segment");
    };
    if top - base > u64::from(u32::MAX) {
        bail!("executable segments span more than 4 GiB");
    }

    let mut stats = TableStats::default();
    let mut bases = BaseAddresses::default();
    if let Some(text) = file.section_by_name(".text") {
        bases = bases.set_text(text.address());
    }
    if let Some(got) = file.section_by_name(".got") {
        bases = bases.set_got(got.address());
    }

    let mut spans = Vec::new();
    let mut eh_cover = Vec::new();
    if let Some(section) = file.section_by_name(".eh_frame") {
        let bytes = section.data().context("reading .eh_frame")?;
        let bases = bases.clone().set_eh_frame(section.address());
        let mut eh_frame = EhFrame::new(bytes, LittleEndian);
        eh_frame.set_address_size(8);
        collect(
            &eh_frame,
            &bases,
            &exec,
            &mut eh_cover,
            &mut spans,
            &mut stats,
        );
    }
    if let Some(section) = file.section_by_name(".debug_frame") {
        match debug_frame_data(&section) {
            Ok(bytes) => {
                let mut debug_frame = DebugFrame::new(&bytes, LittleEndian);
                debug_frame.set_address_size(8);
                let (mut cover, mut debug_spans) = (Vec::new(), Vec::new());
                let before = stats.fdes;
                collect(
                    &debug_frame,
                    &bases,
                    &exec,
                    &mut cover,
                    &mut debug_spans,
                    &mut stats,
                );
                stats.debug_frame_fdes = stats.fdes - before;
                spans.extend(uncovered(&debug_spans, &merge_ranges(eh_cover)));
            }
            Err(_) => stats.debug_frame_compressed = true,
        }
    }

    // Go code without CFI (built with -ldflags=-s or -w) keeps frame
    // pointers: its frames are walked by them.
    let cover = merge_ranges(spans.iter().map(|span| (span.start, span.end)).collect());
    spans.extend(uncovered(&go_frame_spans(&file), &cover));

    // A library linked without an entry point gets the start of .text as
    // e_entry: that is no process's first frame.
    let text_start = file.section_by_name(".text").map(|text| text.address());
    if Some(file.entry()) != text_start {
        spans.extend(entry_without_cfi(file.entry(), &exec, &spans));
    }
    let rows = lay_out(base, spans);
    stats.rows = rows.len();
    stats.unsupported_rows = rows
        .iter()
        .filter(|row| row.cfa_kind() == CfaKind::Unsupported)
        .count();
    stats.bytes = rows.len() * std::mem::size_of::<Row>();
    Ok(UnwindTable {
        base,
        rows,
        segments,
        stats,
    })
}

/// A `.debug_frame` section's bytes, decompressed where the file
/// compresses it (Go's, `gcc -gz`), unless it claims more than
/// [`MAX_DEBUG_FRAME`]: the file is the profiled process's, and may lie.
fn debug_frame_data<'data>(
    section: &object::Section<'data, '_>,
) -> Result<std::borrow::Cow<'data, [u8]>> {
    let compressed = section.compressed_data()?;
    anyhow::ensure!(
        compressed.uncompressed_size <= MAX_DEBUG_FRAME,
        "a .debug_frame of {} bytes",
        compressed.uncompressed_size
    );
    Ok(compressed.decompress()?)
}

/// Spans for a Go program's functions (from its `.gopclntab`), walked by
/// frame pointer: Go's compiler keeps one in every function that calls
/// another, saved at the CFA-16 (the return address at CFA-8, the CFA
/// rbp + 16). Where a goroutine's or a thread's stack begins, the walk
/// ends, complete. None in any other file.
fn go_frame_spans(file: &object::File<'_>) -> Vec<Span> {
    const OUTERMOST: [&str; 3] = ["runtime.goexit", "runtime.mstart", "runtime.rt0_go"];
    let Some(functions) = go_functions_of(file) else {
        return Vec::new();
    };
    let by_frame_pointer = Row::rule(CfaKind::Rbp, 2, RbpKind::AtCfa, -2);
    functions
        .functions()
        .filter(|function| function.entry < function.end)
        .map(|function| Span {
            start: function.entry,
            end: function.end,
            rule: match OUTERMOST.contains(&function.name) {
                true => Row::stop(CfaKind::Outermost),
                false => by_frame_pointer,
            },
        })
        .collect()
}

/// The largest `.debug_frame` decompressed (a large program's is a few MiB).
const MAX_DEBUG_FRAME: u64 = 64 << 20;

/// The code at the ELF entry point is a process's first frame: nothing
/// called it. ld.so's (`_start`, then `_dl_start_user`, which runs the
/// libraries' initializers: C++ static constructors allocate there) is
/// assembly without CFI; its stretch up to the next FDE is outermost, so
/// a stack through it ends there complete instead of cut for lack of
/// unwind information.
fn entry_without_cfi(entry: u64, exec: &[(u64, u64)], spans: &[Span]) -> Option<Span> {
    let &(_, segment_end) = exec.iter().find(|&&(lo, hi)| (lo..hi).contains(&entry))?;
    if entry == 0
        || spans
            .iter()
            .any(|span| (span.start..span.end).contains(&entry))
    {
        return None;
    }
    let end = spans
        .iter()
        .map(|span| span.start)
        .filter(|&start| start > entry)
        .min()
        .unwrap_or(segment_end)
        .min(segment_end);
    Some(Span {
        start: entry,
        end,
        rule: Row::stop(CfaKind::Outermost),
    })
}

fn exec_segments(file: &object::File<'_>) -> Vec<ExecSegment> {
    file.segments()
        .filter(|segment| {
            matches!(segment.flags(), SegmentFlags::Elf { p_flags } if p_flags & object::elf::PF_X != 0)
        })
        .map(|segment| {
            let (offset, filesz) = segment.file_range();
            ExecSegment {
                vaddr: segment.address(),
                memsz: segment.size(),
                offset,
                filesz,
            }
        })
        .collect()
}

/// Evaluates every FDE of `section` whose range lies in `exec`, adding
/// its ranges to `cover` and its rows to `spans`.
fn collect<'a, S: UnwindSection<Reader<'a>>>(
    section: &S,
    bases: &BaseAddresses,
    exec: &[(u64, u64)],
    cover: &mut Vec<(u64, u64)>,
    spans: &mut Vec<Span>,
    stats: &mut TableStats,
) {
    let mut cies: HashMap<usize, CommonInformationEntry<Reader<'a>>> = HashMap::new();
    let mut context = Box::new(UnwindContext::new());
    let mut entries = section.entries(bases);
    // An entry that cannot be parsed ends the section: its length, and so
    // where the next entry starts, cannot be trusted.
    while let Ok(Some(entry)) = entries.next() {
        let partial = match entry {
            CieOrFde::Cie(cie) => {
                cies.insert(cie.offset(), cie);
                continue;
            }
            CieOrFde::Fde(partial) => partial,
        };
        let fde = partial.parse(|section, bases, offset| {
            let key = UnwindOffset::into(offset);
            if let Some(cie) = cies.get(&key) {
                return Ok(cie.clone());
            }
            let cie = section.cie_from_offset(bases, offset)?;
            cies.insert(key, cie.clone());
            Ok(cie)
        });
        let Ok(fde) = fde else {
            stats.skipped_fdes += 1;
            continue;
        };
        let start = fde.initial_address();
        let end = start.checked_add(fde.len()).unwrap_or(start);
        let inside = exec.iter().any(|&(lo, hi)| lo <= start && end <= hi);
        if start == end || !inside {
            stats.skipped_fdes += 1;
            continue;
        }
        let encoding = fde.cie().encoding();
        let first = spans.len();
        let complete = match gimli::UnwindTable::new(section, bases, &mut context, &fde) {
            Ok(mut rows) => loop {
                match rows.next_row() {
                    Ok(Some(row)) => {
                        let (row_start, row_end) = (row.start_address(), row.end_address());
                        if row_start < row_end && start <= row_start {
                            spans.push(Span {
                                start: row_start,
                                end: row_end.min(end),
                                rule: classify(row, section, encoding, stats),
                            });
                        }
                    }
                    Ok(None) => break true,
                    Err(_) => break false,
                }
            },
            Err(_) => false,
        };
        if !complete {
            spans.truncate(first);
            stats.skipped_fdes += 1;
            continue;
        }
        cover.push((start, end));
        stats.fdes += 1;
    }
}

/// Reduces one CFI row to a [`Row`]'s rule.
fn classify<'a, S: UnwindSection<Reader<'a>>>(
    row: &gimli::UnwindTableRow<usize>,
    section: &S,
    encoding: gimli::Encoding,
    stats: &mut TableStats,
) -> Row {
    match row.register(RA) {
        Some(RegisterRule::Offset(-8)) => {}
        Some(RegisterRule::Undefined) => return Row::stop(CfaKind::Outermost),
        _ => {
            stats.unsupported_return_address += 1;
            return Row::stop(CfaKind::Unsupported);
        }
    }
    let (kind, offset, aux) = match row.cfa() {
        CfaRule::RegisterAndOffset {
            register: RSP,
            offset,
        } => (CfaKind::Rsp, *offset, 0),
        CfaRule::RegisterAndOffset {
            register: RBP,
            offset,
        } => (CfaKind::Rbp, *offset, 0),
        CfaRule::RegisterAndOffset { .. } => {
            stats.unsupported_registers += 1;
            return Row::stop(CfaKind::Unsupported);
        }
        CfaRule::Expression(expression) => {
            let recognised = expression
                .get(section)
                .ok()
                .and_then(|expression| recognise(expression, encoding));
            let Some(recognised) = recognised else {
                stats.unsupported_expressions += 1;
                return Row::stop(CfaKind::Unsupported);
            };
            recognised
        }
    };
    let words = i16::try_from(offset / 8).ok().filter(|_| offset % 8 == 0);
    let Some(cfa_words) = words else {
        stats.unsupported_offsets += 1;
        return Row::stop(CfaKind::Unsupported);
    };
    let (rbp, rbp_aux) = match row.register(RBP) {
        None | Some(RegisterRule::SameValue) => (RbpKind::Unchanged, 0),
        Some(RegisterRule::Undefined) => (RbpKind::Undefined, 0),
        Some(RegisterRule::Offset(n)) if n % 8 == 0 && i8::try_from(n / 8).is_ok() => {
            (RbpKind::AtCfa, (n / 8) as i8)
        }
        Some(_) => {
            stats.rbp_lost += 1;
            (RbpKind::Undefined, 0)
        }
    };
    if kind == CfaKind::Plt {
        // `aux` holds the threshold: a PLT stub never saves rbp.
        if rbp != RbpKind::Unchanged {
            stats.unsupported_expressions += 1;
            return Row::stop(CfaKind::Unsupported);
        }
        return Row::rule(kind, cfa_words, rbp, aux);
    }
    Row::rule(kind, cfa_words, rbp, rbp_aux)
}

/// The CFA expressions a row can hold: the PLT stubs' and the word at
/// rbp+N. Returns (kind, offset, aux).
fn recognise(
    expression: gimli::Expression<Reader<'_>>,
    encoding: gimli::Encoding,
) -> Option<(CfaKind, i64, i8)> {
    let mut operations = Vec::with_capacity(9);
    let mut iter = expression.operations(encoding);
    while let Some(operation) = iter.next().ok()? {
        if operations.len() == 9 {
            return None;
        }
        operations.push(operation);
    }
    use Operation as Op;
    match operations.as_slice() {
        // DW_OP_breg7 (rsp) N; DW_OP_breg16 (rip) 0; DW_OP_lit15; DW_OP_and;
        // DW_OP_litK; DW_OP_ge; DW_OP_lit3; DW_OP_shl; DW_OP_plus
        [Op::RegisterOffset {
            register: RSP,
            offset,
            ..
        }, Op::RegisterOffset {
            register: RA,
            offset: 0,
            ..
        }, Op::UnsignedConstant { value: 15 }, Op::And, Op::UnsignedConstant { value: threshold }, Op::Ge, Op::UnsignedConstant { value: 3 }, Op::Shl, Op::Plus]
            if *threshold < 16 =>
        {
            Some((CfaKind::Plt, *offset, *threshold as i8))
        }
        // DW_OP_breg6 (rbp) N; DW_OP_deref
        [Op::RegisterOffset {
            register: RBP,
            offset,
            ..
        }, Op::Deref {
            size: 8,
            space: false,
            ..
        }] => Some((CfaKind::DerefRbp, *offset, 0)),
        _ => None,
    }
}

/// Sorts and merges ranges that overlap or touch.
fn merge_ranges(mut ranges: Vec<(u64, u64)>) -> Vec<(u64, u64)> {
    ranges.sort_unstable();
    let mut merged: Vec<(u64, u64)> = Vec::with_capacity(ranges.len());
    for (start, end) in ranges {
        match merged.last_mut() {
            Some(last) if start <= last.1 => last.1 = last.1.max(end),
            _ => merged.push((start, end)),
        }
    }
    merged
}

/// The parts of `spans` outside `cover` (sorted, merged ranges).
fn uncovered(spans: &[Span], cover: &[(u64, u64)]) -> Vec<Span> {
    let mut out = Vec::new();
    for span in spans {
        let mut start = span.start;
        let mut index = cover.partition_point(|&(_, end)| end <= start);
        while start < span.end {
            match cover.get(index) {
                Some(&(lo, hi)) if lo <= start => {
                    start = hi;
                    index += 1;
                }
                next => {
                    let end = next.map_or(span.end, |&(lo, _)| lo.min(span.end));
                    out.push(Span {
                        start,
                        end,
                        ..*span
                    });
                    start = end;
                }
            }
        }
    }
    out
}

/// Lays the spans out as rows from `base`: sorted, the first span wins
/// where spans overlap (they are in section order, `.eh_frame` first), a
/// gap row wherever no span covers the code (and after the last one), and
/// consecutive equal rules merged.
fn lay_out(base: u64, mut spans: Vec<Span>) -> Vec<Row> {
    spans.sort_by_key(|span| span.start);
    let mut rows: Vec<Row> = Vec::new();
    let mut push = |address: u64, rule: Row| {
        if rows.last().is_some_and(|last| last.same_rule(&rule)) {
            return;
        }
        rows.push(Row {
            pc: (address - base) as u32,
            ..rule
        });
    };
    let mut covered_to: Option<u64> = None;
    for span in spans {
        let start = match covered_to {
            Some(end) if span.start < end => end,
            _ => span.start,
        };
        if start >= span.end {
            continue;
        }
        if let Some(end) = covered_to.filter(|&end| end < start) {
            push(end, Row::stop(CfaKind::Gap));
        }
        push(start, span.rule);
        covered_to = Some(span.end);
    }
    if let Some(end) = covered_to {
        push(end, Row::stop(CfaKind::Gap));
    }
    rows
}

#[cfg(test)]
mod tests {
    use super::*;

    fn rsp(offset: i16) -> Row {
        Row::rule(CfaKind::Rsp, offset / 8, RbpKind::Unchanged, 0)
    }

    fn span(start: u64, end: u64, rule: Row) -> Span {
        Span { start, end, rule }
    }

    fn rows_of(rows: &[Row]) -> Vec<(u32, CfaKind, i64)> {
        rows.iter()
            .map(|row| (row.pc, row.cfa_kind(), row.cfa_offset()))
            .collect()
    }

    #[test]
    fn unwind_lay_out_gaps_merges_and_overlaps() {
        let rows = lay_out(
            0x1000,
            vec![
                // Out of order on purpose.
                span(0x1040, 0x1050, rsp(8)),
                span(0x1000, 0x1004, rsp(8)),
                span(0x1004, 0x1010, rsp(16)),
                // Touches the previous span, same rule as the one before.
                span(0x1010, 0x1020, rsp(8)),
                // Same rule, adjacent: merged.
                span(0x1020, 0x1030, rsp(8)),
                // Overlaps the previous: only its tail is kept.
                span(0x1028, 0x1038, rsp(24)),
                // Inside an earlier span: dropped.
                span(0x1042, 0x1044, rsp(40)),
            ],
        );
        assert_eq!(
            rows_of(&rows),
            vec![
                (0x00, CfaKind::Rsp, 8),
                (0x04, CfaKind::Rsp, 16),
                (0x10, CfaKind::Rsp, 8),
                (0x30, CfaKind::Rsp, 24),
                (0x38, CfaKind::Gap, 0),
                (0x40, CfaKind::Rsp, 8),
                (0x50, CfaKind::Gap, 0),
            ]
        );
        let table = UnwindTable {
            base: 0x1000,
            rows,
            segments: Vec::new(),
            stats: TableStats::default(),
        };
        assert_eq!(table.lookup(0xfff), None);
        assert_eq!(table.lookup(0x1000).unwrap().cfa_offset(), 8);
        assert_eq!(table.lookup(0x100f).unwrap().cfa_offset(), 16);
        assert_eq!(table.lookup(0x1037).unwrap().cfa_offset(), 24);
        assert_eq!(table.lookup(0x1038).unwrap().cfa_kind(), CfaKind::Gap);
        assert_eq!(table.lookup(0x103f).unwrap().cfa_kind(), CfaKind::Gap);
        assert_eq!(table.lookup(0x104f).unwrap().cfa_kind(), CfaKind::Rsp);
        assert_eq!(table.lookup(0x1050).unwrap().cfa_kind(), CfaKind::Gap);
        assert_eq!(table.lookup(0x1_0000_2000).map(|r| r.cfa_kind()), None);
    }

    #[test]
    fn unwind_debug_frame_only_fills_what_eh_frame_leaves() {
        let cover = merge_ranges(vec![(0x30, 0x40), (0x10, 0x20), (0x20, 0x28)]);
        assert_eq!(cover, vec![(0x10, 0x28), (0x30, 0x40)]);
        let pieces = uncovered(
            &[span(0x00, 0x50, rsp(8)), span(0x12, 0x18, rsp(16))],
            &cover,
        );
        let ranges: Vec<(u64, u64)> = pieces.iter().map(|s| (s.start, s.end)).collect();
        assert_eq!(ranges, vec![(0x00, 0x10), (0x28, 0x30), (0x40, 0x50)]);
    }

    #[test]
    fn unwind_row_encoding() {
        let row = Row::rule(CfaKind::Rbp, 2, RbpKind::AtCfa, -2);
        assert_eq!(row.cfa_kind(), CfaKind::Rbp);
        assert_eq!(row.cfa_offset(), 16);
        assert_eq!(row.rbp_kind(), RbpKind::AtCfa);
        assert_eq!(row.rbp_offset(), -16);
        assert_eq!(Row::stop(CfaKind::Gap).kind, 0);
        // A zeroed row is a gap.
        let zero = Row {
            pc: 0,
            cfa_words: 0,
            aux: 0,
            kind: 0,
        };
        assert_eq!(zero.cfa_kind(), CfaKind::Gap);
    }
}
