//! Go's own table of its functions (`.gopclntab`, which stripping keeps):
//! each function's entry, name, and the tables that map its program
//! counters to file, line and inlined calls. Read as the runtime reads it
//! (runtime/symtab.go), for Go 1.16 and later on 64-bit little-endian.
//! The file is a profiled program's: every offset is checked.
use object::{Object as _, ObjectSection as _};

/// A parsed `.gopclntab`.
pub struct GoFunctions<'data> {
    data: &'data [u8],
    layout: Layout,
    /// Entries of 1.18 and later are offsets from it.
    text_start: u64,
    functions: usize,
    /// Offsets in `data` of the tables the header names.
    names: usize,
    compile_units: usize,
    files: usize,
    values: usize,
    table: usize,
    min_instruction: u64,
    /// Where the inline trees lie (Go 1.18 and later: `go:func.*`), as
    /// bytes of the file from that address on.
    inline_base: Option<&'data [u8]>,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Layout {
    /// Go 1.16 and 1.17: absolute entries, 8-byte function table words.
    Go116,
    /// Go 1.18 and 1.19: entries relative to the text, 4-byte words.
    Go118,
    /// Go 1.20 and later: as 1.18, with a start line in each function.
    Go120,
}

/// One function of the table.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct GoFunction<'data> {
    pub entry: u64,
    /// The next function's entry (or the end of the text).
    pub end: u64,
    pub name: &'data str,
}

/// One frame at a program counter: the function and, where known, its
/// file and line. Inlined calls come first, innermost first.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct GoFrame<'data> {
    pub function: &'data str,
    pub file: Option<&'data str>,
    pub line: Option<u32>,
    pub inlined: bool,
}

/// `_PCDATA_InlTreeIndex` and `_FUNCDATA_InlTree`.
const PCDATA_INLINE_INDEX: usize = 2;
const FUNCDATA_INLINE_TREE: usize = 3;
/// Inlined calls followed at one program counter, at most.
const MAX_INLINE_DEPTH: usize = 64;

impl<'data> GoFunctions<'data> {
    /// The table in `data` (a `.gopclntab` section); `inline_base` as
    /// [`GoFunctions::inline_base`] says.
    pub fn parse(data: &'data [u8], inline_base: Option<&'data [u8]>) -> Option<Self> {
        let magic = u32_at(data, 0)?;
        let layout = match magic {
            0xffff_fffa => Layout::Go116,
            0xffff_fff0 => Layout::Go118,
            0xffff_fff1 => Layout::Go120,
            _ => return None,
        };
        if *data.get(7)? != 8 {
            return None;
        }
        let min_instruction = u64::from(*data.get(6)?).max(1);
        let word = |index: usize| u64_at(data, 8 + 8 * index);
        let offset = |index: usize| usize::try_from(word(index)?).ok();
        let functions = usize::try_from(word(0)?).ok()?;
        let (text_start, first_offset) = match layout {
            Layout::Go116 => (0, 2),
            Layout::Go118 | Layout::Go120 => (word(2)?, 3),
        };
        let table = GoFunctions {
            data,
            layout,
            text_start,
            functions,
            names: offset(first_offset)?,
            compile_units: offset(first_offset + 1)?,
            files: offset(first_offset + 2)?,
            values: offset(first_offset + 3)?,
            table: offset(first_offset + 4)?,
            min_instruction,
            inline_base: match layout {
                Layout::Go116 => None,
                _ => inline_base,
            },
        };
        // The function table must be there, end entry included.
        table.table_entry(functions)?;
        Some(table)
    }

    /// Functions in the table.
    pub fn len(&self) -> usize {
        self.functions
    }

    pub fn is_empty(&self) -> bool {
        self.functions == 0
    }

