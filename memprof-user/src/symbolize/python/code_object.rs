//! A code object read from a profiled process: its function's name
//! (qualified where the version keeps one), its file, first line and
//! line table, at the offsets of its CPython version. What is read is the
//! process's to control: lengths are capped, and what does not decode is
//! an error, never a panic.
use std::io;

use super::line_table::{line_at, LineTableFormat};
use crate::host::procfs::memory::ProcessMemory;

/// Where a CPython version keeps a code object's fields and a string's
/// characters (offsets in bytes; checked against pyenv's 3.8 to 3.13 and
/// Debian's 3.11).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct CodeLayout {
    filename: u64,
    name: u64,
    /// 3.11 and later.
    qualname: Option<u64>,
    /// An `int` (C).
    first_line: u64,
    /// A `bytes` object: `co_lnotab` (3.8, 3.9), `co_linetable` after.
    line_table: u64,
    format: LineTableFormat,
    /// A compact ASCII string's characters (after `PyASCIIObject`); a
    /// compact non-ASCII one's follow `PyCompactUnicodeObject`.
    ascii_data: u64,
    compact_data: u64,
}

impl CodeLayout {
    /// The layout of CPython 3.`minor`, for the versions memprof knows.
    pub fn of(minor: u32) -> Option<CodeLayout> {
        let (ascii_data, compact_data) = match minor {
            8..=11 => (48, 72),
            12 | 13 => (40, 56),
            _ => return None,
        };
        let layout = match minor {
            8..=10 => CodeLayout {
                filename: 104,
                name: 112,
                qualname: None,
                first_line: 40,
                line_table: 120,
                format: match minor {
                    10 => LineTableFormat::Linetable,
                    _ => LineTableFormat::Lnotab,
                },
                ascii_data,
                compact_data,
            },
            _ => CodeLayout {
                filename: 112,
                name: 120,
                qualname: Some(128),
                first_line: if minor == 11 { 72 } else { 68 },
                line_table: 136,
                format: LineTableFormat::Locations,
                ascii_data,
                compact_data,
            },
        };
        Some(layout)
    }
}

/// What a report needs of a code object.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct CodeObject {
    /// The qualified name where the version has one (`Class.method`,
    /// `outer.<locals>.inner`), else the function's name.
    pub name: String,
    pub file: String,
    pub first_line: i64,
    line_table: Vec<u8>,
    format: LineTableFormat,
}

impl CodeObject {
    /// The source line of the instruction at byte `offset` of the code.
    pub fn line_at(&self, offset: u64) -> Option<i64> {
        line_at(self.format, &self.line_table, self.first_line, offset)
    }
}

/// Names longer than this are cut (a path is at most 4 KiB).
const MAX_STRING: u64 = 4096;
/// Line tables longer than this are refused (a module's top-level code
/// of 100,000 lines takes a few hundred KiB).
const MAX_LINE_TABLE: u64 = 4 << 20;

/// Reads the code object at `address` of a process.
pub fn read_code_object(
    memory: &ProcessMemory,
    layout: &CodeLayout,
    address: u64,
) -> io::Result<CodeObject> {
    let field = |offset: u64| memory.u64_at(address + offset);
    let name_at = layout.qualname.unwrap_or(layout.name);
    let name = read_string(memory, layout, field(name_at)?)?;
    let file = read_string(memory, layout, field(layout.filename)?)?;
    let first_line = i64::from(memory.i32_at(address + layout.first_line)?);
    let line_table = read_bytes(memory, field(layout.line_table)?)?;
    Ok(CodeObject {
        name,
        file,
        first_line,
        line_table,
        format: layout.format,
    })
}

