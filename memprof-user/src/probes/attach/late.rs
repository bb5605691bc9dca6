//! Probing the files processes load while the profile runs
//! (`Probes::on_library`): a file new to memprof gets its probes, scoped
//! to the process that loaded it; a file probed before is scoped to that
//! process too.
use std::{collections::HashSet, path::Path};

use anyhow::Result;

use super::{
    describe,
    identity::is_own_executable,
    plan::{chosen, partly_probed, refuse_returns_in_go, Planned},
    site_table::TableFull,
    FileProbes, LateProbes, Probes, Unprobed,
};
use crate::{
    discover::{
        allocators::{loader_site, module_sites, LoaderSite, ModuleSites},
        usdt::{usdt_sites, UsdtSite},
    },
    host::files,
};

impl Probes {
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

    /// One try of `on_library`: a file new to memprof gets its probes, a
    /// file looked at before is scoped to process `pid`.
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
        if late.files.contains_key(&identity) {
            return self.probe_known(late, pid, identity, program, held);
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
        let sites = chosen(
            module_sites(library, late.offsets, &late.custom)?,
            late.choice,
        );
        refuse_returns_in_go(library, &sites, late.live)?;
        if let Some(partial) = partly_probed(library, &sites, late.choice) {
            if !self
                .partly_probed
                .iter()
                .any(|p| p.program == partial.program)
            {
                self.partly_probed.push(partial);
            }
        }
        let usdt = match late.usdt {
            true => usdt_sites(library).unwrap_or_default(),
            false => Vec::new(),
        };
        // On the whole host, a loader of its own (a container's) must
        // announce the libraries its processes load, as the host's does.
        let loader = match self.whole_host {
            true => loader_site(library).ok().flatten(),
            false => None,
        };
        let (planned, allocates) = plan_file(late, library, &sites, &usdt, loader.as_ref());
        if planned.is_empty() {
            return Ok(());
        }
        self.attach_file(late, library, identity, pid, planned)?;
        if allocates {
            self.probed_for(program, held);
        }
        Ok(())
    }

    /// A file looked at before (of identity `identity`), loaded by process
    /// `pid`: scoped to it, if its probes are not yet, with the session
    /// entries it may need. `program` and `held` as in `probed_for`.
    fn probe_known(
        &mut self,
        late: &mut LateProbes,
        pid: u32,
        identity: (u64, u64),
        program: Option<(u64, u64)>,
        held: bool,
    ) -> Result<()> {
        // On the whole host a file's probes trap everywhere already.
        if self.whole_host {
            return Ok(());
        }
        let file = late
            .files
            .get_mut(&identity)
            .expect("checked by probe_late");
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
        Ok(())
    }

    /// Attaches the `planned` probes of `library` (of identity
    /// `identity`), new to memprof, for process `pid` (for every process
    /// on the whole host), and records them with its file. On an error,
    /// what it took goes back, and the file is forgotten.
    fn attach_file(
        &mut self,
        late: &mut LateProbes,
        library: &Path,
        identity: (u64, u64),
        pid: u32,
        planned: Vec<Planned>,
    ) -> Result<()> {
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
}

/// The probes of `library`, a file loaded later: its `sites`' and its
/// `usdt` probes' (of which only the allocations' unless in live mode),
/// then its `loader`'s; and whether any but the loader's is planned.
fn plan_file<'a>(
    late: &LateProbes,
    library: &'a Path,
    sites: &'a ModuleSites,
    usdt: &'a [UsdtSite],
    loader: Option<&LoaderSite>,
) -> (Vec<Planned<'a>>, bool) {
    let mut planned = Planned::module(library, sites, late.live, late.session);
    planned.extend(
        usdt.iter()
            .filter(|site| late.live || site.is_alloc())
            .map(|site| Planned::usdt(library, site)),
    );
    let allocates = !planned.is_empty();
    if let Some(site) = loader {
        planned.push(Planned::loader(library, site));
    }
    (planned, allocates)
}
