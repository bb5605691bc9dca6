//! The probe sites of one module: its allocators, release and mapping
//! functions, and those named on the command line, one site per address;
//! and, in the C library, the code whose calls are the library's own.
use std::{
    collections::{BTreeMap, HashSet},
    path::Path,
};

use anyhow::{Context as _, Result};
use memprof_common::{
    allocators::{AllocatorSpec, ALLOCATORS, FREE, NO_ARG, RELEASERS},
    cookies::ProbeCookie,
    dispatch::LibraryCode,
    mappings::{MappingCall, MAPPING_FUNCTIONS},
};

use super::{
    custom::{custom_row, CustomFunction, CustomRole},
    file_name,
    module_code::{code_segment_around, ModuleCode},
    runtime::is_libc_name,
};
use crate::discover::{
    go::{function_addresses, go_module, GoModule},
    probe_offset::{release_reads, ProbeReads},
};

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
    /// In a Go module's Go code (see [`crate::discover::go`]): never
    /// given a return probe.
    pub go_code: bool,
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
    /// Gets a return probe: always in live mode, else where calls nest;
    /// never in Go code (`plan::refuse_returns_in_go` turns away what
    /// would need one there).
    pub fn returns(&self, live: bool) -> bool {
        if self.go_code {
            return false;
        }
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
    /// CPython built with its object allocator inlined into the exported
    /// functions (see [`inlines_pymalloc`]).
    pub python_inlined: bool,
    /// The module is a Go program or library.
    pub go: Option<GoModule>,
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
    let data = crate::host::untrusted::read(module)
        .with_context(|| format!("reading {}", module.display()))?;
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
    let by_name = function_addresses(&file);
    let custom = custom_in(module, custom, &by_name);
    let go = go_module(&file, &by_name);
    if !knows_any(&by_name) && custom.is_empty() {
        return Ok(ModuleSites {
            go,
            ..ModuleSites::default()
        });
    }
    // A Go module's probes are placed by its prologues (see `go_site`).
    let code = ModuleCode::new(file, shown, by_name, offsets && go.is_none());
    let python_inlined = inlines_pymalloc(&code);
    let mut found = Found {
        code: &code,
        go: go.as_ref(),
        sites: Vec::new(),
        seen_addresses: HashSet::new(),
    };
    // Named functions first: a --alloc-fn that aliases a known one wins.
    found.custom(&custom)?;
    found.allocators(module)?;
    found.releasers()?;
    found.mapping_functions()?;
    let sites = found.sites;
    let library_code = library_code(data, module, &sites);
    Ok(ModuleSites {
        sites,
        library_code,
        python_inlined,
        go,
    })
}

/// Whether CPython's `PyObject_Malloc` holds pymalloc's own code rather
/// than a call through its allocator table: a build with link-time
/// inlining (Debian's python3.11, LTO and PGO) has inlined it into
/// hundreds of the interpreter's callers as well, whose calls no probe
/// on the exported functions sees. The wrapper of a build without is at
/// most 0x43 bytes (pyenv's 3.8 to 3.13); Debian's is 0xf7.
fn inlines_pymalloc(code: &ModuleCode<'_>) -> bool {
    code.size_of("PyObject_Malloc")
        .is_some_and(|size| size > INLINED_PYMALLOC_SIZE)
}

/// Bytes beyond which `PyObject_Malloc` holds pymalloc inlined.
const INLINED_PYMALLOC_SIZE: u64 = 0x80;

/// The functions named on the command line that `module` defines and is
/// meant for: the `--alloc-fn` ones, each with its index among them (its
/// row follows `ALLOCATORS`), then the `--free-fn` and `--while` ones
/// (with `usize::MAX`, no row).
fn custom_in<'c>(
    module: &Path,
    custom: &'c [CustomFunction],
    by_name: &BTreeMap<String, u64>,
) -> Vec<(usize, &'c CustomFunction)> {
    custom
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
        .collect()
}

/// Whether a module defines an allocator or a release function memprof
/// knows.
fn knows_any(by_name: &BTreeMap<String, u64>) -> bool {
    ALLOCATORS.iter().any(|a| by_name.contains_key(a.name))
        || RELEASERS
            .iter()
            .any(|(name, _)| by_name.contains_key(*name))
}

