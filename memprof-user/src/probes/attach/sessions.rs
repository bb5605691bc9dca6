//! Session probes on the malloc-like functions (`--live` with sampling,
//! kernel 6.13 or later): a session link per root process, the shared
//! entry event its children inherit, and the shared return events those
//! children get once their fork is announced. In `trace` the children are
//! held at their fork instead, and linked as roots (`fork_hold`).
use std::{
    collections::{HashMap, HashSet},
    os::fd::{AsFd as _, OwnedFd},
    path::{Path, PathBuf},
};

use anyhow::{bail, Context as _, Result};
use aya::maps::MapData;
use memprof_common::dispatch::SITE_GROUPS;

use super::{adopt::watches_stops, link_closer::LinkCloser, plan::Planned, Probes, Programs};
use crate::{
    host::files,
    probes::{fork_hold::ForkHold, session_link, stopped_parents::StoppedParents},
};

/// Session probes (see `session_link`): the malloc-like functions of a
/// site group have, besides its shared events, a session link per root
/// process (the processes profiled from the start or watched later; on
/// the whole host one link for every process). The shared entry event is
/// scoped to the roots too, so that their children inherit it; the shared
/// return event only to those children (after their `Forked` notice),
/// never to a root, whose link runs the return where a call was sampled.
/// With `fork_hold` (`trace`) each process a root forks waits, stopped,
/// until it has links too, and is a root; a group has shared events only
/// for processes whose main thread has ended (see
/// `Probes::scope_session_entries`).
pub(super) struct Sessions {
    pub(super) program: OwnedFd,
    pub(super) whole_host: bool,
    pub(super) groups: Vec<SessionGroup>,
    pub(super) roots: HashSet<u32>,
    /// Each root's links (on the whole host, pid 0's), with the index of
    /// the group each is on.
    pub(super) links: HashMap<u32, Vec<(usize, OwnedFd)>>,
    /// The kernel's `LINKED`: each root's groups, a bit each.
    pub(super) linked: aya::maps::HashMap<MapData, u32, u64>,
    /// The kernel's `RETURNING`: children with the shared return events.
    pub(super) returning: aya::maps::HashMap<MapData, u32, u8>,
    /// `trace`: the program that holds what roots fork.
    pub(super) fork_hold: Option<ForkHold>,
    /// Held (or relinked) processes whose links could not all be made:
    /// they ran without (some of) their probes (counted lost,
    /// `fork_unheld`).
    pub(super) unlinked_forks: u64,
    /// Closes the links of ended processes.
    pub(super) closer: LinkCloser,
}

/// The links left are closed together, not one after the other.
impl Drop for Sessions {
    fn drop(&mut self) {
        self.close_all_links();
    }
}

/// A site group of malloc-like functions under session probes (none left
/// once its file's probes are freed: `reclaim`).
pub(super) struct SessionGroup {
    pub(super) group: u32,
    pub(super) module: PathBuf,
    pub(super) offsets: Vec<u64>,
    /// Its shared return event (none on the whole host).
    pub(super) return_event: Option<u64>,
    /// Its shared entry event (none on the whole host; in `trace` made
    /// only for processes whose main thread has ended: see
    /// `Probes::scope_session_entries`).
    pub(super) entry_event: Option<u64>,
}

impl Sessions {
    /// Links root `pid` (0: every process) to session group `index`.
    /// Marked linked first: from then on the shared entry event leaves the
    /// group's calls to the link (marked after, a call made between would
    /// be counted by both).
    /// Linked already, it is left as it is (two links would count each
    /// call twice). Not linked, it is not marked either (its mark would
    /// leave the group's calls to a link that is not there).
    fn link(&mut self, pid: u32, index: usize) -> Result<()> {
        let linked = self.links.get(&pid);
        if linked.is_some_and(|links| links.iter().any(|(linked, _)| *linked == index)) {
            return Ok(());
        }
        let group = &self.groups[index];
        let bit = 1 << (group.group % SITE_GROUPS);
        let before = match pid {
            0 => None,
            pid => {
                let before = self.linked.get(&pid, 0).unwrap_or(0);
                self.linked
                    .insert(pid, before | bit, 0)
                    .context("map LINKED")?;
                Some(before)
            }
        };
        let cookies = vec![u64::from(group.group); group.offsets.len()];
        let link = session_link::link(
            self.program.as_fd(),
            &group.module,
            &group.offsets,
            &cookies,
            pid,
        )
        .with_context(|| {
            format!(
                "linking session uprobes in {} for pid {pid}",
                group.module.display()
            )
        });
        let link = match (link, before) {
            (Ok(link), _) => link,
            (Err(error), Some(before)) => {
                // (Marked before, by a link `relink` closed.)
                let _ = match before & !bit {
                    0 => self.linked.remove(&pid),
                    rest => self.linked.insert(pid, rest, 0),
                };
                return Err(error);
            }
            (Err(error), None) => return Err(error),
        };
        self.links.entry(pid).or_default().push((index, link));
        Ok(())
    }

