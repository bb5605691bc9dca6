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
        // An undefined symbol is no definition, even with an address: a
        // non-PIE program that takes an imported function's address (as
        // CPython does with malloc and free) gives it its PLT stub's, and
        // a probe there would see every call twice.
        if symbol.kind() != kind || symbol.address() == 0 || symbol.is_undefined() {
            continue;
        }
        if let Ok(name) = symbol.name() {
            by_name.entry(name.to_string()).or_insert(symbol.address());
        }
    }
    by_name
}

/// The size of the function at each address (the largest of its
/// symbols'), dynamic and static.
pub fn symbol_sizes(file: &object::File<'_>) -> std::collections::HashMap<u64, u64> {
    let mut sizes = std::collections::HashMap::new();
    for symbol in file.dynamic_symbols().chain(file.symbols()) {
        if symbol.kind() == SymbolKind::Text && symbol.size() > 0 {
            let size = sizes.entry(symbol.address()).or_insert(0);
            *size = symbol.size().max(*size);
        }
    }
    sizes
}

/// The address and machine code of function `name` (by its symbol's
/// size), or None when the symbol or its size is unknown.
pub fn function_code<'data>(file: &object::File<'data>, name: &str) -> Option<(u64, &'data [u8])> {
    let symbol = file
        .dynamic_symbols()
        .chain(file.symbols())
        .find(|s| s.kind() == SymbolKind::Text && s.size() > 0 && s.name() == Ok(name))?;
    let (address, size) = (symbol.address(), symbol.size());
    Some((address, code_at(file, address, size)?))
}

/// The `size` bytes of machine code at virtual address `address`.
pub fn code_at<'data>(file: &object::File<'data>, address: u64, size: u64) -> Option<&'data [u8]> {
    file.sections()
        .find_map(|section| section.data_range(address, size).ok().flatten())
}

/// The file offset of a virtual address, through the segment holding it.
pub fn vaddr_to_file_offset(file: &object::File<'_>, vaddr: u64) -> Option<u64> {
    file.segments().find_map(|segment| {
        let (start, size) = (segment.address(), segment.size());
        let (file_start, _) = segment.file_range();
        let into = vaddr.checked_sub(start).filter(|&into| into < size)?;
        file_start.checked_add(into)
    })
}

/// The virtual address of a file offset, through the loadable segment
/// holding it.
pub fn file_offset_to_vaddr<'data, R: object::ReadRef<'data>>(
    file: &object::File<'data, R>,
    offset: u64,
) -> Option<u64> {
    file.segments().find_map(|segment| {
        let (file_start, file_size) = segment.file_range();
        let into = offset
            .checked_sub(file_start)
            .filter(|&into| into < file_size)?;
        segment.address().checked_add(into)
    })
}

/// The GNU build id of an ELF file (its `.note.gnu.build-id`), if it has
/// one. Reads only the headers and the notes: `data` can be a
/// `ReadCache` over a file, read on demand.
pub fn build_id<'data, R: object::ReadRef<'data>>(data: R) -> Option<Vec<u8>> {
    match object::FileKind::parse(data).ok()? {
        object::FileKind::Elf32 => build_id_of::<object::elf::FileHeader32<Endianness>, R>(data),
        object::FileKind::Elf64 => build_id_of::<object::elf::FileHeader64<Endianness>, R>(data),
        _ => None,
    }
}

/// As `object`'s `build_id`, without parsing the symbol tables.
fn build_id_of<'data, Elf, R>(data: R) -> Option<Vec<u8>>
where
    Elf: object::read::elf::FileHeader<Endian = Endianness>,
    R: object::ReadRef<'data>,
{
    use object::read::elf::SectionHeader as _;
    // A build id note is 36 bytes; larger note areas are not read.
    const MAX_NOTES: u64 = 64 * 1024;
    let header = Elf::parse(data).ok()?;
    let endian = header.endian().ok()?;
    let find = |mut notes: object::read::elf::NoteIterator<'data, Elf>| {
        while let Ok(Some(note)) = notes.next() {
            if note.name() == object::elf::ELF_NOTE_GNU
                && note.n_type(endian) == object::elf::NT_GNU_BUILD_ID
            {
                return Some(note.desc().to_vec());
            }
        }
        None
    };
    // Section headers if present, else program headers.
    let sections = header.sections(endian, data).ok()?;
    if !sections.is_empty() {
        return sections.iter().find_map(|section| {
            if section.sh_type(endian) != object::elf::SHT_NOTE
                || Into::<u64>::into(section.sh_size(endian)) > MAX_NOTES
            {
                return None;
            }
            find(section.notes(endian, data).ok()??)
        });
    }
    header
        .program_headers(endian, data)
        .ok()?
        .iter()
        .find_map(|segment| {
            if segment.p_type(endian) != object::elf::PT_NOTE
                || Into::<u64>::into(segment.p_filesz(endian)) > MAX_NOTES
            {
                return None;
            }
            find(segment.notes(endian, data).ok()??)
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

/// The GNU build id of an ELF file, in hex (as pprof and debuginfod name
/// it). Any path may come from a process or a saved report: only a
/// regular file is opened ([`crate::host::untrusted::open`]), and only
/// its headers and notes are read.
pub fn build_id_hex(path: &std::path::Path) -> Option<String> {
    let cache = object::read::ReadCache::new(crate::host::untrusted::open(path).ok()?);
    let id = build_id(&cache)?;
    Some(id.iter().map(|b| format!("{b:02x}")).collect())
}
