//! Checks on the processes named with `--pid`, and on memprof's own rights.
use std::fs;

use anyhow::Result;

use crate::error::UserError;

/// PF_KTHREAD in /proc/PID/stat's flags field.
const PF_KTHREAD: u64 = 0x0020_0000;

/// Refuses pids that do not name a user-space process memprof can profile.
pub fn check_pid(pid: i32) -> Result<()> {
    if pid <= 0 {
        return Err(UserError::new(format!("invalid pid {pid}")).into());
    }
    if pid as u32 == std::process::id() {
        return Err(UserError::new(format!("pid {pid} is memprof itself")).into());
    }
    let stat = fs::read_to_string(format!("/proc/{pid}/stat"))
        .map_err(|_| UserError::new(format!("no process with pid {pid}")))?;
    // State is field 3; flags is field 9, i.e. the 7th after the name.
    if matches!(stat_fields_after_name(&stat).next(), Some("Z" | "X")) {
        return Err(UserError::new(format!(
            "pid {pid} has exited (a zombie waiting for its parent): nothing left to profile"
        ))
        .into());
    }
    let flags: u64 = stat_fields_after_name(&stat)
        .nth(6)
        .and_then(|f| f.parse().ok())
        .unwrap_or(0);
    if flags & PF_KTHREAD != 0 {
        return Err(UserError::new(format!(
            "pid {pid} is a kernel thread: it has no user-space allocations to profile"
        ))
        .into());
    }
    Ok(())
}

/// The fields of a /proc/PID/stat line after the command name (field 2),
/// which is in parentheses and may hold spaces: the state comes first.
pub fn stat_fields_after_name(stat: &str) -> std::str::SplitWhitespace<'_> {
    stat.rsplit_once(')')
        .map_or("", |(_, rest)| rest)
        .split_whitespace()
}

/// Capability bits memprof needs (see capabilities(7)).
const CAP_SYS_ADMIN: u32 = 21;
const CAP_PERFMON: u32 = 38;
const CAP_BPF: u32 = 39;

/// memprof loads BPF programs, opens perf events and writes tracefs:
/// refuse early, before anything is loaded, when it may not.
pub fn check_privileges() -> Result<()> {
    let status = fs::read_to_string("/proc/self/status").unwrap_or_default();
    let effective = status
        .lines()
        .find_map(|line| line.strip_prefix("CapEff:"))
        .and_then(|hex| u64::from_str_radix(hex.trim(), 16).ok())
        .unwrap_or(0);
    let missing: Vec<&str> = [
        (CAP_SYS_ADMIN, "CAP_SYS_ADMIN"),
        (CAP_BPF, "CAP_BPF"),
        (CAP_PERFMON, "CAP_PERFMON"),
    ]
    .into_iter()
    .filter(|(bit, _)| effective & (1 << bit) == 0)
    .map(|(_, name)| name)
    .collect();
    if missing.is_empty() {
        Ok(())
    } else {
        Err(UserError::new(format!(
            "memprof must run as root (missing {}): try sudo memprof ...",
            missing.join(", ")
        ))
        .into())
    }
}

/// `monitor --comm REGEX --exe PATH`: which processes to watch.
#[derive(Clone, Debug)]
pub struct Selection {
    comms: Vec<regex::Regex>,
    exes: Vec<std::path::PathBuf>,
}

impl Selection {
    /// None when nothing is named.
    pub fn new(comms: &[regex::Regex], exes: &[std::path::PathBuf]) -> Option<Selection> {
        let exes: Vec<std::path::PathBuf> = exes
            .iter()
            .map(|exe| fs::canonicalize(exe).unwrap_or_else(|_| exe.clone()))
            .collect();
        (!comms.is_empty() || !exes.is_empty()).then(|| Selection {
            comms: comms.to_vec(),
            exes,
        })
    }

    /// Whether process `pid` (not memprof, not a kernel thread) is one.
    pub fn selects(&self, pid: i32) -> bool {
        if pid == std::process::id() as i32 {
            return false;
        }
        let Ok(exe) = fs::read_link(format!("/proc/{pid}/exe")) else {
            return false;
        };
        let comm = fs::read_to_string(format!("/proc/{pid}/comm")).unwrap_or_default();
        self.comms.iter().any(|re| re.is_match(comm.trim_end())) || self.exes.contains(&exe)
    }

    /// The running processes it selects, by pid.
    pub fn running(&self) -> Vec<i32> {
        let Ok(entries) = fs::read_dir("/proc") else {
            return Vec::new();
        };
        let mut pids: Vec<i32> = entries
            .flatten()
            .filter_map(|entry| entry.file_name().to_str()?.parse::<i32>().ok())
            .filter(|&pid| self.selects(pid))
            .collect();
        pids.sort_unstable();
        pids
    }
}
