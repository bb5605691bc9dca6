//! Kernel side of a profile: load the BPF object (here), put uprobes on
//! the allocator functions and scope them to the target processes
//! (`attach`).
mod attach;
pub(crate) mod bpf_call;
mod fork_hold;
mod kernel_types;
pub mod mode;
pub mod perf;
mod preemption;
mod scopes;
mod session_link;
pub mod stopped_parents;
pub mod tracefs;
pub mod watchdog;

use std::os::fd::AsFd as _;

use anyhow::{Context as _, Result};
pub use attach::{describe, has_kthreadd, ProbeSet, ProbedFunction, Probes, Unprobed};
use aya::{
    maps::{Map, MapData, ProgramArray},
    programs::{RawTracePoint, UProbe},
    Ebpf, EbpfLoader,
};
use memprof_common::{
    dispatch::{entry, ret},
    images::ProcState,
    live::{LiveEntry, ProcHeap, HEAP_SLOTS, NO_HEAP_SLOT},
    settings::{Gating, UnwindMode},
};
pub use mode::Mode;
pub use scopes::Scopes;

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
    /// Which kind of profile: whether processes may wait for their tables
    /// (`trace`), which execs are announced, whose probes the budget
    /// gates, whether ended processes are evicted (`monitor`).
    pub mode: Mode,
    /// Direct mappings are counted (their programs are loaded).
    pub mappings: bool,
    /// `--while`: only calls inside these functions are recorded.
    pub regions: bool,
    /// `--delay`, `--start-on`: recording starts paused.
    pub start_paused: bool,
    /// Some calls may go unrecorded (--while, --delay, --start-on,
    /// --toggle-on): frees of unknown blocks are not counted.
    pub recording_limited: bool,
    /// Processes profiled at once (`--max-processes`).
    pub max_processes: u32,
    /// `--usdt`: the programs for USDT probes are loaded, and counts are
    /// kept in sampling units.
    pub usdt: bool,
    /// `--live` with sampling: session uprobes on the malloc-like
    /// functions (see `session_link`), where the kernel has them.
    pub session: SessionProbes,
}

impl Settings {
    /// `trace` of a static program with unwind tables: it waits at its
    /// exec instead (no loader announces its code).
    fn holds_at_exec(&self) -> bool {
        matches!(
            self.mode,
            Mode::Trace {
                static_program: true
            }
        ) && self.unwind_rows.is_some()
    }

    /// `monitor` of the whole host: the probes cover every process, and
    /// memprof's own calls are skipped.
    fn ignored_tgid(&self) -> u32 {
        match self.mode.whole_host() {
            true => std::process::id(),
            false => 0,
        }
    }
}

/// Where session uprobes carry the malloc-like functions' probes.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum SessionProbes {
    /// Nowhere: every call of theirs has a return probe in live mode.
    Off,
    /// A link per profiled process (and file); its children get the
    /// shared events' return probes after their `Forked` notice.
    Scoped,
    /// One link per file for every process (`monitor` of the whole host).
    WholeHost,
}

impl SessionProbes {
    /// Session probes for a `--live` profile sampling every
    /// `sample_bytes`, where this kernel has them (6.13 and later).
    pub fn for_profile(live: bool, sample_bytes: u64, whole_host: bool) -> SessionProbes {
        if !live || sample_bytes == 0 || !session_link::supported() {
            return SessionProbes::Off;
        }
        match whole_host {
            true => SessionProbes::WholeHost,
            false => SessionProbes::Scoped,
        }
    }
}

/// Loads `alloc_session` as a session-uprobe program (before any map is
/// taken out of `ebpf`).
pub fn load_session_program(ebpf: &Ebpf) -> Result<std::os::fd::OwnedFd> {
    session_link::load_programs(BPF_OBJECT, ebpf, "alloc_enter")
}

/// Processes profiled at once unless `monitor --max-processes` says.
pub const MAX_PROCESSES: u32 = 16384;

/// Processes whose mappings the kernel keeps for `--unwind dwarf` at once
/// (8 KiB each, allocated as they come).
pub const UNWIND_PROCESSES: u32 = 4096;

#[derive(Clone, Copy, Debug)]
pub struct LiveSettings {
    pub max_live: u32,
    pub temp_threshold_ns: u64,
    /// Tests: the pointer table's slots instead of
    /// `LiveEntry::table_slots(max_live)` (a small table sends blocks to
    /// the overflow map).
    pub slots: Option<u32>,
    /// Tests: the heaps' slots instead of `HEAP_SLOTS`.
    pub heap_slots: Option<u32>,
}