/// A `str` object: compact (every name a code object holds is), its
/// characters 1, 2 or 4 bytes each.
fn read_string(memory: &ProcessMemory, layout: &CodeLayout, object: u64) -> io::Result<String> {
    let length = memory.u64_at(object + 16)?;
    let state = memory.i32_at(object + 32)? as u32;
    let kind = (state >> 2) & 7;
    let compact = (state >> 5) & 1 == 1;
    let ascii = (state >> 6) & 1 == 1;
    if !compact || !matches!(kind, 1 | 2 | 4) || length > i64::MAX as u64 {
        return Err(invalid("not a compact str"));
    }
    let shown = length.min(MAX_STRING);
    let data = object
        + if ascii {
            layout.ascii_data
        } else {
            layout.compact_data
        };
    let bytes = memory.bytes_at(data, (shown * u64::from(kind)) as usize)?;
    let text: String = match kind {
        1 if ascii => String::from_utf8_lossy(&bytes).into_owned(),
        // Latin-1: each byte is its code point.
        1 => bytes.iter().map(|&b| char::from(b)).collect(),
        2 => char::decode_utf16(
            bytes
                .chunks_exact(2)
                .map(|c| u16::from_le_bytes([c[0], c[1]])),
        )
        .map(|c| c.unwrap_or(char::REPLACEMENT_CHARACTER))
        .collect(),
        _ => bytes
            .chunks_exact(4)
            .map(|c| {
                char::from_u32(u32::from_le_bytes([c[0], c[1], c[2], c[3]]))
                    .unwrap_or(char::REPLACEMENT_CHARACTER)
            })
            .collect(),
    };
    Ok(match shown < length {
        true => format!("{text}…"),
        false => text,
    })
}

/// A `bytes` object's contents: its size at 16, its bytes from 32.
fn read_bytes(memory: &ProcessMemory, object: u64) -> io::Result<Vec<u8>> {
    let size = memory.u64_at(object + 16)?;
    if size > MAX_LINE_TABLE {
        return Err(invalid("line table too long"));
    }
    memory.bytes_at(object + 32, size as usize)
}

fn invalid(what: &str) -> io::Error {
    io::Error::new(io::ErrorKind::InvalidData, what.to_string())
}

#[cfg(test)]
mod tests {
    use std::{
        io::{BufRead as _, BufReader},
        process::{Command, Stdio},
    };

    use super::*;

    /// Prints the address of a method's code object, its qualified name,
    /// first line and, for four offsets, the line CPython gives each; then
    /// waits for its stdin to close.
    const SCRIPT: &str = r#"
import sys
class Shelf:
    def fill(self, n):
        kept = []
        for i in range(n):
            kept.append("é" * i)
        return kept
code = Shelf.fill.__code__
name = getattr(code, "co_qualname", code.co_name)
if hasattr(code, "co_lines"):
    lines = {start: line for start, end, line in code.co_lines()}
else:
    import dis
    lines = dict(dis.findlinestarts(code))
print(id(code), name, code.co_firstlineno, " ".join(f"{o}:{l}" for o, l in sorted(lines.items())), flush=True)
sys.stdin.read()
"#;

    #[test]
    fn reads_a_live_method_in_every_version() {
        let pythons = super::super::interpreters_here();
        assert!(pythons.len() >= 2, "{pythons:?}");
        for (minor, python) in pythons {
            let mut child = Command::new(&python)
                .args(["-c", SCRIPT])
                .stdin(Stdio::piped())
                .stdout(Stdio::piped())
                .spawn()
                .unwrap();
            let mut line = String::new();
            BufReader::new(child.stdout.take().unwrap())
                .read_line(&mut line)
                .unwrap();
            let mut fields = line.split_whitespace();
            let address: u64 = fields.next().unwrap().parse().unwrap();
            let name = fields.next().unwrap();
            let first: i64 = fields.next().unwrap().parse().unwrap();
            let memory = ProcessMemory::open(child.id()).unwrap();
            let layout = CodeLayout::of(minor).unwrap();
            let code = read_code_object(&memory, &layout, address).unwrap();
            drop(child.stdin.take());
            child.wait().unwrap();
            assert_eq!(code.name, name, "{python}");
            if minor >= 11 {
                assert_eq!(code.name, "Shelf.fill", "{python}");
            }
            assert_eq!(code.file, "<string>", "{python}");
            assert_eq!(code.first_line, first, "{python}");
            let mut checked = 0;
            for pair in fields {
                let (offset, line) = pair.split_once(':').unwrap();
                let Ok(line) = line.parse::<i64>() else {
                    continue;
                };
                assert_eq!(
                    code.line_at(offset.parse().unwrap()),
                    Some(line),
                    "{python} at byte {offset}"
                );
                checked += 1;
            }
            assert!(checked >= 4, "{python}: {line}");
        }
    }
}
