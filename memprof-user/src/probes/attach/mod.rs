//! The allocator probes (`Probes`): what holds them in the kernel, what
//! was probed, and the settings they are attached with. Attaching them at
//! the start (`start`), on files loaded later (`late`) and for processes
//! watched later (`adopt`) is done in the submodules.
use std::{
    collections::{HashMap, HashSet},
    os::fd::{AsFd as _, OwnedFd},
    path::PathBuf,
};

use anyhow::Result;
use aya::{maps::MapData, programs::UProbe, Ebpf};

mod adopt;
mod events;
mod identity;
mod late;
mod link_closer;
mod plan;
mod reclaim;
mod sessions;
mod site_table;
mod start;

pub use events::has_kthreadd;
use sessions::Sessions;
use site_table::SiteTable;

use super::{program_mut, scopes::Scopes, tracefs, Mode};
use crate::discover::allocators::CustomFunction;

/// Attached uprobes, and what they probe. Dropping this detaches
/// everything.
///
/// The probes of a site group share one tracefs event for their entries
/// and one for their returns, whose programs find the site in the
/// kernel's site table (`memprof_common::dispatch`): detaching costs an
/// RCU grace period per event, one event after another.
pub struct Probes {
    attached: Attached,
    sites: SiteTable,
    /// What was probed, where.
    pub functions: Vec<ProbedFunction>,
    /// Targets with no allocator memprof knows: nothing of theirs counts.
    pub unprobed: Vec<Unprobed>,
    /// Files probed in part, and what their figures miss.
    pub partly_probed: Vec<Unprobed>,
    /// Allocator files a process loaded while it ran on (not held), which
    /// got their probes for it only then: its calls in between (after a
    /// dlopen, or an attach during its start, milliseconds) went unseen.
    /// Counted once per process and file (lost `probed_late`).
    pub probed_late: u64,
    /// A program's own USDT probes were placed (`--usdt`): its figures are
    /// its own estimates. Kept when their probes are freed (`reclaim`).
    pub usdt_placed: bool,
    /// What probing libraries loaded later needs.
    late: Option<LateProbes>,
    /// The events made at the start (their probes cover the targets'
    /// files): a process watched later is scoped onto them.
    start_events: Vec<u64>,
    /// `--usdt`: the events made at the start for the targets that sample
    /// their own allocations (their USDT probes and the loader's): a
    /// process watched later that cooperates is scoped onto these.
    start_usdt_events: Vec<u64>,
    /// The scope events of each process watched later (and under the
    /// budget, of every process), closed when it ends (a monitor runs for
    /// days).
    scopes: Scopes,
    /// `monitor` of the whole host: every event traps in every process
    /// (memprof's own calls are skipped in the kernel); under the budget,
    /// the allocators' events through the host's scope events (`scopes::HOST`).
    whole_host: bool,
    /// `monitor`: memprof's own program is never probed (see
    /// [`identity::is_own_executable`]).
    skips_own_program: bool,
    /// `--live` with sampling: session probes on the malloc-like
    /// functions.
    sessions: Option<Sessions>,
    /// The session groups made at the start (indices into
    /// `Sessions::groups`): a process watched later is linked to these.
    start_session_groups: Vec<usize>,
    /// The kernel's `STOP_WATCHERS`: parents seen to take a stop of their
    /// child's for their own (`stopped_parents`).
    stop_watchers: aya::maps::HashMap<MapData, u32, u8>,
    /// The kernel's `EXEC_PENDING`: announced processes not decided on.
    exec_pending: aya::maps::HashMap<MapData, u32, u8>,
}

/// What holds the probes in the kernel. The field order is the drop
/// order: what no group owns (session links and scope events, closed
/// with the rest at the end; the benchmarks' probe) goes before the
/// groups' tracefs events are removed (removal fails while an event is
/// open).
#[derive(Default)]
struct Attached {
    rest: GroupHold,
    /// Each site group's (freed with its file's: `reclaim`).
    groups: HashMap<u32, GroupHold>,
}

