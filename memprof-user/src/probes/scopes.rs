//! Which processes the uprobe events trap in after the start: each process
//! scoped since (or, under `monitor`'s budget, from the start) has scope
//! events of its own, opened with `inherit` so the children it forks
//! trap too (see `perf`).
//!
//! Under the budget, a process is scoped under its nearest scoped
//! ancestor, its *root*: a root's whole tree is taken out (its scope
//! events closed: the kernel takes the breakpoints out of those address
//! spaces) and put in again (reopened for the root and each descendant
//! running then, since reopened events reach only children forked later).
//! While that goes on the tree's processes are in the kernel's `GATED_OUT`
//! and not counted: what is counted falls between the moments user space
//! knows.
//!
//! On the whole host the one root is [`HOST`]: its scope events are
//! system-wide (one per uprobe event), and every process goes in and out
//! with them.
use std::{
    collections::HashMap,
    os::fd::OwnedFd,
    time::{Duration, Instant},
};

use anyhow::{Context as _, Result};
use aya::maps::{Array, HashMap as BpfHashMap, MapData};

use super::perf;
use crate::host::procfs::status;

#[derive(Default)]
pub struct Scopes {
    /// `monitor`'s budget: the kernel's `GATED_OUT`; processes are scoped
    /// under their root.
    gate: Option<BpfHashMap<MapData, u32, u8>>,
    /// With `gate`: the kernel's `PROBE_EPOCH`, bumped each time a tree's
    /// probes have gone out or come in (the nesting depths of calls under
    /// way then are stale).
    epoch: Option<(Array<MapData, u32>, u32)>,
    /// With `gate`: the kernel's `ALLOWANCES` and `FIRST_ALLOWANCE`, the
    /// traps each process may take before it asks to be taken out.
    allowances: Option<Allowances>,
    /// The kernel's `TREES`: each process with scope events of its own,
    /// and those forked since from it (their events are inherited); none
    /// in unit tests.
    trees: Option<BpfHashMap<MapData, u32, u32>>,
    roots: HashMap<u32, Root>,
    /// Every process's children, read at most every [`CHILDREN_MAX_AGE`]
    /// (a read visits all of /proc).
    children: Option<(Instant, HashMap<u32, Vec<u32>>)>,
}

/// What taking trees' probes out and putting them in needs: the kernel's
/// `GATED_OUT`, `PROBE_EPOCH`, and the allowances.
pub type SwitchMaps = (
    BpfHashMap<MapData, u32, u8>,
    Array<MapData, u32>,
    Allowances,
);

/// The traps each process may take before the kernel asks user space to
/// take its probes out (`OVER_BUDGET`).
pub struct Allowances {
    /// By tgid (an LRU map).
    pub by_process: BpfHashMap<MapData, u32, u64>,
    /// `[0]`: a process without an entry's; 0: none kept.
    pub first: Array<MapData, u64>,
}

/// The root of every process on the host (`monitor` of the whole host
/// under the budget); no process has pid 0.
pub const HOST: u32 = 0;

/// How old the children read from /proc may be: a process forked since,
/// while its root was out, gets its probes at the root's next window.
const CHILDREN_MAX_AGE: Duration = Duration::from_secs(1);

/// A process scoped apart, and the tree it heads.
struct Root {
    /// When it started: with the pid, who it is.
    start_time: u64,
    /// When it got events of its own.
    scoped_at: Instant,
    /// The events its tree is scoped onto.
    events: Vec<u64>,
    /// Its tree's open scope events, by the process each is on and the
    /// uprobe event it scopes; none while it is out.
    fds: Vec<(u32, u64, OwnedFd)>,
    /// Out: the processes of its tree then, not counted meanwhile.
    out: Option<Vec<u32>>,
    /// The tree it was in when it got events of its own (whose events it
    /// inherited too), if any.
    within: Option<u32>,
}

impl Scopes {
    /// Scopes tracked in the kernel's `trees`; with `gate`, they can be
    /// taken out and put in.
    pub fn new(trees: BpfHashMap<MapData, u32, u32>, gate: Option<SwitchMaps>) -> Scopes {
        let (gate, epoch, allowances) = match gate {
            Some((gate, epoch, allowances)) => (Some(gate), Some(epoch), Some(allowances)),
            None => (None, None, None),
        };
        Scopes {
            gate,
            epoch: epoch.map(|epoch| (epoch, 0)),
            allowances,
            trees: Some(trees),
            roots: HashMap::new(),
            children: None,
        }
    }

    pub fn is_switchable(&self) -> bool {
        self.gate.is_some()
    }

    /// Makes uprobe event `event` trap in every process (at once, or when
    /// the host's probes are put in again), under the root [`HOST`].
    pub fn scope_host(&mut self, event: u64) -> Result<()> {
        self.scope_under(HOST, HOST, event)
    }

