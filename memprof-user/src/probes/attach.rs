//! Attaching the allocator probes: which functions of which files, with
//! which BPF program and cookie, scoped to which processes; and the
//! libraries loaded later (`Probes::on_library`).
use std::{
    collections::{HashMap, HashSet},
    os::fd::{AsFd as _, OwnedFd},
    path::{Path, PathBuf},
};

use anyhow::{bail, Context as _, Result};
use aya::{programs::UProbe, Ebpf};
use memprof_common::{allocators::MALLOC, mappings::mapping_name};

use super::{perf, program_mut, tracefs};
use crate::{
    error::UserError,
    target::allocators::{
        allocator_name, loader_site, module_sites, CustomFunction, ModuleSites, ProbeSite, Runtime,
        SiteRole,
    },
};

/// Attached uprobes. Dropping this detaches everything; the field order
/// is the drop order: links and perf events close before their tracefs
/// events are removed (removal fails while an event is open).
pub struct Probes {
    links: Vec<OwnedFd>,
    anchors: Vec<OwnedFd>,
    scopes: Vec<OwnedFd>,
    uprobes: Vec<tracefs::UprobeEvent>,
    /// What was probed, where.
    pub functions: Vec<ProbedFunction>,
    /// Targets with no allocator memprof knows: nothing of theirs counts.
    pub unprobed: Vec<Unprobed>,
    /// What probing libraries loaded later needs.
    late: Option<LateProbes>,
}

/// Probing the allocators of libraries loaded while the profile runs
/// (dlopen, or a child that exec'd another program).
struct LateProbes {
    root: PathBuf,
    programs: Programs,
    live: bool,
    offsets: bool,
    custom: Vec<CustomFunction>,
    verbose: bool,
    mappings: bool,
    /// Every file looked at, by device and inode.
    files: HashMap<(u64, u64), FileProbes>,
    /// Names the next file's tracefs events.
    next_index: usize,
}

struct FileProbes {
    /// Its probes' tracefs event ids (none: no allocator there).
    events: Vec<u64>,
    /// The processes they are scoped to (and their children forked since);
    /// None for the files probed at the start, scoped to the targets.
    scoped: Option<HashSet<u32>>,
}

impl FileProbes {
    /// A file of the targets at the start, scoped to them.
    fn at_start(events: Vec<u64>) -> FileProbes {
        FileProbes {
            events,
            scoped: None,
        }
    }
}

/// A target in which memprof found nothing to probe.
#[derive(Clone, Debug)]
pub struct Unprobed {
    pub program: String,
    pub reason: String,
}

/// Which probes to attach.
#[derive(Clone, Debug, Default)]
pub struct ProbeSet {
    /// `--live`: return probes on every allocator and a probe on free.
    pub live: bool,
    /// Benchmarks: the same probes running programs that do nothing.
    pub empty_programs: bool,
    /// Probe each function at its first instruction the kernel emulates,
    /// when that is safe (`--no-probe-offsets` turns it off).
    pub probe_offsets: bool,
    /// Benchmarks: one empty probe on this function alone, to measure
    /// what one probe costs there.
    pub bench_probe: Option<String>,
    /// `--alloc-fn`, `--free-fn`.
    pub custom: Vec<CustomFunction>,
    /// `--verbose`: print each probe of a library loaded later.
    pub verbose: bool,
    /// Direct mappings: probes on mmap, mremap, munmap, sbrk.
    pub mappings: bool,
}

/// One function memprof put a probe on (`--verbose`, and the report).
#[derive(Clone, Debug)]
pub struct ProbedFunction {
    pub module: PathBuf,
    pub function: String,
    /// "alloc", "free" or "release".
    pub role: &'static str,
    /// How reports name an allocator's calls.
    pub allocator: Option<&'static str>,
    pub file_offset: u64,
    /// The function's code, and that of the functions it tail-calls, as
    /// file offsets [start, end).
    pub code: Vec<(u64, u64)>,
}

/// What runs at a site's entry probe.
struct EntryProbe<'a> {
    program: &'a OwnedFd,
    cookie: u64,
    role: &'static str,
    allocator: Option<&'static str>,
}