/// The sites found so far in one module: one per address, named after
/// the first function found there.
struct Found<'a, 'data> {
    code: &'a ModuleCode<'data>,
    go: Option<&'a GoModule>,
    sites: Vec<ProbeSite>,
    seen_addresses: HashSet<u64>,
}

impl Found<'_, '_> {
    /// The `--alloc-fn`, `--free-fn` and `--while` functions.
    fn custom(&mut self, custom: &[(usize, &CustomFunction)]) -> Result<()> {
        for (index, function) in custom {
            let address = self.code.by_name[&function.symbol];
            if !self.seen_addresses.insert(address) {
                continue;
            }
            let role = custom_site_role(function.role, *index);
            if let Some(go) = self.go.filter(|go| go.holds(address)) {
                let site = self.go_site(&function.symbol, address, go, role)?;
                self.sites.push(site);
                continue;
            }
            self.sites.push(ProbeSite {
                function: function.symbol.clone(),
                // Its arguments may be anywhere: probed at its first byte.
                file_offset: self.code.probe_at(&function.symbol, address, None)?,
                code: self.code.code_of(address),
                role,
                go_code: false,
            });
        }
        Ok(())
    }

    /// A site in Go code, which gets no return probe (see `discover::go`):
    /// an allocator counted at its entry, without nesting, its arguments
    /// in Go's registers, probed on its stack check's branch where it has
    /// one. Other roles are probed at the first byte (and refused where
    /// they need a return, `plan::refuse_returns_in_go`).
    fn go_site(
        &self,
        name: &str,
        address: u64,
        go: &GoModule,
        role: SiteRole,
    ) -> Result<ProbeSite> {
        let (file_offset, role) = match role {
            SiteRole::Alloc(cookie) => {
                let (file_offset, on_check) = self.code.probe_go_at(name, address)?;
                let cookie = ProbeCookie {
                    may_nest: false,
                    go_abi: go.passes_in_registers(),
                    go_stack_check: on_check,
                    ..cookie
                };
                (file_offset, SiteRole::Alloc(cookie))
            }
            other => (self.code.probe_at(name, address, None)?, other),
        };
        Ok(ProbeSite {
            function: name.to_string(),
            file_offset,
            code: self.code.code_of(address),
            role,
            go_code: true,
        })
    }

    /// The allocators of `ALLOCATORS`, but for C++'s `operator new` in its
    /// own runtime.
    fn allocators(&mut self, module: &Path) -> Result<()> {
        // glibc's calloc does not call malloc; musl's (and others') may.
        let glibc = file_name(module) == "libc.so.6";
        let cxx_runtime = is_cxx_runtime(module);
        for (index, spec) in ALLOCATORS.iter().enumerate() {
            let Some(&address) = self.code.by_name.get(spec.name) else {
                continue;
            };
            if cxx_runtime && is_operator_new(spec) {
                // Its malloc call is probed, and reads as the operator.
                continue;
            }
            if !self.seen_addresses.insert(address) {
                continue;
            }
            let mut cookie = ProbeCookie::of_allocator(index);
            if let Some(go) = self.go.filter(|go| go.holds(address)) {
                // Arguments on the stack (before Go 1.17) are not read:
                // said in the report (`GoModule::uncounted_heap`).
                if go.passes_in_registers() {
                    let mut site = self.go_site(spec.name, address, go, SiteRole::Alloc(cookie))?;
                    site.code.extend(self.go_runtime_mapping_code());
                    self.sites.push(site);
                }
                continue;
            }
            cookie.may_nest |= !glibc && spec.count_arg != NO_ARG;
            self.sites.push(ProbeSite {
                function: spec.name.to_string(),
                file_offset: self
                    .code
                    .probe_at(spec.name, address, allocator_reads(spec))?,
                code: self.code.code_of(address),
                role: SiteRole::Alloc(cookie),
                go_code: false,
            });
        }
        Ok(())
    }

