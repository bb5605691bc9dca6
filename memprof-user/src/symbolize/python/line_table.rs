//! A Python code object's line table: which source line the instruction
//! at a byte offset of its bytecode belongs to, in each of CPython's three
//! encodings (`Objects/lnotab_notes.txt` of each version). The tables are
//! read from a profiled process: any byte string decodes to some answer
//! or to none, never a panic.

/// How a CPython version encodes its line table.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum LineTableFormat {
    /// 3.8, 3.9 `co_lnotab`: (bytecode delta u8, line delta i8) pairs.
    Lnotab,
    /// 3.10 `co_linetable`: (bytecode delta u8, line delta i8) pairs that
    /// end ranges; a line delta of -128 marks a range without a line.
    Linetable,
    /// 3.11 and later: the location table, one entry per run of code
    /// units, with line (and column) deltas in varints.
    Locations,
}

/// The line of the instruction at byte `offset` of the bytecode, from
/// `table` in `format`, the code object's first line `first_line`; None
/// where the table gives none (code with no line, or past its end).
pub fn line_at(format: LineTableFormat, table: &[u8], first_line: i64, offset: u64) -> Option<i64> {
    match format {
        LineTableFormat::Lnotab => Some(lnotab_line(table, first_line, offset)),
        LineTableFormat::Linetable => linetable_line(table, first_line, offset),
        LineTableFormat::Locations => locations_line(table, first_line, offset),
    }
}

/// 3.8 and 3.9: the line grows by each pair's delta up to the last pair
/// that starts at or before `offset`.
fn lnotab_line(table: &[u8], first_line: i64, offset: u64) -> i64 {
    let mut line = first_line;
    let mut address = 0u64;
    for pair in table.chunks_exact(2) {
        address += u64::from(pair[0]);
        if address > offset {
            break;
        }
        line += i64::from(pair[1] as i8);
    }
    line
}

/// 3.10: each pair ends a range of bytecode at a line (or at none).
fn linetable_line(table: &[u8], first_line: i64, offset: u64) -> Option<i64> {
    let mut line = first_line;
    let mut end = 0u64;
    for pair in table.chunks_exact(2) {
        let start = end;
        end += u64::from(pair[0]);
        let delta = pair[1] as i8;
        let range_line = match delta {
            -128 => None,
            _ => {
                line += i64::from(delta);
                Some(line)
            }
        };
        if (start..end).contains(&offset) {
            return range_line;
        }
    }
    None
}

/// 3.11 and later: entries start with a byte whose top bit is set; its
/// bits 3-6 say how the line moves, its bits 0-2 how many code units (of
/// 2 bytes) the entry covers, less one.
fn locations_line(table: &[u8], first_line: i64, offset: u64) -> Option<i64> {
    let mut line = first_line;
    let mut end = 0u64;
    let mut at = 0;
    while at < table.len() {
        let head = table[at];
        let code = (head >> 3) & 15;
        let start = end;
        end += (u64::from(head & 7) + 1) * 2;
        let mut varints = Varints { table, at: at + 1 };
        line += match code {
            // Short forms (columns only), and one-line forms.
            0..=9 => 0,
            10..=12 => i64::from(code - 10),
            // No columns, and the long form: a signed line delta first.
            13 | 14 => varints.signed()?,
            // No location: the line stays as it was for what follows.
            _ => 0,
        };
        if (start..end).contains(&offset) {
            return (code != 15).then_some(line);
        }
        // The next entry starts at the next byte with the top bit set.
        at += 1;
        while at < table.len() && table[at] & 0x80 == 0 {
            at += 1;
        }
    }
    None
}

/// The varints after an entry's first byte: 6 bits a byte, bit 6 set
/// while more follow.
struct Varints<'a> {
    table: &'a [u8],
    at: usize,
}

impl Varints<'_> {
    fn unsigned(&mut self) -> Option<u64> {
        let mut value = 0u64;
        let mut shift = 0;
        loop {
            let byte = *self.table.get(self.at)?;
            self.at += 1;
            if shift >= 64 {
                return None;
            }
            value |= u64::from(byte & 63) << shift;
            shift += 6;
            if byte & 64 == 0 {
                return Some(value);
            }
        }
    }

    /// Its low bit is the sign.
    fn signed(&mut self) -> Option<i64> {
        let value = self.unsigned()?;
        let magnitude = (value >> 1) as i64;
        Some(if value & 1 == 1 {
            -magnitude
        } else {
            magnitude
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Tables dumped from pyenv's CPython 3.8 to 3.13, each with the line
    /// `co_lines()` (3.10+) or `dis.findlinestarts` (before) gives every
    /// instruction of one function (-1: none): a loop, a line spread over
    /// two, a 300-line gap and a dict over four lines.
    const VECTORS: &str = include_str!("line_tables.json");

    fn format_of(version: &str) -> LineTableFormat {
        match version {
            "3.8" | "3.9" => LineTableFormat::Lnotab,
            "3.10" => LineTableFormat::Linetable,
            _ => LineTableFormat::Locations,
        }
    }

    fn hex(text: &str) -> Vec<u8> {
        (0..text.len())
            .step_by(2)
            .map(|i| u8::from_str_radix(&text[i..i + 2], 16).unwrap())
            .collect()
    }

    #[test]
    fn lines_match_cpythons_own() {
        let vectors: serde_json::Value = serde_json::from_str(VECTORS).unwrap();
        let vectors = vectors.as_array().unwrap();
        assert_eq!(vectors.len(), 6);
        for vector in vectors {
            let version = vector["version"].as_str().unwrap();
            let format = format_of(version);
            let table = hex(vector["table"].as_str().unwrap());
            let first = vector["first_line"].as_i64().unwrap();
            let lines = vector["lines"].as_array().unwrap();
            assert!(lines.len() > 40, "{version}");
            for pair in lines {
                let offset = pair[0].as_u64().unwrap();
                let expected = pair[1].as_i64().unwrap();
                let expected = (expected >= 0).then_some(expected);
                assert_eq!(
                    line_at(format, &table, first, offset),
                    expected,
                    "{version} at byte {offset}"
                );
            }
            // The 300-line gap is crossed.
            assert!(
                lines.iter().any(|p| p[1].as_i64().unwrap() > 300),
                "{version}"
            );
        }
    }

    #[test]
    fn any_bytes_decode_without_panicking() {
        let mut state = 0x2545_f491_4f6c_dd1du64;
        for _ in 0..2000 {
            state ^= state << 13;
            state ^= state >> 7;
            state ^= state << 17;
            let table: Vec<u8> = state.to_le_bytes().repeat((state % 5) as usize);
            for format in [
                LineTableFormat::Lnotab,
                LineTableFormat::Linetable,
                LineTableFormat::Locations,
            ] {
                let _ = line_at(format, &table, (state % 1000) as i64, state % 300);
            }
        }
    }
}