    /// `trace`: process `child`, held at its fork by a root linked to the
    /// groups with bits `groups` (in `LINKED`), is a root linked to them.
    fn adopt(&mut self, child: u32, groups: u64) -> Result<()> {
        // Links under its pid were a dead process's.
        self.close_links(child);
        self.roots.insert(child);
        let indices: Vec<usize> = (0..self.groups.len())
            .filter(|&index| {
                let group = &self.groups[index];
                !group.offsets.is_empty() && groups & (1 << (group.group % SITE_GROUPS)) != 0
            })
            .collect();
        for index in indices {
            self.link(child, index)?;
        }
        Ok(())
    }

    /// Process `pid`'s links go (closed on the closer's threads).
    pub(super) fn close_links(&mut self, pid: u32) {
        if let Some(links) = self.links.remove(&pid) {
            self.closer.close(links.into_iter().map(|(_, link)| link));
        }
    }

    /// Every process's links go, closed together.
    pub(super) fn close_all_links(&mut self) {
        for pid in self.links.keys().copied().collect::<Vec<_>>() {
            self.close_links(pid);
        }
    }

    /// `trace`: the processes adopted at their fork that have ended (one
    /// that never allocated is never announced ended).
    pub(super) fn ended_forks(&self) -> Vec<u32> {
        if self.fork_hold.is_none() {
            return Vec::new();
        }
        self.roots
            .iter()
            .copied()
            .filter(|&pid| !crate::host::procfs::status::process_runs(pid))
            .collect()
    }

    /// Holds no more process: the profile is ending.
    pub(super) fn stop_holding(&mut self) {
        if let Some(hold) = self.fork_hold.as_mut() {
            hold.detach();
        }
    }

    /// Session group `group` goes: its links, and the roots' marks in
    /// `LINKED` (the group number is given to another file next).
    pub(super) fn free_group(&mut self, group: u32) {
        let Some(index) = self
            .groups
            .iter()
            .position(|g| g.group == group && !g.offsets.is_empty())
        else {
            return;
        };
        for links in self.links.values_mut() {
            links.retain(|(linked, _)| *linked != index);
        }
        let bit = 1u64 << (group % SITE_GROUPS);
        let roots: Vec<u32> = self.linked.keys().filter_map(Result::ok).collect();
        for root in roots {
            if let Ok(bits) = self.linked.get(&root, 0) {
                if bits & bit != 0 {
                    let _ = self.linked.insert(root, bits & !bit, 0);
                }
            }
        }
        let freed = &mut self.groups[index];
        freed.offsets.clear();
        freed.return_event = None;
        freed.entry_event = None;
    }
}

impl Probes {
    /// A site group of malloc-like functions under session probes: its
    /// shared events (none on the whole host) and the roots' links.
    pub(super) fn attach_session_group(
        &mut self,
        root: &Path,
        programs: &Programs,
        members: &[Planned],
        pids: &[i32],
    ) -> Result<Vec<u64>> {
        let whole_host = self.whole_host;
        // On the whole host one link covers every process, and in `trace`
        // each process gets its own at its fork: no shared events.
        // Elsewhere they are scoped below (the entry event) or to children
        // later (the return event). A link puts its breakpoints only in
        // its process's main thread's address space: in a process whose
        // main thread has ended (pthread_exit) it puts none in a file
        // mapped since, and the group's calls there would go unseen. The
        // shared entry event scoped to the threads running on puts them
        // in (and leaves the calls to the link, whose program then runs).
        let held_forks = self
            .sessions
            .as_ref()
            .is_some_and(|sessions| sessions.fork_hold.is_some());
        let shared_events = !whole_host
            && (!held_forks
                || pids
                    .iter()
                    .any(|&pid| self.needs_session_entries(pid as u32)));
        let group = self.place_group(members)?;
        let module = members[0].module;
        let offsets: Vec<u64> = members.iter().map(|p| p.file_offset).collect();
        let (return_event, entry_event) = if shared_events {
            let (returns, entries) =
                self.attach_session_events(root, programs, group, module, &offsets)?;
            (Some(returns), Some(entries))
        } else {
            (None, None)
        };
        let sessions = self.sessions.as_mut().expect("session sites need sessions");
        sessions.groups.push(SessionGroup {
            group,
            module: module.to_path_buf(),
            offsets,
            return_event,
            entry_event,
        });
        let index = sessions.groups.len() - 1;
        if whole_host {
            sessions.link(0, index)?;
            return Ok(Vec::new());
        }
        for &pid in pids {
            match entry_event {
                Some(entry_event) => self.scopes.scope(pid as u32, entry_event)?,
                // Its forks are announced all the same (they are held).
                None => self.scopes.head_tree(pid as u32),
            }
            self.session_scope(pid as u32, &[index])?;
        }
        Ok(entry_event.into_iter().collect())
    }

