//! Kernel side of a profile: load the BPF object, put uprobes on the
//! allocator functions, scope them to the target processes.
pub mod perf;
pub mod tracefs;

use std::{
    collections::{HashMap, HashSet},
    os::fd::{AsFd as _, OwnedFd},
    path::{Path, PathBuf},
};

use anyhow::{bail, Context as _, Result};
use aya::{
    programs::{TracePoint, UProbe},
    Ebpf, EbpfLoader,
};
use memprof_common::{
    allocators::MALLOC, LiveEntry, ProcHeap, ProcState, HEAP_SLOTS, NO_HEAP_SLOT,
};

use crate::{
    error::UserError,
    target::allocators::{
        allocator_name, loader_site, module_sites, CustomFunction, ModuleSites, ProbeSite, Runtime,
        SiteRole,
    },
};

/// The BPF object built by build.rs from memprof-ebpf.
static BPF_OBJECT: &[u8] = aya::include_bytes_aligned!(concat!(env!("OUT_DIR"), "/memprof"));

/// What the command line sets before the BPF object is loaded.
pub struct Settings {
    pub max_stacks: u32,
    pub stack_map_size: u32,
    /// `--live`: the pointer table's capacity and the temporary threshold.
    pub live: Option<LiveSettings>,
    /// `--sample-bytes`: mean bytes between samples; 0 records every call.
    pub sample_bytes: u64,
    /// `--unwind dwarf`: the rows of unwind tables the kernel holds;
    /// `None` walks frame pointers.
    pub unwind_rows: Option<u32>,
    /// `trace`: processes wait, stopped, while the unwind tables of the
    /// libraries they load go to the kernel and their allocators get
    /// probes (memprof started them).
    pub hold_for_tables: bool,
    /// `trace` of a static program: it waits at its exec instead (no
    /// loader announces its code).
    pub hold_at_exec: bool,
}

/// Processes whose mappings the kernel keeps for `--unwind dwarf` at once
/// (2 KiB each).
pub const UNWIND_PROCESSES: u32 = 4096;

#[derive(Clone, Copy, Debug)]
pub struct LiveSettings {
    pub max_live: u32,
    pub temp_threshold_ns: u64,
    /// Tests: the pointer table's slots instead of
    /// `LiveEntry::table_slots(max_live)` (a small table sends blocks to
    /// the overflow map).
    pub slots: Option<u32>,
}

/// Loads the BPF programs and maps (nothing attached yet).
pub fn load(settings: &Settings) -> Result<Ebpf> {
    // The sched tracepoints below and the uprobe events need tracefs.
    tracefs::tracefs_root()?;
    let live_mode: u8 = settings.live.is_some().into();
    let (max_live, temp_threshold_ns) = settings.live.map_or((1, 0), |live| {
        (live.max_live.max(1), live.temp_threshold_ns)
    });
    let live_slots = match settings.live.and_then(|live| live.slots) {
        Some(slots) => slots.clamp(1, 1 << 31).next_power_of_two(),
        None => LiveEntry::table_slots(max_live),
    };
    // Live mode keeps each site's stats under an id (up to --max-stacks
    // sites; more go to COUNTS).
    let site_ids = if settings.live.is_some() {
        settings.max_stacks
    } else {
        1
    };
    // Live mode keeps each process image's heap exact, in a slot of its own.
    let heap_slots = if settings.live.is_some() {
        HEAP_SLOTS
    } else {
        1
    };
    let (unwind_mode, unwind_rows, unwind_processes) = match settings.unwind_rows {
        Some(rows) => (memprof_common::UNWIND_DWARF, rows, UNWIND_PROCESSES),
        None => (memprof_common::UNWIND_FP, 1, 1),
    };
    let mut ebpf = EbpfLoader::new()
        .map_max_entries("UNWIND_ROWS", unwind_rows)
        .map_max_entries("UNWIND_MAPS", unwind_processes)
        .override_global("UNWIND_MODE", &unwind_mode, true)
        .override_global("HOLD_FOR_TABLES", &u8::from(settings.hold_for_tables), true)
        .override_global("HOLD_AT_EXEC", &u8::from(settings.hold_at_exec), true)
        .map_max_entries("COUNTS", settings.max_stacks)
        .map_max_entries("STACKS", settings.stack_map_size)
        .map_max_entries("LIVE", live_slots)
        // Room for every block --max-live admits (preallocated).
        .map_max_entries("LIVE_OVERFLOW", max_live)
        .map_max_entries("SITE_IDS", site_ids)
        .map_max_entries("SITE_STATS", site_ids)
        .map_max_entries("HEAPS", heap_slots)
        .override_global("HEAP_SLOT_MASK", &(heap_slots - 1), true)
        .override_global("SITE_ID_COUNT", &site_ids, true)
        .override_global("LIVE_MODE", &live_mode, true)
        .override_global("TEMP_THRESHOLD_NS", &temp_threshold_ns, true)
        .override_global("LIVE_SLOT_MASK", &(live_slots - 1), true)
        .override_global("MAX_LIVE", &u64::from(max_live), true)
        .override_global("SAMPLE_BYTES", &settings.sample_bytes, true)
        // THREADS is task storage, which aya cannot read from user space;
        // only the BPF programs use it.
        .allow_unsupported_maps()
        .load(BPF_OBJECT)
        .context("loading the BPF object")?;
    for name in [
        "alloc_enter",
        "malloc_enter",
        "alloc_return",
        "free_enter",
        "release_enter",
        "noop_enter",
        "noop_return",
        "on_libraries",
    ] {
        let program: &mut UProbe = program_mut(&mut ebpf, name)?;
        let started = std::time::Instant::now();
        program
            .load()
            .with_context(|| format!("loading BPF program {name}"))?;
        if std::env::var_os("MEMPROF_LOAD_TIMES").is_some() {
            eprintln!("memprof: loaded {name} in {:?}", started.elapsed());
        }
    }
    for (name, event) in [
        ("on_exec", "sched_process_exec"),
        ("on_fork", "sched_process_fork"),
        ("on_exit", "sched_process_exit"),
    ] {
        let program: &mut TracePoint = program_mut(&mut ebpf, name)?;
        program
            .load()
            .with_context(|| format!("loading BPF program {name}"))?;
        program
            .attach("sched", event)
            .with_context(|| format!("attaching {name} to sched:{event}"))?;
    }
    Ok(ebpf)
}

