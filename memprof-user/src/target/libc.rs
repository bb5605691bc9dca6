//! Finding the C library a target uses, and the allocator functions in it.
use std::{
    collections::BTreeMap,
    fs,
    path::{Path, PathBuf},
};

use anyhow::{bail, Context as _, Result};
use memprof_common::allocators::ALLOCATORS;
use object::{Object as _, ObjectSegment as _, ObjectSymbol as _};

use crate::error::UserError;

/// Names of the C library as it appears in memory maps and DT_NEEDED.
fn is_libc_name(file_name: &str) -> bool {
    file_name == "libc.so.6"
        || (file_name.starts_with("libc-") && file_name.ends_with(".so"))
        || (file_name.starts_with("ld-musl-") && file_name.ends_with(".so.1"))
}

/// Directories the dynamic loader searches by default on Debian/x86_64.
const SYSTEM_LIB_DIRS: [&str; 6] = [
    "/lib/x86_64-linux-gnu",
    "/usr/lib/x86_64-linux-gnu",
    "/lib64",
    "/usr/lib64",
    "/lib",
    "/usr/lib",
];

/// The libc mapped by a running process, as a path memprof can open.
pub fn libc_of_pid(pid: i32) -> Result<PathBuf> {
    let maps = fs::read_to_string(format!("/proc/{pid}/maps"))
        .with_context(|| format!("reading /proc/{pid}/maps"))?;
    for line in maps.lines() {
        let Some(path) = line.split_whitespace().nth(5) else {
            continue;
        };
        let name = Path::new(path)
            .file_name()
            .and_then(|n| n.to_str())
            .unwrap_or("");
        if path.starts_with('/') && is_libc_name(name) {
            // The process may live in another mount namespace (a container).
            let in_root = PathBuf::from(format!("/proc/{pid}/root{path}"));
            return Ok(if in_root.exists() {
                in_root
            } else {
                PathBuf::from(path)
            });
        }
    }
    Err(UserError::new(format!(
        "process {pid} has no dynamic C library mapped (looked for libc.so.6 or ld-musl in \
         /proc/{pid}/maps); statically linked programs are not supported"
    ))
    .into())
}

/// The libc a program will load: follows `#!` scripts to their
/// interpreter, and refuses statically linked programs.
pub fn libc_of_program(program: &Path) -> Result<PathBuf> {
    let mut program = program.to_path_buf();
    for _ in 0..4 {
        let data = fs::read(&program).with_context(|| format!("reading {}", program.display()))?;
        if let Some(interpreter) = shebang_interpreter(&data) {
            program = which::which(&interpreter).unwrap_or(interpreter);
            continue;
        }
        let dynamic = has_interpreter(&data).map_err(|_| {
            UserError::new(format!(
                "{} is neither a 64-bit ELF program nor a #! script",
                program.display()
            ))
        })?;
        if !dynamic {
            bail!(UserError::new(format!(
                "{} is statically linked: it has no dynamic C library (libc.so.6) whose \
                 malloc memprof could probe",
                program.display()
            )));
        }
        return find_system_libc();
    }
    bail!(
        "too many nested #! interpreters starting at {}",
        program.display()
    )
}

fn shebang_interpreter(data: &[u8]) -> Option<PathBuf> {
    let rest = data.strip_prefix(b"#!")?;
    let line = rest.split(|&b| b == b'\n').next()?;
    let line = std::str::from_utf8(line).ok()?;
    let interpreter = line.split_whitespace().next()?;
    Some(PathBuf::from(interpreter))
}

/// True when the program names a dynamic loader (PT_INTERP), i.e. it is
/// dynamically linked and will map a shared libc.
fn has_interpreter(data: &[u8]) -> Result<bool> {
    use object::read::elf::ProgramHeader as _;
    let elf = object::read::elf::ElfFile64::<object::Endianness>::parse(data)?;
    let endian = elf.endian();
    Ok(elf
        .elf_program_headers()
        .iter()
        .any(|header| header.p_type(endian) == object::elf::PT_INTERP))
}

