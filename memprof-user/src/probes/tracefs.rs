//! Uprobe events in tracefs (`uprobe_events`).
//!
//! memprof creates its uprobes here rather than through the perf `uprobe`
//! PMU because only tracefs events can be opened per process with
//! `inherit`: the probes then follow the target's forks and execs, and
//! nothing else on the host hits them. Unlike perf fds, these events stay
//! when memprof is killed, so each memprof names its group after its pid
//! and removes the groups of memprofs that are gone.
use std::{
    fs,
    io::Write as _,
    path::{Path, PathBuf},
};

use anyhow::{bail, Context as _, Result};

const GROUP_PREFIX: &str = "memprof_";

/// Where tracefs is mounted; mounts it when it is not. A fresh host often
/// has it unmounted: like libtracefs and trace-cmd, memprof mounts tracefs
/// on its own mount point, or else debugfs (which carries `tracing` inside).
/// Call before anything else looks for tracefs (aya looks once per process).
pub fn tracefs_root() -> Result<PathBuf> {
    if let Some(root) = mounted_root() {
        return Ok(root);
    }
    let mut failures = Vec::new();
    for (fstype, target) in [
        ("tracefs", "/sys/kernel/tracing"),
        ("debugfs", "/sys/kernel/debug"),
    ] {
        let mounted = nix::mount::mount(
            Some(fstype),
            target,
            Some(fstype),
            nix::mount::MsFlags::empty(),
            None::<&str>,
        );
        match mounted {
            Ok(()) => {
                if let Some(root) = mounted_root() {
                    return Ok(root);
                }
                failures.push(format!("{fstype} on {target} has no uprobe_events"));
            }
            Err(err) => failures.push(format!("mounting {fstype} on {target}: {err}")),
        }
    }
    bail!(
        "tracefs is not mounted and memprof could not mount it ({}); \
         uprobe events need a kernel with CONFIG_UPROBE_EVENTS and tracefs \
         (mount -t tracefs nodev /sys/kernel/tracing)",
        failures.join("; ")
    )
}

/// The mounted tracefs that has uprobe events, if any.
pub fn mounted_root() -> Option<PathBuf> {
    ["/sys/kernel/tracing", "/sys/kernel/debug/tracing"]
        .into_iter()
        .map(PathBuf::from)
        .find(|root| root.join("uprobe_events").exists())
}

/// One uprobe event created by this process; removed on drop.
#[derive(Debug)]
pub struct UprobeEvent {
    root: PathBuf,
    group: String,
    name: String,
    /// The tracepoint id perf_event_open takes as `config`.
    pub id: u64,
    ret: bool,
}

impl UprobeEvent {
    /// Creates `p:` (entry) or `r:` (return) probe `name` at `offset` in
    /// `binary` (with a USDT semaphore at file offset `semaphore`).
    pub fn create(
        root: &Path,
        name: &str,
        binary: &Path,
        (offset, semaphore): (u64, Option<u64>),
        ret: bool,
    ) -> Result<Self> {
        let group = format!("{GROUP_PREFIX}{}", std::process::id());
        let mut event = UprobeEvent {
            root: root.to_path_buf(),
            group,
            name: name.to_string(),
            id: 0,
            ret,
        };
        event.append(binary, (offset, semaphore))?;
        let id_path = root.join("events").join(&event.group).join(name).join("id");
        event.id = fs::read_to_string(&id_path)
            .with_context(|| format!("reading {}", id_path.display()))?
            .trim()
            .parse()
            .with_context(|| format!("parsing {}", id_path.display()))?;
        Ok(event)
    }

    /// Adds a probe at `offset` in `binary` to this event (before it is
    /// enabled): the kernel keeps one event with several probes, which
    /// detaches at once.
    /// The kernel raises a semaphore's 16-bit counter in each process
    /// while the probe is in (a USDT probe fires only then).
    pub fn append(&self, binary: &Path, (offset, semaphore): (u64, Option<u64>)) -> Result<()> {
        let kind = if self.ret { 'r' } else { 'p' };
        let semaphore = semaphore.map_or(String::new(), |at| format!("({at:#x})"));
        let line = format!(
            "{kind}:{}/{} {}:{offset:#x}{semaphore}",
            self.group,
            self.name,
            binary.display()
        );
        append(&self.root.join("uprobe_events"), &line)
            .with_context(|| format!("creating uprobe '{line}'"))
    }
}

impl Drop for UprobeEvent {
    fn drop(&mut self) {
        // Fails with EBUSY while a perf event is open on it: callers close
        // those first (field order in `Probes`).
        let _ = append(
            &self.root.join("uprobe_events"),
            &format!("-:{}/{}", self.group, self.name),
        );
    }
}

/// Removes the uprobe events of memprof processes that no longer run
/// (killed with SIGKILL, say).
pub fn remove_stale(root: &Path) -> Result<()> {
    let events_path = root.join("uprobe_events");
    let events = fs::read_to_string(&events_path)?;
    for line in events.lines() {
        // "p:memprof_123/malloc_0 /usr/lib/x86_64-linux-gnu/libc.so.6:0x..."
        let Some(spec) = line.split_whitespace().next() else {
            continue;
        };
        let Some((_, event)) = spec.split_once(':') else {
            continue;
        };
        let Some((group, _name)) = event.split_once('/') else {
            continue;
        };
        let Some(owner) = group.strip_prefix(GROUP_PREFIX) else {
            continue;
        };
        let Ok(owner) = owner.parse::<u32>() else {
            continue;
        };
        if owner == std::process::id() || Path::new(&format!("/proc/{owner}")).exists() {
            continue;
        }
        let _ = append(&events_path, &format!("-:{event}"));
    }
    Ok(())
}

/// Writes one line to a tracefs control file without truncating it.
fn append(path: &Path, line: &str) -> std::io::Result<()> {
    let mut file = fs::OpenOptions::new().append(true).open(path)?;
    file.write_all(format!("{line}\n").as_bytes())
}