fn entry_probe<'a>(
    site: &ProbeSite,
    sites: &ModuleSites,
    programs: &'a Programs,
) -> EntryProbe<'a> {
    match site.role {
        SiteRole::Alloc(cookie) => EntryProbe {
            // malloc's program knows its cookie (no helper call).
            program: if cookie.allocator as usize == MALLOC {
                &programs.malloc_enter
            } else {
                &programs.enter
            },
            cookie: cookie.encode(),
            role: "alloc",
            allocator: Some(allocator_name(cookie.allocator.into())),
        },
        SiteRole::Free => EntryProbe {
            program: &programs.free,
            // Where the library's own code is, from the probe: frees it
            // makes of blocks it took without malloc are its own.
            cookie: sites.free_caller_range.map_or(0, |(from, to)| {
                u64::from(from as u32) | u64::from(to as u32) << 32
            }),
            role: "free",
            allocator: None,
        },
        SiteRole::Release { ptr_arg } => EntryProbe {
            program: &programs.release,
            cookie: u64::from(ptr_arg),
            role: "release",
            allocator: None,
        },
        SiteRole::Mapping(call) => EntryProbe {
            program: &programs.mapping,
            cookie: call as u64,
            role: "mapping",
            allocator: mapping_name(call.allocator()),
        },
    }
}

/// The BPF programs the probes run.
struct Programs {
    enter: OwnedFd,
    malloc_enter: OwnedFd,
    ret: OwnedFd,
    free: OwnedFd,
    release: OwnedFd,
    mapping: OwnedFd,
    mapping_return: OwnedFd,
}

impl Programs {
    /// memprof's programs, or (benchmarks' floor) ones that do nothing.
    fn of(ebpf: &mut Ebpf, empty: bool) -> Result<Programs> {
        let names = if empty {
            [
                "noop_enter",
                "noop_enter",
                "noop_return",
                "noop_enter",
                "noop_enter",
                "noop_enter",
                "noop_return",
            ]
        } else {
            [
                "alloc_enter",
                "malloc_enter",
                "alloc_return",
                "free_enter",
                "release_enter",
                "mapping_enter",
                "mapping_return",
            ]
        };
        Ok(Programs {
            enter: program_fd(ebpf, names[0])?,
            malloc_enter: program_fd(ebpf, names[1])?,
            ret: program_fd(ebpf, names[2])?,
            free: program_fd(ebpf, names[3])?,
            release: program_fd(ebpf, names[4])?,
            mapping: program_fd(ebpf, names[5])?,
            mapping_return: program_fd(ebpf, names[6])?,
        })
    }
}

/// A module's sites, less its mapping functions unless direct mappings
/// are counted.
fn with_mappings(mut sites: ModuleSites, mappings: bool) -> ModuleSites {
    if !mappings {
        sites
            .sites
            .retain(|site| !matches!(site.role, SiteRole::Mapping(_)));
    }
    sites
}

/// Every `--alloc-fn`/`--free-fn` must be somewhere: a one-line error
/// naming the modules searched, unless it names a module that is not
/// loaded yet (probed if it is, later).
fn check_named_functions(
    custom: &[CustomFunction],
    modules: &[PathBuf],
    found: &[(PathBuf, ModuleSites)],
) -> Result<()> {
    for function in custom {
        let found_here = found
            .iter()
            .any(|(_, sites)| sites.sites.iter().any(|s| s.function == function.symbol));
        if found_here {
            continue;
        }
        if let Some(module) = &function.module {
            if !modules.iter().any(|m| function.wants(m)) {
                eprintln!(
                    "memprof: {}@{module}: no such module yet; probed if the target loads it",
                    function.symbol
                );
                continue;
            }
        }
        let searched: Vec<String> = modules.iter().map(|m| m.display().to_string()).collect();
        bail!(UserError::new(format!(
            "function {} not found{}; searched {}",
            function.symbol,
            function
                .module
                .as_ref()
                .map(|m| format!(" in a module named {m}"))
                .unwrap_or_default(),
            searched.join(", ")
        ))
        .with_exit_code(2));
    }
    Ok(())
}