    /// Where a cgo build's Go runtime maps its memory (its heap arenas,
    /// goroutine stacks, the collector's bitmaps): through the C library,
    /// from `x_cgo_mmap`. Those mappings are the Go allocator's own, whose
    /// objects `mallocgc` counts; without cgo the runtime makes the system
    /// call itself, unseen. Found by symbol: stripped builds keep counting
    /// them as the program's mappings.
    fn go_runtime_mapping_code(&self) -> Vec<(u64, u64)> {
        match self.code.by_name.get(GO_RUNTIME_MMAP) {
            Some(&address) => self.code.code_of(address),
            None => Vec::new(),
        }
    }

    /// `free` and the other release functions of `RELEASERS`.
    fn releasers(&mut self) -> Result<()> {
        for &(name, ptr_arg) in &RELEASERS {
            let Some(&address) = self.code.by_name.get(name) else {
                continue;
            };
            if !self.seen_addresses.insert(address) {
                continue;
            }
            let file_offset = self.code.probe_at(name, address, release_reads(ptr_arg))?;
            let role = if name == FREE {
                SiteRole::Free
            } else {
                SiteRole::Release { ptr_arg }
            };
            self.sites.push(ProbeSite {
                function: name.to_string(),
                file_offset,
                code: self.code.code_of(address),
                role,
                go_code: false,
            });
        }
        Ok(())
    }

    /// Where the C library (or a static program) maps memory itself.
    fn mapping_functions(&mut self) -> Result<()> {
        for &(name, call) in &MAPPING_FUNCTIONS {
            let Some(&address) = self.code.by_name.get(name) else {
                continue;
            };
            if !self.seen_addresses.insert(address) {
                continue;
            }
            self.sites.push(ProbeSite {
                function: name.to_string(),
                // Arguments read at the first byte.
                file_offset: self.code.probe_at(name, address, None)?,
                code: self.code.code_of(address),
                role: SiteRole::Mapping(call),
                go_code: false,
            });
        }
        Ok(())
    }
}

/// The C function of a cgo build through which Go's runtime calls mmap.
const GO_RUNTIME_MMAP: &str = "x_cgo_mmap";

/// What the probe of a function named on the command line does; `index`
/// is an `--alloc-fn`'s among them.
fn custom_site_role(role: CustomRole, index: usize) -> SiteRole {
    match role {
        CustomRole::Alloc {
            size_arg,
            count_arg,
            ptr_arg,
        } => SiteRole::Alloc(ProbeCookie {
            allocator: custom_row(index) as u8,
            size_arg,
            count_arg,
            // It may call malloc (or mmap) for its memory: that
            // counts inside it.
            may_nest: true,
            old_pointer_arg: ptr_arg,
            out_pointer_arg: NO_ARG,
            go_abi: false,
            go_stack_check: false,
        }),
        CustomRole::Free { ptr_arg } => SiteRole::Release { ptr_arg },
        CustomRole::Region => SiteRole::Region,
    }
}

/// The C library's code segment, for `ModuleSites::library_code`; None
/// in any other module.
fn library_code(data: &[u8], module: &Path, sites: &[ProbeSite]) -> Option<(u64, u64)> {
    // Only the C library frees blocks it took without malloc's entry, and
    // maps memory for malloc. (Any of its probes finds its code: free's
    // may be another row's, an --alloc-fn's.)
    is_libc_name(file_name(Path::new(
        &crate::host::procfs::paths::path_in_maps(module),
    )))
    .then(|| {
        sites
            .iter()
            .find_map(|site| code_segment_around(data, site.file_offset))
    })
    .flatten()
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

/// What an allocator's probe reads: its arguments, the frame pointer and
/// the stack (the probe may skip code that writes none of them).
fn allocator_reads(spec: &AllocatorSpec) -> Option<ProbeReads> {
    ProbeReads::allocator(&[
        spec.size_arg,
        spec.count_arg,
        spec.old_pointer_arg,
        spec.out_pointer_arg,
    ])
}

#[cfg(test)]
mod tests {
    use super::{super::runtime::find_system_libc, *};

    fn glibc_sites(offsets: bool) -> ModuleSites {
        module_sites(&find_system_libc().unwrap(), offsets, &[]).unwrap()
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
        let library = std::fs::canonicalize("/usr/lib/x86_64-linux-gnu/libstdc++.so.6").unwrap();
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
}
