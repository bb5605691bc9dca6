//! Attaching the probes at the start (`Probes::attach`): the kernel's
//! tables and maps taken out of the BPF object, the targets' files read
//! for allocators, loaders and USDT probes, and their probes placed and
//! scoped to the targets.
use std::{
    collections::{HashMap, HashSet},
    os::fd::OwnedFd,
    path::{Path, PathBuf},
};

use anyhow::{Context as _, Result};
use aya::{maps::Array, Ebpf};
use memprof_common::{dispatch::SITE_GROUPS, usdt::USDT_SPECS};

use super::{
    identity::{distinct_files, is_own_executable},
    link_closer::LinkCloser,
    plan::{
        check_named_functions, chosen, partly_probed, refuse_returns_in_go, unprobed_targets,
        Planned,
    },
    program_fd,
    sessions::Sessions,
    site_table::SiteTable,
    Attached, FileProbes, LateProbes, ProbeSet, Probes, Programs, Unprobed,
};
use crate::{
    discover::{
        allocators::{loader_site, module_sites, LoaderSite, ModuleSites, Runtime},
        usdt::{usdt_sites, UsdtSite},
    },
    host::files,
    probes::{
        fork_hold::ForkHold,
        scopes::{Allowances, Scopes},
        tracefs,
    },
};

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
        mut set: ProbeSet,
    ) -> Result<Probes> {
        let root = tracefs::tracefs_root()?;
        tracefs::remove_stale(&root).context("removing uprobes left by a killed memprof")?;
        let mut probes = Probes::new(ebpf, &set)?;
        let session_program = set.session_program.take();
        let session = session_program.is_some();
        let programs = Programs::of(ebpf, set.empty_programs, session && !set.mode.whole_host())?;
        if let Some(program) = session_program {
            probes.sessions = Some(new_sessions(ebpf, program, &set, pids)?);
        }
        let modules = target_modules(runtimes, set.mode.is_monitor());
        let (found, partly) = allocator_sites(&modules, &set)?;
        probes.partly_probed = partly;
        check_named_functions(&set.custom, &modules, &found, set.mode.watches_later())?;
        if let Some(function) = &set.bench_probe {
            probes.attach_bench(ebpf, &root, function, &found, pids)?;
            return Ok(probes);
        }
        let loaders = distinct_files(runtimes.iter().filter_map(|r| r.loader.as_ref()));
        let start = StartSites {
            found: &found,
            loaders: loader_sites(&loaders)?,
            usdt: usdt_probes(&modules, set.usdt),
            live: set.live,
            session,
        };
        probes.attach_targets(&root, &programs, runtimes, pids, &start)?;
        probes.late = Some(late_probes(root, programs, set, session, &modules));
        Ok(probes)
    }

    /// No probe yet: the kernel's tables and maps the probes use, taken
    /// out of `ebpf`.
    fn new(ebpf: &mut Ebpf, set: &ProbeSet) -> Result<Probes> {
        let table = ebpf.take_map("SITE_TABLE").context("map SITE_TABLE")?;
        let specs = ebpf.take_map("USDT_SPECS").context("map USDT_SPECS")?;
        Ok(Probes {
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
            partly_probed: Vec::new(),
            probed_late: 0,
            usdt_placed: false,
            late: None,
            start_events: Vec::new(),
            start_usdt_events: Vec::new(),
            sessions: None,
            start_session_groups: Vec::new(),
            scopes: Scopes::new(
                aya::maps::HashMap::try_from(ebpf.take_map("TREES").context("map TREES")?)?,
                match set.mode.budget() {
                    true => Some((
                        aya::maps::HashMap::try_from(
                            ebpf.take_map("GATED_OUT").context("map GATED_OUT")?,
                        )?,
                        Array::try_from(ebpf.take_map("PROBE_EPOCH").context("map PROBE_EPOCH")?)?,
                        Allowances {
                            by_process: aya::maps::HashMap::try_from(
                                ebpf.take_map("ALLOWANCES").context("map ALLOWANCES")?,
                            )?,
                            first: Array::try_from(
                                ebpf.take_map("FIRST_ALLOWANCE")
                                    .context("map FIRST_ALLOWANCE")?,
                            )?,
                        },
                    )),
                    false => None,
                },
            ),
            whole_host: set.mode.whole_host(),
            skips_own_program: set.mode.is_monitor(),
            exec_pending: aya::maps::HashMap::try_from(
                ebpf.take_map("EXEC_PENDING").context("map EXEC_PENDING")?,
            )?,
            stop_watchers: aya::maps::HashMap::try_from(
                ebpf.take_map("STOP_WATCHERS")
                    .context("map STOP_WATCHERS")?,
            )?,
        })
    }

    /// Benchmarks: one empty probe on `function` alone, active in `pids`.
    fn attach_bench(
        &mut self,
        ebpf: &mut Ebpf,
        root: &Path,
        function: &str,
        found: &[(PathBuf, ModuleSites)],
        pids: &[i32],
    ) -> Result<()> {
        let noop = program_fd(ebpf, "noop_enter")?;
        let (module, site) = found
            .iter()
            .flat_map(|(module, sites)| sites.sites.iter().map(move |s| (module, s)))
            .find(|(_, site)| site.function == function)
            .with_context(|| format!("no {function} in the target's modules"))?;
        let event =
            tracefs::UprobeEvent::create(root, "bench", module, (site.file_offset, None), false)?;
        let hooked = self.hook(&event, &noop, 0, pids, false)?;
        self.attached.rest.add(hooked);
        self.attached.rest.events.push(event);
        Ok(())
    }

    /// The targets' probes, each group of targets' scoped to its `pids`.
    fn attach_targets(
        &mut self,
        root: &Path,
        programs: &Programs,
        runtimes: &[Runtime],
        pids: &[i32],
        start: &StartSites,
    ) -> Result<()> {
        // --usdt: a target that samples its own allocations (a module with
        // the contract's `alloc` probe) is profiled through its probes,
        // instead of the allocators' entry points, which it then never
        // traps on. With no target named yet (monitor), both are probed.
        let usdt_files = start.sampling_files();
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
        if !coop.is_empty() {
            let coop_pids: Vec<i32> = coop.iter().filter_map(|(_, pid)| *pid).collect();
            let planned = start.group_planned(&coop, true);
            self.start_usdt_events = self.attach_planned(root, programs, planned, &coop_pids)?;
        }
        if !other.is_empty() || runtimes.is_empty() {
            self.attach_others(root, programs, &other, paired, start)?;
        }
        Ok(())
    }

    /// The probes of the targets that do not sample their own allocations
    /// (`other`): their loaders', their allocators', and, unless each
    /// target is paired with its pid, the USDT probes of their files.
    fn attach_others(
        &mut self,
        root: &Path,
        programs: &Programs,
        other: &[(&Runtime, Option<i32>)],
        paired: bool,
        start: &StartSites,
    ) -> Result<()> {
        let other_pids: Vec<i32> = other.iter().filter_map(|(_, pid)| *pid).collect();
        let mut planned = start.group_planned(other, !paired);
        let files: HashSet<(u64, u64)> = other
            .iter()
            .flat_map(|(r, _)| r.modules.iter())
            .map(|m| files::inode(m).unwrap_or_default())
            .collect();
        for (module, sites) in start.found {
            if files.contains(&files::inode(module).unwrap_or_default()) {
                planned.extend(Planned::module(module, sites, start.live, start.session));
            }
        }
        let groups_before = self.session_group_count();
        self.start_events = self.attach_planned(root, programs, planned, &other_pids)?;
        self.start_session_groups = (groups_before..self.session_group_count()).collect();
        if !self.whole_host {
            let others: Vec<Runtime> = other.iter().map(|(r, _)| (*r).clone()).collect();
            self.unprobed = unprobed_targets(&others, start.found, start.live);
            // A program not probed at all is not also "probed in part".
            let unprobed = &self.unprobed;
            self.partly_probed
                .retain(|partly| !unprobed.iter().any(|u| u.program == partly.program));
        }
        Ok(())
    }
}