fn program_mut<'a, T>(ebpf: &'a mut Ebpf, name: &str) -> Result<&'a mut T>
where
    &'a mut T: TryFrom<&'a mut aya::programs::Program, Error = aya::programs::ProgramError>,
{
    let program = ebpf
        .program_mut(name)
        .with_context(|| format!("BPF program {name} missing from the object"))?;
    Ok(program.try_into()?)
}

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

/// A target in which memprof found nothing to probe.
#[derive(Clone, Debug)]
pub struct Unprobed {
    pub program: String,
    pub reason: String,
}

/// Processes memprof attaches to start as image generation 0, which user
/// space knows them by before their first allocation (processes first seen
/// later get a generation from the clock). In live mode each gets a heap
/// slot here; the kernel hands out the slots after theirs.
pub fn register_targets(ebpf: &mut Ebpf, pids: &[i32], live: bool) -> Result<()> {
    let mut heap_slot = |index: usize, pid: i32| -> Result<u32> {
        if !live {
            return Ok(NO_HEAP_SLOT);
        }
        let mut heaps: aya::maps::Array<&mut aya::maps::MapData, ProcHeap> =
            aya::maps::Array::try_from(ebpf.map_mut("HEAPS").context("map HEAPS")?)?;
        let heap = ProcHeap {
            owner: ProcHeap::owner_of(pid as u32, 0),
            ..ProcHeap::default()
        };
        heaps.set(index as u32, heap, 0).context("map HEAPS")?;
        Ok(index as u32)
    };
    let mut states = Vec::new();
    for (index, &pid) in pids.iter().enumerate() {
        let state = ProcState {
            generation: 0,
            announced: 0,
            heap_slot: heap_slot(index, pid)?,
            library_changes: 0,
        };
        states.push((pid as u32, state));
    }
    if live {
        let mut next: aya::maps::Array<&mut aya::maps::MapData, u64> =
            aya::maps::Array::try_from(ebpf.map_mut("NEXT_HEAP").context("map NEXT_HEAP")?)?;
        next.set(0, pids.len() as u64, 0).context("map NEXT_HEAP")?;
    }
    let mut procs: aya::maps::HashMap<&mut aya::maps::MapData, u32, ProcState> =
        aya::maps::HashMap::try_from(ebpf.map_mut("PROCS").context("map PROCS")?)?;
    for (pid, state) in states {
        procs
            .insert(pid, state, 0)
            .context("registering the target in the kernel's process table")?;
    }
    Ok(())
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
    }
}

