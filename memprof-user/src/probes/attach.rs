//! Attaching the allocator probes: which functions of which files, with
//! which BPF program and cookie, scoped to which processes; and the
//! libraries loaded later (`Probes::on_library`).
use std::{
    collections::{HashMap, HashSet},
    os::fd::{AsFd as _, OwnedFd},
    path::{Path, PathBuf},
};

use anyhow::{bail, Context as _, Result};
use aya::{
    maps::{Array, MapData},
    programs::UProbe,
    Ebpf,
};
use memprof_common::{dispatch::SITE_GROUPS, usdt::USDT_SPECS};

mod link_closer;
mod plan;
mod reclaim;
mod sessions;
mod site_table;

use link_closer::LinkCloser;
use plan::{
    check_named_functions, session_groups, site_groups, unprobed_targets, with_mappings, Planned,
};
use sessions::Sessions;
use site_table::{SiteTable, TableFull};

use super::{fork_hold::ForkHold, perf, program_mut, scopes::Scopes, tracefs};
use crate::{
    discover::{
        allocators::{loader_site, module_sites, CustomFunction, Runtime},
        usdt::{usdt_sites, UsdtSite},
    },
    host::files,
    human::error::UserError,
};

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
    /// [`is_own_executable`]).
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
    mappings: bool,
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
#[derive(Debug, Default)]
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
    /// `monitor` of the whole host: probes trap in every process.
    pub whole_host: bool,
    /// `monitor`: memprof's own program is never probed (memprof stands
    /// in for processes to come; its helpers run it).
    pub skips_own_program: bool,
    /// `monitor` selecting processes as they start: a function named
    /// (`--while`, `--alloc-fn`...) may be in their files alone.
    pub watches_later: bool,
    /// `monitor`'s budget: each process's probes may be turned off and
    /// on (no process is an anchor's; see `Scopes`).
    pub switchable: bool,
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
        let table = ebpf.take_map("SITE_TABLE").context("map SITE_TABLE")?;
        let specs = ebpf.take_map("USDT_SPECS").context("map USDT_SPECS")?;
        let mut probes = Probes {
            attached: Attached::default(),
            sites: SiteTable {
                map: Array::try_from(table)?,
                next_group: 0,
                limit: set.site_groups.unwrap_or(SITE_GROUPS).min(SITE_GROUPS),
                free: Vec::new(),
                placed: Vec::new(),
                reclaims: 0,
                freed_files: 0,
                usdt_specs: Array::try_from(specs)?,
                next_spec: 0,
                spec_limit: set.usdt_specs.unwrap_or(USDT_SPECS).min(USDT_SPECS),
                free_specs: Vec::new(),
            },
            functions: Vec::new(),
            unprobed: Vec::new(),
            probed_late: 0,
            usdt_placed: false,
            late: None,
            start_events: Vec::new(),
            start_usdt_events: Vec::new(),
            sessions: None,
            start_session_groups: Vec::new(),
            scopes: Scopes::new(
                aya::maps::HashMap::try_from(ebpf.take_map("TREES").context("map TREES")?)?,
                match set.switchable {
                    true => Some((
                        aya::maps::HashMap::try_from(
                            ebpf.take_map("GATED_OUT").context("map GATED_OUT")?,
                        )?,
                        Array::try_from(ebpf.take_map("PROBE_EPOCH").context("map PROBE_EPOCH")?)?,
                    )),
                    false => None,
                },
            ),
            whole_host: set.whole_host,
            skips_own_program: set.skips_own_program,
            exec_pending: aya::maps::HashMap::try_from(
                ebpf.take_map("EXEC_PENDING").context("map EXEC_PENDING")?,
            )?,
            stop_watchers: aya::maps::HashMap::try_from(
                ebpf.take_map("STOP_WATCHERS")
                    .context("map STOP_WATCHERS")?,
            )?,
        };
        let session = set.session_program.is_some();
        let programs = Programs::of(ebpf, set.empty_programs, session && !set.whole_host)?;
        if let Some(program) = set.session_program {
            let fork_hold = match set.hold_forks && !set.whole_host {
                true => match ForkHold::attach(ebpf) {
                    Ok(hold) => Some(hold),
                    Err(err) => {
                        if set.verbose {
                            eprintln!(
                                "memprof: children are probed through their parent's events: {err:#}"
                            );
                        }
                        None
                    }
                },
                false => None,
            };
            probes.sessions = Some(Sessions {
                fork_hold,
                unlinked_forks: 0,
                closer: LinkCloser::new(),
                program,
                whole_host: set.whole_host,
                groups: Vec::new(),
                roots: pids.iter().map(|&pid| pid as u32).collect(),
                links: HashMap::new(),
                linked: aya::maps::HashMap::try_from(
                    ebpf.take_map("LINKED").context("map LINKED")?,
                )?,
                returning: aya::maps::HashMap::try_from(
                    ebpf.take_map("RETURNING").context("map RETURNING")?,
                )?,
            });
        }
        let mut modules = distinct_files(runtimes.iter().flat_map(|r| r.modules.iter()));
        if set.skips_own_program {
            modules.retain(|module| !is_own_executable(files::inode(module).unwrap_or_default()));
        }
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
        check_named_functions(&set.custom, &modules, &found, set.watches_later)?;
        if let Some(function) = &set.bench_probe {
            let noop = program_fd(ebpf, "noop_enter")?;
            let (module, site) = found
                .iter()
                .flat_map(|(module, sites)| sites.sites.iter().map(move |s| (module, s)))
                .find(|(_, site)| site.function == *function)
                .with_context(|| format!("no {function} in the target's modules"))?;
            let event = tracefs::UprobeEvent::create(
                &root,
                "bench",
                module,
                (site.file_offset, None),
                false,
            )?;
            let hooked = probes.hook(&event, &noop, 0, pids, false)?;
            probes.attached.rest.add(hooked);
            probes.attached.rest.events.push(event);
            return Ok(probes);
        }
        let loaders = distinct_files(runtimes.iter().filter_map(|r| r.loader.as_ref()));
        let mut loader_sites = Vec::new();
        for loader in &loaders {
            if let Some(site) = loader_site(loader)? {
                loader_sites.push((files::inode(loader).unwrap_or_default(), loader, site));
            }
        }
        // --usdt: a target that samples its own allocations (a module with
        // the contract's `alloc` probe) is profiled through its probes,
        // instead of the allocators' entry points, which it then never
        // traps on. With no target named yet (monitor), both are probed.
        let usdt: Vec<(PathBuf, Vec<UsdtSite>)> = match set.usdt {
            true => modules
                .iter()
                .filter_map(|m| Some((m.clone(), usdt_sites(m).ok().filter(|s| !s.is_empty())?)))
                .collect(),
            false => Vec::new(),
        };
        let usdt_files: HashSet<(u64, u64)> = usdt
            .iter()
            .filter(|(_, sites)| sites.iter().any(UsdtSite::is_alloc))
            .map(|(module, _)| files::inode(module).unwrap_or_default())
            .collect();
        let cooperates = |runtime: &Runtime| {
            runtime
                .modules
                .iter()
                .any(|m| usdt_files.contains(&files::inode(m).unwrap_or_default()))
        };
        let paired = !pids.is_empty() && runtimes.len() == pids.len();
        let (coop, other): (Vec<_>, Vec<_>) = runtimes
            .iter()
            .zip(
                pids.iter()
                    .copied()
                    .map(Some)
                    .chain(std::iter::repeat(None)),
            )
            .partition(|(runtime, _)| paired && cooperates(runtime));
        let group_planned = |group: &[(&Runtime, Option<i32>)], usdt_probes: bool| {
            let files: HashSet<(u64, u64)> = group
                .iter()
                .flat_map(|(r, _)| r.modules.iter().chain(&r.loader))
                .map(|m| files::inode(m).unwrap_or_default())
                .collect();
            let mut planned: Vec<Planned> = loader_sites
                .iter()
                .filter(|(identity, _, _)| files.contains(identity))
                .map(|(_, loader, site)| Planned::loader(loader, site))
                .collect();
            for (module, sites) in &usdt {
                if usdt_probes && files.contains(&files::inode(module).unwrap_or_default()) {
                    planned.extend(
                        sites
                            .iter()
                            .filter(|site| set.live || site.is_alloc())
                            .map(|site| Planned::usdt(module, site)),
                    );
                }
            }
            planned
        };
        if !coop.is_empty() {
            let coop_pids: Vec<i32> = coop.iter().filter_map(|(_, pid)| *pid).collect();
            let planned = group_planned(&coop, true);
            probes.start_usdt_events =
                probes.attach_planned(&root, &programs, planned, &coop_pids)?;
        }
        if !other.is_empty() || runtimes.is_empty() {
            let other_pids: Vec<i32> = other.iter().filter_map(|(_, pid)| *pid).collect();
            let mut planned = group_planned(&other, !paired);
            let files: HashSet<(u64, u64)> = other
                .iter()
                .flat_map(|(r, _)| r.modules.iter())
                .map(|m| files::inode(m).unwrap_or_default())
                .collect();
            for (module, sites) in &found {
                if files.contains(&files::inode(module).unwrap_or_default()) {
                    planned.extend(Planned::module(module, sites, set.live, session));
                }
            }
            let groups_before = probes.session_group_count();
            probes.start_events = probes.attach_planned(&root, &programs, planned, &other_pids)?;
            probes.start_session_groups = (groups_before..probes.session_group_count()).collect();
            if !set.whole_host {
                let others: Vec<Runtime> = other.iter().map(|(r, _)| (*r).clone()).collect();
                probes.unprobed = unprobed_targets(&others, &found);
            }
        }
        // Every file looked at is known: those probed at the start are
        // scoped to the targets already. (--usdt: a file only cooperating
        // targets mapped at the start is not probed for allocators later
        // either.)
        let files: HashMap<_, _> = modules
            .iter()
            .map(|module| {
                (
                    files::inode(module).unwrap_or_default(),
                    FileProbes::at_start(),
                )
            })
            .collect();
        probes.late = Some(LateProbes {
            root,
            programs,
            live: set.live,
            offsets: set.probe_offsets,
            custom: set.custom,
            verbose: set.verbose,
            mappings: set.mappings,
            usdt: set.usdt,
            session,
            files,
            full: HashMap::new(),
        });
        Ok(probes)
    }

    /// `monitor`: process `pid` exec'd a program the selection names, and
    /// ran on unseen: `adopt`s it. If by the time its probes are all in
    /// (they go in one by one, milliseconds) its loader has mapped an
    /// allocator (its C library, within a millisecond of the exec), what
    /// it called meanwhile was lost: counted once for it, as a library
    /// probed late is; so is one that has ended already (what a process
    /// not decided on forks is announced too). (One watched already, with
    /// no call yet, lost nothing.)
    pub fn adopt_execd(&mut self, pid: u32) -> Result<()> {
        let watched_before = self.scopes.is_scoped(pid) && !self.scopes.is_gone(pid);
        let counted_before = self.probed_late;
        let adopted = self.adopt(pid);
        // One gone already ran unseen from start to end; one whose files
        // `adopt` probed late is counted already.
        let gone = crate::host::procfs::status::start_time(pid).is_none();
        if !self.whole_host
            && !watched_before
            && self.probed_late == counted_before
            && (gone || self.maps_an_allocator(pid))
        {
            self.probed_late += 1;
        }
        adopted
    }

    /// `monitor`: watches process `pid` from now on (it exec'd a program
    /// the selection names): scoped onto the probes made at the start
    /// (the loader's among them, so the libraries it loads from now on
    /// are announced), and onto those of the files it maps already.
    /// What it allocated before is not seen (see `adopt_execd`).
    /// On the whole host, the probes trap there already: only files no
    /// probe covers yet get probes (a container's C library and loader).
    pub fn adopt(&mut self, pid: u32) -> Result<()> {
        // An ended process whose pid it took, not pruned yet: its scope
        // events, links and marks go first (the next prune would take
        // this one's).
        if self.scopes.is_gone(pid) {
            self.forget(pid);
        }
        // --usdt: a process that samples its own allocations gets its USDT
        // probes (with its files, below), not the allocators' (nor the
        // loader's: libraries it loads later are not looked at).
        let cooperates = self.late.as_ref().is_some_and(|late| late.usdt)
            && mapped_files(pid).iter().any(|(_, file)| {
                usdt_sites(file).is_ok_and(|sites| sites.iter().any(UsdtSite::is_alloc))
            });
        if !self.whole_host {
            let events = match cooperates {
                true => &self.start_usdt_events,
                false => &self.start_events,
            };
            for id in events.clone() {
                self.scopes.scope(pid, id)?;
            }
            // A child of a root that has its shared return events (it
            // exec'd a selected program) stays as it is: linked as well, its
            // unsampled calls would return through those events too.
            let returning = self
                .sessions
                .as_ref()
                .is_some_and(|sessions| sessions.returning.get(&pid, 0).is_ok());
            if !cooperates && !returning {
                if let Some(sessions) = self.sessions.as_mut() {
                    sessions.roots.insert(pid);
                }
                self.session_scope(pid, &self.start_session_groups.clone())?;
            }
        }
        // Its files are read once the loader's probe is in: the host's,
        // scoped above, or its own, probed by this first read (then they
        // are read again). A process adopted at its exec maps its
        // libraries meanwhile, and its loader announces them once: before
        // a read that sees them, or after the probe is in (a container's C
        // library was missed).
        let files_known = |probes: &Probes| probes.late.as_ref().map(|late| late.files.len());
        let before = files_known(self);
        let mut looked_at = HashSet::new();
        self.probe_mapped_files(pid, &mut looked_at);
        if files_known(self) != before {
            self.probe_mapped_files(pid, &mut looked_at);
        }
        Ok(())
    }

    /// Whether process `pid` maps a file whose allocators are probed.
    fn maps_an_allocator(&self, pid: u32) -> bool {
        let modules: HashSet<&Path> = self
            .functions
            .iter()
            .filter(|function| function.role == "alloc")
            .map(|function| function.module.as_path())
            .collect();
        let allocators: HashSet<(u64, u64)> = modules
            .into_iter()
            .map(|m| files::inode(m).unwrap_or_default())
            .collect();
        mapped_files(pid)
            .iter()
            .any(|(_, path)| allocators.contains(&files::inode(path).unwrap_or_default()))
    }

    /// The files process `pid` maps, but those in `looked_at`, get their
    /// probes (`on_library`).
    fn probe_mapped_files(&mut self, pid: u32, looked_at: &mut HashSet<String>) {
        for (file, path) in mapped_files(pid) {
            if !looked_at.insert(file.clone()) {
                continue;
            }
            // One file that cannot be probed leaves the others to be.
            if let Err(err) = self.on_library(pid, &path, false) {
                eprintln!(
                    "memprof: warning: the allocators of {file} (pid {pid}) could not be probed: {err:#}"
                );
            }
        }
    }

    /// Process `pid` stopped itself when memprof stopped a child of its:
    /// it takes its children's stops as its own (`parent_watch`: they are
    /// stopped from now on only if nothing watches its own stops).
    pub fn watches_stops(&mut self, pid: u32) {
        watches_stops(&mut self.stop_watchers, pid);
    }

    /// User space has decided on announced process `pid` (watched from
    /// now on, or not): what it forks from now on is not announced.
    pub fn settle(&mut self, pid: u32) {
        let _ = self.exec_pending.remove(&pid);
    }

    /// A process watched later has ended: its scope events go.
    pub fn forget(&mut self, pid: u32) {
        self.scopes.forget(pid);
        if let Some(sessions) = self.sessions.as_mut() {
            if sessions.roots.remove(&pid) {
                sessions.close_links(pid);
                let _ = sessions.linked.remove(&pid);
            }
        }
        if let Some(late) = self.late.as_mut() {
            for file in late.files.values_mut() {
                if let Some(scoped) = file.scoped.as_mut() {
                    scoped.remove(&pid);
                }
            }
        }
    }

    /// Forgets the processes scoped since the start that have ended (or
    /// whose pid another process took): a monitor runs for days, and the
    /// end of a process is not always announced (one that never
    /// allocated; one still exiting when its notice is read).
    pub fn prune(&mut self) {
        for pid in self.scopes.gone() {
            self.forget(pid);
        }
        let ended = self
            .sessions
            .as_ref()
            .map_or(Vec::new(), |sessions| sessions.ended_forks());
        for pid in ended {
            self.forget(pid);
        }
        self.scopes.close_ended();
    }

    /// The processes' scope events, to turn their probes off and on
    /// (`monitor`'s budget).
    pub fn scopes(&mut self) -> &mut Scopes {
        &mut self.scopes
    }

    /// Process `pid` has loaded `library` (the loader said so): the
    /// allocators in it get probes, scoped to this process and the
    /// children it forks from now on. Files probed at the start, or
    /// already for this process, are left as they are. `held`: the
    /// process waits meanwhile (`trace`, at its loader's notices), else
    /// it runs on and what it called before the probes went unseen.
    pub fn on_library(&mut self, pid: u32, library: &Path, held: bool) -> Result<()> {
        let Some(mut late) = self.late.take() else {
            return Ok(());
        };
        let mut result = self.probe_late(&mut late, pid, library, held);
        // The table full: the groups of files no process maps any more go,
        // and, if any did, another try.
        if result.as_ref().is_err_and(|e| e.is::<TableFull>()) && self.reclaim(&mut late) {
            result = self.probe_late(&mut late, pid, library, held);
        }
        self.late = Some(late);
        // A process that ran on and ended before its probes were in: its
        // calls went unseen (the file itself can be probed).
        if result.is_err() && !held && crate::host::procfs::status::start_time(pid).is_none() {
            self.probed_late += 1;
            return Ok(());
        }
        // A file whose allocators could not be probed (the kernel's site
        // table full, say) is listed in reports: its calls go uncounted.
        if let Err(err) = &result {
            let program = library.display().to_string();
            if !self.unprobed.iter().any(|u| u.program == program) {
                self.unprobed.push(Unprobed {
                    program,
                    reason: format!("{err:#}"),
                    no_allocator: false,
                });
            }
        }
        result
    }

    fn probe_late(
        &mut self,
        late: &mut LateProbes,
        pid: u32,
        library: &Path,
        held: bool,
    ) -> Result<()> {
        // Read now, where a program is listed as having no allocator: the
        // process may be gone by the time the probes are in.
        let program = match self.unprobed.iter().any(|u| u.no_allocator) {
            true => crate::host::procfs::paths::program_file(pid)
                .map(|(_, file)| files::inode(&file).unwrap_or_default()),
            false => None,
        };
        let identity = files::inode(library).unwrap_or_default();
        if identity == (0, 0) || (self.skips_own_program && is_own_executable(identity)) {
            return Ok(());
        }
        if late
            .full
            .get(&identity)
            .is_some_and(|(reclaims, _)| *reclaims == self.sites.reclaims)
        {
            // Nothing freed since it found the table full.
            return Ok(());
        }
        if let Some(file) = late.files.get_mut(&identity) {
            // On the whole host a file's probes trap everywhere already.
            if self.whole_host {
                return Ok(());
            }
            let Some(scoped) = file.scoped.as_mut() else {
                // Probed at the start: scoped to the targets, and linked
                // to what they fork, but for a process whose main thread
                // has ended.
                if !self.start_session_groups.is_empty() && self.needs_session_entries(pid) {
                    let groups = self.start_session_groups_of(identity);
                    return self.scope_session_entries(&late.root, &late.programs, pid, &groups);
                }
                return Ok(());
            };
            // (In `trace` a file whose probes are all session ones has no
            // events: its links are what it has.)
            let probed = !file.events.is_empty() || !file.session_groups.is_empty();
            if !probed {
                return Ok(());
            }
            let groups = file.session_groups.clone();
            // Announced again (still mapped, or mapped again after a
            // dlclose: its links may put no breakpoint in it then), only
            // the entry events may be needed.
            let first = scoped.insert(pid);
            if first {
                for &id in &file.events {
                    self.scopes.scope(pid, id)?;
                }
                self.session_scope(pid, &groups)?;
            }
            if !groups.is_empty() && self.needs_session_entries(pid) {
                self.scope_session_entries(&late.root, &late.programs, pid, &groups)?;
            }
            if first {
                self.probed_for(program, held);
            }
            return Ok(());
        }
        late.files.insert(
            identity,
            FileProbes {
                events: Vec::new(),
                groups: Vec::new(),
                module: library.to_path_buf(),
                name: crate::host::procfs::paths::path_in_maps(library),
                session_groups: Vec::new(),
                scoped: Some(HashSet::from([pid])),
            },
        );
        let sites = with_mappings(
            module_sites(library, late.offsets, &late.custom)?,
            late.mappings,
        );
        let mut planned = Planned::module(library, &sites, late.live, late.session);
        let usdt = match late.usdt {
            true => usdt_sites(library).unwrap_or_default(),
            false => Vec::new(),
        };
        planned.extend(
            usdt.iter()
                .filter(|site| late.live || site.is_alloc())
                .map(|site| Planned::usdt(library, site)),
        );
        let allocates = !planned.is_empty();
        // On the whole host, a loader of its own (a container's) must
        // announce the libraries its processes load, as the host's does.
        let loader = match self.whole_host {
            true => loader_site(library).ok().flatten(),
            false => None,
        };
        if let Some(site) = &loader {
            planned.push(Planned::loader(library, site));
        }
        if planned.is_empty() {
            return Ok(());
        }
        let functions_before = self.functions.len();
        let pids = if self.whole_host {
            Vec::new()
        } else {
            vec![pid as i32]
        };
        let groups_before = self.session_group_count();
        self.sites.placed.clear();
        let attached = self.attach_planned(&late.root, &late.programs, planned, &pids);
        let groups = std::mem::take(&mut self.sites.placed);
        let events = match attached {
            Ok(events) => events,
            Err(err) => {
                // What it took goes back; it is tried again when groups
                // are freed.
                self.free_groups(&groups, library);
                late.files.remove(&identity);
                if err.is::<TableFull>() {
                    let program = library.display().to_string();
                    late.full.insert(identity, (self.sites.reclaims, program));
                }
                return Err(err);
            }
        };
        // Listed as unprobed when it found the table full: no more.
        if let Some((_, program)) = late.full.remove(&identity) {
            self.unprobed.retain(|u| u.program != program);
        }
        if let Some(file) = late.files.get_mut(&identity) {
            file.events = events;
            file.groups = groups;
            file.session_groups = (groups_before..self.session_group_count()).collect();
        }
        if late.verbose {
            for function in &self.functions[functions_before..] {
                eprintln!("{}", describe(function));
            }
        }
        if allocates {
            self.probed_for(program, held);
        }
        Ok(())
    }

    /// A process running `program` (its file's identity) has its
    /// allocators probed in a file it loaded: its program is no longer
    /// one with none, and, if it ran on meanwhile (not `held`), its calls
    /// until now went unseen (counted).
    fn probed_for(&mut self, program: Option<(u64, u64)>, held: bool) {
        if let Some(program) = program {
            self.unprobed.retain(|u| {
                !u.no_allocator
                    || files::inode(Path::new(&u.program)).unwrap_or_default() != program
            });
        }
        if !held {
            self.probed_late += 1;
        }
    }

    /// Places `planned` probes in site groups, each group's on two shared
    /// events (entries, returns); returns the events' ids. A group takes
    /// sites whose page offsets differ (the kernel finds a site by its
    /// group and page offset).
    /// The ids returned are those a process scoped later gets (not the
    /// session groups' return events: see `Sessions`). Sites under
    /// session probes get groups of their own.
    fn attach_planned(
        &mut self,
        root: &Path,
        programs: &Programs,
        planned: Vec<Planned>,
        pids: &[i32],
    ) -> Result<Vec<u64>> {
        let (session, shared): (Vec<Planned>, Vec<Planned>) =
            planned.into_iter().partition(Planned::has_session);
        // On the whole host under the budget the loaders' probes get
        // groups of their own: the allocators' go in and out, theirs stay
        // (a library loaded meanwhile is announced all the same).
        let host_switched = self.whole_host && self.scopes.is_switchable();
        let (loaders, shared): (Vec<Planned>, Vec<Planned>) = match host_switched {
            true => shared.into_iter().partition(Planned::is_loader),
            false => (Vec::new(), shared),
        };
        let mut events = Vec::new();
        for members in site_groups(loaders).into_iter().chain(site_groups(shared)) {
            events.extend(self.attach_group(root, programs, &members, pids)?.1);
        }
        for members in session_groups(session) {
            events.extend(self.attach_session_group(root, programs, &members, pids)?);
        }
        Ok(events)
    }

    /// One site group: its sites go to the kernel's table, then its return
    /// probes are enabled, then its entries (so that no entry fires
    /// without its return).
    fn attach_group(
        &mut self,
        root: &Path,
        programs: &Programs,
        members: &[Planned],
        pids: &[i32],
    ) -> Result<(u32, Vec<u64>)> {
        let group = self.place_group(members)?;
        let always = self.whole_host && members.iter().all(Planned::is_loader);
        let returns = members.iter().filter(|p| p.ret.is_some()).map(probe_at);
        let entries = members.iter().map(probe_at);
        let events = [
            ("returns", returns.collect(), true, &programs.ret),
            ("entries", entries.collect(), false, &programs.enter),
        ];
        let events = self.attach_events(root, group, events, pids, always)?;
        Ok((group, events))
    }

    /// Site group `group`'s shared events, each running its program, in
    /// the order given (callers give its returns first: no entry fires
    /// without its return); none where it has no probe. Returns the ids of
    /// those made. On an error, those made go again (a later try would
    /// find their names taken).
    fn attach_events(
        &mut self,
        root: &Path,
        group: u32,
        events: [SharedEvent<'_>; 2],
        pids: &[i32],
        always: bool,
    ) -> Result<Vec<u64>> {
        let before = self.attached.groups.get(&group).map(GroupHold::len);
        let mut ids = Vec::new();
        for (name, probes, ret, program) in events {
            let made =
                shared_event(root, &format!("{name}_{group}"), probes, ret).and_then(|event| {
                    let Some(event) = event else {
                        return Ok(());
                    };
                    let hooked = self.hook(&event, program, group.into(), pids, always);
                    ids.push(event.id);
                    let hold = self.attached.groups.entry(group).or_default();
                    hold.events.push(event);
                    hold.add(hooked?);
                    Ok(())
                });
            if let Err(err) = made {
                if let Some(hold) = self.attached.groups.get_mut(&group) {
                    hold.truncate(before.unwrap_or_default());
                }
                return Err(err);
            }
        }
        Ok(ids)
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

    /// `always`: on the whole host, an event that stays in under the
    /// budget (a loader's).
    fn hook(
        &mut self,
        event: &tracefs::UprobeEvent,
        program: &OwnedFd,
        cookie: u64,
        pids: &[i32],
        always: bool,
    ) -> Result<Hooked> {
        // The anchor selects its process too; with none yet (`monitor`
        // waiting for its processes), or where each process's probes are
        // to be turned off and on (the budget), kthreadd, which has no
        // address space: the probe then traps only where a process is
        // scoped. On the whole host, every process (-1); under the
        // budget, where the host's scope events say.
        let switchable = self.scopes.is_switchable();
        let host_scoped = self.whole_host && switchable && !always;
        let anchor_pid = match pids.first() {
            Some(&pid) if !switchable => pid,
            _ if self.whole_host && !host_scoped => -1,
            _ => kthreadd()?,
        };
        let anchor = perf::open_tracepoint(event.id, anchor_pid, false).with_context(|| {
            format!(
                "perf_event_open on uprobe {} for pid {anchor_pid}",
                event.id
            )
        })?;
        let link = perf::link_program(program.as_fd(), &anchor, cookie)
            .context("attaching the BPF program to a uprobe (BPF_LINK_CREATE)")?;
        let mut hooked = Hooked {
            link,
            anchor,
            scopes: Vec::new(),
        };
        if host_scoped {
            self.scopes.scope_host(event.id)?;
        }
        for &pid in pids {
            if switchable {
                self.scopes.scope(pid as u32, event.id)?;
                continue;
            }
            let scopes = perf::open_scopes(event.id, pid, perf::Threads::Every)
                .with_context(|| format!("perf_event_open on uprobe {} for pid {pid}", event.id))?;
            hooked.scopes.extend(scopes);
        }
        Ok(hooked)
    }
}

/// Whether pid 2 is the kernel's thread spawner (not in a pid namespace).
pub fn has_kthreadd() -> bool {
    std::fs::read_to_string("/proc/2/stat").is_ok_and(|stat| stat.contains("(kthreadd)"))
}

/// The kernel's thread spawner, pid 2: always there, never in user space
/// (checked: in a pid namespace pid 2 may be a process).
fn kthreadd() -> Result<i32> {
    if !has_kthreadd() {
        bail!(UserError::new(
            "no kernel thread at pid 2 here (a pid namespace?): name a running process to watch"
        )
        .with_exit_code(2));
    }
    Ok(2)
}

/// A shared event to make: its name, its probes (see `shared_event`),
/// whether they are return probes, and the program they run.
type SharedEvent<'p> = (&'static str, Vec<ProbeAt<'p>>, bool, &'p OwnedFd);