/// The targets none of whose files has an allocator memprof knows.
fn unprobed_targets(runtimes: &[Runtime], found: &[(PathBuf, ModuleSites)]) -> Vec<Unprobed> {
    let probed: HashSet<(u64, u64)> = found.iter().map(|(m, _)| file_identity(m)).collect();
    runtimes
        .iter()
        .filter(|runtime| {
            !runtime
                .modules
                .iter()
                .any(|m| probed.contains(&file_identity(m)))
        })
        .map(|runtime| Unprobed {
            program: runtime
                .modules
                .first()
                .map(|m| m.display().to_string())
                .unwrap_or_default(),
            reason: format!(
                "no allocator memprof knows in its {} module{} (malloc, operator new, \
                 jemalloc, tcmalloc, mimalloc); name one with --alloc-fn",
                runtime.modules.len(),
                if runtime.modules.len() == 1 { "" } else { "s" }
            ),
        })
        .collect()
}

impl Probes {
    /// Puts entry probes (and return probes where calls may nest, or on
    /// all in live mode) on every allocator function found in the
    /// targets' modules, on the functions that release blocks in live
    /// mode, and a probe where each loader announces loaded libraries;
    /// active in `pids` and their descendants only.
    pub fn attach(
        ebpf: &mut Ebpf,
        runtimes: &[Runtime],
        pids: &[i32],
        set: ProbeSet,
    ) -> Result<Probes> {
        let root = tracefs::tracefs_root()?;
        tracefs::remove_stale(&root).context("removing uprobes left by a killed memprof")?;
        let mut probes = Probes {
            links: Vec::new(),
            anchors: Vec::new(),
            scopes: Vec::new(),
            uprobes: Vec::new(),
            functions: Vec::new(),
            unprobed: Vec::new(),
            late: None,
        };
        let programs = Programs::of(ebpf, set.empty_programs)?;
        let modules = distinct_files(runtimes.iter().flat_map(|r| r.modules.iter()));
        let mut found = Vec::new();
        for module in &modules {
            let sites = with_mappings(
                module_sites(module, set.probe_offsets, &set.custom)?,
                set.mappings,
            );
            if !sites.sites.is_empty() {
                found.push((module.clone(), sites));
            }
        }
        check_named_functions(&set.custom, &modules, &found)?;
        if let Some(function) = &set.bench_probe {
            let noop = program_fd(ebpf, "noop_enter")?;
            let (module, site) = found
                .iter()
                .flat_map(|(module, sites)| sites.sites.iter().map(move |s| (module, s)))
                .find(|(_, site)| site.function == *function)
                .with_context(|| format!("no {function} in the target's modules"))?;
            let event =
                tracefs::UprobeEvent::create(&root, "bench", module, site.file_offset, false)?;
            probes.hook(&event, &noop, 0, pids)?;
            probes.uprobes.push(event);
            return Ok(probes);
        }
        let on_libraries = program_fd(ebpf, "on_libraries")?;
        let loaders = distinct_files(runtimes.iter().filter_map(|r| r.loader.as_ref()));
        for (index, loader) in loaders.iter().enumerate() {
            if let Some(site) = loader_site(loader)? {
                let name = format!("dl_debug_state_{index}");
                let event =
                    tracefs::UprobeEvent::create(&root, &name, loader, site.file_offset, false)?;
                probes.hook(&event, &on_libraries, site.r_debug_delta as u64, pids)?;
                probes.uprobes.push(event);
            }
        }
        probes.unprobed = unprobed_targets(runtimes, &found);
        // Every file looked at is known; those with allocators, by their
        // probes' events.
        let mut files: HashMap<_, _> = modules
            .iter()
            .map(|module| (file_identity(module), FileProbes::at_start(Vec::new())))
            .collect();
        for (index, (module, sites)) in found.iter().enumerate() {
            let events =
                probes.attach_module(&root, &programs, index, module, sites, pids, set.live)?;
            files.insert(file_identity(module), FileProbes::at_start(events));
        }
        probes.late = Some(LateProbes {
            root,
            programs,
            live: set.live,
            offsets: set.probe_offsets,
            custom: set.custom,
            verbose: set.verbose,
            mappings: set.mappings,
            files,
            next_index: found.len(),
        });
        Ok(probes)
    }

