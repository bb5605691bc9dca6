//! Where a target's allocators are: the files it runs (its program and
//! libraries) and, in each, the allocator functions memprof knows
//! (`ALLOCATORS`, `RELEASERS`) or was told about (`--alloc-fn`,
//! `--free-fn`).
use std::{
    collections::{BTreeMap, HashSet},
    fs,
    path::{Path, PathBuf},
    process::Command,
    sync::OnceLock,
};

use anyhow::{bail, Context as _, Result};
use memprof_common::{
    allocators::{AllocatorSpec, ALLOCATORS, FREE, NO_ARG, RELEASERS},
    cookies::ProbeCookie,
    dispatch::LibraryCode,
    mappings::{MappingCall, MAPPING_FUNCTIONS},
};
use object::SymbolKind;

use crate::{
    discover::probe_offset::{
        branch_targets, plt_slot, probe_offset, tail_call_targets, ProbeReads, ALLOCATOR_READS,
        FREE_READS,
    },
    host::elf::{
        code_at, code_segments, function_code, interpreter, symbol_addresses, symbol_sizes,
        vaddr_to_file_offset,
    },
    human::error::UserError,
};

/// The files memprof looks for allocators in, for one target.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Runtime {
    /// The program and the libraries it loads, as paths memprof can open.
    pub modules: Vec<PathBuf>,
    /// The dynamic loader, which tells (through `_dl_debug_state`) where
    /// it loaded each library; None for static programs, or when memprof
    /// could not find it.
    pub loader: Option<PathBuf>,
}

pub fn is_loader_name(file_name: &str) -> bool {
    file_name.starts_with("ld-linux")
}

/// Names of the C library as it appears in memory maps and DT_NEEDED.
pub fn is_libc_name(file_name: &str) -> bool {
    file_name == "libc.so.6"
        || (file_name.starts_with("libc-") && file_name.ends_with(".so"))
        || (file_name.starts_with("ld-musl-") && file_name.ends_with(".so.1"))
}

fn file_name(path: &Path) -> &str {
    path.file_name().and_then(|n| n.to_str()).unwrap_or("")
}

/// Every file a running process has mapped executable, as paths memprof
/// can open (through /proc/PID/root for a process in another mount
/// namespace), and its loader.
pub fn runtime_of_pid(pid: i32) -> Result<Runtime> {
    let maps = crate::host::procfs::maps::read_maps_text(pid as u32)
        .ok_or_else(|| UserError::new(format!("no process with pid {pid}")))?;
    if maps.trim().is_empty() {
        // A zombie, or a process that exited since it was checked.
        return Err(
            UserError::new(format!("pid {pid} has exited: nothing left to profile")).into(),
        );
    }
    let files = crate::host::procfs::maps::executable_files(pid as u32, &maps);
    let loader = files
        .iter()
        .find(|(path, _)| is_loader_name(file_name(Path::new(path))))
        .map(|(_, file)| file.clone());
    let modules = files.into_iter().map(|(_, file)| file).collect();
    Ok(Runtime { modules, loader })
}

/// The files a program will run: itself and the libraries its loader
/// would load (as `ld.so --list` finds them, so RUNPATH, LD_LIBRARY_PATH
/// and ld.so.cache count), following `#!` scripts to their interpreter.
/// A static program is its only module.
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
        let program = fs::canonicalize(&program).unwrap_or(program);
        let Some(loader) = loader else {
            return Ok(Runtime {
                modules: vec![program],
                loader: None,
            });
        };
        let loader = fs::canonicalize(&loader).ok();
        let mut modules = vec![program.clone()];
        let listed = loader
            .as_deref()
            .map(|loader| libraries_listed_by(loader, &program))
            .unwrap_or_default();
        for library in listed {
            if !modules.contains(&library) {
                modules.push(library);
            }
        }
        if !modules.iter().any(|m| is_libc_name(file_name(m))) {
            modules.push(find_system_libc()?);
        }
        return Ok(Runtime { modules, loader });
    }
    bail!(
        "too many nested #! interpreters starting at {}",
        program.display()
    )
}