/// A probe's file, and its offset and USDT semaphore there.
type ProbeAt<'p> = (&'p Path, (u64, Option<u64>));

fn probe_at<'p>(probe: &Planned<'p>) -> ProbeAt<'p> {
    (probe.module, (probe.file_offset, probe.semaphore))
}

/// One tracefs event holding a probe at each of `probes`; none if there
/// is no probe.
fn shared_event<'p>(
    root: &Path,
    name: &str,
    probes: impl IntoIterator<Item = ProbeAt<'p>>,
    ret: bool,
) -> Result<Option<tracefs::UprobeEvent>> {
    let mut probes = probes.into_iter();
    let Some((module, at)) = probes.next() else {
        return Ok(None);
    };
    let event = tracefs::UprobeEvent::create(root, name, module, at, ret)?;
    for (module, at) in probes {
        event.append(module, at)?;
    }
    Ok(Some(event))
}

fn program_fd(ebpf: &mut Ebpf, name: &str) -> Result<OwnedFd> {
    let program: &mut UProbe = program_mut(ebpf, name)?;
    Ok(program.fd()?.as_fd().try_clone_to_owned()?)
}

/// The files process `pid` maps executable (`procs::executable_files`).
fn mapped_files(pid: u32) -> Vec<(String, PathBuf)> {
    let maps = crate::host::procfs::maps::read_maps_text(pid).unwrap_or_default();
    crate::host::procfs::maps::executable_files(pid, &maps)
}