    /// Makes uprobe event `event` trap in process `pid` and the children
    /// it forks from now on (at once, or when its root is put in again).
    pub fn scope(&mut self, pid: u32, event: u64) -> Result<()> {
        let root = match self.is_switchable() {
            true => self.root_of(pid).unwrap_or(pid),
            false => pid,
        };
        self.scope_under(root, pid, event)
    }

    /// Makes uprobe event `event` trap in `pid` through events of its own,
    /// not under its root (its tree's head has ended, or the event is for
    /// it alone); none if it has one.
    pub fn scope_own(&mut self, pid: u32, event: u64) -> Result<()> {
        if self
            .roots
            .get(&pid)
            .is_some_and(|root| root.events.contains(&event))
        {
            return Ok(());
        }
        self.scope_under(pid, pid, event)
    }

    fn scope_under(&mut self, root: u32, pid: u32, event: u64) -> Result<()> {
        if !self.roots.contains_key(&root) {
            let within = self
                .trees
                .as_ref()
                .filter(|_| root != HOST)
                .and_then(|trees| trees.get(&root, 0).ok())
                .filter(|&tree| tree != root);
            // Its own tree from now on, and counted (it may have been in
            // a tree taken out when that tree's head ended).
            if let Some(trees) = self.trees.as_mut().filter(|_| root != HOST) {
                let _ = trees.insert(root, root, 0);
            }
            if let Some(gate) = self.gate.as_mut() {
                let _ = gate.remove(&root);
            }
            self.roots.insert(
                root,
                Root {
                    start_time: status::start_time(root).unwrap_or(0),
                    scoped_at: Instant::now(),
                    events: Vec::new(),
                    fds: Vec::new(),
                    out: None,
                    within,
                },
            );
        }
        let entry = self.roots.get_mut(&root).expect("inserted above");
        if !entry.events.contains(&event) {
            entry.events.push(event);
        }
        if entry.out.is_none() {
            let fds = open_scope(pid, event, perf::Threads::Every)
                .with_context(|| format!("perf_event_open on uprobe {event} for pid {pid}"))?;
            entry.fds.extend(fds.into_iter().map(|fd| (pid, event, fd)));
        }
        Ok(())
    }

    /// Process `pid` heads a tree in the kernel's `TREES` without scope
    /// events of its own (`trace`'s root when its malloc-like functions
    /// have session links alone): what it forks is announced.
    pub fn head_tree(&mut self, pid: u32) {
        if let Some(trees) = self.trees.as_mut() {
            let _ = trees.insert(pid, pid, 0);
        }
    }

    /// Whether `pid` has scope events of its own.
    pub fn is_scoped(&self, pid: u32) -> bool {
        self.roots.contains_key(&pid)
    }

    /// The root whose tree `pid` is in (itself, or its nearest scoped
    /// ancestor), if any.
    pub fn root_of(&self, pid: u32) -> Option<u32> {
        if self.roots.contains_key(&HOST) {
            return Some(HOST);
        }
        let mut pid = pid;
        // Bounded: /proc may change under the walk.
        for _ in 0..64 {
            if self.roots.contains_key(&pid) {
                return Some(pid);
            }
            pid = status::parent_of(pid).filter(|&parent| parent > 1)?;
        }
        None
    }

    /// When `root` got scope events of its own.
    pub fn scoped_since(&self, root: u32) -> Option<Instant> {
        self.roots.get(&root).map(|entry| entry.scoped_at)
    }