/// The libraries `loader` would load for `program`, from its list mode
/// (what `ldd` shows): nothing of the program runs.
fn libraries_listed_by(loader: &Path, program: &Path) -> Vec<PathBuf> {
    let Ok(output) = Command::new(loader).arg("--list").arg(program).output() else {
        return Vec::new();
    };
    String::from_utf8_lossy(&output.stdout)
        .lines()
        .filter_map(|line| {
            // "\tlibc.so.6 => /lib/x86_64-linux-gnu/libc.so.6 (0x...)" or
            // "\t/lib64/ld-linux-x86-64.so.2 (0x...)".
            let line = line.trim();
            let path = line.split_once("=> ").map_or(line, |(_, path)| path);
            let path = path.split(" (").next()?;
            path.starts_with('/')
                .then(|| fs::canonicalize(path).unwrap_or_else(|_| PathBuf::from(path)))
        })
        .collect()
}

fn shebang_interpreter(data: &[u8]) -> Option<PathBuf> {
    let rest = data.strip_prefix(b"#!")?;
    let line = rest.split(|&b| b == b'\n').next()?;
    let line = std::str::from_utf8(line).ok()?;
    let interpreter = line.split_whitespace().next()?;
    Some(PathBuf::from(interpreter))
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

/// A function named on the command line as an allocator (`--alloc-fn`)
/// or a release function (`--free-fn`). Argument positions are 0-based
/// here (1-based on the command line).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct CustomFunction {
    pub symbol: String,
    /// Looked for in this module only: a path, or a file name (with or
    /// without its version suffix: `libfoo.so` matches `libfoo.so.1`).
    pub module: Option<String>,
    pub role: CustomRole,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum CustomRole {
    Alloc {
        size_arg: u8,
        count_arg: u8,
        /// The block a realloc-like function is given, or NO_ARG.
        ptr_arg: u8,
    },
    Free {
        ptr_arg: u8,
    },
    /// `--while`: allocations are recorded only inside its calls.
    Region,
}

impl CustomFunction {
    /// `SYMBOL[@MODULE]:size=N[,count=N][,ptr=N]` (`free`: `:ptr=N`).
    pub fn parse(text: &str, free: bool) -> Result<CustomFunction, String> {
        let usage = if free {
            "expected SYMBOL[@MODULE]:ptr=N"
        } else {
            "expected SYMBOL[@MODULE]:size=N[,count=N][,ptr=N]"
        };
        let (name, args) = text.split_once(':').ok_or(usage)?;
        let (symbol, module) = match name.split_once('@') {
            Some((symbol, module)) => (symbol, Some(module.to_string())),
            None => (name, None),
        };
        if symbol.is_empty() || module.as_deref() == Some("") {
            return Err(usage.to_string());
        }
        let mut positions: BTreeMap<&str, u8> = BTreeMap::new();
        for pair in args.split(',') {
            let (key, value) = pair.split_once('=').ok_or(usage)?;
            if !matches!(key, "size" | "count" | "ptr") || (free && key != "ptr") {
                return Err(format!("unknown key {key:?}: {usage}"));
            }
            let position: u8 = value
                .parse()
                .ok()
                .filter(|n| (1..=6).contains(n))
                .ok_or_else(|| format!("{key}={value}: argument positions are 1 to 6"))?;
            positions.insert(key, position - 1);
        }
        let role = if free {
            CustomRole::Free {
                ptr_arg: *positions.get("ptr").ok_or(usage)?,
            }
        } else {
            CustomRole::Alloc {
                size_arg: *positions.get("size").ok_or(usage)?,
                count_arg: positions.get("count").copied().unwrap_or(NO_ARG),
                ptr_arg: positions.get("ptr").copied().unwrap_or(NO_ARG),
            }
        };
        Ok(CustomFunction {
            symbol: symbol.to_string(),
            module,
            role,
        })
    }

    /// `FUNCTION[@MODULE]` (`--while`).
    pub fn region(text: &str) -> Result<CustomFunction, String> {
        let (symbol, module) = match text.split_once('@') {
            Some((symbol, module)) => (symbol, Some(module.to_string())),
            None => (text, None),
        };
        if symbol.is_empty() || module.as_deref() == Some("") || symbol.contains(':') {
            return Err(
                "expected FUNCTION[@MODULE], FUNCTION as the binary names it (C++: its mangled name)"
                    .to_string(),
            );
        }
        let probed = ALLOCATORS.iter().any(|a| a.name == symbol)
            || RELEASERS.iter().any(|(name, _)| *name == symbol)
            || MAPPING_FUNCTIONS.iter().any(|(name, _)| *name == symbol);
        if probed {
            return Err(format!(
                "{symbol} is a function memprof probes as an allocator; --while takes one that calls them"
            ));
        }
        Ok(CustomFunction {
            symbol: symbol.to_string(),
            module,
            role: CustomRole::Region,
        })
    }

    pub fn wants(&self, module: &Path) -> bool {
        let Some(wanted) = &self.module else {
            return true;
        };
        let name = file_name(module);
        module == Path::new(wanted)
            || module.ends_with(wanted)
            || name == wanted
            || name
                .strip_prefix(wanted.as_str())
                .is_some_and(|rest| rest.starts_with('.'))
    }
}

/// Names of the `--alloc-fn` functions, whose rows follow `ALLOCATORS`
/// (set once, before any report is made).
static CUSTOM_NAMES: OnceLock<Vec<String>> = OnceLock::new();

/// The row of the `index`th `--alloc-fn`.
fn custom_row(index: usize) -> usize {
    ALLOCATORS.len() + index
}

/// Remembers the `--alloc-fn` names for reports.
pub fn register_custom(custom: &[CustomFunction]) {
    let names = custom
        .iter()
        .filter(|f| matches!(f.role, CustomRole::Alloc { .. }))
        .map(|f| f.symbol.clone())
        .collect();
    let _ = CUSTOM_NAMES.set(names);
}

/// How reports name the allocator of row `index`.
pub fn allocator_name(index: u32) -> &'static str {
    if let Some(name) = memprof_common::mappings::mapping_name(index) {
        return name;
    }
    if let Some(name) = memprof_common::usdt::provider_name(index) {
        return name;
    }
    let index = index as usize;
    match ALLOCATORS.get(index) {
        Some(spec) => spec.shown,
        None => CUSTOM_NAMES
            .get()
            .and_then(|names| names.get(index - ALLOCATORS.len()))
            .map_or("?", String::as_str),
    }
}