    /// The `index`th function (by entry, as the table is sorted).
    pub fn function(&self, index: usize) -> Option<GoFunction<'data>> {
        let (entry, func) = self.table_entry(index)?;
        let (end, _) = self.table_entry(index + 1)?;
        Some(GoFunction {
            entry,
            end,
            name: self.name(self.i32_field(func, Field::Name)?)?,
        })
    }

    /// The functions, in the table's order.
    pub fn functions(&self) -> impl Iterator<Item = GoFunction<'data>> + '_ {
        (0..self.functions).filter_map(|index| self.function(index))
    }

    /// The index of the function holding `pc`.
    pub fn find(&self, pc: u64) -> Option<usize> {
        let (first, _) = self.table_entry(0)?;
        let (end, _) = self.table_entry(self.functions)?;
        if !(first..end).contains(&pc) {
            return None;
        }
        // The last function whose entry is at or below pc.
        let (mut low, mut high) = (0, self.functions);
        while high - low > 1 {
            let middle = low + (high - low) / 2;
            match self.table_entry(middle)?.0 <= pc {
                true => low = middle,
                false => high = middle,
            }
        }
        Some(low)
    }

    /// The frames at `pc` (a call instruction's address): the functions
    /// inlined there, innermost first, then the function itself.
    pub fn frames(&self, pc: u64) -> Option<Vec<GoFrame<'data>>> {
        let index = self.find(pc)?;
        let (entry, func) = self.table_entry(index)?;
        let outer = self.name(self.i32_field(func, Field::Name)?)?;
        let mut frames = Vec::new();
        let mut pc = pc;
        let tree = self.inline_tree(func);
        while let Some(tree) = tree {
            if frames.len() >= MAX_INLINE_DEPTH {
                break;
            }
            let index = match self.pcdata(func, entry, PCDATA_INLINE_INDEX, pc) {
                Some(index) if index >= 0 => index as usize,
                _ => break,
            };
            let (name, parent_pc) = self.inlined_call(tree, index)?;
            let (file, line) = self.position(func, entry, pc);
            frames.push(GoFrame {
                function: self.name(name)?,
                file,
                line,
                inlined: true,
            });
            pc = entry.checked_add(u64::try_from(parent_pc).ok()?)?;
        }
        // Without the tree, a program counter in inlined code has the
        // inlined function's position: not given to the outer one.
        let inlined_unread = tree.is_none()
            && self
                .pcdata(func, entry, PCDATA_INLINE_INDEX, pc)
                .is_some_and(|index| index >= 0);
        let (file, line) = match inlined_unread {
            true => (None, None),
            false => self.position(func, entry, pc),
        };
        frames.push(GoFrame {
            function: outer,
            file,
            line,
            inlined: false,
        });
        Some(frames)
    }

    /// The entry and `_func` offset (in `data`) of table entry `index`.
    fn table_entry(&self, index: usize) -> Option<(u64, usize)> {
        let (entry, func) = match self.layout {
            Layout::Go116 => {
                let at = self.table.checked_add(index.checked_mul(16)?)?;
                let entry = u64_at(self.data, at)?;
                // The end entry has no function offset after it.
                let func = u64_at(self.data, at + 8).unwrap_or(0);
                (entry, usize::try_from(func).ok()?)
            }
            Layout::Go118 | Layout::Go120 => {
                let at = self.table.checked_add(index.checked_mul(8)?)?;
                let entry = self
                    .text_start
                    .checked_add(u64::from(u32_at(self.data, at)?))?;
                let func = u32_at(self.data, at + 4).unwrap_or(0);
                (entry, func as usize)
            }
        };
        Some((entry, self.table.checked_add(func)?))
    }

    /// A function's name, at `offset` in the name table.
    fn name(&self, offset: i32) -> Option<&'data str> {
        let start = self.names.checked_add(usize::try_from(offset).ok()?)?;
        c_string(self.data, start)
    }

    /// The file and line at `pc` in the function at `func`.
    fn position(&self, func: usize, entry: u64, pc: u64) -> (Option<&'data str>, Option<u32>) {
        let file = self
            .u32_field(func, Field::PcFile)
            .and_then(|table| self.pc_value(table, entry, pc))
            .and_then(|number| self.file_name(func, number));
        let line = self
            .u32_field(func, Field::PcLine)
            .and_then(|table| self.pc_value(table, entry, pc))
            .and_then(|line| u32::try_from(line).ok());
        (file, line)
    }

    /// File `number` of the function's compile unit.
    fn file_name(&self, func: usize, number: i32) -> Option<&'data str> {
        let unit = self.u32_field(func, Field::CompileUnit)? as usize;
        let index = unit.checked_add(usize::try_from(number).ok()?)?;
        let at = self.compile_units.checked_add(index.checked_mul(4)?)?;
        let offset = u32_at(self.data, at)?;
        if offset == u32::MAX {
            return None;
        }
        c_string(self.data, self.files.checked_add(offset as usize)?)
    }

    /// The value of the function's `pcdata` table `which` at `pc`.
    fn pcdata(&self, func: usize, entry: u64, which: usize, pc: u64) -> Option<i32> {
        let count = self.u32_field(func, Field::PcDataCount)? as usize;
        if which >= count {
            return None;
        }
        let at = func
            .checked_add(self.layout.pcdata_start())?
            .checked_add(which * 4)?;
        let table = u32_at(self.data, at)?;
        (table != 0)
            .then(|| self.pc_value(table, entry, pc))
            .flatten()
    }

    /// The function's inline tree, as bytes from its start.
    fn inline_tree(&self, func: usize) -> Option<&'data [u8]> {
        let base = self.inline_base?;
        let funcdata = *self.data.get(func + self.layout.funcdata_count())? as usize;
        if FUNCDATA_INLINE_TREE >= funcdata {
            return None;
        }
        let pcdata = self.u32_field(func, Field::PcDataCount)? as usize;
        let at = func
            .checked_add(self.layout.pcdata_start())?
            .checked_add(pcdata.checked_mul(4)?)?
            .checked_add(FUNCDATA_INLINE_TREE * 4)?;
        let offset = u32_at(self.data, at)?;
        if offset == u32::MAX {
            return None;
        }
        base.get(offset as usize..)
    }

    /// Inlined call `index` of a tree: the callee's name offset and the
    /// offset from the entry of an instruction at its call site.
    fn inlined_call(&self, tree: &[u8], index: usize) -> Option<(i32, i32)> {
        match self.layout {
            // parent i16, funcID u8, _ u8, file i32, line i32, func i32,
            // parentPc i32.
            Layout::Go118 => {
                let at = index.checked_mul(20)?;
                Some((i32_at(tree, at + 12)?, i32_at(tree, at + 16)?))
            }
            // funcID u8, _ [3]u8, nameOff i32, parentPc i32, startLine i32.
            Layout::Go120 => {
                let at = index.checked_mul(16)?;
                Some((i32_at(tree, at + 4)?, i32_at(tree, at + 8)?))
            }
            Layout::Go116 => None,
        }
    }

    /// The value a pc-value table at `table` (in the values) gives `pc`,
    /// decoded as the runtime's `pcvalue` does: zigzag value deltas and
    /// pc deltas in units of the minimum instruction size.
    fn pc_value(&self, table: u32, entry: u64, target: u64) -> Option<i32> {
        let start = self.values.checked_add(table as usize)?;
        let mut bytes = self.data.get(start..)?;
        let (mut pc, mut value) = (entry, -1i32);
        let mut first = true;
        loop {
            let (delta, used) = uvarint(bytes)?;
            bytes = bytes.get(used..)?;
            if delta == 0 && !first {
                return None;
            }
            first = false;
            let delta = delta as u32;
            let delta = match delta & 1 {
                0 => delta >> 1,
                _ => !(delta >> 1),
            } as i32;
            value = value.wrapping_add(delta);
            let (step, used) = uvarint(bytes)?;
            bytes = bytes.get(used..)?;
            pc = pc.checked_add(step.checked_mul(self.min_instruction)?)?;
            if target < pc {
                return Some(value);
            }
        }
    }

    fn u32_field(&self, func: usize, field: Field) -> Option<u32> {
        u32_at(self.data, func.checked_add(self.layout.field(field))?)
    }

    fn i32_field(&self, func: usize, field: Field) -> Option<i32> {
        i32_at(self.data, func.checked_add(self.layout.field(field))?)
    }
}

