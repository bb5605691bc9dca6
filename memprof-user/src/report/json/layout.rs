//! Version 2's text: indented as version 1, except that what people never
//! read item by item stays on one line: a stack's frame indices and a
//! timeline's samples (a stack of 40 frames takes one line, not 40), and
//! each entry of the shared tables (one line per module, file, function
//! or frame).
use std::io;

use serde_json::ser::{CompactFormatter, Formatter, PrettyFormatter};

/// The keys whose lists are written on one line.
const ONE_LINE: &[&[u8]] = &[b"frames", b"secs", b"total", b"values", b"windows"];
/// The keys whose lists have an entry per line.
const LINE_PER_ENTRY: &[&[u8]] = &[b"modules", b"functions", b"locations"];

pub struct OneLineLists<'a> {
    pretty: PrettyFormatter<'a>,
    /// The key being written, or the last one written.
    key: Vec<u8>,
    in_key: bool,
    /// Containers open inside something written on one line (0: none).
    one_line_depth: usize,
    /// The open containers: true for a list of an entry per line.
    entry_lists: Vec<bool>,
}

impl OneLineLists<'_> {
    pub fn new() -> Self {
        OneLineLists {
            pretty: PrettyFormatter::new(),
            key: Vec::new(),
            in_key: false,
            one_line_depth: 0,
            entry_lists: Vec::new(),
        }
    }

    fn inline(&self) -> bool {
        self.one_line_depth > 0
    }

    /// Opens a container: on one line when inside one already, or when
    /// `one_line` says so.
    fn open<W: ?Sized + io::Write>(
        &mut self,
        writer: &mut W,
        one_line: bool,
        bracket: &[u8],
        entry_list: bool,
    ) -> io::Result<bool> {
        self.entry_lists.push(entry_list);
        if self.inline() || one_line {
            self.one_line_depth += 1;
            writer.write_all(bracket)?;
            return Ok(true);
        }
        Ok(false)
    }

    /// Closes a container; true when it was written on one line.
    fn close<W: ?Sized + io::Write>(&mut self, writer: &mut W, bracket: &[u8]) -> io::Result<bool> {
        self.entry_lists.pop();
        if self.inline() {
            self.one_line_depth -= 1;
            writer.write_all(bracket)?;
            return Ok(true);
        }
        Ok(false)
    }
}

/// Forwards each call to the compact formatter inside a one-line
/// container, else to the pretty one.
macro_rules! forward {
    ($name:ident ( $($arg:ident : $ty:ty),* )) => {
        fn $name<W: ?Sized + io::Write>(&mut self, writer: &mut W, $($arg: $ty),*) -> io::Result<()> {
            match self.inline() {
                true => CompactFormatter.$name(writer, $($arg),*),
                false => self.pretty.$name(writer, $($arg),*),
            }
        }
    };
}

impl Formatter for OneLineLists<'_> {
    forward!(begin_array_value(first: bool));
    forward!(end_array_value());
    forward!(begin_object_value());
    forward!(end_object_value());

    fn begin_array<W: ?Sized + io::Write>(&mut self, writer: &mut W) -> io::Result<()> {
        let key = self.key.as_slice();
        let (one_line, entries) = (ONE_LINE.contains(&key), LINE_PER_ENTRY.contains(&key));
        if !self.open(writer, one_line, b"[", entries)? {
            self.pretty.begin_array(writer)?;
        }
        Ok(())
    }

    fn end_array<W: ?Sized + io::Write>(&mut self, writer: &mut W) -> io::Result<()> {
        if !self.close(writer, b"]")? {
            self.pretty.end_array(writer)?;
        }
        Ok(())
    }

    fn begin_object<W: ?Sized + io::Write>(&mut self, writer: &mut W) -> io::Result<()> {
        let entry = self.entry_lists.last() == Some(&true);
        if !self.open(writer, entry, b"{", false)? {
            self.pretty.begin_object(writer)?;
        }
        Ok(())
    }

    fn end_object<W: ?Sized + io::Write>(&mut self, writer: &mut W) -> io::Result<()> {
        if !self.close(writer, b"}")? {
            self.pretty.end_object(writer)?;
        }
        Ok(())
    }

    fn begin_object_key<W: ?Sized + io::Write>(
        &mut self,
        writer: &mut W,
        first: bool,
    ) -> io::Result<()> {
        self.in_key = true;
        self.key.clear();
        match self.inline() {
            true => CompactFormatter.begin_object_key(writer, first),
            false => self.pretty.begin_object_key(writer, first),
        }
    }

    fn write_string_fragment<W: ?Sized + io::Write>(
        &mut self,
        writer: &mut W,
        fragment: &str,
    ) -> io::Result<()> {
        if self.in_key {
            self.key.extend_from_slice(fragment.as_bytes());
        }
        writer.write_all(fragment.as_bytes())
    }

    fn end_object_key<W: ?Sized + io::Write>(&mut self, writer: &mut W) -> io::Result<()> {
        self.in_key = false;
        self.pretty.end_object_key(writer)
    }
}

#[cfg(test)]
mod tests {
    use serde::Serialize as _;

    #[test]
    fn frames_and_table_entries_take_a_line_each() {
        let value = serde_json::json!({
            "functions": [{"name": "main", "file": 0}, {"name": "f", "file": null}],
            "processes": [{"stacks": [{"frames": [0, 1, 2], "bytes": 4}]}],
        });
        let mut text = Vec::new();
        let mut serializer =
            serde_json::Serializer::with_formatter(&mut text, super::OneLineLists::new());
        value.serialize(&mut serializer).unwrap();
        let text = String::from_utf8(text).unwrap();
        let expected = r#"{
  "functions": [
    {"file":0,"name":"main"},
    {"file":null,"name":"f"}
  ],
  "processes": [
    {
      "stacks": [
        {
          "bytes": 4,
          "frames": [0,1,2]
        }
      ]
    }
  ]
}"#;
        assert_eq!(text, expected);
    }
}
