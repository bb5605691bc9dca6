//! Kernel side of a profile: load the BPF object, put uprobes on the
//! allocator functions, scope them to the target processes.
pub mod perf;
pub mod tracefs;

use std::os::fd::{AsFd as _, OwnedFd};

use anyhow::{Context as _, Result};
use aya::{
    programs::{TracePoint, UProbe},
    Ebpf, EbpfLoader,
};
use memprof_common::{
    allocators::{ALLOCATORS, FREE, MALLOC},
    LiveEntry, ProcHeap, ProcState, HEAP_SLOTS, NO_HEAP_SLOT,
};

use crate::target::libc::{library_sites, loader_site, Runtime};

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
    /// libraries they load go to the kernel (memprof started them).
    pub hold_for_tables: bool,
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
}

impl Probes {
    /// Puts entry probes (and return probes where calls may nest, or on
    /// all in live mode) on every allocator function of each C library,
    /// on free in live mode, and a probe where each loader announces
    /// loaded libraries; active in `pids` and their descendants only.
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
        };
        let (enter, malloc_enter, ret, free) = if set.empty_programs {
            ("noop_enter", "noop_enter", "noop_return", "noop_enter")
        } else {
            ("alloc_enter", "malloc_enter", "alloc_return", "free_enter")
        };
        let (enter, malloc_enter, ret, free) = (
            program_fd(ebpf, enter)?,
            program_fd(ebpf, malloc_enter)?,
            program_fd(ebpf, ret)?,
            program_fd(ebpf, free)?,
        );
        if let Some(function) = &set.bench_probe {
            let noop = program_fd(ebpf, "noop_enter")?;
            for runtime in runtimes {
                let library = &runtime.libc;
                let sites = library_sites(library, set.probe_offsets)?;
                let offset = if function == FREE {
                    sites.free(library)?
                } else {
                    sites
                        .allocators
                        .into_iter()
                        .find(|site| ALLOCATORS[site.allocator].name == function)
                        .with_context(|| format!("no {function} in {}", library.display()))?
                        .file_offset
                };
                let event = tracefs::UprobeEvent::create(&root, "bench", library, offset, false)?;
                probes.hook(&event, &noop, 0, pids)?;
                probes.uprobes.push(event);
            }
            return Ok(probes);
        }
        let on_libraries = program_fd(ebpf, "on_libraries")?;
        for (lib_index, runtime) in runtimes.iter().enumerate() {
            if let Some(loader) = &runtime.loader {
                if let Some(site) = loader_site(loader)? {
                    let name = format!("dl_debug_state_{lib_index}");
                    let event = tracefs::UprobeEvent::create(
                        &root,
                        &name,
                        loader,
                        site.file_offset,
                        false,
                    )?;
                    probes.hook(&event, &on_libraries, site.r_debug_delta as u64, pids)?;
                    probes.uprobes.push(event);
                }
            }
            let library = &runtime.libc;
            let all = library_sites(library, set.probe_offsets)?;
            let sites = &all.allocators;
            // Return probes first, so that no entry fires without its return.
            for site in sites
                .iter()
                .filter(|s| set.live || ALLOCATORS[s.allocator].may_nest)
            {
                let spec = &ALLOCATORS[site.allocator];
                let name = format!("{}_{lib_index}_ret", spec.name);
                let event =
                    tracefs::UprobeEvent::create(&root, &name, library, site.file_offset, true)?;
                probes.hook(&event, &ret, 0, pids)?;
                probes.uprobes.push(event);
            }
            for site in sites {
                let spec = &ALLOCATORS[site.allocator];
                let name = format!("{}_{lib_index}", spec.name);
                let event =
                    tracefs::UprobeEvent::create(&root, &name, library, site.file_offset, false)?;
                let cookie = spec.cookie(site.allocator).encode();
                let program = if site.allocator == MALLOC {
                    &malloc_enter
                } else {
                    &enter
                };
                probes.hook(&event, program, cookie, pids)?;
                probes.uprobes.push(event);
            }
            // After the allocators: a free seen before its block's
            // allocation would only count as unknown.
            if set.live {
                let offset = all.free(library)?;
                let name = format!("free_{lib_index}");
                let event = tracefs::UprobeEvent::create(&root, &name, library, offset, false)?;
                // Where the library's own code is, from the probe: frees it
                // makes of blocks it took without malloc are its own.
                let cookie = all.free_caller_range.map_or(0, |(from, to)| {
                    u64::from(from as u32) | u64::from(to as u32) << 32
                });
                probes.hook(&event, &free, cookie, pids)?;
                probes.uprobes.push(event);
            }
        }
        Ok(probes)
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