/// What the start found in the targets' files, to plan their probes from.
struct StartSites<'a> {
    /// The allocator sites of the files that have any.
    found: &'a [(PathBuf, ModuleSites)],
    /// The loaders' probe sites, with their files' identities.
    loaders: Vec<((u64, u64), &'a PathBuf, LoaderSite)>,
    /// `--usdt`: the USDT probes of the files that have any.
    usdt: Vec<(PathBuf, Vec<UsdtSite>)>,
    live: bool,
    /// Session probes on the malloc-like functions.
    session: bool,
}

impl StartSites<'_> {
    /// The files with the contract's `alloc` probe (their programs sample
    /// their own allocations).
    fn sampling_files(&self) -> HashSet<(u64, u64)> {
        self.usdt
            .iter()
            .filter(|(_, sites)| sites.iter().any(UsdtSite::is_alloc))
            .map(|(module, _)| files::inode(module).unwrap_or_default())
            .collect()
    }

    /// The probes of the loaders that `group` (targets, with their pids)
    /// map, and, with `usdt_probes`, the USDT probes of their files.
    fn group_planned(
        &self,
        group: &[(&Runtime, Option<i32>)],
        usdt_probes: bool,
    ) -> Vec<Planned<'_>> {
        let files: HashSet<(u64, u64)> = group
            .iter()
            .flat_map(|(r, _)| r.modules.iter().chain(&r.loader))
            .map(|m| files::inode(m).unwrap_or_default())
            .collect();
        let mut planned: Vec<Planned> = self
            .loaders
            .iter()
            .filter(|(identity, _, _)| files.contains(identity))
            .map(|(_, loader, site)| Planned::loader(loader, site))
            .collect();
        for (module, sites) in &self.usdt {
            if usdt_probes && files.contains(&files::inode(module).unwrap_or_default()) {
                planned.extend(
                    sites
                        .iter()
                        .filter(|site| self.live || site.is_alloc())
                        .map(|site| Planned::usdt(module, site)),
                );
            }
        }
        planned
    }
}

