//! A module's ELF file as probing reads it: where each function's probe
//! goes, and the code a call to it runs (its own, and that of the
//! functions it tail-calls, through PLT stubs too).
use std::collections::{BTreeMap, BTreeSet, HashMap, HashSet};

use anyhow::{Context as _, Result};

use crate::{
    discover::probe_offset::{
        branch_targets, go_stack_check, plt_slot, probe_offset, tail_call_targets, ProbeReads,
    },
    host::elf::{code_at, code_segments, function_code, symbol_sizes, vaddr_to_file_offset},
};

/// Bytes enough for a Go prologue's stack check (at most 3 instructions).
const GO_STACK_CHECK_BYTES: u64 = 24;

/// One module's parsed file, its functions by name and size, and (with
/// probe offsets on) every direct branch target in its code.
pub(super) struct ModuleCode<'data> {
    file: object::File<'data>,
    /// The module, as errors name it.
    shown: String,
    pub(super) by_name: BTreeMap<String, u64>,
    targets: Option<HashSet<u64>>,
    sizes: HashMap<u64, u64>,
    /// Where each function starts, named or sized: where an unnamed one
    /// ends.
    starts: BTreeSet<u64>,
}

impl<'data> ModuleCode<'data> {
    /// Decodes the code of `file` once: its sizes and, with `offsets`, its
    /// branch targets.
    pub(super) fn new(
        file: object::File<'data>,
        shown: String,
        by_name: BTreeMap<String, u64>,
        offsets: bool,
    ) -> Self {
        let targets = library_branch_targets(&file, offsets);
        let sizes = symbol_sizes(&file);
        let starts = sizes.keys().chain(by_name.values()).copied().collect();
        ModuleCode {
            file,
            shown,
            by_name,
            targets,
            sizes,
            starts,
        }
    }

    /// Where function `name` at `address` is probed in the file.
    pub(super) fn probe_at(
        &self,
        name: &str,
        address: u64,
        reads: Option<ProbeReads>,
    ) -> Result<u64> {
        let shown = &self.shown;
        let start = vaddr_to_file_offset(&self.file, address).with_context(|| {
            format!("{name} at {address:#x} is in no loadable segment of {shown}")
        })?;
        let skipped = reads.map_or(0, |reads| {
            skip(&self.file, name, reads, self.targets.as_ref())
        });
        Ok(start.saturating_add(skipped))
    }

    /// Where Go function `name` at `address` is probed in the file: on
    /// its stack check's branch (see `go_stack_check`), and whether it is
    /// there; else at its first byte.
    pub(super) fn probe_go_at(&self, name: &str, address: u64) -> Result<(u64, bool)> {
        let start = self.probe_at(name, address, None)?;
        let check = code_at(&self.file, address, GO_STACK_CHECK_BYTES)
            .and_then(|code| go_stack_check(code, address));
        Ok((start + check.unwrap_or(0), check.is_some()))
    }

    /// The size of function `name`'s code, from its symbol.
    pub(super) fn size_of(&self, name: &str) -> Option<u64> {
        self.sizes.get(self.by_name.get(name)?).copied()
    }

    /// The size of the function at `target`. A tail-called function of a
    /// stripped library has no symbol: it reaches to the next symbol (at
    /// most 64 KiB), all allocator code in an allocator library.
    fn size_of_unnamed(&self, target: u64) -> u64 {
        self.sizes.get(&target).copied().unwrap_or_else(|| {
            let next = self.starts.range(target + 1..).next().copied();
            next.map_or(1, |next| next - target).min(64 * 1024)
        })
    }

    /// The file offsets of the code of the function at `address`, and of
    /// the functions it tail-calls.
    pub(super) fn code_of(&self, address: u64) -> Vec<(u64, u64)> {
        let range = |address: u64, size: u64| {
            let start = vaddr_to_file_offset(&self.file, address).unwrap_or(0);
            (start, start + size.max(1))
        };
        let size = self.sizes.get(&address).copied().unwrap_or(1);
        let mut ranges = vec![range(address, size)];
        if let Some(code) = code_at(&self.file, address, size) {
            ranges.extend(
                tail_call_targets(code, address)
                    .into_iter()
                    .map(|target| through_plt(&self.file, target, &self.by_name).unwrap_or(target))
                    .map(|target| range(target, self.size_of_unnamed(target))),
            );
        }
        ranges
    }
}

/// The function a PLT stub at `stub` jumps to (tcmalloc's `malloc` ends
/// in `jmp allocate_full_malloc_oom@plt`), found through the stub's GOT
/// slot and that slot's relocation; None if `stub` is no PLT stub.
fn through_plt(file: &object::File<'_>, stub: u64, by_name: &BTreeMap<String, u64>) -> Option<u64> {
    use object::{
        Object as _, ObjectSection as _, ObjectSymbol as _, ObjectSymbolTable as _,
        RelocationTarget,
    };
    file.sections().find(|section| {
        matches!(section.name(), Ok(".plt" | ".plt.sec"))
            && (section.address()..section.address() + section.size()).contains(&stub)
    })?;
    let slot = plt_slot(code_at(file, stub, 16)?, stub)?;
    let (_, relocation) = file
        .dynamic_relocations()?
        .find(|(offset, _)| *offset == slot)?;
    let RelocationTarget::Symbol(index) = relocation.target() else {
        return None;
    };
    let name = file
        .dynamic_symbol_table()?
        .symbol_by_index(index)
        .ok()?
        .name()
        .ok()?;
    by_name.get(name).copied()
}

/// The code segment holding `offset`, as file offsets `[start, end)`.
pub(super) fn code_segment_around(data: &[u8], offset: u64) -> Option<(u64, u64)> {
    let segment = code_segments(data)
        .ok()?
        .into_iter()
        .find(|s| (s.offset..s.offset.saturating_add(s.memsz)).contains(&offset))?;
    Some((segment.offset, segment.offset.checked_add(segment.memsz)?))
}

/// How far into function `name` its probe may go (0 with `offsets` off).
/// `targets`: every direct branch target in the library's code, so that a
/// jump from elsewhere into the skipped bytes keeps the probe at 0.
fn skip(
    file: &object::File<'_>,
    name: &str,
    reads: ProbeReads,
    targets: Option<&HashSet<u64>>,
) -> u64 {
    let Some(targets) = targets else {
        return 0;
    };
    let Some((address, code)) = function_code(file, name) else {
        return 0;
    };
    probe_offset(code, address, reads, targets)
}

/// Direct branch targets in all of the library's executable sections
/// (None when probe offsets are off).
fn library_branch_targets(file: &object::File<'_>, offsets: bool) -> Option<HashSet<u64>> {
    use object::{Object as _, ObjectSection as _, SectionFlags};
    if !offsets {
        return None;
    }
    let mut targets = HashSet::new();
    for section in file.sections() {
        let executable = match section.flags() {
            SectionFlags::Elf { sh_flags } => sh_flags & u64::from(object::elf::SHF_EXECINSTR) != 0,
            _ => false,
        };
        if let (true, Ok(code)) = (executable, section.data()) {
            targets.extend(branch_targets(code, section.address()));
        }
    }
    Some(targets)
}
