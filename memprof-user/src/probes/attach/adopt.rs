//! Processes as they come and go: adopting one that exec'd a selected
//! program (`monitor`: scoped onto the start's probes, its files probed),
//! settling announced ones, noting parents that take their children's
//! stops, and forgetting those that ended.
use std::{collections::HashSet, path::Path};

use anyhow::Result;
use aya::maps::MapData;

use super::{identity::mapped_files, Probes};
use crate::{
    discover::usdt::{usdt_sites, UsdtSite},
    host::files,
};

impl Probes {
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
}

/// Enters process `pid` in the kernel's `STOP_WATCHERS` (see
/// `Probes::watches_stops`; also where `Probes` is borrowed in part).
pub(super) fn watches_stops(stop_watchers: &mut aya::maps::HashMap<MapData, u32, u8>, pid: u32) {
    let _ = stop_watchers.insert(pid, 1, 0);
}