/// Session probes' state for `program`'s links, with the roots `pids`;
/// in `trace`, where the kernel allows, what they fork is held
/// (`fork_hold`).
fn new_sessions(
    ebpf: &mut Ebpf,
    program: OwnedFd,
    set: &ProbeSet,
    pids: &[i32],
) -> Result<Sessions> {
    let fork_hold = match set.hold_forks && !set.mode.whole_host() {
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
    Ok(Sessions {
        fork_hold,
        unlinked_forks: 0,
        closer: LinkCloser::new(),
        program,
        whole_host: set.mode.whole_host(),
        groups: Vec::new(),
        roots: pids.iter().map(|&pid| pid as u32).collect(),
        links: HashMap::new(),
        linked: aya::maps::HashMap::try_from(ebpf.take_map("LINKED").context("map LINKED")?)?,
        returning: aya::maps::HashMap::try_from(
            ebpf.take_map("RETURNING").context("map RETURNING")?,
        )?,
    })
}

/// The targets' files, each once (`skips_own_program`: memprof's own
/// program left out).
fn target_modules(runtimes: &[Runtime], skips_own_program: bool) -> Vec<PathBuf> {
    let mut modules = distinct_files(runtimes.iter().flat_map(|r| r.modules.iter()));
    if skips_own_program {
        modules.retain(|module| !is_own_executable(files::inode(module).unwrap_or_default()));
    }
    modules
}

/// Each module with allocator sites, and its sites.
type FoundSites = Vec<(PathBuf, ModuleSites)>;

/// The allocator sites of each of `modules` that has any, and the
/// modules probed in part (see `partly_probed`).
fn allocator_sites(modules: &[PathBuf], set: &ProbeSet) -> Result<(FoundSites, Vec<Unprobed>)> {
    let mut found = Vec::new();
    let mut partial = Vec::new();
    for module in modules {
        let sites = chosen(
            module_sites(module, set.probe_offsets, &set.custom)?,
            set.site_choice(),
        );
        refuse_returns_in_go(module, &sites, set.live)?;
        partial.extend(partly_probed(module, &sites, set.site_choice()));
        if !sites.sites.is_empty() {
            found.push((module.clone(), sites));
        }
    }
    Ok((found, partial))
}

/// A loader's probe site, with its file's identity (device, inode).
type LoaderOf<'a> = ((u64, u64), &'a PathBuf, LoaderSite);

/// The probe site of each of `loaders` that has one.
fn loader_sites(loaders: &[PathBuf]) -> Result<Vec<LoaderOf<'_>>> {
    let mut sites = Vec::new();
    for loader in loaders {
        if let Some(site) = loader_site(loader)? {
            sites.push((files::inode(loader).unwrap_or_default(), loader, site));
        }
    }
    Ok(sites)
}

/// `--usdt` (`usdt`): the USDT probes of each of `modules` that has any.
fn usdt_probes(modules: &[PathBuf], usdt: bool) -> Vec<(PathBuf, Vec<UsdtSite>)> {
    match usdt {
        true => modules
            .iter()
            .filter_map(|m| Some((m.clone(), usdt_sites(m).ok().filter(|s| !s.is_empty())?)))
            .collect(),
        false => Vec::new(),
    }
}

/// What probing the files loaded later needs, from `set`, with the files
/// looked at so far (`modules`).
fn late_probes(
    root: PathBuf,
    programs: Programs,
    set: ProbeSet,
    session: bool,
    modules: &[PathBuf],
) -> LateProbes {
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
    let choice = set.site_choice();
    LateProbes {
        root,
        programs,
        live: set.live,
        offsets: set.probe_offsets,
        custom: set.custom,
        verbose: set.verbose,
        choice,
        usdt: set.usdt,
        session,
        files,
        full: HashMap::new(),
    }
}
