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
    LiveEntry, ProcState,
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
}

#[derive(Clone, Copy, Debug)]
pub struct LiveSettings {
    pub max_live: u32,
    pub temp_threshold_ns: u64,
}

/// Loads the BPF programs and maps (nothing attached yet).
pub fn load(settings: &Settings) -> Result<Ebpf> {
    // The sched tracepoints below and the uprobe events need tracefs.
    tracefs::tracefs_root()?;
    let live_mode: u8 = settings.live.is_some().into();
    let (max_live, temp_threshold_ns) = settings.live.map_or((1, 0), |live| {
        (live.max_live.max(1), live.temp_threshold_ns)
    });
    let live_slots = LiveEntry::table_slots(max_live);
    // Live mode keeps each site's stats under an id (up to --max-stacks
    // sites; more go to COUNTS).
    let site_ids = if settings.live.is_some() {
        settings.max_stacks
    } else {
        1
    };
    let mut ebpf = EbpfLoader::new()
        .map_max_entries("COUNTS", settings.max_stacks)
        .map_max_entries("STACKS", settings.stack_map_size)
        .map_max_entries("LIVE", live_slots)
        .map_max_entries("SITE_IDS", site_ids)
        .map_max_entries("SITE_STATS", site_ids)
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
        program
            .load()
            .with_context(|| format!("loading BPF program {name}"))?;
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
/// later get a generation from the clock).
pub fn register_targets(ebpf: &mut Ebpf, pids: &[i32]) -> Result<()> {
    let mut procs: aya::maps::HashMap<&mut aya::maps::MapData, u32, ProcState> =
        aya::maps::HashMap::try_from(ebpf.map_mut("PROCS").context("map PROCS")?)?;
    for &pid in pids {
        let state = ProcState {
            generation: 0,
            announced: 0,
        };
        procs
            .insert(pid as u32, state, 0)
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
                probes.hook(&event, &free, 0, pids)?;
                probes.uprobes.push(event);
            }
        }
        Ok(probes)
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

fn program_fd(ebpf: &mut Ebpf, name: &str) -> Result<OwnedFd> {
    let program: &mut UProbe = program_mut(ebpf, name)?;
    Ok(program.fd()?.as_fd().try_clone_to_owned()?)
}