/// One probe site: a function (or several aliases) at one file offset.
#[derive(Clone, Debug)]
pub struct ProbeSite {
    /// The symbol probed (the first of its aliases memprof knows).
    pub function: String,
    /// Where in the file the probe goes: the function's first instruction,
    /// or the first one the kernel emulates (see `probe_offset`).
    pub file_offset: u64,
    /// The function's code, as file offsets [start, end) (by its symbol's
    /// size; just its first byte when the size is unknown), then the code
    /// of the functions it tail-calls: a stack with a return address in
    /// any of these is inside the call.
    pub code: Vec<(u64, u64)>,
    pub role: SiteRole,
}

#[derive(Clone, Copy, Debug)]
pub enum SiteRole {
    /// An allocator; the cookie tells the BPF program its arguments.
    Alloc(ProbeCookie),
    /// `free` itself.
    Free,
    /// Another function that releases the block in argument `ptr_arg`.
    Release { ptr_arg: u8 },
    /// `mmap`, `munmap`, `mremap` or `sbrk` (direct mappings).
    Mapping(MappingCall),
    /// A `--while` function: the region recorded.
    Region,
}

impl ProbeSite {
    /// Gets a return probe: always in live mode, else where calls nest.
    pub fn returns(&self, live: bool) -> bool {
        match self.role {
            SiteRole::Alloc(cookie) => live || cookie.may_nest,
            SiteRole::Free | SiteRole::Release { .. } => false,
            SiteRole::Mapping(call) => call != MappingCall::Unmap,
            SiteRole::Region => true,
        }
    }
}

/// Where memprof probes one module.
#[derive(Clone, Debug, Default)]
pub struct ModuleSites {
    pub sites: Vec<ProbeSite>,
    /// The C library's code segment, as file offsets `[start, end)`: a
    /// call to free or to a mapping function from there is the library's
    /// own (see [`ModuleSites::library_code_around`]).
    pub library_code: Option<(u64, u64)>,
}

impl ModuleSites {
    /// The C library's code around a probe at `offset` in it: a return
    /// address there, seen at the probe, is in the library (a free of a
    /// block it took without malloc's entry; malloc mapping its memory).
    pub fn library_code_around(&self, offset: u64) -> Option<LibraryCode> {
        let (start, end) = self.library_code?;
        if !(start..end).contains(&offset) {
            return None;
        }
        Some(LibraryCode {
            below: u32::try_from(offset - start).ok()?,
            above: u32::try_from(end - offset).ok()?,
        })
    }
}

/// Finds the allocator functions of `module`, reading and decoding it
/// once. Functions that share an address (aliases) become one site,
/// named after the first row: two probes there would count each call
/// twice. With `offsets`, each probe sits at the cheapest safe instruction.
pub fn module_sites(
    module: &Path,
    offsets: bool,
    custom: &[CustomFunction],
) -> Result<ModuleSites> {
    let data = fs::read(module).with_context(|| format!("reading {}", module.display()))?;
    module_sites_in(&data, module, offsets, custom)
}