/// Each file once (by device and inode: the same library may be reached
/// by several paths), in first-seen order.
fn distinct_files<'a>(paths: impl Iterator<Item = &'a PathBuf>) -> Vec<PathBuf> {
    let mut seen = std::collections::HashSet::new();
    paths
        .filter(|path| seen.insert(files::inode(path).unwrap_or_default()))
        .cloned()
        .collect()
}

/// Whether the file is memprof's own program, which `monitor` never
/// probes: memprof never watches itself, and on the whole host its
/// allocator (mimalloc, its own) would be probed in every process that
/// maps it (its watchdog, another memprof), memprof too, and each of
/// memprof's allocations would take a trap. By name, memprof's own
/// process stands in for those to come at the start, and its budget's
/// calibration child is adopted: their program's probes would be
/// listed, and take room, for nothing. (`trace -- memprof ...` does
/// profile memprof.)
fn is_own_executable(identity: (u64, u64)) -> bool {
    static OWN: std::sync::OnceLock<(u64, u64)> = std::sync::OnceLock::new();
    identity == *OWN.get_or_init(|| files::inode(Path::new("/proc/self/exe")).unwrap_or_default())
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

/// Enters process `pid` in the kernel's `STOP_WATCHERS` (see
/// `Probes::watches_stops`; also where `Probes` is borrowed in part).
fn watches_stops(stop_watchers: &mut aya::maps::HashMap<MapData, u32, u8>, pid: u32) {
    let _ = stop_watchers.insert(pid, 1, 0);
}