    /// Session group `group`'s shared events (returns, entries), as
    /// `attach_group` makes a group's, scoped to no process yet.
    fn attach_session_events(
        &mut self,
        root: &Path,
        programs: &Programs,
        group: u32,
        module: &Path,
        offsets: &[u64],
    ) -> Result<(u64, u64)> {
        let enter = programs
            .session_enter
            .as_ref()
            .context("session probes without their entry program")?;
        let at: Vec<_> = offsets
            .iter()
            .map(|&offset| (module, (offset, None)))
            .collect();
        let events = [
            ("returns", at.clone(), true, &programs.ret),
            ("entries", at, false, enter),
        ];
        match self.attach_events(root, group, events, &[], false)?[..] {
            [returns, entries] => Ok((returns, entries)),
            _ => bail!("a session group without its two events"),
        }
    }

    /// `trace`: whether process `pid` needs the shared entry events of
    /// the session groups of a file it maps (see `scope_session_entries`):
    /// its main thread has ended.
    pub(super) fn needs_session_entries(&self, pid: u32) -> bool {
        self.sessions
            .as_ref()
            .is_some_and(|sessions| sessions.fork_hold.is_some())
            && crate::host::procfs::status::main_thread_ended(pid)
    }

    /// `trace`: process `pid`, whose main thread has ended
    /// (`needs_session_entries`), maps (or still maps: the loader
    /// announces its files again at each dlopen) the file of session
    /// `groups`, made before, for another process or for it. Its links put
    /// no breakpoint in a file mapped since its main thread ended (see
    /// `attach_session_group`): its calls would go unseen. Each group's
    /// shared entry event, made now where the group has none, is scoped to
    /// it (and to what it forks from now on) and puts them in; its program
    /// leaves the calls to the link (`LINKED`). Where the file was mapped
    /// before the main thread ended this adds a consumer the link did not
    /// need: a cost per call, not a count.
    pub(super) fn scope_session_entries(
        &mut self,
        root: &Path,
        programs: &Programs,
        pid: u32,
        groups: &[usize],
    ) -> Result<()> {
        for &index in groups {
            let sessions = self.sessions.as_ref().expect("held forks need sessions");
            let group = &sessions.groups[index];
            // (Freed: its file's probes went.)
            if group.offsets.is_empty() {
                continue;
            }
            let entry_event = match group.entry_event {
                Some(event) => event,
                None => {
                    let (number, module, offsets) =
                        (group.group, group.module.clone(), group.offsets.clone());
                    let (returns, entries) =
                        self.attach_session_events(root, programs, number, &module, &offsets)?;
                    let sessions = self.sessions.as_mut().expect("held forks need sessions");
                    sessions.groups[index].return_event = Some(returns);
                    sessions.groups[index].entry_event = Some(entries);
                    entries
                }
            };
            self.scopes.scope_own(pid, entry_event)?;
        }
        Ok(())
    }

    /// The session groups made at the start on the file of identity
    /// `file`.
    pub(super) fn start_session_groups_of(&self, file: (u64, u64)) -> Vec<usize> {
        let Some(sessions) = self.sessions.as_ref() else {
            return Vec::new();
        };
        self.start_session_groups
            .iter()
            .copied()
            .filter(|&index| {
                files::inode(&sessions.groups[index].module).unwrap_or_default() == file
            })
            .collect()
    }

    /// The functions under session probes (see `Sessions`).
    pub fn session_functions(&self) -> usize {
        self.sessions
            .as_ref()
            .map_or(0, |s| s.groups.iter().map(|g| g.offsets.len()).sum())
    }

    /// Processes held at their fork that ran without (some of) their
    /// session links: they could not be made.
    pub fn unlinked_forks(&self) -> u64 {
        self.sessions.as_ref().map_or(0, |s| s.unlinked_forks)
    }

    /// Session groups made so far.
    pub(super) fn session_group_count(&self) -> usize {
        self.sessions.as_ref().map_or(0, |s| s.groups.len())
    }

    /// Process `pid`, scoped to the shared entry events of session
    /// `groups`: a root is linked to them; any other process (a child of
    /// a root) gets their shared return events.
    pub(super) fn session_scope(&mut self, pid: u32, groups: &[usize]) -> Result<()> {
        let Some(sessions) = self.sessions.as_mut() else {
            return Ok(());
        };
        if sessions.whole_host {
            return Ok(());
        }
        if sessions.roots.contains(&pid) {
            for &index in groups {
                sessions.link(pid, index)?;
            }
            return Ok(());
        }
        let events: Vec<u64> = groups
            .iter()
            .filter_map(|&index| sessions.groups[index].return_event)
            .collect();
        for event in events {
            self.scopes.scope(pid, event)?;
        }
        Ok(())
    }

