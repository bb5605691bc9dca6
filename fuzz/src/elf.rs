//! ELF and DWARF files of profiled processes, as memprof's own readers
//! take them (loader, allocator sites, probe offsets, `r_debug`, code
//! segments, build ids) and as the symbolizer does.
use std::{
    cell::{Cell, RefCell},
    fs,
    ops::Range,
    path::{Path, PathBuf},
    process::Command,
    sync::atomic::{AtomicU64, Ordering},
};

use memprof::{
    collect::catalog::{Catalog, ProcessInfo},
    discover::allocators,
    host::{elf, guard, procfs::maps::Mapping},
    symbolize::{elf_check, Symbolizer},
};
use memprof_common::notices::{LibraryNotice, NoticeKind, PATH_MAX};
use object::{
    read::elf::{ElfFile64, FileHeader as _},
    Endianness, Object as _, ObjectSection as _, ObjectSymbol as _, SymbolKind,
};
use proptest::{collection::vec, prelude::*, test_runner::TestCaseResult};

use crate::{harness::*, mutate::*};

/// The ranges of an ELF file that its readers interpret: the file header,
/// program and section headers, symbol and string tables, dynamic
/// section, notes, debug link and DWARF sections.
pub(crate) fn elf_hot_ranges(data: &[u8]) -> Vec<Range<usize>> {
    let mut hot: Vec<Range<usize>> = Vec::new();
    hot.push(0..64);
    if let Ok(file) = ElfFile64::<Endianness>::parse(data) {
        let endian = file.endian();
        let header = file.elf_header();
        let table = |offset: u64, count: u16, size: u16| {
            let start = offset as usize;
            start..start + usize::from(count) * usize::from(size)
        };
        hot.push(table(
            header.e_phoff(endian),
            header.e_phnum(endian),
            header.e_phentsize(endian),
        ));
        hot.push(table(
            header.e_shoff(endian),
            header.e_shnum(endian),
            header.e_shentsize(endian),
        ));
        for section in file.sections() {
            let name = section.name().unwrap_or("");
            let interesting = [
                ".dynsym",
                ".dynstr",
                ".symtab",
                ".strtab",
                ".dynamic",
                ".interp",
                ".gnu.hash",
                ".hash",
                ".gnu_debuglink",
                ".gnu_debugdata",
                ".eh_frame_hdr",
            ]
            .contains(&name)
                || name.starts_with(".note")
                || name.starts_with(".debug_")
                || name.starts_with(".zdebug_");
            if let (true, Some((offset, size))) = (interesting, section.file_range()) {
                // A huge section (.debug_info) is hot near its start:
                // unit headers, abbreviations.
                let size = size.min(64 * 1024);
                hot.push(offset as usize..(offset + size) as usize);
            }
        }
    }
    hot.into_iter()
        .map(|r| r.start.min(data.len())..r.end.min(data.len()))
        .filter(|r| !r.is_empty())
        .collect()
}

/// File offsets of up to `most` functions of an ELF file (evenly picked).
pub(crate) fn function_offsets(data: &[u8], most: usize) -> Vec<u64> {
    let Ok(file) = object::File::parse(data) else {
        return Vec::new();
    };
    let mut offsets: Vec<u64> = file
        .symbols()
        .chain(file.dynamic_symbols())
        .filter(|s| s.kind() == SymbolKind::Text && s.size() > 0)
        .filter_map(|s| elf::vaddr_to_file_offset(&file, s.address() + s.size() / 2))
        .collect();
    offsets.sort_unstable();
    offsets.dedup();
    let step = offsets.len().div_ceil(most).max(1);
    offsets.into_iter().step_by(step).collect()
}

/// A small program with DWARF (inlined functions, several files' lines),
/// built with gcc when it is there.
pub(crate) fn small_program(dir: &Path) -> Option<PathBuf> {
    let source = dir.join("small.c");
    fs::write(
        &source,
        "#include <stdlib.h>\n\
         static inline __attribute__((always_inline)) void *grow(size_t n) { return malloc(n * 2); }\n\
         struct node { struct node *next; int value; };\n\
         __attribute__((noinline)) struct node *push(struct node *head, int value) {\n\
           struct node *n = grow(sizeof *n); n->next = head; n->value = value; return n; }\n\
         int main(int argc, char **argv) { struct node *h = 0;\n\
           for (int i = 0; i < argc * 10; i++) h = push(h, i);\n\
           return h ? h->value : 0; }\n",
    )
    .ok()?;
    let program = dir.join("small");
    let built = Command::new("gcc")
        .args(["-g", "-O1", "-o"])
        .arg(&program)
        .arg(&source)
        .status()
        .ok()?;
    built.success().then_some(program)
}

