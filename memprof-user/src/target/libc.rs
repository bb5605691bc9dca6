//! Finding the libraries memprof probes in a target — its C library and
//! its dynamic loader — and the functions in them.
use std::{
    collections::{BTreeMap, HashSet},
    fs,
    path::{Path, PathBuf},
};

use anyhow::{bail, Context as _, Result};
use memprof_common::allocators::{ALLOCATORS, FREE};
use object::SymbolKind;

use super::{
    elf::{code_segments, function_code, interpreter, symbol_addresses, vaddr_to_file_offset},
    probe_offset::{branch_targets, probe_offset, ProbeReads, ALLOCATOR_READS, FREE_READS},
};
use crate::error::UserError;

/// The shared objects memprof probes in a target.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Runtime {
    /// The C library, whose allocator functions get the probes.
    pub libc: PathBuf,
    /// The dynamic loader, which tells (through `_dl_debug_state`) where
    /// it loaded each library; None when memprof could not find it.
    pub loader: Option<PathBuf>,
}

fn is_loader_name(file_name: &str) -> bool {
    file_name.starts_with("ld-linux")
}

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

/// The libc and loader mapped by a running process, as paths memprof can open.
pub fn runtime_of_pid(pid: i32) -> Result<Runtime> {
    let maps = fs::read_to_string(format!("/proc/{pid}/maps"))
        .map_err(|_| UserError::new(format!("no process with pid {pid}")))?;
    if maps.trim().is_empty() {
        // A zombie, or a process that exited since it was checked.
        return Err(
            UserError::new(format!("pid {pid} has exited: nothing left to profile")).into(),
        );
    }
    let mut libc = None;
    let mut loader = None;
    for line in maps.lines() {
        let Some(path) = line.split_whitespace().nth(5) else {
            continue;
        };
        let name = Path::new(path)
            .file_name()
            .and_then(|n| n.to_str())
            .unwrap_or("");
        if !path.starts_with('/') {
            continue;
        }
        // The process may live in another mount namespace (a container).
        let in_root = PathBuf::from(format!("/proc/{pid}/root{path}"));
        let openable = if in_root.exists() {
            in_root
        } else {
            PathBuf::from(path)
        };
        if libc.is_none() && is_libc_name(name) {
            libc = Some(openable);
        } else if loader.is_none() && is_loader_name(name) {
            loader = Some(openable);
        }
    }
    match libc {
        Some(libc) => Ok(Runtime { libc, loader }),
        None => Err(UserError::new(format!(
            "process {pid} has no dynamic C library mapped (looked for libc.so.6 or ld-musl in \
             /proc/{pid}/maps); statically linked programs are not supported"
        ))
        .into()),
    }
}

