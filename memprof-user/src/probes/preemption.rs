//! Whether this kernel may preempt memprof's BPF programs. Since 6.0
//! (sleepable uprobe programs) uprobe programs run with migration
//! disabled, not preemption; memprof keeps per-CPU scratch state (the
//! stack being walked, counters' slots, the sampling countdown) and
//! assumes two of its programs never interleave on one CPU
//! (docs/decisions/0004-per-cpu-scratch-and-preemption.md). Under `preempt=none` or `voluntary` (server
//! distributions) they cannot; under `full`, `lazy` or a real-time kernel
//! they can, rarely, and a call's figures could then mix with another's.
//! memprof says so at start rather than be silently wrong.
use std::{fs, io::Read as _};

/// The preemption model, when it lets the kernel preempt BPF programs
/// ("full", "lazy", "real-time"); None when it does not, or cannot be told.
pub fn preempting_model() -> Option<String> {
    let release = fs::read_to_string("/proc/sys/kernel/osrelease").unwrap_or_default();
    if !uprobes_preemptible(&release) {
        return None;
    }
    let active = fs::read_to_string("/sys/kernel/debug/sched/preempt").ok();
    let version = fs::read_to_string("/proc/sys/kernel/version").unwrap_or_default();
    let cmdline = fs::read_to_string("/proc/cmdline").unwrap_or_default();
    model(active.as_deref(), &version, &cmdline, build_config)
}

/// From the scheduler's debugfs file (the active model in parentheses, as
/// `none voluntary (full) lazy`), else the kernel's version string (its
/// build: `PREEMPT_RT`, `PREEMPT_DYNAMIC`, `PREEMPT`), a dynamic kernel's
/// `preempt=` boot option, and its build's default (`config`, read only
/// when needed).
fn model(
    active: Option<&str>,
    version: &str,
    cmdline: &str,
    config: impl FnOnce() -> Option<String>,
) -> Option<String> {
    if let Some(active) = active {
        let chosen = active.split_whitespace().find(|m| m.starts_with('('))?;
        return preempting(chosen.trim_matches(|c| c == '(' || c == ')'));
    }
    let build: Vec<&str> = version.split_whitespace().collect();
    if build.contains(&"PREEMPT_RT") {
        return Some("real-time".to_owned());
    }
    if build.contains(&"PREEMPT_DYNAMIC") {
        if let Some(chosen) = cmdline
            .split_whitespace()
            .rev()
            .find_map(|option| option.strip_prefix("preempt="))
        {
            return preempting(chosen);
        }
        let config = config()?;
        let set = |option: &str| config.lines().any(|line| line == format!("{option}=y"));
        return if set("CONFIG_PREEMPT_LAZY") {
            Some("lazy".to_owned())
        } else if set("CONFIG_PREEMPT") {
            Some("full".to_owned())
        } else {
            None
        };
    }
    build.contains(&"PREEMPT").then(|| "full".to_owned())
}

/// Before 6.0 the kernel ran uprobe programs with preemption disabled.
fn uprobes_preemptible(release: &str) -> bool {
    let mut numbers = release.trim().split(['.', '-']).map(str::parse::<u32>);
    match (numbers.next(), numbers.next()) {
        (Some(Ok(major)), Some(Ok(_))) => major >= 6,
        _ => true,
    }
}

fn preempting(model: &str) -> Option<String> {
    matches!(model, "full" | "lazy").then(|| model.to_owned())
}

/// The running kernel's build configuration, where the system keeps it.
fn build_config() -> Option<String> {
    let release = fs::read_to_string("/proc/sys/kernel/osrelease").ok()?;
    if let Ok(config) = fs::read_to_string(format!("/boot/config-{}", release.trim())) {
        return Some(config);
    }
    let packed = fs::File::open("/proc/config.gz").ok()?;
    let mut config = String::new();
    flate2::read::GzDecoder::new(packed)
        .read_to_string(&mut config)
        .ok()?;
    Some(config)
}

#[cfg(test)]
mod tests {
    use super::*;

    const DYNAMIC: &str = "#1 SMP PREEMPT_DYNAMIC Debian 6.1.112-1 (2024-09-30)";

    fn config(lines: &str) -> impl FnOnce() -> Option<String> + '_ {
        move || Some(lines.to_owned())
    }

    #[test]
    fn the_active_model_is_the_one_in_parentheses() {
        let model = |active| model(Some(active), DYNAMIC, "", || None);
        assert_eq!(model("none voluntary (full) lazy"), Some("full".into()));
        assert_eq!(model("none voluntary full (lazy)"), Some("lazy".into()));
        assert_eq!(model("(none) voluntary full lazy"), None);
        assert_eq!(model("none (voluntary) full"), None);
    }

    #[test]
    fn without_debugfs_the_build_and_boot_options_tell() {
        let none = "CONFIG_PREEMPT_BUILD=y\nCONFIG_PREEMPT_NONE=y\n# CONFIG_PREEMPT is not set";
        let full = "CONFIG_PREEMPT_BUILD=y\nCONFIG_PREEMPT=y";
        // This VM: dynamic, built "none", nothing on the command line.
        assert_eq!(model(None, DYNAMIC, "quiet", config(none)), None);
        assert_eq!(
            model(None, DYNAMIC, "quiet", config(full)),
            Some("full".into())
        );
        assert_eq!(
            model(None, DYNAMIC, "ro preempt=lazy", config(none)),
            Some("lazy".into())
        );
        assert_eq!(
            model(None, DYNAMIC, "preempt=voluntary", config(full)),
            None
        );
        // No configuration found: not said.
        assert_eq!(model(None, DYNAMIC, "", || None), None);
        let rt = "#1 SMP PREEMPT_RT Fri Oct 4 2024";
        assert_eq!(model(None, rt, "", || None), Some("real-time".into()));
        // The last preempt= counts, as for the kernel.
        assert_eq!(
            model(None, DYNAMIC, "preempt=full preempt=none", config(full)),
            None
        );
        let full_build = "#1 SMP PREEMPT Thu, 01 Aug 2024 12:00:00 +0000";
        assert_eq!(model(None, full_build, "", || None), Some("full".into()));
        assert_eq!(model(None, "#1 SMP Debian 6.1", "", || None), None);
    }

    #[test]
    fn before_6_0_uprobe_programs_ran_unpreempted() {
        assert!(!uprobes_preemptible("5.15.0-119-lowlatency\n"));
        assert!(uprobes_preemptible("6.1.0-26-rt-amd64"));
        assert!(uprobes_preemptible("6.18.44-fc-v657"));
    }
}