/// The separate debug file of an ELF file (by build id), when installed.
pub(crate) fn debug_file(path: &Path) -> Option<PathBuf> {
    let id = elf::build_id(fs::read(path).ok()?.as_slice())?;
    let hex: String = id.iter().map(|b| format!("{b:02x}")).collect();
    let debug = PathBuf::from(format!(
        "/usr/lib/debug/.build-id/{}/{}.debug",
        &hex[..2],
        &hex[2..]
    ));
    debug.exists().then_some(debug)
}

pub(crate) fn elf_seed(path: &Path) -> Option<Seed> {
    let bytes = fs::read(path).ok()?;
    Some(Seed {
        name: path.display().to_string(),
        hot: elf_hot_ranges(&bytes),
        bytes,
    })
}

pub(crate) struct ElfSeeds {
    pub(crate) seeds: Vec<Seed>,
    /// Per seed: file offsets of some of its functions.
    pub(crate) functions: Vec<Vec<u64>>,
    pub(crate) dir: PathBuf,
}

impl Drop for ElfSeeds {
    fn drop(&mut self) {
        let _ = fs::remove_dir_all(&self.dir);
    }
}

/// Real programs and libraries, and (for the symbolizer) DWARF.
pub(crate) fn elf_seeds(dwarf: bool) -> ElfSeeds {
    static RUN: AtomicU64 = AtomicU64::new(0);
    let dir = std::env::temp_dir().join(format!(
        "memprof-fuzz-{}-{}",
        std::process::id(),
        RUN.fetch_add(1, Ordering::Relaxed)
    ));
    fs::create_dir_all(&dir).unwrap();
    let libc = fs::canonicalize("/usr/lib/x86_64-linux-gnu/libc.so.6").unwrap();
    let mut paths = vec![
        PathBuf::from("/bin/true"),
        libc.clone(),
        fs::canonicalize("/lib64/ld-linux-x86-64.so.2").unwrap(),
    ];
    paths.extend(small_program(&dir));
    if dwarf {
        paths.extend(debug_file(&libc));
    }
    let seeds: Vec<Seed> = paths.iter().filter_map(|p| elf_seed(p)).collect();
    let functions = seeds
        .iter()
        .map(|seed| function_offsets(&seed.bytes, 24))
        .collect();
    ElfSeeds {
        seeds,
        functions,
        dir,
    }
}

/// memprof's own ELF readers on one file's bytes.
pub(crate) fn check_elf(data: &[u8], offsets: bool) -> TestCaseResult {
    one_line("interpreter", elf::interpreter(data))?;
    one_line("code segments", elf::code_segments(data))?;
    elf::build_id(data);
    one_line(
        "allocator sites",
        allocators::module_sites_in(data, Path::new("libc.so.6"), offsets, &[]),
    )?;
    one_line("loader site", allocators::loader_site_in(data, "fuzzed.so"))?;
    one_line("symbolizer's check", elf_check::check(data))?;
    Ok(())
}

pub(crate) fn fuzz_elf_readers(budget: Budget) {
    let ElfSeeds { ref seeds, .. } = elf_seeds(false);
    let strategy = (input(seeds.len()), any::<bool>());
    run("ELF readers", budget, strategy, |(input, offsets)| {
        let data = input.bytes(seeds);
        // Branch targets of all of a C library's code take a while: with
        // probe offsets on the smaller files only.
        check_elf(&data, offsets && data.len() < 512 * 1024)
    });
}

#[test]
pub(crate) fn smoke_elf_readers() {
    fuzz_elf_readers(Budget::Cases(64));
}

#[test]
#[ignore = "runs for MEMPROF_FUZZ_SECS: cargo xtask fuzz"]
pub(crate) fn fuzz_elf() {
    fuzz_elf_readers(fuzz_time());
}

pub(crate) fn c_path(path: &Path) -> [u8; PATH_MAX] {
    let mut out = [0u8; PATH_MAX];
    let bytes = path.as_os_str().as_encoded_bytes();
    out[..bytes.len()].copy_from_slice(bytes);
    out
}

