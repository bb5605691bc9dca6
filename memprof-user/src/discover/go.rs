//! Go programs: whether a module is one, the Go version that built it and
//! where its Go code lies.
//!
//! Go's runtime moves goroutine stacks and walks them itself: a return
//! probe, which replaces a return address on the stack with the kernel's
//! trampoline, makes it die (SIGILL, or "unexpected return pc"). Code a
//! Go binary links from C (cgo) runs on the thread's own stack and is
//! not Go code here.
use std::{collections::BTreeMap, path::Path};

use object::{Object as _, ObjectSection as _, SectionKind, SymbolKind};

use memprof_common::allocators::GO_MALLOCGC;

use crate::host::{
    elf::{code_at, symbol_addresses},
    gopclntab::{go_functions_of, uvarint},
};

/// What memprof knows of a module built by Go.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct GoModule {
    /// `(major, minor)` from the build information, as `go1.19.8` gives
    /// `(1, 19)`; None where it cannot be read.
    pub version: Option<(u32, u32)>,
    /// Its Go code, as virtual addresses `[start, end)`.
    pub code: (u64, u64),
    /// Whether its symbols name Go's allocator, `runtime.mallocgc`.
    pub names_allocator: bool,
}

impl GoModule {
    /// Whether the function at `address` is Go code.
    pub fn holds(&self, address: u64) -> bool {
        (self.code.0..self.code.1).contains(&address)
    }

    /// Whether its Go functions take their arguments in registers (Go's
    /// internal ABI on x86-64 since 1.17: RAX, RBX, RCX, RDI, RSI, R8…);
    /// before, on the stack.
    pub fn passes_in_registers(&self) -> bool {
        self.version.is_some_and(|version| version >= (1, 17))
    }

    /// The version as Go writes it (`go1.19`), or "an unknown Go".
    pub fn version_text(&self) -> String {
        match self.version {
            Some((major, minor)) => format!("go{major}.{minor}"),
            None => "an unknown Go".to_string(),
        }
    }

    /// Why its heap is not counted (`live`: under `--live`), or None when
    /// it is.
    pub fn uncounted_heap(&self, live: bool) -> Option<String> {
        let version = self.version_text();
        if !self.names_allocator {
            Some(format!(
                "a Go program ({version}) whose symbols and function table \
                 (.gopclntab) do not name its allocator, runtime.mallocgc: its \
                 heap is not counted"
            ))
        } else if !self.passes_in_registers() {
            Some(format!(
                "a Go program built by {version}, which passes arguments on the \
                 stack: memprof reads Go's register arguments (go1.17 and later); \
                 its heap is not counted"
            ))
        } else if live {
            Some(format!(
                "a Go program ({version}): --live does not follow Go's heap, which \
                 its garbage collector frees without a call memprof can see; \
                 without --live its allocations are counted"
            ))
        } else {
            None
        }
    }
}

/// The Go module `file` is, if Go built it (it has a `.go.buildinfo` or
/// a `.gopclntab` section, kept by stripping); `by_name` are its function
/// symbols' addresses.
pub fn go_module(file: &object::File<'_>, by_name: &BTreeMap<String, u64>) -> Option<GoModule> {
    let buildinfo = file.section_by_name(".go.buildinfo");
    let pclntab = file
        .section_by_name(".gopclntab")
        .or_else(|| file.section_by_name(".data.rel.ro.gopclntab"));
    if buildinfo.is_none() && pclntab.is_none() {
        return None;
    }
    let version = buildinfo
        .and_then(|section| section.data().ok())
        .and_then(|data| version_in_buildinfo(file, data));
    let code = match (by_name.get("runtime.text"), by_name.get("runtime.etext")) {
        (Some(&start), Some(&end)) if start < end => Some((start, end)),
        _ => None,
    }
    .or_else(|| {
        pclntab
            .and_then(|s| s.data().ok())
            .and_then(text_of_pclntab)
    })
    .unwrap_or_else(|| all_code(file));
    Some(GoModule {
        version,
        code,
        names_allocator: by_name.contains_key(GO_MALLOCGC),
    })
}

/// The Go module the file at `path` is, if Go built it.
pub fn go_module_of(path: &Path) -> Option<GoModule> {
    let data = crate::host::untrusted::read(path).ok()?;
    let file = object::File::parse(&*data).ok()?;
    go_module(&file, &function_addresses(&file))
}

/// The addresses of a file's functions by name: its symbols, and in a Go
/// program stripped of them (`-ldflags=-s`) the functions its
/// `.gopclntab` names.
pub fn function_addresses(file: &object::File<'_>) -> BTreeMap<String, u64> {
    let mut by_name = symbol_addresses(file, SymbolKind::Text);
    if by_name.contains_key(GO_MALLOCGC) {
        return by_name;
    }
    if let Some(functions) = go_functions_of(file) {
        for function in functions.functions() {
            by_name
                .entry(function.name.to_string())
                .or_insert(function.entry);
        }
    }
    by_name
}