/// [`module_sites`] of a module's bytes.
pub fn module_sites_in(
    data: &[u8],
    module: &Path,
    offsets: bool,
    custom: &[CustomFunction],
) -> Result<ModuleSites> {
    let shown = module.display().to_string();
    let Ok(file) = object::File::parse(data) else {
        // Not ELF (a script mapped executable?): nothing to probe there.
        return Ok(ModuleSites::default());
    };
    let by_name = symbol_addresses(&file, SymbolKind::Text);
    let custom: Vec<(usize, &CustomFunction)> = custom
        .iter()
        .filter(|f| matches!(f.role, CustomRole::Alloc { .. }))
        .enumerate()
        .chain(
            custom
                .iter()
                .filter(|f| matches!(f.role, CustomRole::Free { .. } | CustomRole::Region))
                .map(|f| (usize::MAX, f)),
        )
        .filter(|(_, f)| f.wants(module) && by_name.contains_key(&f.symbol))
        .collect();
    let known = ALLOCATORS.iter().any(|a| by_name.contains_key(a.name))
        || RELEASERS
            .iter()
            .any(|(name, _)| by_name.contains_key(*name));
    if !known && custom.is_empty() {
        return Ok(ModuleSites::default());
    }
    let targets = library_branch_targets(&file, offsets);
    // Where function `name` at `address` is probed in the file.
    let probe_at = |name: &str, address: u64, reads: Option<ProbeReads>| -> Result<u64> {
        let start = vaddr_to_file_offset(&file, address).with_context(|| {
            format!("{name} at {address:#x} is in no loadable segment of {shown}")
        })?;
        let skipped = reads.map_or(0, |reads| skip(&file, name, reads, targets.as_ref()));
        Ok(start.saturating_add(skipped))
    };
    let sizes = symbol_sizes(&file);
    // A tail-called function of a stripped library has no symbol: it
    // reaches to the next symbol (at most 64 KiB), all allocator code in
    // an allocator library.
    let starts: std::collections::BTreeSet<u64> =
        sizes.keys().chain(by_name.values()).copied().collect();
    let size_of_unnamed = |target: u64| -> u64 {
        sizes.get(&target).copied().unwrap_or_else(|| {
            let next = starts.range(target + 1..).next().copied();
            next.map_or(1, |next| next - target).min(64 * 1024)
        })
    };
    // The file offsets of the code of the function at `address`, and of
    // the functions it tail-calls.
    let code_of = |address: u64| -> Vec<(u64, u64)> {
        let range = |address: u64, size: u64| {
            let start = vaddr_to_file_offset(&file, address).unwrap_or(0);
            (start, start + size.max(1))
        };
        let size = sizes.get(&address).copied().unwrap_or(1);
        let mut ranges = vec![range(address, size)];
        if let Some(code) = code_at(&file, address, size) {
            ranges.extend(
                tail_call_targets(code, address)
                    .into_iter()
                    .map(|target| through_plt(&file, target, &by_name).unwrap_or(target))
                    .map(|target| range(target, size_of_unnamed(target))),
            );
        }
        ranges
    };
    let mut sites: Vec<ProbeSite> = Vec::new();
    let mut seen_addresses = HashSet::new();
    // Named functions first: a --alloc-fn that aliases a known one wins.
    for (index, function) in &custom {
        let address = by_name[&function.symbol];
        if !seen_addresses.insert(address) {
            continue;
        }
        let role = match function.role {
            CustomRole::Alloc {
                size_arg,
                count_arg,
                ptr_arg,
            } => SiteRole::Alloc(ProbeCookie {
                allocator: custom_row(*index) as u8,
                size_arg,
                count_arg,
                // It may call malloc (or mmap) for its memory: that
                // counts inside it.
                may_nest: true,
                old_pointer_arg: ptr_arg,
                out_pointer_arg: NO_ARG,
            }),
            CustomRole::Free { ptr_arg } => SiteRole::Release { ptr_arg },
            CustomRole::Region => SiteRole::Region,
        };
        sites.push(ProbeSite {
            function: function.symbol.clone(),
            // Its arguments may be anywhere: probed at its first byte.
            file_offset: probe_at(&function.symbol, address, None)?,
            code: code_of(address),
            role,
        });
    }
    // glibc's calloc does not call malloc; musl's (and others') may.
    let glibc = file_name(module) == "libc.so.6";
    let cxx_runtime = is_cxx_runtime(module);
    for (index, spec) in ALLOCATORS.iter().enumerate() {
        let Some(&address) = by_name.get(spec.name) else {
            continue;
        };
        if cxx_runtime && is_operator_new(spec) {
            // Its malloc call is probed, and reads as the operator.
            continue;
        }
        if !seen_addresses.insert(address) {
            continue;
        }
        let mut cookie = ProbeCookie::of_allocator(index);
        cookie.may_nest |= !glibc && spec.count_arg != NO_ARG;
        sites.push(ProbeSite {
            function: spec.name.to_string(),
            file_offset: probe_at(spec.name, address, allocator_reads(spec))?,
            code: code_of(address),
            role: SiteRole::Alloc(cookie),
        });
    }
    for &(name, ptr_arg) in &RELEASERS {
        let Some(&address) = by_name.get(name) else {
            continue;
        };
        if !seen_addresses.insert(address) {
            continue;
        }
        let file_offset = probe_at(name, address, Some(FREE_READS))?;
        let role = if name == FREE {
            SiteRole::Free
        } else {
            SiteRole::Release { ptr_arg }
        };
        sites.push(ProbeSite {
            function: name.to_string(),
            file_offset,
            code: code_of(address),
            role,
        });
    }
    // Where the C library (or a static program) maps memory itself.
    for &(name, call) in &MAPPING_FUNCTIONS {
        let Some(&address) = by_name.get(name) else {
            continue;
        };
        if !seen_addresses.insert(address) {
            continue;
        }
        sites.push(ProbeSite {
            function: name.to_string(),
            // Arguments read at the first byte.
            file_offset: probe_at(name, address, None)?,
            code: code_of(address),
            role: SiteRole::Mapping(call),
        });
    }
    // Only the C library frees blocks it took without malloc's entry, and
    // maps memory for malloc. (Any of its probes finds its code: free's
    // may be another row's, an --alloc-fn's.)
    let library_code = is_libc_name(file_name(Path::new(
        &crate::host::procfs::paths::path_in_maps(module),
    )))
    .then(|| {
        sites
            .iter()
            .find_map(|site| code_segment_around(data, site.file_offset))
    })
    .flatten();
    Ok(ModuleSites {
        sites,
        library_code,
    })
}