/// Loads the BPF programs and maps (nothing attached yet).
pub fn load(settings: &Settings) -> Result<Ebpf> {
    // The uprobe events need tracefs.
    tracefs::tracefs_root()?;
    warn_if_preempting();
    let layout = Layout::of(settings);
    let mut ebpf = load_object(settings, &layout)?;
    let programs = programs_of(settings);
    verify_programs(&mut ebpf, &programs, settings.live.is_some())?;
    fill_program_arrays(&mut ebpf, &programs)?;
    if settings.start_paused {
        set_paused(&mut ebpf, true)?;
    }
    attach_tracepoints(&mut ebpf)?;
    Ok(ebpf)
}

/// Warns where the kernel preempts kernel code: memprof's per-CPU
/// figures may then mix (docs/decisions/0004-per-cpu-scratch-and-preemption.md).
/// Loads the BPF object and verifies the programs `settings` run, then
/// drops them: what `memprof doctor` checks. Nothing is attached, tracefs
/// is not touched.
pub fn verify_only(settings: &Settings) -> Result<()> {
    let layout = Layout::of(settings);
    let mut ebpf = load_object(settings, &layout)?;
    verify_programs(&mut ebpf, &programs_of(settings), settings.live.is_some())
}

/// The preemption model, where it lets the kernel preempt memprof's
/// programs (see `preemption`).
pub fn preempting_model() -> Option<String> {
    preemption::preempting_model()
}

/// Whether this kernel has session uprobes (6.13 and later).
pub fn has_session_uprobes() -> bool {
    session_link::supported()
}

fn warn_if_preempting() {
    if let Some(model) = preemption::preempting_model() {
        eprintln!(
            "memprof: warning: this kernel preempts kernel code ({model} preemption): memprof's \
             programs may then interleave on a CPU, and a call's figures mix with another's \
             (rarely; exact on preempt=none or voluntary, see docs/decisions/0004-per-cpu-scratch-and-preemption.md)"
        );
    }
}

/// The sizes of the object's maps the settings decide, and the globals
/// that go with them.
struct Layout {
    live_mode: u8,
    max_live: u32,
    temp_threshold_ns: u64,
    live_slots: u32,
    site_ids: u32,
    heap_slots: u32,
    unwind_mode: u8,
    unwind_rows: u32,
    unwind_processes: u32,
    live_only: u32,
    budget_entries: u32,
    sessions_only: u32,
}

impl Layout {
    fn of(settings: &Settings) -> Layout {
        let live_mode: u8 = settings.live.is_some().into();
        let (max_live, temp_threshold_ns) = settings.live.map_or((1, 0), |live| {
            (live.max_live.max(1), live.temp_threshold_ns)
        });
        let live_slots = match settings.live.and_then(|live| live.slots) {
            Some(slots) => slots.clamp(1, 1 << 31).next_power_of_two(),
            None => LiveEntry::table_slots(max_live),
        };
        // Live mode keeps each site's stats under an id (the first
        // LIVE_SITE_IDS sites, at most --max-stacks; more go to COUNTS).
        let site_ids = if settings.live.is_some() {
            settings.max_stacks.min(LIVE_SITE_IDS)
        } else {
            1
        };
        // Live mode keeps each process image's heap exact, in a slot of its own.
        let heap_slots = match settings.live {
            Some(live) => live.heap_slots.map_or(HEAP_SLOTS, |slots| {
                slots.clamp(1, HEAP_SLOTS).next_power_of_two()
            }),
            None => 1,
        };
        let (unwind_mode, unwind_rows, unwind_processes) = match settings.unwind_rows {
            Some(rows) => (UnwindMode::Dwarf as u8, rows, UNWIND_PROCESSES),
            None => (UnwindMode::FramePointers as u8, 1, 1),
        };
        // Maps only live mode uses; sized down otherwise (preallocated).
        let live_only = if settings.live.is_some() { 4096 } else { 1 };
        // Maps only the budget uses: a process each.
        let budget_entries = match settings.mode.gating() {
            Gating::Off => 1,
            Gating::Processes | Gating::Host => settings.max_processes,
        };
        let sessions_only = match settings.session {
            SessionProbes::Scoped => settings.max_processes,
            _ => 1,
        };
        Layout {
            live_mode,
            max_live,
            temp_threshold_ns,
            live_slots,
            site_ids,
            heap_slots,
            unwind_mode,
            unwind_rows,
            unwind_processes,
            live_only,
            budget_entries,
            sessions_only,
        }
    }
}