    /// Process `pid` has loaded `library` (the loader said so): the
    /// allocators in it get probes, scoped to this process and the
    /// children it forks from now on. Files probed at the start, or
    /// already for this process, are left as they are.
    pub fn on_library(&mut self, pid: u32, library: &Path) -> Result<()> {
        let Some(mut late) = self.late.take() else {
            return Ok(());
        };
        let result = self.probe_late(&mut late, pid, library);
        self.late = Some(late);
        result
    }

    fn probe_late(&mut self, late: &mut LateProbes, pid: u32, library: &Path) -> Result<()> {
        let identity = file_identity(library);
        if identity == (0, 0) {
            return Ok(());
        }
        if let Some(file) = late.files.get_mut(&identity) {
            let Some(scoped) = file.scoped.as_mut() else {
                return Ok(());
            };
            if file.events.is_empty() || !scoped.insert(pid) {
                return Ok(());
            }
            for &id in &file.events {
                let scope = perf::open_tracepoint(id, pid as i32, true)
                    .with_context(|| format!("perf_event_open on uprobe {id} for pid {pid}"))?;
                self.scopes.push(scope);
            }
            return Ok(());
        }
        late.files.insert(
            identity,
            FileProbes {
                events: Vec::new(),
                scoped: Some(HashSet::from([pid])),
            },
        );
        let sites = with_mappings(
            module_sites(library, late.offsets, &late.custom)?,
            late.mappings,
        );
        if sites.sites.is_empty() {
            return Ok(());
        }
        let index = late.next_index;
        late.next_index += 1;
        let functions_before = self.functions.len();
        let events = self.attach_module(
            &late.root,
            &late.programs,
            index,
            library,
            &sites,
            &[pid as i32],
            late.live,
        )?;
        if let Some(file) = late.files.get_mut(&identity) {
            file.events = events;
        }
        if late.verbose {
            for function in &self.functions[functions_before..] {
                eprintln!("{}", describe(function));
            }
        }
        Ok(())
    }

    /// The probes of one module; returns their tracefs event ids. Return
    /// probes first, so that no entry fires without its return; releases
    /// last: a free seen before its block's allocation would only count as
    /// unknown.
    #[allow(clippy::too_many_arguments)]
    fn attach_module(
        &mut self,
        root: &Path,
        programs: &Programs,
        index: usize,
        module: &Path,
        sites: &ModuleSites,
        pids: &[i32],
        live: bool,
    ) -> Result<Vec<u64>> {
        let first = self.uprobes.len();
        // tracefs event names: letters, digits and underscores; unique by
        // the module's index and the site's (names are cut).
        let event_name = |site: &ProbeSite, suffix: &str| {
            let name: String = site
                .function
                .chars()
                .map(|c| if c.is_ascii_alphanumeric() { c } else { '_' })
                .take(40)
                .collect();
            let position = sites
                .sites
                .iter()
                .position(|s| std::ptr::eq(s, site))
                .unwrap_or_default();
            format!("{name}_{index}_{position}{suffix}")
        };
        for site in sites.sites.iter().filter(|s| s.returns(live)) {
            let event = tracefs::UprobeEvent::create(
                root,
                &event_name(site, "_ret"),
                module,
                site.file_offset,
                true,
            )?;
            let program = match site.role {
                SiteRole::Mapping(_) => &programs.mapping_return,
                _ => &programs.ret,
            };
            self.hook(&event, program, 0, pids)?;
            self.uprobes.push(event);
        }
        // Allocators (and mapping functions) first, then (live mode) the
        // functions releasing blocks.
        let (allocs, releases): (Vec<_>, Vec<_>) = sites
            .sites
            .iter()
            .map(|site| (site, entry_probe(site, sites, programs)))
            .partition(|(_, probe)| probe.role != "free" && probe.role != "release");
        let releases = if live { releases } else { Vec::new() };
        for (site, probe) in allocs.into_iter().chain(releases) {
            let event = tracefs::UprobeEvent::create(
                root,
                &event_name(site, ""),
                module,
                site.file_offset,
                false,
            )?;
            self.hook(&event, probe.program, probe.cookie, pids)?;
            self.uprobes.push(event);
            self.functions.push(ProbedFunction {
                module: module.to_path_buf(),
                function: site.function.clone(),
                role: probe.role,
                allocator: probe.allocator,
                file_offset: site.file_offset,
                code: site.code.clone(),
            });
        }
        Ok(self.uprobes[first..].iter().map(|e| e.id).collect())
    }

