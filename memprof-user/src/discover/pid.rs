//! Checks on the processes named with `--pid`, and on memprof's own rights.
use std::fs;

use anyhow::Result;

use crate::{host::procfs::status::stat_fields_after_name, human::error::UserError};

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
    if crate::host::procfs::status::has_ended(pid as u32, &stat) {
        return Err(UserError::new(format!(
            "pid {pid} has exited (a zombie waiting for its parent): nothing left to profile"
        ))
        .into());
    }
    // Flags is field 9, the 7th after the name.
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

/// Capability bits memprof needs (see capabilities(7)).
const CAP_SYS_ADMIN: u32 = 21;
const CAP_PERFMON: u32 = 38;
const CAP_BPF: u32 = 39;

/// memprof loads BPF programs, opens perf events and writes tracefs:
/// refuse early, before anything is loaded, when it may not.
pub fn check_privileges() -> Result<()> {
    let missing = missing_capabilities();
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

/// The capabilities memprof needs that this process does not have in
/// effect (`memprof doctor` says the same).
pub fn missing_capabilities() -> Vec<&'static str> {
    let status = fs::read_to_string("/proc/self/status").unwrap_or_default();
    let effective = status
        .lines()
        .find_map(|line| line.strip_prefix("CapEff:"))
        .and_then(|hex| u64::from_str_radix(hex.trim(), 16).ok())
        .unwrap_or(0);
    [
        (CAP_SYS_ADMIN, "CAP_SYS_ADMIN"),
        (CAP_BPF, "CAP_BPF"),
        (CAP_PERFMON, "CAP_PERFMON"),
    ]
    .into_iter()
    .filter(|(bit, _)| effective & (1 << bit) == 0)
    .map(|(_, name)| name)
    .collect()
}

/// `monitor --comm REGEX --exe PATH --cgroup PATH`: which processes to
/// watch; with none named, every one (the whole host).
#[derive(Clone, Debug)]
pub struct Selection {
    comms: Vec<regex::Regex>,
    exes: Vec<std::path::PathBuf>,
    /// Cgroup paths as /proc/PID/cgroup names them ("/system.slice/x").
    cgroups: Vec<String>,
}

impl Selection {
    /// None when nothing is named.
    pub fn new(
        comms: &[regex::Regex],
        exes: &[std::path::PathBuf],
        cgroups: &[String],
    ) -> Option<Selection> {
        let exes: Vec<std::path::PathBuf> = exes
            .iter()
            .map(|exe| fs::canonicalize(exe).unwrap_or_else(|_| exe.clone()))
            .collect();
        (!comms.is_empty() || !exes.is_empty() || !cgroups.is_empty()).then(|| Selection {
            comms: comms.to_vec(),
            exes,
            cgroups: cgroups.to_vec(),
        })
    }

    /// Every process but memprof (the whole host).
    pub fn everyone() -> Selection {
        Selection {
            comms: vec![regex::Regex::new("").expect("an empty pattern")],
            exes: Vec::new(),
            cgroups: Vec::new(),
        }
    }

    /// Whether it selects every process (the whole host).
    pub fn is_everyone(&self) -> bool {
        self.comms.iter().any(|re| re.as_str().is_empty())
    }

    /// Whether process `pid` (not memprof, not a kernel thread) is one.
    pub fn selects(&self, pid: i32) -> bool {
        if pid == std::process::id() as i32 {
            return false;
        }
        // A program upgraded since it started is still the one named.
        // (Through a live thread: a process whose main thread ended has no
        // /proc/PID/exe.)
        let Some(exe) = crate::host::procfs::paths::program_link(
            &crate::host::procfs::status::live_dir(pid as u32).join("exe"),
        ) else {
            return false;
        };
        let comm = fs::read_to_string(format!("/proc/{pid}/comm")).unwrap_or_default();
        self.comms.iter().any(|re| re.is_match(comm.trim_end()))
            || self.exes.contains(&std::path::PathBuf::from(exe))
            || (!self.cgroups.is_empty()
                && crate::host::procfs::cgroups::cgroups_of(pid as u32)
                    .iter()
                    .any(|group| self.cgroups.iter().any(|want| within(group, want))))
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

/// Cgroup `group` is `want` or below it.
fn within(group: &str, want: &str) -> bool {
    want == "/"
        || group == want
        || group
            .strip_prefix(want)
            .is_some_and(|rest| rest.starts_with('/'))
}

/// `--cgroup PATH`: a cgroup's directory under a cgroup mount
/// (/sys/fs/cgroup/system.slice/x.service), or its path as
/// /proc/PID/cgroup shows it (/system.slice/x.service): the latter.
pub fn cgroup_path(arg: &std::path::Path) -> Result<String> {
    if !arg.is_absolute() {
        anyhow::bail!(UserError::new(format!(
            "--cgroup {}: give the cgroup's path (/system.slice/x.service) or its directory (/sys/fs/cgroup/...)",
            arg.display()
        ))
        .with_exit_code(2));
    }
    let mounts = fs::read_to_string("/proc/self/mounts").unwrap_or_default();
    let points: Vec<&str> = mounts
        .lines()
        .filter_map(|line| {
            let mut fields = line.split(' ');
            let (_, point, fstype) = (fields.next()?, fields.next()?, fields.next()?);
            (fstype == "cgroup" || fstype == "cgroup2").then_some(point)
        })
        .collect();
    // Its directory under a mount, or a path some hierarchy has.
    let path = points
        .iter()
        .find_map(|point| {
            let rest = arg.strip_prefix(point).ok()?;
            arg.is_dir().then(|| format!("/{}", rest.display()))
        })
        .or_else(|| {
            let relative = arg.strip_prefix("/").ok()?;
            points
                .iter()
                .any(|point| std::path::Path::new(point).join(relative).is_dir())
                .then(|| arg.display().to_string())
        })
        .ok_or_else(|| {
            UserError::new(format!("no such cgroup: {}", arg.display())).with_exit_code(2)
        })?;
    let trimmed = path.trim_end_matches('/');
    Ok(if trimmed.is_empty() { "/" } else { trimmed }.to_string())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_cgroup_is_within_itself_and_its_ancestors_only() {
        assert!(within("/system.slice/a.service", "/system.slice"));
        assert!(within("/system.slice", "/system.slice"));
        assert!(within("/x", "/"));
        assert!(!within("/system.slicer", "/system.slice"));
        assert!(!within("/system.slice", "/system.slice/a.service"));
    }

    #[test]
    fn cgroup_paths_are_taken_as_proc_shows_them() {
        assert_eq!(cgroup_path(std::path::Path::new("/")).unwrap(), "/");
        assert!(cgroup_path(std::path::Path::new("/memprof-no-such-group")).is_err());
        assert!(cgroup_path(std::path::Path::new("system.slice")).is_err());
    }
}