/// Loads the BPF object, its maps sized and its globals set (no program
/// loaded yet).
fn load_object(settings: &Settings, layout: &Layout) -> Result<Ebpf> {
    let offsets = kernel_types::KernelOffsets::of_running_kernel()?;
    // The values a per-CPU map has, which the kernel sums at an exec.
    let possible_cpus = aya::util::nr_cpus().map_err(|(_, e)| e)? as u32;
    let ebpf = size_maps(&mut EbpfLoader::new(), settings, layout)
        .override_global("UNWIND_MODE", &layout.unwind_mode, true)
        .override_global(
            "HOLD_FOR_TABLES",
            &u8::from(settings.mode.starts_processes()),
            true,
        )
        .override_global("HOLD_AT_EXEC", &u8::from(settings.holds_at_exec()), true)
        .override_global("HEAP_SLOT_MASK", &(layout.heap_slots - 1), true)
        .override_global("SITE_ID_COUNT", &layout.site_ids, true)
        .override_global("LIVE_MODE", &layout.live_mode, true)
        .override_global("TEMP_THRESHOLD_NS", &layout.temp_threshold_ns, true)
        .override_global("LIVE_SLOT_MASK", &(layout.live_slots - 1), true)
        .override_global("MAX_LIVE", &u64::from(layout.max_live), true)
        .override_global("SAMPLE_BYTES", &settings.sample_bytes, true)
        .override_global("REGION_MODE", &u8::from(settings.regions), true)
        .override_global(
            "RECORDING_LIMITED",
            &u8::from(settings.recording_limited || settings.mode.budget()),
            true,
        )
        .override_global("GATING", &(settings.mode.gating() as u8), true)
        .override_global("COUNT_CALLS", &u8::from(settings.mode.budget()), true)
        .override_global("POSSIBLE_CPUS", &possible_cpus, true)
        .override_global(
            "SESSION_SCOPED",
            &u8::from(settings.session == SessionProbes::Scoped),
            true,
        )
        .override_global("WATCH_EXECS", &(settings.mode.watch_execs() as u8), true)
        .override_global("IGNORED_TGID", &settings.ignored_tgid(), true)
        .override_global("UNIT_COUNTS", &u8::from(settings.usdt), true)
        .override_global(
            "SITE_SLOTS_OFF",
            &u8::from(settings.mode.is_monitor()),
            true,
        )
        .override_global("TASK_PID_OFFSET", &offsets.task_pid, true)
        .override_global("TASK_TGID_OFFSET", &offsets.task_tgid, true)
        .override_global("BPRM_FILENAME_OFFSET", &offsets.bprm_filename, true)
        .override_global("TASK_SIGNAL_OFFSET", &offsets.task_signal, true)
        .override_global("SIGNAL_LIVE_OFFSET", &offsets.signal_live, true)
        .override_global("TASK_RUNTIME_OFFSET", &offsets.task_runtime, true)
        .override_global("SIGNAL_RUNTIME_OFFSET", &offsets.signal_runtime, true)
        .override_global("TASK_PARENT_OFFSET", &offsets.task_parent, true)
        .override_global("TASK_STATE_OFFSET", &offsets.task_state, true)
        .override_global("SIGNAL_PGRP_OFFSET", &offsets.signal_pgrp, true)
        .override_global("SIGNAL_WAITERS_OFFSET", &offsets.signal_waiters, true)
        .override_global(
            "WAITER_FLAGS_FROM_NODE",
            &(offsets.waiter_flags_from_node as u32),
            true,
        )
        // THREADS is task storage, which aya cannot read from user space;
        // only the BPF programs use it.
        .allow_unsupported_maps()
        .load(BPF_OBJECT)
        .context("loading the BPF object")?;
    Ok(ebpf)
}