/// The libc and loader a program will load: follows `#!` scripts to
/// their interpreter, and refuses statically linked programs.
pub fn runtime_of_program(program: &Path) -> Result<Runtime> {
    let mut program = program.to_path_buf();
    for _ in 0..4 {
        let data = fs::read(&program).with_context(|| format!("reading {}", program.display()))?;
        if let Some(interpreter) = shebang_interpreter(&data) {
            program = which::which(&interpreter).unwrap_or(interpreter);
            continue;
        }
        let loader = interpreter(&data).map_err(|_| {
            UserError::new(format!(
                "{} is neither a 64-bit ELF program nor a #! script",
                program.display()
            ))
        })?;
        let Some(loader) = loader else {
            bail!(UserError::new(format!(
                "{} is statically linked: it has no dynamic C library (libc.so.6) whose \
                 malloc memprof could probe",
                program.display()
            )));
        };
        return Ok(Runtime {
            libc: find_system_libc()?,
            loader: fs::canonicalize(&loader).ok(),
        });
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
    /// Where in the file the probe goes: the function's first instruction,
    /// or the first one the kernel emulates (see `probe_offset`).
    pub file_offset: u64,
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

/// Where memprof probes one C library: each allocator function and free.
#[derive(Clone, Debug)]
pub struct LibrarySites {
    pub allocators: Vec<AllocatorSite>,
    /// File offset of free's probe, when the library has a free.
    free: Option<u64>,
    /// The library's code around free's probe, as distances from it:
    /// a return address that far from the probe is inside the library.
    pub free_caller_range: Option<(i32, i32)>,
}

impl LibrarySites {
    /// free's probe, or why there is none (`--live` needs it).
    pub fn free(&self, library: &Path) -> Result<u64> {
        self.free.ok_or_else(|| {
            UserError::new(format!(
                "{} has no free symbol: --live cannot pair frees with allocations",
                library.display()
            ))
            .into()
        })
    }
}

/// Finds each row of [`ALLOCATORS`] and free in `library`, reading and
/// decoding it once. Rows whose functions share an address (aliases)
/// become one site, named after the first row: two probes there would
/// count each call twice. With `offsets`, each probe sits at the cheapest
/// safe instruction.
pub fn library_sites(library: &Path, offsets: bool) -> Result<LibrarySites> {
    let data = fs::read(library).with_context(|| format!("reading {}", library.display()))?;
    library_sites_in(&data, &library.display().to_string(), offsets)
}

/// [`library_sites`] of a library's bytes; `shown` names it in errors.
pub fn library_sites_in(data: &[u8], shown: &str, offsets: bool) -> Result<LibrarySites> {
    let file = object::File::parse(data).with_context(|| format!("{shown} is not an ELF file"))?;
    let by_name = symbol_addresses(&file, SymbolKind::Text);
    let targets = library_branch_targets(&file, offsets);
    // Where function `name` at `address` is probed in the file.
    let probe_at = |name: &str, address: u64, reads: ProbeReads| -> Result<u64> {
        let start = vaddr_to_file_offset(&file, address).with_context(|| {
            format!("{name} at {address:#x} is in no loadable segment of {shown}")
        })?;
        Ok(start.saturating_add(skip(&file, name, reads, targets.as_ref())))
    };
    let mut allocators: Vec<AllocatorSite> = Vec::new();
    let mut seen_addresses = BTreeMap::new();
    for (index, spec) in ALLOCATORS.iter().enumerate() {
        let Some(&address) = by_name.get(spec.name) else {
            continue;
        };
        if seen_addresses.insert(address, index).is_some() {
            continue;
        }
        allocators.push(AllocatorSite {
            allocator: index,
            file_offset: probe_at(spec.name, address, ALLOCATOR_READS)?,
        });
    }
    if !allocators
        .iter()
        .any(|s| ALLOCATORS[s.allocator].name == "malloc")
    {
        bail!(UserError::new(format!(
            "{shown} has no malloc symbol: not a C library memprof can probe"
        )));
    }
    let free = match by_name.get(FREE) {
        Some(&address) => Some(probe_at(FREE, address, FREE_READS)?),
        None => None,
    };
    let free_caller_range = free.and_then(|free| {
        let segment = code_segments(data)
            .ok()?
            .into_iter()
            .find(|s| (s.offset..s.offset.saturating_add(s.memsz)).contains(&free))?;
        let end = segment.offset.checked_add(segment.memsz)?;
        let from = i32::try_from(i128::from(segment.offset) - i128::from(free)).ok()?;
        let to = i32::try_from(i128::from(end) - i128::from(free)).ok()?;
        Some((from, to))
    });
    Ok(LibrarySites {
        allocators,
        free,
        free_caller_range,
    })
}

/// Where the loader announces loaded libraries: `_dl_debug_state`, which
/// glibc's ld.so calls after each change to its list of loaded objects
/// (the debugger interface), and how far `_r_debug`, the head of that
/// list, lies from it.
#[derive(Clone, Copy, Debug)]
pub struct LoaderSite {
    pub file_offset: u64,
    /// `_r_debug` minus `_dl_debug_state`, in virtual addresses.
    pub r_debug_delta: i64,
}

pub fn loader_site(loader: &Path) -> Result<Option<LoaderSite>> {
    let data = fs::read(loader).with_context(|| format!("reading {}", loader.display()))?;
    loader_site_in(&data, &loader.display().to_string())
}

/// [`loader_site`] of a loader's bytes; `shown` names it in errors.
pub fn loader_site_in(data: &[u8], shown: &str) -> Result<Option<LoaderSite>> {
    let file = object::File::parse(data).with_context(|| format!("{shown} is not an ELF file"))?;
    let functions = symbol_addresses(&file, SymbolKind::Text);
    let data_symbols = symbol_addresses(&file, SymbolKind::Data);
    let (Some(&state), Some(&r_debug)) = (
        functions.get("_dl_debug_state"),
        data_symbols.get("_r_debug"),
    ) else {
        return Ok(None);
    };
    Ok(
        vaddr_to_file_offset(&file, state).map(|file_offset| LoaderSite {
            file_offset,
            r_debug_delta: (r_debug as i64).wrapping_sub(state as i64),
        }),
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn finds_the_loaders_debugger_interface() {
        let loader = fs::canonicalize("/lib64/ld-linux-x86-64.so.2").unwrap();
        let site = loader_site(&loader)
            .unwrap()
            .expect("glibc's ld.so has _dl_debug_state");
        assert!(site.r_debug_delta > 0, "_r_debug is data, after the code");
    }

    #[test]
    fn finds_glibc_allocators_and_merges_aliases() {
        let libc = find_system_libc().unwrap();
        let sites = library_sites(&libc, false).unwrap().allocators;
        let names: Vec<_> = sites.iter().map(|s| ALLOCATORS[s.allocator].name).collect();
        assert!(names.contains(&"malloc"));
        assert!(names.contains(&"calloc"));
        // glibc's aligned_alloc is memalign under another name: one probe.
        assert!(names.contains(&"memalign"));
        assert!(!names.contains(&"aligned_alloc"));
    }

    #[test]
    fn glibc_free_keeps_its_offset_after_the_whole_library_is_checked() {
        let libc = find_system_libc().unwrap();
        let data = fs::read(&libc).unwrap();
        let file = object::File::parse(&*data).unwrap();
        let (address, _) = function_code(&file, FREE).unwrap();
        let free = |offsets| library_sites(&libc, offsets).unwrap().free(&libc).unwrap();
        let offset = free(true) - free(false);
        // Nothing in glibc jumps into free's first instruction.
        assert_eq!(offset, 3, "free at {address:#x}");
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