/// The BPF programs the probes run.
struct Programs {
    enter: OwnedFd,
    malloc_enter: OwnedFd,
    ret: OwnedFd,
    free: OwnedFd,
    release: OwnedFd,
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
        let names = if set.empty_programs {
            [
                "noop_enter",
                "noop_enter",
                "noop_return",
                "noop_enter",
                "noop_enter",
            ]
        } else {
            [
                "alloc_enter",
                "malloc_enter",
                "alloc_return",
                "free_enter",
                "release_enter",
            ]
        };
        let programs = Programs {
            enter: program_fd(ebpf, names[0])?,
            malloc_enter: program_fd(ebpf, names[1])?,
            ret: program_fd(ebpf, names[2])?,
            free: program_fd(ebpf, names[3])?,
            release: program_fd(ebpf, names[4])?,
        };
        let modules = distinct_files(runtimes.iter().flat_map(|r| r.modules.iter()));
        let mut found = Vec::new();
        for module in &modules {
            let sites = module_sites(module, set.probe_offsets, &set.custom)?;
            if !sites.sites.is_empty() {
                found.push((module.clone(), sites));
            }
        }
        for function in &set.custom {
            let found_here = found
                .iter()
                .any(|(_, sites)| sites.sites.iter().any(|s| s.function == function.symbol));
            let module_loaded = modules.iter().any(|m| function.wants(m));
            if !found_here && function.module.is_some() && !module_loaded {
                eprintln!(
                    "memprof: {}@{}: no such module yet; probed if the target loads it",
                    function.symbol,
                    function.module.as_deref().unwrap_or_default()
                );
                continue;
            }
            if !found_here {
                let searched: Vec<String> =
                    modules.iter().map(|m| m.display().to_string()).collect();
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
        }
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
        for runtime in runtimes {
            let probed = runtime
                .modules
                .iter()
                .any(|m| found.iter().any(|(module, _)| same_file(module, m)));
            if !probed {
                probes.unprobed.push(Unprobed {
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
                });
            }
        }
        let mut files = HashMap::new();
        for module in &modules {
            files.insert(
                file_identity(module),
                FileProbes {
                    events: Vec::new(),
                    scoped: None,
                },
            );
        }
        for (index, (module, sites)) in found.iter().enumerate() {
            let before = probes.uprobes.len();
            probes.attach_module(&root, &programs, index, module, sites, pids, set.live)?;
            if let Some(file) = files.get_mut(&file_identity(module)) {
                file.events = probes.uprobes[before..].iter().map(|e| e.id).collect();
            }
        }
        probes.late = Some(LateProbes {
            root,
            programs,
            live: set.live,
            offsets: set.probe_offsets,
            custom: set.custom,
            verbose: set.verbose,
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
        let sites = module_sites(library, late.offsets, &late.custom)?;
        if sites.sites.is_empty() {
            return Ok(());
        }
        let index = late.next_index;
        late.next_index += 1;
        let (before, functions_before) = (self.uprobes.len(), self.functions.len());
        self.attach_module(
            &late.root,
            &late.programs,
            index,
            library,
            &sites,
            &[pid as i32],
            late.live,
        )?;
        if let Some(file) = late.files.get_mut(&identity) {
            file.events = self.uprobes[before..].iter().map(|e| e.id).collect();
        }
        if late.verbose {
            for function in &self.functions[functions_before..] {
                eprintln!("{}", describe(function));
            }
        }
        Ok(())
    }

    /// The probes of one module. Return probes first, so that no entry
    /// fires without its return; releases last: a free seen before its
    /// block's allocation would only count as unknown.
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
    ) -> Result<()> {
        // tracefs event names: letters, digits and underscores.
        let event_name = |site: &ProbeSite, suffix: &str| {
            let name: String = site
                .function
                .chars()
                .map(|c| if c.is_ascii_alphanumeric() { c } else { '_' })
                .take(40)
                .collect();
            format!("{name}_{index}{suffix}")
        };
        for site in sites.sites.iter().filter(|s| s.returns(live)) {
            let event = tracefs::UprobeEvent::create(
                root,
                &event_name(site, "_ret"),
                module,
                site.file_offset,
                true,
            )?;
            self.hook(&event, &programs.ret, 0, pids)?;
            self.uprobes.push(event);
        }
        // Allocators first, then (live mode) the functions releasing blocks.
        let (allocs, releases): (Vec<_>, Vec<_>) = sites
            .sites
            .iter()
            .map(|site| (site, entry_probe(site, sites, programs)))
            .partition(|(_, probe)| probe.role == "alloc");
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
            });
        }
        Ok(())
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

fn same_file(a: &Path, b: &Path) -> bool {
    a == b || file_identity(a) == file_identity(b)
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