/// Sizes the object's maps, as `settings` and `layout` say.
fn size_maps<'l, 'a>(
    loader: &'l mut EbpfLoader<'a>,
    settings: &Settings,
    layout: &Layout,
) -> &'l mut EbpfLoader<'a> {
    loader
        .map_max_entries("UNKNOWN_FREES", layout.live_only)
        .map_max_entries("INTERNAL_FREES", layout.live_only)
        .map_max_entries("UNWIND_ROWS", layout.unwind_rows)
        .map_max_entries("UNWIND_MAPS", layout.unwind_processes)
        .map_max_entries("COUNTS", settings.max_stacks)
        .map_max_entries("STACKS", settings.stack_map_size)
        .map_max_entries("LIVE", layout.live_slots)
        // Room for every block --max-live admits (preallocated).
        .map_max_entries("LIVE_OVERFLOW", layout.max_live)
        .map_max_entries("SITE_IDS", layout.site_ids)
        .map_max_entries("SITE_STATS", layout.site_ids)
        .map_max_entries("HEAPS", layout.heap_slots)
        .map_max_entries("CALLS", layout.budget_entries)
        .map_max_entries("EXEC_CALLS", layout.budget_entries)
        .map_max_entries("GATED_OUT", layout.budget_entries)
        .map_max_entries("ALLOWANCES", layout.budget_entries)
        .map_max_entries("LINKED", layout.sessions_only)
        .map_max_entries("RETURNING", layout.sessions_only)
        .map_max_entries("PROCS", settings.max_processes)
        .map_max_entries("TREES", settings.max_processes)
}

/// The programs the mode runs (only those: each costs the verifier time).
fn programs_of(settings: &Settings) -> Vec<&'static str> {
    let mut programs = vec![
        "site_enter",
        "site_return",
        "alloc_enter",
        "on_libraries",
        "noop_enter",
        "noop_return",
    ];
    if settings.live.is_some() {
        programs.extend(["release_enter", "alloc_unreturned"]);
    } else {
        // Go's heap is not followed live (see `discover::go`).
        programs.push("go_alloc_enter");
    }
    if settings.session == SessionProbes::Scoped {
        programs.extend(["session_group_enter"]);
    }
    if settings.mappings {
        programs.extend(["mapping_enter", "mapping_return"]);
    }
    if settings.regions {
        programs.extend(["region_enter", "region_return"]);
    }
    if settings.usdt {
        programs.extend(["usdt_alloc", "usdt_free"]);
    }
    programs
}

/// Loads `programs` (the kernel verifies each) on two threads. `live`:
/// live mode's, whose `alloc_enter` takes longer.
fn verify_programs(ebpf: &mut Ebpf, programs: &[&str], live: bool) -> Result<()> {
    // Verifying them takes most of the start: two threads, about half the
    // work each by measured times (2 cores here: ~130 ms one after the
    // other). Live mode's `alloc_enter` takes half again as long.
    let first_half: &[&str] = if live {
        &["alloc_enter", "site_return", "release_enter"]
    } else {
        &["site_enter", "alloc_enter"]
    };
    let (largest, rest): (Vec<_>, Vec<_>) = ebpf
        .programs_mut()
        .filter(|(name, _)| programs.contains(name))
        .partition(|(name, _)| first_half.contains(name));
    std::thread::scope(|scope| {
        let other = scope.spawn(move || load_programs(rest));
        let here = load_programs(largest);
        other
            .join()
            .unwrap_or_else(|_| Err(anyhow::anyhow!("loading BPF programs: a thread panicked")))
            .and(here)
    })
}

/// Loads the raw tracepoint programs and attaches them: raw ones, as
/// closing a classic tracepoint's perf event waits for an RCU grace
/// period (see `kernel_types`).
fn attach_tracepoints(ebpf: &mut Ebpf) -> Result<()> {
    for (name, event) in [
        ("on_exec", "sched_process_exec"),
        ("on_fork", "sched_process_fork"),
        ("on_exit", "sched_process_exit"),
    ] {
        let program: &mut RawTracePoint = program_mut(ebpf, name)?;
        program
            .load()
            .with_context(|| format!("loading BPF program {name}"))?;
        program
            .attach(event)
            .with_context(|| format!("attaching {name} to raw tracepoint {event}"))?;
    }
    Ok(())
}

/// Loads (the kernel verifies) each of `programs`, uprobe programs all.
fn load_programs(programs: Vec<(&str, &mut aya::programs::Program)>) -> Result<()> {
    for (name, program) in programs {
        let program: &mut UProbe = program.try_into()?;
        let started = std::time::Instant::now();
        program
            .load()
            .with_context(|| format!("loading BPF program {name}"))?;
        if std::env::var_os("MEMPROF_LOAD_TIMES").is_some() {
            eprintln!("memprof: loaded {name} in {:?}", started.elapsed());
        }
    }
    Ok(())
}