/// What holds one site group's probes in the kernel. The field order is
/// the drop order: links and perf events close before their tracefs
/// events are removed.
#[derive(Default)]
struct GroupHold {
    links: Vec<OwnedFd>,
    anchors: Vec<OwnedFd>,
    scopes: Vec<OwnedFd>,
    events: Vec<tracefs::UprobeEvent>,
    /// Its sites' file offsets (their entries in the kernel's table).
    offsets: Vec<u64>,
    /// Its USDT probes' indices in the kernel's spec table.
    usdt_specs: Vec<u32>,
}

impl GroupHold {
    fn add(&mut self, hooked: Hooked) {
        self.links.push(hooked.link);
        self.anchors.push(hooked.anchor);
        self.scopes.extend(hooked.scopes);
    }

    /// How many of its links, anchors, scope events and events it holds.
    fn len(&self) -> [usize; 4] {
        [
            self.links.len(),
            self.anchors.len(),
            self.scopes.len(),
            self.events.len(),
        ]
    }

    /// What it took since it held `len` goes: the perf events first (an
    /// event cannot be removed while they are open).
    fn truncate(&mut self, [links, anchors, scopes, events]: [usize; 4]) {
        self.links.truncate(links);
        self.anchors.truncate(anchors);
        self.scopes.truncate(scopes);
        self.events.truncate(events);
    }
}

/// A BPF program on a uprobe event: the link, the event's anchor, and the
/// scope events of the processes it traps in from the start.
struct Hooked {
    link: OwnedFd,
    anchor: OwnedFd,
    scopes: Vec<OwnedFd>,
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
    /// Which of a file's sites are probed.
    choice: plan::SiteChoice,
    /// `--usdt`.
    usdt: bool,
    /// Session probes on the malloc-like functions.
    session: bool,
    /// Every file looked at, by device and inode.
    files: HashMap<(u64, u64), FileProbes>,
    /// Files whose probes found the site table full: how many reclaims
    /// had freed groups then (tried again after the next), and the path
    /// listed as unprobed.
    full: HashMap<(u64, u64), (u64, String)>,
}

struct FileProbes {
    /// Its probes' tracefs event ids (none: no allocator there), but for
    /// session groups' return events and the entry events made late for
    /// processes whose main thread has ended.
    events: Vec<u64>,
    /// Its site groups (freed when no process maps it: `reclaim`).
    groups: Vec<u32>,
    /// The path its probes were placed through, and its path in the
    /// processes' maps.
    module: PathBuf,
    name: String,
    /// Its session groups (indices into `Sessions::groups`).
    session_groups: Vec<usize>,
    /// The processes they are scoped to (and their children forked since);
    /// None for the files probed at the start, scoped to the targets.
    scoped: Option<HashSet<u32>>,
}

impl FileProbes {
    /// A file of the targets at the start, scoped to them.
    fn at_start() -> FileProbes {
        FileProbes {
            events: Vec::new(),
            groups: Vec::new(),
            module: PathBuf::new(),
            name: String::new(),
            session_groups: Vec::new(),
            scoped: None,
        }
    }
}

/// A target in which memprof found nothing to probe.
#[derive(Clone, Debug)]
pub struct Unprobed {
    pub program: String,
    pub reason: String,
    /// Listed because none of its files had an allocator (not because
    /// probing failed): a library it loads later may have one.
    pub no_allocator: bool,
}