fn find_system_libc() -> Result<PathBuf> {
    for dir in SYSTEM_LIB_DIRS {
        let candidate = Path::new(dir).join("libc.so.6");
        if candidate.exists() {
            return Ok(fs::canonicalize(&candidate).unwrap_or(candidate));
        }
    }
    Err(UserError::new(format!(
        "no libc.so.6 found in {}; pass --libc PATH",
        SYSTEM_LIB_DIRS.join(", ")
    ))
    .into())
}

/// One probe site: a function (or several aliases) at one file offset.
#[derive(Clone, Debug)]
pub struct AllocatorSite {
    /// Row in [`ALLOCATORS`] whose name the reports use.
    pub allocator: usize,
    /// Offset of the function's first instruction in the file.
    pub file_offset: u64,
}

/// Finds each row of [`ALLOCATORS`] in `library`. Rows whose functions
/// share an address (aliases) become one site, named after the first row:
/// two probes there would count each call twice.
pub fn allocator_sites(library: &Path) -> Result<Vec<AllocatorSite>> {
    let data = fs::read(library).with_context(|| format!("reading {}", library.display()))?;
    let file = object::File::parse(&*data)
        .with_context(|| format!("{} is not an ELF file", library.display()))?;
    let mut by_name = BTreeMap::new();
    for symbol in file.dynamic_symbols().chain(file.symbols()) {
        if symbol.kind() != object::SymbolKind::Text || symbol.address() == 0 {
            continue;
        }
        if let Ok(name) = symbol.name() {
            // Versioned dynamic names may carry "@GLIBC_..."; the default version wins.
            by_name.entry(name.to_string()).or_insert(symbol.address());
        }
    }
    let mut sites: Vec<AllocatorSite> = Vec::new();
    let mut seen_addresses = BTreeMap::new();
    for (index, spec) in ALLOCATORS.iter().enumerate() {
        let Some(&address) = by_name.get(spec.name) else {
            continue;
        };
        if seen_addresses.insert(address, index).is_some() {
            continue;
        }
        let file_offset = vaddr_to_file_offset(&file, address).with_context(|| {
            format!(
                "{} at {address:#x} is in no loadable segment of {}",
                spec.name,
                library.display()
            )
        })?;
        sites.push(AllocatorSite {
            allocator: index,
            file_offset,
        });
    }
    if !sites
        .iter()
        .any(|s| ALLOCATORS[s.allocator].name == "malloc")
    {
        bail!(UserError::new(format!(
            "{} has no malloc symbol: not a C library memprof can probe",
            library.display()
        )));
    }
    Ok(sites)
}

fn vaddr_to_file_offset(file: &object::File<'_>, vaddr: u64) -> Option<u64> {
    file.segments().find_map(|segment| {
        let (start, size) = (segment.address(), segment.size());
        let (file_start, _) = segment.file_range();
        (vaddr >= start && vaddr < start + size).then(|| vaddr - start + file_start)
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn finds_glibc_allocators_and_merges_aliases() {
        let libc = find_system_libc().unwrap();
        let sites = allocator_sites(&libc).unwrap();
        let names: Vec<_> = sites.iter().map(|s| ALLOCATORS[s.allocator].name).collect();
        assert!(names.contains(&"malloc"));
        assert!(names.contains(&"calloc"));
        // glibc's aligned_alloc is memalign under another name: one probe.
        assert!(names.contains(&"memalign"));
        assert!(!names.contains(&"aligned_alloc"));
    }

    #[test]
    fn reads_shebang() {
        assert_eq!(
            shebang_interpreter(b"#!/bin/sh -e\necho"),
            Some(PathBuf::from("/bin/sh"))
        );
        assert_eq!(shebang_interpreter(b"\x7fELF"), None);
    }
}