/// The function a PLT stub at `stub` jumps to (tcmalloc's `malloc` ends
/// in `jmp allocate_full_malloc_oom@plt`), found through the stub's GOT
/// slot and that slot's relocation; None if `stub` is no PLT stub.
fn through_plt(file: &object::File<'_>, stub: u64, by_name: &BTreeMap<String, u64>) -> Option<u64> {
    use object::{
        Object as _, ObjectSection as _, ObjectSymbol as _, ObjectSymbolTable as _,
        RelocationTarget,
    };
    file.sections().find(|section| {
        matches!(section.name(), Ok(".plt" | ".plt.sec"))
            && (section.address()..section.address() + section.size()).contains(&stub)
    })?;
    let slot = plt_slot(code_at(file, stub, 16)?, stub)?;
    let (_, relocation) = file
        .dynamic_relocations()?
        .find(|(offset, _)| *offset == slot)?;
    let RelocationTarget::Symbol(index) = relocation.target() else {
        return None;
    };
    let name = file
        .dynamic_symbol_table()?
        .symbol_by_index(index)
        .ok()?
        .name()
        .ok()?;
    by_name.get(name).copied()
}

/// libstdc++ and libc++, whose `operator new` is malloc's caller.
///
/// Their operators get no probe: a return probe (which nesting needs,
/// to count their malloc once) replaces the return address with one C++'s
/// unwinder cannot pass, and a `bad_alloc` thrown out of the operator,
/// which the program would catch, would end it (std::terminate). Their
/// malloc call is probed instead and reported as the operator, from the
/// code that called `new` (`report::stacks::through_operator_new`).
fn is_cxx_runtime(module: &Path) -> bool {
    let name = file_name(module);
    name.starts_with("libstdc++.so") || name.starts_with("libc++.so")
}

fn is_operator_new(spec: &AllocatorSpec) -> bool {
    spec.shown.starts_with("new")
}

