//! Putting planned probes on the kernel's uprobes: each site group on two
//! shared tracefs events (entries, returns), each event hooked to its BPF
//! program and scoped to the processes it traps in.
use std::{
    os::fd::{AsFd as _, OwnedFd},
    path::Path,
};

use anyhow::{bail, Context as _, Result};

use super::{
    plan::{session_groups, site_groups, Planned},
    GroupHold, Hooked, Probes, Programs,
};
use crate::{
    human::error::UserError,
    probes::{perf, tracefs},
};

impl Probes {
    /// Places `planned` probes in site groups, each group's on two shared
    /// events (entries, returns); returns the events' ids. A group takes
    /// sites whose page offsets differ (the kernel finds a site by its
    /// group and page offset).
    /// The ids returned are those a process scoped later gets (not the
    /// session groups' return events: see `Sessions`). Sites under
    /// session probes get groups of their own.
    pub(super) fn attach_planned(
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
    pub(super) fn attach_events(
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

    /// `always`: on the whole host, an event that stays in under the
    /// budget (a loader's).
    pub(super) fn hook(
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