/// Every executable section, where the Go code itself cannot be found:
/// all of it is taken for Go's.
fn all_code(file: &object::File<'_>) -> (u64, u64) {
    file.sections()
        .filter(|s| s.kind() == SectionKind::Text)
        .map(|s| (s.address(), s.address() + s.size()))
        .reduce(|a, b| (a.0.min(b.0), a.1.max(b.1)))
        .unwrap_or((0, u64::MAX))
}

/// The Go version in a `.go.buildinfo` section: inline after its 32-byte
/// header (Go 1.18 and later), or through a pointer to a Go string.
fn version_in_buildinfo(file: &object::File<'_>, data: &[u8]) -> Option<(u32, u32)> {
    const MAGIC: &[u8] = b"\xff Go buildinf:";
    if data.get(..MAGIC.len())? != MAGIC {
        return None;
    }
    let pointer_size = usize::from(*data.get(14)?);
    let flags = *data.get(15)?;
    if flags & 1 != 0 || pointer_size != 8 {
        // Big-endian or 32-bit: not a target here.
        return None;
    }
    let text = if flags & 2 != 0 {
        let (length, used) = uvarint(data.get(32..)?)?;
        let start = 32 + used;
        data.get(start..start.checked_add(usize::try_from(length).ok()?)?)?
    } else {
        let header = read_u64(data, 16)?;
        let string = code_at(file, header, 16)?;
        let (pointer, length) = (read_u64(string, 0)?, read_u64(string, 8)?);
        code_at(file, pointer, length.min(64))?
    };
    parse_version(std::str::from_utf8(text).ok()?)
}

/// `go1.19.8` (or `go1.21rc2`, `devel go1.22-…`): `(1, 19)`.
fn parse_version(text: &str) -> Option<(u32, u32)> {
    let rest = &text[text.find("go")? + 2..];
    let mut parts = rest.split(|c: char| !c.is_ascii_digit());
    let major = parts.next()?.parse().ok()?;
    let minor = parts.next()?.parse().ok()?;
    Some((major, minor))
}

/// The text addresses `[start, end)` a `.gopclntab` covers, from its
/// header and function table (Go 1.2 to 1.24 layouts, 64-bit).
fn text_of_pclntab(data: &[u8]) -> Option<(u64, u64)> {
    let magic = u32::from_le_bytes(data.get(..4)?.try_into().ok()?);
    if *data.get(7)? != 8 {
        return None;
    }
    let field = |index: usize| read_u64(data, 8 + 8 * index);
    let range = match magic {
        // Go 1.18 and later: entries are 32-bit offsets from textStart,
        // the last one the end of the text.
        0xffff_fff0 | 0xffff_fff1 => {
            let (functions, text_start, table) = (field(0)?, field(2)?, field(7)?);
            let end_entry = usize::try_from(table.checked_add(functions.checked_mul(8)?)?).ok()?;
            let end = u32::from_le_bytes(data.get(end_entry..end_entry + 4)?.try_into().ok()?);
            (text_start, text_start.checked_add(u64::from(end))?)
        }
        // Go 1.16 and 1.17: (pc, offset) pairs of addresses, then the end.
        0xffff_fffa => address_table(data, field(0)?, field(6)?)?,
        // Go 1.2 to 1.15: the table follows the function count.
        0xffff_fffb => address_table(data, field(0)?, 16)?,
        _ => return None,
    };
    (range.0 != 0 && range.0 < range.1).then_some(range)
}

/// The first function's address and the end address of a table of
/// `functions` (pc, offset) pairs at `table`.
fn address_table(data: &[u8], functions: u64, table: u64) -> Option<(u64, u64)> {
    let table = usize::try_from(table).ok()?;
    let end = table.checked_add(usize::try_from(functions.checked_mul(16)?).ok()?)?;
    Some((read_u64(data, table)?, read_u64(data, end)?))
}

fn read_u64(data: &[u8], at: usize) -> Option<u64> {
    Some(u64::from_le_bytes(
        data.get(at..at.checked_add(8)?)?.try_into().ok()?,
    ))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn versions() {
        assert_eq!(parse_version("go1.19.8"), Some((1, 19)));
        assert_eq!(parse_version("go1.21rc2"), Some((1, 21)));
        assert_eq!(parse_version("devel go1.22-abc"), Some((1, 22)));
        assert_eq!(parse_version("gone"), None);
    }

    #[test]
    fn varints() {
        assert_eq!(uvarint(&[0x08]), Some((8, 1)));
        assert_eq!(uvarint(&[0x96, 0x01]), Some((150, 2)));
        assert_eq!(uvarint(&[0x80]), None);
    }
}