/// What an allocator's probe reads, when `ALLOCATOR_READS` covers it; a
/// row reading an argument beyond the first three is probed at byte 0.
fn allocator_reads(spec: &AllocatorSpec) -> Option<ProbeReads> {
    let beyond = |arg: u8| arg != NO_ARG && arg > 2;
    let covered =
        !(beyond(spec.size_arg) || beyond(spec.count_arg) || beyond(spec.old_pointer_arg));
    covered.then_some(ALLOCATOR_READS)
}

/// The code segment holding `offset`, as file offsets `[start, end)`.
fn code_segment_around(data: &[u8], offset: u64) -> Option<(u64, u64)> {
    let segment = code_segments(data)
        .ok()?
        .into_iter()
        .find(|s| (s.offset..s.offset.saturating_add(s.memsz)).contains(&offset))?;
    Some((segment.offset, segment.offset.checked_add(segment.memsz)?))
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

    fn glibc_sites(offsets: bool) -> ModuleSites {
        module_sites(&find_system_libc().unwrap(), offsets, &[]).unwrap()
    }

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
        let sites = glibc_sites(false);
        let names: Vec<_> = sites.sites.iter().map(|s| s.function.as_str()).collect();
        assert!(names.contains(&"malloc"));
        assert!(names.contains(&"calloc"));
        assert!(names.contains(&"free"));
        // glibc's aligned_alloc is memalign under another name: one probe;
        // __libc_malloc is malloc.
        assert!(names.contains(&"memalign"));
        assert!(!names.contains(&"aligned_alloc"));
        assert!(!names.contains(&"__libc_malloc"));
        assert!(sites.library_code.is_some());
    }

    #[test]
    fn glibc_free_keeps_its_offset_after_the_whole_library_is_checked() {
        let free = |offsets| {
            glibc_sites(offsets)
                .sites
                .into_iter()
                .find(|s| matches!(s.role, SiteRole::Free))
                .unwrap()
                .file_offset
        };
        // Nothing in glibc jumps into free's first instruction.
        assert_eq!(free(true) - free(false), 3);
    }

    #[test]
    fn libstdcxx_operator_delete_is_a_releaser_and_operator_new_is_left_to_malloc() {
        let library = fs::canonicalize("/usr/lib/x86_64-linux-gnu/libstdc++.so.6").unwrap();
        let sites = module_sites(&library, false, &[]).unwrap();
        assert!(
            !sites
                .sites
                .iter()
                .any(|s| matches!(s.role, SiteRole::Alloc(_))),
            "no return probe where bad_alloc is thrown"
        );
        assert!(sites.sites.iter().any(|s| s.function == "_ZdlPv"));
        assert!(sites.library_code.is_none());
    }

    #[test]
    fn parses_custom_functions() {
        let alloc = CustomFunction::parse("rt_alloc@librt.so:size=2,count=3,ptr=1", false).unwrap();
        assert_eq!(alloc.symbol, "rt_alloc");
        assert_eq!(alloc.module.as_deref(), Some("librt.so"));
        assert_eq!(
            alloc.role,
            CustomRole::Alloc {
                size_arg: 1,
                count_arg: 2,
                ptr_arg: 0
            }
        );
        assert!(alloc.wants(Path::new("/opt/x/librt.so.1")));
        assert!(!alloc.wants(Path::new("/opt/x/librtx.so")));
        let free = CustomFunction::parse("rt_free:ptr=1", true).unwrap();
        assert_eq!(free.role, CustomRole::Free { ptr_arg: 0 });
        for bad in [
            "rt_alloc",
            "rt_alloc:count=1",
            "rt_alloc:size=0",
            "rt_alloc:size=7",
            "@x:size=1",
        ] {
            assert!(CustomFunction::parse(bad, false).is_err(), "{bad}");
        }
        assert!(CustomFunction::parse("rt_free:size=1", true).is_err());
    }

    #[test]
    fn reads_shebang() {
        assert_eq!(
            shebang_interpreter(b"#!/bin/sh -e\necho"),
            Some(PathBuf::from("/bin/sh"))
        );
        assert_eq!(shebang_interpreter(b"\x7fELF"), None);
    }

    #[test]
    fn lists_a_programs_libraries() {
        let runtime = runtime_of_program(Path::new("/usr/bin/sqlite3")).unwrap();
        let names: Vec<_> = runtime.modules.iter().map(|m| file_name(m)).collect();
        assert!(names[0] == "sqlite3", "{names:?}");
        assert!(
            names.iter().any(|n| n.starts_with("libsqlite3")),
            "{names:?}"
        );
        assert!(names.contains(&"libc.so.6"), "{names:?}");
    }
}