/// The programs the shared events' `site_enter`/`site_return` tail-call,
/// by `SiteEntry::entry`/`ret` (see `memprof_common::dispatch`), of those
/// `loaded`. The arrays stay in `ebpf`: the kernel empties a program array
/// when user space closes its last fd.
fn fill_program_arrays(ebpf: &mut Ebpf, loaded: &[&str]) -> Result<()> {
    let tables: [(&str, &[(u32, &str)]); 2] = [
        (
            "ENTRY_PROGRAMS",
            &[
                (entry::ALLOC, "alloc_enter"),
                (entry::RELEASE, "release_enter"),
                (entry::MAPPING, "mapping_enter"),
                (entry::LOADER, "on_libraries"),
                (entry::REGION, "region_enter"),
                (entry::USDT_ALLOC, "usdt_alloc"),
                (entry::USDT_FREE, "usdt_free"),
                (entry::UNRETURNED, "alloc_unreturned"),
                (entry::GO_ALLOC, "go_alloc_enter"),
            ],
        ),
        (
            "RETURN_PROGRAMS",
            &[
                (ret::MAPPING, "mapping_return"),
                (ret::REGION, "region_return"),
            ],
        ),
    ];
    for (array, programs) in tables {
        let mut fds = Vec::new();
        for &(index, name) in programs.iter().filter(|(_, name)| loaded.contains(name)) {
            let program: &mut UProbe = program_mut(ebpf, name)?;
            fds.push((index - 1, program.fd()?.try_clone()?));
        }
        let mut map: ProgramArray<&mut MapData> = ProgramArray::try_from(
            ebpf.map_mut(array)
                .with_context(|| format!("map {array}"))?,
        )?;
        for (index, fd) in &fds {
            map.set(*index, fd, 0)
                .with_context(|| format!("map {array}"))?;
        }
    }
    Ok(())
}

/// Pauses or resumes recording (`--delay`, `--start-on`, `--toggle-on`):
/// calls made while paused are not recorded.
pub fn set_paused(ebpf: &mut Ebpf, paused: bool) -> Result<()> {
    let mut map: aya::maps::Array<&mut MapData, u32> =
        aya::maps::Array::try_from(ebpf.map_mut("PAUSED").context("map PAUSED")?)?;
    map.set(0, u32::from(paused), 0).context("map PAUSED")
}

pub(crate) fn program_mut<'a, T>(ebpf: &'a mut Ebpf, name: &str) -> Result<&'a mut T>
where
    &'a mut T: TryFrom<&'a mut aya::programs::Program, Error = aya::programs::ProgramError>,
{
    let program = ebpf
        .program_mut(name)
        .with_context(|| format!("BPF program {name} missing from the object"))?;
    Ok(program.try_into()?)
}

/// Sites that keep their live stats in a per-CPU slot of their own
/// (`site_ids` in the BPF object); the kernel allocates each slot per CPU
/// at load, which took 98 ms of every `--live` start at 65,536 slots, 33
/// ms at 16,384.
/// Sites beyond these count in `COUNTS`, a hash lookup more per call.
pub const LIVE_SITE_IDS: u32 = 4096;

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
        if index as u32 >= heaps.len() {
            return Ok(NO_HEAP_SLOT);
        }
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
            heap_slot: heap_slot(index, pid)?,
            ..ProcState::default()
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

/// A second handle on one of the object's maps (a duplicated fd).
pub fn own_handle(ebpf: &Ebpf, name: &str) -> Result<Map> {
    let map = ebpf.map(name).with_context(|| format!("map {name}"))?;
    let copy = |data: &MapData| -> Result<MapData> {
        let fd = data.fd().as_fd().try_clone_to_owned()?;
        Ok(MapData::from_fd(fd)?)
    };
    Ok(match map {
        Map::PerCpuHashMap(data) => Map::PerCpuHashMap(copy(data)?),
        Map::HashMap(data) => Map::HashMap(copy(data)?),
        Map::PerCpuArray(data) => Map::PerCpuArray(copy(data)?),
        Map::Array(data) => Map::Array(copy(data)?),
        _ => anyhow::bail!("map {name}: unexpected type"),
    })
}
