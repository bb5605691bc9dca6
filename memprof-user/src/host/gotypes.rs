//! Go's type descriptors (`runtime._type`, `internal/abi.Type`): the name
//! of the type `runtime.mallocgc` was asked for, read from the binary as
//! the runtime reads it (runtime/type.go, Go 1.17 and later: the register
//! ABI the type argument is read in). The file is a profiled program's:
//! every offset is checked, and a name must lie among the type data.
use object::{Object as _, ObjectSection as _};

use super::{
    elf::file_offset_to_vaddr,
    gopclntab::{go_type_range, u32_at, uvarint},
};

/// Offsets in a type descriptor (the same from Go 1.14 on): its flags
/// byte and its name, a 32-bit offset from the module's type data.
const TFLAG: usize = 20;
const NAME_OFFSET: usize = 40;
/// `tflagExtraStar`: the name is stored with a `*` to drop.
const EXTRA_STAR: u8 = 1 << 1;
/// Longer names are not read (Go's own are far shorter).
const MAX_NAME: usize = 1024;

/// The types of one Go binary.
pub struct GoTypes<'data, 'file, R: object::ReadRef<'data>> {
    file: &'file object::File<'data, R>,
    types: u64,
    end: u64,
}

impl<'data, 'file, R: object::ReadRef<'data>> GoTypes<'data, 'file, R> {
    /// The binary's type data, if it is a Go program memprof can read.
    pub fn of(file: &'file object::File<'data, R>) -> Option<Self> {
        let (types, end) = go_type_range(file)?;
        Some(GoTypes { file, types, end })
    }

    /// The name of the type whose descriptor lies at `offset` from file
    /// offset `code` as the file is mapped (`main.record`, `[]int`,
    /// `map.bucket[string]int`): `code` is the file offset of an address
    /// in the program's code, where the binary is known to be mapped.
    pub fn name_at(&self, code: u64, offset: i64) -> Option<String> {
        let code_address = file_offset_to_vaddr(self.file, code)?;
        let address = code_address.checked_add_signed(offset)?;
        if address < self.types || address >= self.end {
            return None;
        }
        let descriptor = self.bytes_at(address, NAME_OFFSET as u64 + 4)?;
        let tflag = *descriptor.get(TFLAG)?;
        let name_offset = u32_at(descriptor, NAME_OFFSET)? as i32;
        let name_at = self.types.checked_add_signed(i64::from(name_offset))?;
        if name_at >= self.end {
            return None;
        }
        let name = self.name(name_at)?;
        let name = if tflag & EXTRA_STAR != 0 {
            name.strip_prefix('*')?
        } else {
            name
        };
        Some(name.to_string())
    }

    /// A name as `runtime.name` encodes it: a flags byte, a varint
    /// length, the bytes.
    fn name(&self, address: u64) -> Option<&'data str> {
        let head = self.bytes_at(address, 11)?;
        let (length, taken) = uvarint(head.get(1..)?)?;
        let length = usize::try_from(length).ok().filter(|&l| l <= MAX_NAME)?;
        let bytes = self.bytes_at(address.checked_add(1 + taken as u64)?, length as u64)?;
        std::str::from_utf8(bytes.get(..length)?).ok()
    }

    /// `length` bytes of the file at a virtual address, or to the end of
    /// the section holding it when fewer.
    fn bytes_at(&self, address: u64, length: u64) -> Option<&'data [u8]> {
        self.file.sections().find_map(|section| {
            let into = address.checked_sub(section.address())?;
            if into >= section.size() {
                return None;
            }
            let data = section.data().ok()?;
            let start = usize::try_from(into).ok()?;
            let end = start.saturating_add(length as usize).min(data.len());
            data.get(start..end)
        })
    }
}