    /// Detaches everything, in parallel: closing a uprobe's perf event or
    /// removing its tracefs event waits for an RCU grace period (tens of
    /// ms here), and one after another they took about 2 s. Links and
    /// perf events close before their tracefs events are removed, as in
    /// the field order a plain drop follows.
    pub fn detach(self) {
        let Probes {
            links,
            anchors,
            scopes,
            uprobes,
            ..
        } = self;
        in_parallel(links);
        in_parallel(anchors.into_iter().chain(scopes).collect());
        in_parallel(uprobes);
    }

    fn hook(
        &mut self,
        event: &tracefs::UprobeEvent,
        program: &OwnedFd,
        cookie: u64,
        pids: &[i32],
    ) -> Result<()> {
        let anchor = perf::open_tracepoint(event.id, pids[0], false).with_context(|| {
            format!("perf_event_open on uprobe {} for pid {}", event.id, pids[0])
        })?;
        let link = perf::link_program(program.as_fd(), &anchor, cookie)
            .context("attaching the BPF program to a uprobe (BPF_LINK_CREATE)")?;
        self.anchors.push(anchor);
        self.links.push(link);
        for &pid in pids {
            let scope = perf::open_tracepoint(event.id, pid, true)
                .with_context(|| format!("perf_event_open on uprobe {} for pid {pid}", event.id))?;
            self.scopes.push(scope);
        }
        Ok(())
    }
}

/// Drops `items` on a few threads at once; returns when all are dropped.
/// Each drop mostly sleeps in the kernel, so threads beyond the cores help.
fn in_parallel<T: Send>(items: Vec<T>) {
    const THREADS: usize = 16;
    if items.len() <= 1 {
        return;
    }
    let per_thread = items.len().div_ceil(THREADS);
    let mut items = items;
    std::thread::scope(|scope| {
        while !items.is_empty() {
            let rest = items.split_off(items.len().saturating_sub(per_thread));
            scope.spawn(move || drop(rest));
        }
    });
}

fn program_fd(ebpf: &mut Ebpf, name: &str) -> Result<OwnedFd> {
    let program: &mut UProbe = program_mut(ebpf, name)?;
    Ok(program.fd()?.as_fd().try_clone_to_owned()?)
}

/// Each file once (by device and inode: the same library may be reached
/// by several paths), in first-seen order.
fn distinct_files<'a>(paths: impl Iterator<Item = &'a PathBuf>) -> Vec<PathBuf> {
    let mut seen = std::collections::HashSet::new();
    paths
        .filter(|path| seen.insert(file_identity(path)))
        .cloned()
        .collect()
}

fn file_identity(path: &Path) -> (u64, u64) {
    use std::os::unix::fs::MetadataExt as _;
    std::fs::metadata(path).map_or((0, 0), |m| (m.dev(), m.ino()))
}

/// "memprof: probe alloc _Znwm at /usr/lib/.../libstdc++.so.6+0x... (reported as new)".
pub fn describe(function: &ProbedFunction) -> String {
    format!(
        "memprof: probe {} {} at {}+{:#x}{}",
        function.role,
        function.function,
        function.module.display(),
        function.file_offset,
        function
            .allocator
            .filter(|a| *a != function.function)
            .map(|a| format!(" (reported as {a})"))
            .unwrap_or_default()
    )
}