    /// `--live` with session probes: process `child` was forked by
    /// `parent` without the shared return events (see `Sessions`). If the
    /// parent is profiled, the child gets them, on every session group;
    /// from then on its malloc-like calls are paired with their blocks.
    pub fn on_fork(&mut self, parent: u32, child: u32) -> Result<()> {
        let Some(sessions) = self.sessions.as_ref() else {
            return Ok(());
        };
        let profiled = sessions.roots.contains(&parent) || self.scopes.is_scoped(parent);
        if !profiled || sessions.whole_host || sessions.fork_hold.is_some() {
            return Ok(());
        }
        self.give_returns(child)
    }

    /// `trace`: root `pid` exec'd from a thread other than its main one
    /// (`NoticeKind::Relink`). Its links name the old main thread and put
    /// no breakpoint in the new image: they are made again, the old ones
    /// closed first, here (where the new ones put breakpoints the old
    /// ones' program runs too, and each call would count twice). Not
    /// `held`: the new image ran meanwhile, its first calls unseen
    /// (counted, as a library probed late). Where a group's link cannot
    /// be made (it loses its mark in `LINKED`: see `Sessions::link`) the
    /// process is counted as one whose links could not be made
    /// (`fork_unheld`); the other groups are linked.
    pub fn relink(&mut self, pid: u32, held: bool) -> Result<()> {
        let Some(links) = self.sessions.as_mut().and_then(|s| s.links.remove(&pid)) else {
            return Ok(());
        };
        let groups: Vec<usize> = links.iter().map(|(index, _)| *index).collect();
        drop(links);
        if groups.is_empty() {
            return Ok(());
        }
        if !held {
            self.probed_late += 1;
        }
        let sessions = self.sessions.as_mut().expect("links come from sessions");
        let mut first_error = None;
        for index in groups {
            if let Err(err) = sessions.link(pid, index) {
                first_error.get_or_insert(err);
            }
        }
        match first_error {
            Some(err) => {
                sessions.unlinked_forks += 1;
                Err(err)
            }
            None => Ok(()),
        }
    }

    /// `trace`: the processes the kernel holds at their fork (`fork_hold`)
    /// get their parent's session links, then run. `last`: no process is
    /// held from now on, and those waiting just run (the profile is over).
    /// Each is let go through `parents`: its parent may have taken the
    /// stop for its own.
    pub fn release_held_forks(&mut self, last: bool, parents: &mut StoppedParents) {
        let Some(sessions) = self.sessions.as_mut() else {
            return;
        };
        let Some(hold) = sessions.fork_hold.as_mut() else {
            return;
        };
        if last {
            hold.detach();
        }
        // Once the profile ends they just run.
        let adopting = hold.holding();
        let verbose = self.late.as_ref().is_some_and(|late| late.verbose);
        for (child, groups) in hold.held() {
            if adopting {
                if let Err(err) = sessions.adopt(child, groups) {
                    // It may have been killed meanwhile.
                    if crate::host::procfs::status::start_time(child).is_some() {
                        sessions.unlinked_forks += 1;
                        if verbose {
                            eprintln!("memprof: pid {child}: {err:#}");
                        }
                    }
                }
            }
            // Let go first, then out of the map: memprof stopped (or
            // killed) in between leaves it listed, and its watchdog lets it
            // go; never stopped and listed nowhere.
            let stop_watchers = &mut self.stop_watchers;
            parents.release(child, |parent| watches_stops(stop_watchers, parent));
            if let Some(hold) = sessions.fork_hold.as_mut() {
                hold.unlist(child);
            }
        }
    }

    /// Scopes `pid` onto every session group's shared return event, then
    /// marks it in the kernel as having them (first the events: an entry
    /// that expects a return must get one). If it ends first, the
    /// processes it forks meanwhile keep them (see `Scopes::forget`).
    fn give_returns(&mut self, pid: u32) -> Result<()> {
        let Some(sessions) = self.sessions.as_ref() else {
            return Ok(());
        };
        let events: Vec<u64> = sessions
            .groups
            .iter()
            .filter_map(|group| group.return_event)
            .collect();
        for event in events {
            self.scopes.scope(pid, event)?;
        }
        if let Some(sessions) = self.sessions.as_mut() {
            sessions
                .returning
                .insert(pid, 1, 0)
                .context("map RETURNING")?;
        }
        Ok(())
    }
}