    pub fn roots(&self) -> impl Iterator<Item = u32> + '_ {
        self.roots.keys().copied()
    }

    /// The traps a process first seen may take (0: no allowance kept).
    pub fn allow_first(&mut self, traps: u64) {
        if let Some(allowances) = self.allowances.as_mut() {
            let _ = allowances.first.set(0, traps, 0);
        }
    }

    /// The traps each process of `root`'s tree may take from now; on
    /// [`HOST`] every process's, those started later too.
    pub fn allow(&mut self, root: u32, traps: u64) {
        if self.allowances.is_none() {
            return;
        }
        let tree = match root {
            HOST => Vec::new(),
            _ => self.tree(root),
        };
        let Some(allowances) = self.allowances.as_mut() else {
            return;
        };
        if root == HOST {
            // Every process afresh, from the first allowance.
            let _ = allowances.first.set(0, traps, 0);
            let pids: Vec<u32> = allowances
                .by_process
                .keys()
                .filter_map(|k| k.ok())
                .collect();
            for pid in pids {
                let _ = allowances.by_process.remove(&pid);
            }
        }
        for pid in tree {
            let _ = allowances.by_process.insert(pid, traps.max(1), 0);
        }
    }

    /// The processes of `root`'s tree: itself and every descendant running
    /// (as of the last read of /proc), but those under roots of their own.
    pub fn tree(&mut self, root: u32) -> Vec<u32> {
        // The host's, one root switched once a window, is read afresh: a
        // process started since the last read would have no CPU time in
        // the window, and be estimated by its share of the time.
        let fresh = root != HOST
            && self
                .children
                .as_ref()
                .is_some_and(|(read, _)| read.elapsed() < CHILDREN_MAX_AGE);
        if !fresh {
            self.children = Some((Instant::now(), status::children()));
        }
        let children = &self.children.as_ref().expect("read above").1;
        // The host's: every process (init's tree; the kernel's threads
        // are kthreadd's).
        let head = match root {
            HOST => 1,
            _ => root,
        };
        let mut tree = status::descendants(children, head, |pid| {
            root != HOST && self.roots.contains_key(&pid)
        });
        tree.insert(0, head);
        tree
    }

    /// Takes the probes out of `root`'s tree (until [`Scopes::put_in`]);
    /// its processes are not counted from the moment this is called.
    /// `uncounted` runs with the tree as soon as they are not (before
    /// their events close).
    pub fn take_out(&mut self, root: u32, uncounted: impl FnOnce(&[u32])) {
        if self
            .roots
            .get(&root)
            .is_none_or(|entry| entry.out.is_some())
        {
            return;
        }
        let tree = self.tree(root);
        if let Some(gate) = self.gate.as_mut() {
            for &pid in on_own(root, &tree) {
                // Full: that process is counted while its probes go out.
                let _ = gate.insert(pid, 1, 0);
            }
        }
        uncounted(&tree);
        let entry = self.roots.get_mut(&root).expect("looked up above");
        // Last opened, first closed: each group's entry event before its
        // return event (opened first), so that no entry traps once its
        // return cannot (the return's filter is asked at the entry: in the
        // other order a call entered between the two closes lost its
        // return, and a --while region never ended).
        while let Some(scope) = entry.fds.pop() {
            drop(scope);
        }
        entry.out = Some(tree);
        // Once they are out: a call entered before then may still have
        // lost its return (an entry program running on another CPU). This
        // also covers a forgotten root's heirs, scoped anew later.
        self.next_epoch();
    }

    /// Bumps the kernel's `PROBE_EPOCH`: the nesting depths of the calls
    /// under way go stale (their returns may go unseen).
    fn next_epoch(&mut self) {
        if let Some((map, epoch)) = self.epoch.as_mut() {
            *epoch = epoch.wrapping_add(1);
            let _ = map.set(0, *epoch, 0);
        }
    }

    /// Puts the probes back in `root`'s tree, on the threads `threads`
    /// says; its processes are counted from the moment this returns.
    /// Returns the tree's processes. `uncounted` runs with them the
    /// moment before they are counted (their events open).
    pub fn put_in(
        &mut self,
        root: u32,
        threads: perf::Threads,
        uncounted: impl FnOnce(&[u32]),
    ) -> Vec<u32> {
        if self
            .roots
            .get(&root)
            .is_none_or(|entry| entry.out.is_none())
        {
            return Vec::new();
        }
        let tree = self.tree(root);
        let entry = self.roots.get_mut(&root).expect("looked up above");
        for &pid in on_own(root, &tree) {
            for &event in &entry.events {
                // A process that has just ended is no error.
                if let Ok(fds) = open_scope(pid, event, threads) {
                    entry.fds.extend(fds.into_iter().map(|fd| (pid, event, fd)));
                }
            }
        }
        let out = entry.out.take().unwrap_or_default();
        // An entry program still running on another CPU as `take_out`
        // bumped the epoch may have deepened with the new one and then
        // lost its return. (Each bump costs a may-nest call under way
        // elsewhere on the host, between its entry and its nested call,
        // one count too many: nanoseconds to microseconds.)
        self.next_epoch();
        uncounted(&tree);
        if let Some(gate) = self.gate.as_mut() {
            for pid in on_own(root, &out).iter().chain(on_own(root, &tree)) {
                let _ = gate.remove(pid);
            }
        }
        tree
    }

    /// A process has ended: its scope events go (with its tree's, when it
    /// is a root). The processes forked from it (or from them) still
    /// running, which inherited its events, get events of their own first:
    /// the kernel drops inherited events with the ones they came from (a
    /// daemon's parent that forks it and exits would leave it unprobed).
    pub fn forget(&mut self, pid: u32) {
        let Some((events, within)) = self
            .roots
            .get(&pid)
            .map(|root| (root.events.clone(), root.within))
        else {
            return;
        };
        let heirs = self.heirs(pid);
        if let Some(trees) = self.trees.as_mut() {
            let _ = trees.remove(&pid);
        }
        for heir in heirs {
            for &event in &events {
                if let Err(err) = self.scope_own(heir, event) {
                    // It may have ended meanwhile.
                    if status::start_time(heir).is_some() {
                        eprintln!("memprof: warning: pid {heir}: {err:#}");
                    }
                }
            }
        }
        // They hold its events themselves now, but still inherit those of
        // the tree it was in (perf copies a parent's events from the event
        // they came from): they are in that tree now, and get its events
        // when its head ends (a grandchild whose parent ended before the
        // root lost the root's events with it).
        for root in self.roots.values_mut() {
            if root.within == Some(pid) {
                root.within = within;
            }
        }
        let Some(root) = self.roots.remove(&pid) else {
            return;
        };
        if let Some(gate) = self.gate.as_mut() {
            for pid in root.out.iter().flatten() {
                let _ = gate.remove(pid);
            }
        }
    }

    /// The processes still running that inherited `head`'s events: those
    /// of its tree, and of the trees of those with events of their own
    /// since (they inherited `head`'s too), theirs, and so on.
    fn heirs(&self, head: u32) -> Vec<u32> {
        let members: Vec<(u32, u32)> = self.trees.as_ref().map_or(Vec::new(), |trees| {
            trees
                .iter()
                .filter_map(|entry| entry.ok())
                .filter(|&(member, tree)| member != tree)
                .collect()
        });
        let mut heirs = Vec::new();
        let mut trees = vec![head];
        while let Some(tree) = trees.pop() {
            let subtrees = self
                .roots
                .iter()
                .filter(|(&root, entry)| entry.within == Some(tree) && root != head)
                .map(|(&root, _)| root);
            for heir in members
                .iter()
                .filter(|&&(_, of)| of == tree)
                .map(|&(member, _)| member)
                .chain(subtrees)
            {
                if heir == head || heirs.contains(&heir) {
                    continue;
                }
                if self.roots.contains_key(&heir) {
                    trees.push(heir);
                }
                heirs.push(heir);
            }
        }
        heirs.retain(|&heir| status::start_time(heir).is_some());
        heirs
    }

    /// The roots that have ended, or whose pid another process took.
    pub fn gone(&self) -> Vec<u32> {
        self.roots
            .keys()
            .copied()
            .filter(|&pid| self.is_gone(pid))
            .collect()
    }

    /// Whether root `pid` has ended, or another process took its pid.
    pub fn is_gone(&self, pid: u32) -> bool {
        pid != HOST
            && self
                .roots
                .get(&pid)
                .is_some_and(|root| status::start_time(pid) != Some(root.start_time))
    }

    /// Closes the scope events of the processes of a tree that have ended
    /// (a root in all along would keep one per process it ever scoped).
    pub fn close_ended(&mut self) {
        for (&root, entry) in &mut self.roots {
            let mut ended: HashMap<u32, bool> = HashMap::new();
            entry.fds.retain(|&(pid, _, _)| {
                pid == root
                    || !*ended
                        .entry(pid)
                        .or_insert_with(|| status::start_time(pid).is_none())
            });
        }
    }

    /// Every open scope event, to be closed with the rest at the end.
    pub fn take_all(&mut self) -> Vec<OwnedFd> {
        std::mem::take(&mut self.roots)
            .into_values()
            .flat_map(|root| root.fds.into_iter().map(|(_, _, fd)| fd))
            .collect()
    }

    /// Uprobe events about to be removed (their file's probes are freed):
    /// no tree is scoped onto them any more; their scope events, to be
    /// closed before them.
    pub fn drop_events(&mut self, events: &[u64]) -> Vec<OwnedFd> {
        let mut dropped = Vec::new();
        for root in self.roots.values_mut() {
            root.events.retain(|event| !events.contains(event));
            let (gone, kept) = std::mem::take(&mut root.fds)
                .into_iter()
                .partition(|(_, event, _)| events.contains(event));
            root.fds = kept;
            dropped.extend(gone.into_iter().map(|(_, _, fd)| fd));
        }
        dropped
    }
}

/// The scope events of uprobe event `event` on process `pid`'s
/// `threads`, inherited by what they fork (`perf::open_scopes`); on
/// [`HOST`], one of every process.
fn open_scope(pid: u32, event: u64, threads: perf::Threads) -> std::io::Result<Vec<OwnedFd>> {
    match pid {
        HOST => Ok(vec![perf::open_tracepoint(event, -1, false)?]),
        _ => perf::open_scopes(event, pid as i32, threads),
    }
}

/// What of `root`'s tree `tree` has scope events and `GATED_OUT` keys of
/// its own: each process, or on [`HOST`] one of each for every process.
fn on_own(root: u32, tree: &[u32]) -> &[u32] {
    match root {
        HOST => &[HOST],
        _ => tree,
    }
}