/// The `_func` fields read.
#[derive(Clone, Copy)]
enum Field {
    Name,
    PcFile,
    PcLine,
    PcDataCount,
    CompileUnit,
}

impl Layout {
    /// A field's offset in `_func`: after a 4-byte entry offset (8-byte
    /// entry in 1.16), nameOff, args, deferreturn, pcsp, pcfile, pcln,
    /// npcdata, cuOffset.
    fn field(self, field: Field) -> usize {
        let base = match self {
            Layout::Go116 => 8,
            Layout::Go118 | Layout::Go120 => 4,
        };
        base + 4 * match field {
            Field::Name => 0,
            Field::PcFile => 4,
            Field::PcLine => 5,
            Field::PcDataCount => 6,
            Field::CompileUnit => 7,
        }
    }

    /// Offset of `nfuncdata` (after cuOffset: funcID, flag, a pad byte,
    /// and from 1.20 a start line before them).
    fn funcdata_count(self) -> usize {
        match self {
            Layout::Go116 | Layout::Go120 => 43,
            Layout::Go118 => 39,
        }
    }

    /// Where the pcdata offsets start.
    fn pcdata_start(self) -> usize {
        self.funcdata_count() + 1
    }
}

/// The table of an ELF file, without its inline trees (entries and names
/// need none, and finding them scans the module data).
pub fn go_functions_of<'data, R: object::ReadRef<'data>>(
    file: &object::File<'data, R>,
) -> Option<GoFunctions<'data>> {
    GoFunctions::parse(pclntab_section(file)?.data().ok()?, None)
}

