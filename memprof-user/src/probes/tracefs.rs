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

/// Where tracefs is mounted; mounts it when it is not.
pub fn tracefs_root() -> Result<PathBuf> {
    for root in ["/sys/kernel/tracing", "/sys/kernel/debug/tracing"] {
        if Path::new(root).join("uprobe_events").exists() {
            return Ok(PathBuf::from(root));
        }
    }
    let root = Path::new("/sys/kernel/tracing");
    nix::mount::mount(
        Some("tracefs"),
        root,
        Some("tracefs"),
        nix::mount::MsFlags::empty(),
        None::<&str>,
    )
    .context("tracefs is not mounted and mounting it on /sys/kernel/tracing failed")?;
    if !root.join("uprobe_events").exists() {
        bail!("this kernel has no uprobe_events (CONFIG_UPROBE_EVENTS is off)");
    }
    Ok(root.to_path_buf())
}

/// One uprobe event created by this process; removed on drop.
#[derive(Debug)]
pub struct UprobeEvent {
    root: PathBuf,
    group: String,
    name: String,
    /// The tracepoint id perf_event_open takes as `config`.
    pub id: u64,
}

impl UprobeEvent {
    /// Creates `p:` (entry) or `r:` (return) probe `name` at `offset` in `binary`.
    pub fn create(root: &Path, name: &str, binary: &Path, offset: u64, ret: bool) -> Result<Self> {
        let group = format!("{GROUP_PREFIX}{}", std::process::id());
        let kind = if ret { 'r' } else { 'p' };
        let line = format!("{kind}:{group}/{name} {}:{offset:#x}", binary.display());
        append(&root.join("uprobe_events"), &line)
            .with_context(|| format!("creating uprobe '{line}'"))?;
        let mut event = UprobeEvent {
            root: root.to_path_buf(),
            group,
            name: name.to_string(),
            id: 0,
        };
        let id_path = root.join("events").join(&event.group).join(name).join("id");
        event.id = fs::read_to_string(&id_path)
            .with_context(|| format!("reading {}", id_path.display()))?
            .trim()
            .parse()
            .with_context(|| format!("parsing {}", id_path.display()))?;
        Ok(event)
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