/// A profiled process maps the file: the notice path (its code segments)
/// and the symbolizer (blazesym: ELF, symbols, DWARF, through the file).
pub(crate) fn check_symbolize(
    symbolizer: &mut Symbolizer,
    path: &Path,
    len: u64,
    offsets: &[u64],
) -> TestCaseResult {
    const PID: u32 = 4_000_000;
    let mut catalog = Catalog::default();
    catalog.on_library(&LibraryNotice {
        kind: NoticeKind::Library as u32,
        tgid: PID,
        generation: 0,
        index: 1,
        held: 0,
        _reserved: 0,
        base: 0x7f00_0000_0000,
        path: c_path(path),
    });
    let from_notice = catalog.get(PID, 0).cloned().unwrap_or_default();
    for trust in [elf_check::Links::Trusted, elf_check::Links::Untrusted] {
        one_line(
            "symbolizer's check of the file",
            elf_check::readable_by_blazesym(path, &[PathBuf::from("/usr/lib/debug")], trust)
                .map_err(|unreadable| anyhow::anyhow!(unreadable.reason)),
        )?;
    }
    // The whole file mapped at one place, as /proc/PID/maps could show it.
    let mapped = ProcessInfo {
        pid: PID,
        mappings: vec![Mapping {
            start: 0x10_0000,
            end: 0x10_0000 + len.max(1),
            file_offset: 0,
            path: path.display().to_string(),
            deleted: false,
        }],
        ..Default::default()
    };
    let addresses: Vec<u64> = offsets.iter().map(|o| 0x10_0000 + o + 1).collect();
    let frames = symbolizer.symbolize(Some(&mapped), &addresses);
    prop_assert_eq!(frames.len(), addresses.len());
    let named = frames
        .iter()
        .flatten()
        .filter(|f| f.function.is_some())
        .count();
    let lines = frames.iter().flatten().filter(|f| f.line.is_some()).count();
    let inlined = frames.iter().flatten().filter(|f| f.inlined).count();
    outcome(match (named, lines, inlined) {
        (0, _, _) => "no frame named",
        (_, 0, _) => "frames named, no file:line",
        (_, _, 0) => "frames named with file:line",
        _ => "frames named with file:line and inlined",
    });
    outcome(format!(
        "code segments from the notice: {}",
        from_notice.mappings.len().min(3)
    ));
    let notice_addresses: Vec<u64> = from_notice
        .mappings
        .iter()
        .flat_map(|m| {
            [
                m.start,
                m.start.wrapping_add(m.end.wrapping_sub(m.start) / 2),
            ]
        })
        .collect();
    symbolizer.symbolize(Some(&from_notice), &notice_addresses);
    match symbolizer.panicked() {
        Some(panic) => Err(proptest::test_runner::TestCaseError::fail(format!(
            "the symbolizer's thread panicked: {panic}"
        ))),
        None => Ok(()),
    }
}

pub(crate) fn fuzz_symbolizer(budget: Budget) {
    let seeds = elf_seeds(true);
    let counter = Cell::new(0u64);
    let symbolizer = RefCell::new(Symbolizer::new());
    let strategy = (input(seeds.seeds.len()), vec(any::<u64>(), 0..4));
    run(
        "symbolizer (blazesym ELF/DWARF)",
        budget,
        strategy,
        |(input, random)| {
            let data = input.bytes(&seeds.seeds);
            let n = counter.get();
            counter.set(n + 1);
            // blazesym keeps every file it opened: start afresh now and
            // then, so that the deleted inputs are let go.
            if n.is_multiple_of(16) {
                *symbolizer.borrow_mut() = Symbolizer::new();
            }
            let path = seeds.dir.join(format!("input-{n}.so"));
            fs::write(&path, &data).unwrap();
            let mut offsets: Vec<u64> = match &input {
                Input::Mutated { seed, .. } => seeds.functions[*seed].clone(),
                Input::Random { .. } => Vec::new(),
            };
            let len = data.len() as u64;
            offsets.extend(random.iter().map(|r| r % len.max(1)));
            let result = check_symbolize(&mut symbolizer.borrow_mut(), &path, len, &offsets);
            let _ = fs::remove_file(&path);
            result
        },
    );
    let caught = guard::caught_panics();
    if !caught.is_empty() {
        println!("panics contained so far (location: count): {caught:?}");
    }
}

#[test]
pub(crate) fn smoke_symbolizer() {
    fuzz_symbolizer(Budget::Cases(32));
}

#[test]
#[ignore = "runs for MEMPROF_FUZZ_SECS: cargo xtask fuzz"]
pub(crate) fn fuzz_symbolize() {
    fuzz_symbolizer(fuzz_time());
}