/// Which probes to attach.
#[derive(Debug)]
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
    /// CPython's allocators (`--no-python-allocators` turns them off).
    pub python_allocators: bool,
    /// Which kind of profile: on the whole host probes trap in every
    /// process; `monitor` never probes memprof's own program (memprof
    /// stands in for processes to come; its helpers run it), may find a
    /// function named (`--while`, `--alloc-fn`...) in the files of
    /// processes that start later, and under its budget each process's
    /// probes may be turned off and on (no process is an anchor's; see
    /// `Scopes`).
    pub mode: Mode,
    /// `--usdt`: the allocation-sampling USDT probes of programs that have
    /// them, instead of the allocators' entry points.
    pub usdt: bool,
    /// `--live` with sampling, where the kernel has session uprobes: the
    /// program their links run (`probes::load_session_program`).
    pub session_program: Option<OwnedFd>,
    /// `trace` with session probes: a process a profiled one forks waits,
    /// stopped, until it has session links of its own (`fork_hold`),
    /// where the kernel allows (6.13 and later).
    pub hold_forks: bool,
    /// Tests: the site groups memprof may use (default: all).
    pub site_groups: Option<u32>,
    /// Tests: the USDT probes' specs memprof may use (default: all).
    pub usdt_specs: Option<u32>,
}

impl ProbeSet {
    fn site_choice(&self) -> plan::SiteChoice {
        plan::SiteChoice {
            mappings: self.mappings,
            python: self.python_allocators,
            live: self.live,
        }
    }
}

/// One function memprof put a probe on (`--verbose`, and the report).
#[derive(Clone, Debug)]
pub struct ProbedFunction {
    pub module: PathBuf,
    /// The module's file name as processes' maps show it: symlinks
    /// resolved (the loader names `libtcmalloc.so.4` what maps show as
    /// `libtcmalloc.so.4.5.10`).
    pub file_name: String,
    pub function: String,
    /// "alloc", "free", "release", "mapping" or "region" (--while).
    pub role: &'static str,
    /// How reports name an allocator's calls.
    pub allocator: Option<&'static str>,
    pub file_offset: u64,
    /// The function's code, and that of the functions it tail-calls, as
    /// file offsets [start, end).
    pub code: Vec<(u64, u64)>,
}

/// The BPF programs on the shared events: the dispatchers, or (benchmarks'
/// floor) programs that do nothing.
struct Programs {
    enter: OwnedFd,
    ret: OwnedFd,
    /// At the entries of session groups (see `Sessions`), if any.
    session_enter: Option<OwnedFd>,
}

impl Programs {
    fn of(ebpf: &mut Ebpf, empty: bool, session: bool) -> Result<Programs> {
        let (enter, ret) = if empty {
            ("noop_enter", "noop_return")
        } else {
            ("site_enter", "site_return")
        };
        Ok(Programs {
            enter: program_fd(ebpf, enter)?,
            ret: program_fd(ebpf, ret)?,
            session_enter: match session {
                true => Some(program_fd(ebpf, "session_group_enter")?),
                false => None,
            },
        })
    }
}

impl Probes {
    /// The processes' scope events, to turn their probes off and on
    /// (`monitor`'s budget).
    pub fn scopes(&mut self) -> &mut Scopes {
        &mut self.scopes
    }

    /// Starts detaching everything on a thread of its own, keeping what
    /// was probed (the report lists it); join the thread before exiting.
    /// The last perf event of each tracefs event to close waits for an RCU
    /// grace period (~88 ms here), one event after another, so the report
    /// is made meanwhile.
    pub fn start_detach(&mut self) -> std::thread::JoinHandle<()> {
        self.late = None;
        // Closed with the rest, before the events are removed.
        let scopes = self.scopes.take_all();
        self.attached.rest.scopes.extend(scopes);
        if let Some(sessions) = self.sessions.as_mut() {
            sessions.stop_holding();
            // Many at once (each of `trace`'s children has links).
            sessions.close_all_links();
        }
        let attached = std::mem::take(&mut self.attached);
        std::thread::spawn(move || drop(attached))
    }
}

/// A copy of the fd of uprobe program `name`.
fn program_fd(ebpf: &mut Ebpf, name: &str) -> Result<OwnedFd> {
    let program: &mut UProbe = program_mut(ebpf, name)?;
    Ok(program.fd()?.as_fd().try_clone_to_owned()?)
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
