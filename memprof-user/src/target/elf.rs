//! What memprof reads from ELF files: symbols, segments, the interpreter.
use std::{collections::BTreeMap, path::PathBuf};

use anyhow::Result;
use object::{
    read::elf::{ElfFile64, ProgramHeader as _},
    Endianness, Object as _, ObjectSection as _, ObjectSegment as _, ObjectSymbol as _, SymbolKind,
};

/// Addresses (virtual, as in the file) of the defined symbols of `kind`,
/// dynamic and static; the first definition of a name wins.
pub fn symbol_addresses(file: &object::File<'_>, kind: SymbolKind) -> BTreeMap<String, u64> {
    let mut by_name = BTreeMap::new();
    for symbol in file.dynamic_symbols().chain(file.symbols()) {
        if symbol.kind() != kind || symbol.address() == 0 {
            continue;
        }
        if let Ok(name) = symbol.name() {
            by_name.entry(name.to_string()).or_insert(symbol.address());
        }
    }
    by_name
}

/// The address and machine code of function `name` (by its symbol's
/// size), or None when the symbol or its size is unknown.
pub fn function_code<'data>(file: &object::File<'data>, name: &str) -> Option<(u64, &'data [u8])> {
    let symbol = file
        .dynamic_symbols()
        .chain(file.symbols())
        .find(|s| s.kind() == SymbolKind::Text && s.size() > 0 && s.name() == Ok(name))?;
    let (address, size) = (symbol.address(), symbol.size());
    let code = file
        .sections()
        .find_map(|section| section.data_range(address, size).ok().flatten())?;
    Some((address, code))
}

/// The file offset of a virtual address, through the segment holding it.
pub fn vaddr_to_file_offset(file: &object::File<'_>, vaddr: u64) -> Option<u64> {
    file.segments().find_map(|segment| {
        let (start, size) = (segment.address(), segment.size());
        let (file_start, _) = segment.file_range();
        (vaddr >= start && vaddr < start + size).then(|| vaddr - start + file_start)
    })
}

/// The program's dynamic loader (PT_INTERP), or None for a static program.
pub fn interpreter(data: &[u8]) -> Result<Option<PathBuf>> {
    let elf = ElfFile64::<Endianness>::parse(data)?;
    let endian = elf.endian();
    for header in elf.elf_program_headers() {
        if header.p_type(endian) == object::elf::PT_INTERP {
            let bytes = header.data(endian, data).unwrap_or_default();
            let path = bytes.split(|&b| b == 0).next().unwrap_or_default();
            return Ok(Some(PathBuf::from(
                String::from_utf8_lossy(path).into_owned(),
            )));
        }
    }
    Ok(None)
}

/// An executable PT_LOAD segment.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct CodeSegment {
    pub vaddr: u64,
    pub memsz: u64,
    pub offset: u64,
}

/// The executable segments of an ELF file: where its code lands once
/// loaded at some base address.
pub fn code_segments(data: &[u8]) -> Result<Vec<CodeSegment>> {
    let elf = ElfFile64::<Endianness>::parse(data)?;
    let endian = elf.endian();
    Ok(elf
        .elf_program_headers()
        .iter()
        .filter(|h| {
            h.p_type(endian) == object::elf::PT_LOAD && h.p_flags(endian) & object::elf::PF_X != 0
        })
        .map(|h| CodeSegment {
            vaddr: h.p_vaddr(endian),
            memsz: h.p_memsz(endian),
            offset: h.p_offset(endian),
        })
        .collect())
}