/// The table of an ELF file, with its inline trees where the runtime's
/// module data says where they are: what naming frames needs.
pub fn go_functions_with_inlines_of<'data, R: object::ReadRef<'data>>(
    file: &object::File<'data, R>,
) -> Option<GoFunctions<'data>> {
    let section = pclntab_section(file)?;
    let data = section.data().ok()?;
    let inline_base = module_gofunc(file, section.address(), data).and_then(|address| {
        file.sections().find_map(|s| {
            let offset = address.checked_sub(s.address())?;
            (offset < s.size())
                .then(|| s.data().ok()?.get(offset as usize..))
                .flatten()
        })
    });
    GoFunctions::parse(data, inline_base)
}

fn pclntab_section<'data, 'file, R: object::ReadRef<'data>>(
    file: &'file object::File<'data, R>,
) -> Option<object::Section<'data, 'file, R>> {
    file.section_by_name(".gopclntab")
        .or_else(|| file.section_by_name(".data.rel.ro.gopclntab"))
}

/// `moduledata.gofunc` (Go 1.18 and later), where funcdata offsets count
/// from.
fn module_gofunc<'data, R: object::ReadRef<'data>>(
    file: &object::File<'data, R>,
    header: u64,
    data: &[u8],
) -> Option<u64> {
    let words = module_data(file, header, data)?;
    words.word(words.first_types_word + 3)
}

/// Where the module's type descriptors lie, `[types, etypes)` as virtual
/// addresses of the file: what a type's name offset counts from.
pub fn go_type_range<'data, R: object::ReadRef<'data>>(
    file: &object::File<'data, R>,
) -> Option<(u64, u64)> {
    let section = pclntab_section(file)?;
    let words = module_data(file, section.address(), section.data().ok()?)?;
    let types = words.word(words.first_types_word)?;
    let end = words.word(words.first_types_word + 1)?;
    (types != 0 && types < end).then_some((types, end))
}

/// The runtime's `moduledata` of the file, as it lies there.
struct ModuleData<'data> {
    bytes: &'data [u8],
    first_types_word: usize,
}

impl ModuleData<'_> {
    fn word(&self, index: usize) -> Option<u64> {
        u64_at(self.bytes, 8 * index)
    }
}

/// Finds `moduledata` (Go 1.18 and later): it starts with the table
/// header's address, then the name table as a slice whose pointer the
/// header gives. `types` is its 36th word (38th from Go 1.20, after the
/// coverage counters), then `etypes`, `rodata` and `gofunc`.
fn module_data<'data, R: object::ReadRef<'data>>(
    file: &object::File<'data, R>,
    header: u64,
    data: &[u8],
) -> Option<ModuleData<'data>> {
    let first_types_word = match u32_at(data, 0)? {
        0xffff_fff0 => 35,
        0xffff_fff1 => 37,
        _ => return None,
    };
    let names = header.checked_add(u64_at(data, 8 + 8 * 3)?)?;
    for section in file.sections() {
        if !matches!(
            section.name(),
            Ok(".noptrdata" | ".data" | ".data.rel.ro" | ".go.module")
        ) {
            continue;
        }
        let Ok(bytes) = section.data() else {
            continue;
        };
        for at in (0..bytes.len().saturating_sub(16)).step_by(8) {
            if u64_at(bytes, at) == Some(header) && u64_at(bytes, at + 8) == Some(names) {
                return Some(ModuleData {
                    bytes: &bytes[at..],
                    first_types_word,
                });
            }
        }
    }
    None
}

pub(crate) fn u32_at(data: &[u8], at: usize) -> Option<u32> {
    Some(u32::from_le_bytes(
        data.get(at..at.checked_add(4)?)?.try_into().ok()?,
    ))
}

fn i32_at(data: &[u8], at: usize) -> Option<i32> {
    u32_at(data, at).map(|value| value as i32)
}

pub(crate) fn u64_at(data: &[u8], at: usize) -> Option<u64> {
    Some(u64::from_le_bytes(
        data.get(at..at.checked_add(8)?)?.try_into().ok()?,
    ))
}

/// The NUL-terminated UTF-8 string at `start` (at most 4 KiB).
fn c_string(data: &[u8], start: usize) -> Option<&str> {
    let rest = data.get(start..)?;
    let rest = &rest[..rest.len().min(4096)];
    let end = rest.iter().position(|&b| b == 0)?;
    std::str::from_utf8(&rest[..end]).ok()
}

/// An unsigned LEB128 varint, and the bytes it took.
pub fn uvarint(data: &[u8]) -> Option<(u64, usize)> {
    let mut value = 0u64;
    for (index, &byte) in data.iter().enumerate().take(10) {
        value |= u64::from(byte & 0x7f) << (7 * index);
        if byte & 0x80 == 0 {
            return Some((value, index + 1));
        }
    }
    None
}
