//! `memprof doctor`: whether memprof can run on this host, and if not,
//! why and what to do. Nothing is profiled and nothing attached: the BPF
//! object is loaded and verified, then dropped.
use std::{fs, path::Path, time::Instant};

use anyhow::Result;
use clap::Parser as _;

use crate::{
    cli::{settings::settings, ProfileOptions},
    discover::pid::missing_capabilities,
    human::error::one_line,
    probes::{self, tracefs, Mode},
};

/// What memprof needs first of all: below it, it does not start.
const MIN_KERNEL: (u32, u32) = (6, 1);

#[derive(Clone, Copy, PartialEq, Eq)]
enum Verdict {
    Ok,
    /// memprof runs, with less than it could.
    Note,
    /// memprof cannot run (or not in full) until it is fixed.
    Fail,
}

struct Check {
    verdict: Verdict,
    what: &'static str,
    /// What was found, and for a note or a failure, what to do.
    detail: String,
}

fn check(verdict: Verdict, what: &'static str, detail: impl Into<String>) -> Check {
    Check {
        verdict,
        what,
        detail: detail.into(),
    }
}

pub(super) fn doctor() -> Result<i32> {
    let has_capabilities = missing_capabilities().is_empty();
    let mut checks = vec![
        kernel(),
        capabilities(),
        btf(),
        uprobes(),
        tracefs(),
        lockdown(),
        preemption(),
        pid_namespace(),
        bpf_jit(),
        perf_event_paranoid(has_capabilities),
    ];
    checks.push(match has_capabilities {
        true => bpf_programs(),
        false => check(
            Verdict::Fail,
            "BPF programs",
            "not tried without the capabilities above",
        ),
    });
    checks.push(session_uprobes(has_capabilities));
    for check in &checks {
        let tag = match check.verdict {
            Verdict::Ok => "ok  ",
            Verdict::Note => "note",
            Verdict::Fail => "FAIL",
        };
        println!("{tag}  {}: {}", check.what, check.detail);
    }
    let failed = checks.iter().filter(|c| c.verdict == Verdict::Fail).count();
    if failed == 0 {
        println!("memprof can run here.");
        Ok(0)
    } else {
        println!("memprof cannot run here until the {failed} FAIL line(s) above are fixed.");
        Ok(1)
    }
}

/// What `--version` says of this host beside the build: the kernel and
/// the BPF features memprof uses where it has them.
pub fn bpf_features() -> String {
    let release = read("/proc/sys/kernel/osrelease").unwrap_or_else(|| "?".into());
    let yes_no = |found: bool| if found { "yes" } else { "no" };
    let sessions = match missing_capabilities().is_empty() {
        true => yes_no(probes::has_session_uprobes()),
        false => "unknown (not root)",
    };
    format!(
        "kernel {release}; BPF: BTF {}, uprobes {}, session uprobes {sessions}, JIT {}",
        yes_no(has_btf()),
        yes_no(has_uprobes()),
        yes_no(jit_on()),
    )
}

fn read(path: &str) -> Option<String> {
    fs::read_to_string(path).ok().map(|s| s.trim().to_string())
}

fn kernel() -> Check {
    let release = read("/proc/sys/kernel/osrelease").unwrap_or_default();
    let mut numbers = release
        .split(|c: char| !c.is_ascii_digit())
        .filter_map(|n| n.parse::<u32>().ok());
    let version = (numbers.next().unwrap_or(0), numbers.next().unwrap_or(0));
    if version >= MIN_KERNEL {
        check(Verdict::Ok, "kernel", format!("Linux {release}"))
    } else {
        check(
            Verdict::Fail,
            "kernel",
            format!(
                "Linux {release}: memprof needs {}.{} or later (uprobe programs' helpers, BTF for task and signal layouts)",
                MIN_KERNEL.0, MIN_KERNEL.1
            ),
        )
    }
}

fn capabilities() -> Check {
    let missing = missing_capabilities();
    if missing.is_empty() {
        return check(
            Verdict::Ok,
            "capabilities",
            "CAP_BPF, CAP_PERFMON, CAP_SYS_ADMIN",
        );
    }
    check(
        Verdict::Fail,
        "capabilities",
        format!(
            "{} missing: run memprof as root (sudo memprof ...), or in a container with them added (docs: packaging/)",
            missing.join(", ")
        ),
    )
}

fn has_btf() -> bool {
    Path::new("/sys/kernel/btf/vmlinux").exists()
}

fn has_uprobes() -> bool {
    Path::new("/sys/bus/event_source/devices/uprobe").exists()
}

fn jit_on() -> bool {
    read("/proc/sys/net/core/bpf_jit_enable").as_deref() != Some("0")
}

fn btf() -> Check {
    if has_btf() {
        check(Verdict::Ok, "BTF", "/sys/kernel/btf/vmlinux")
    } else {
        check(
            Verdict::Fail,
            "BTF",
            "no /sys/kernel/btf/vmlinux: memprof reads the kernel's task layout from it; use a kernel built with CONFIG_DEBUG_INFO_BTF=y (every major distribution's)",
        )
    }
}

fn uprobes() -> Check {
    if has_uprobes() {
        check(Verdict::Ok, "uprobes", "the kernel has uprobe events")
    } else {
        check(
            Verdict::Fail,
            "uprobes",
            "no uprobe event source: use a kernel built with CONFIG_UPROBES and CONFIG_UPROBE_EVENTS",
        )
    }
}

fn tracefs() -> Check {
    if let Some(root) = tracefs::mounted_root() {
        return check(Verdict::Ok, "tracefs", format!("{}", root.display()));
    }
    let filesystems = read("/proc/filesystems").unwrap_or_default();
    if filesystems.contains("tracefs") || filesystems.contains("debugfs") {
        check(
            Verdict::Ok,
            "tracefs",
            "not mounted: memprof mounts it when it starts (or: mount -t tracefs nodev /sys/kernel/tracing)",
        )
    } else {
        check(
            Verdict::Fail,
            "tracefs",
            "the kernel has neither tracefs nor debugfs: use one built with CONFIG_TRACING",
        )
    }
}

fn lockdown() -> Check {
    let Some(modes) = read("/sys/kernel/security/lockdown") else {
        return check(Verdict::Ok, "lockdown", "no lockdown");
    };
    let active = modes
        .split_whitespace()
        .find(|m| m.starts_with('['))
        .map(|m| m.trim_matches(|c| c == '[' || c == ']').to_string())
        .unwrap_or_default();
    match active.as_str() {
        "confidentiality" => check(
            Verdict::Fail,
            "lockdown",
            "confidentiality: the kernel refuses BPF programs that read memory; boot with lockdown=integrity or none (Secure Boot kernels: mokutil --disable-validation)",
        ),
        mode => check(Verdict::Ok, "lockdown", mode.to_string()),
    }
}

fn preemption() -> Check {
    match probes::preempting_model() {
        None => check(
            Verdict::Ok,
            "preemption",
            "BPF programs are not preempted",
        ),
        Some(model) => check(
            Verdict::Note,
            "preemption",
            format!(
                "{model}: memprof's programs may rarely interleave on a CPU and a call's figures mix with another's; exact with preempt=none or voluntary (boot option preempt=voluntary)"
            ),
        ),
    }
}

/// A PID namespace of its own (a container without the host's): memprof
/// sees only that namespace's processes.
fn pid_namespace() -> Check {
    let status = read("/proc/self/status").unwrap_or_default();
    let levels = status
        .lines()
        .find_map(|line| line.strip_prefix("NSpid:"))
        .map_or(1, |pids| pids.split_whitespace().count());
    if levels <= 1 {
        check(Verdict::Ok, "PID namespace", "the host's")
    } else {
        check(
            Verdict::Note,
            "PID namespace",
            "a container's: memprof sees only its processes; run it in the host's (docker --pid=host, Kubernetes hostPID: true)",
        )
    }
}

fn bpf_jit() -> Check {
    match jit_on() {
        false => check(
            Verdict::Note,
            "BPF JIT",
            "off: memprof's programs run interpreted, several times slower (sysctl net.core.bpf_jit_enable=1)",
        ),
        true => check(Verdict::Ok, "BPF JIT", "on"),
    }
}

fn perf_event_paranoid(has_capabilities: bool) -> Check {
    let level = read("/proc/sys/kernel/perf_event_paranoid").unwrap_or_else(|| "?".into());
    match has_capabilities {
        true => check(
            Verdict::Ok,
            "perf_event_paranoid",
            format!("{level} (CAP_PERFMON allows memprof's perf events whatever it is)"),
        ),
        false => check(
            Verdict::Note,
            "perf_event_paranoid",
            format!("{level}: memprof needs CAP_PERFMON for its perf events in any case"),
        ),
    }
}

/// memprof's own BPF object, loaded and verified as `attach --live` would
/// (the most programs), small tables.
fn bpf_programs() -> Check {
    let parsed = DoctorOptions::try_parse_from([
        "memprof",
        "--live",
        "--max-live",
        "1024",
        "--max-stacks",
        "1024",
        "--stack-map-size",
        "1024",
        "--unwind-rows",
        "64K",
    ]);
    let options = match parsed {
        Ok(parsed) => parsed.options,
        Err(err) => return check(Verdict::Fail, "BPF programs", err.to_string()),
    };
    let started = Instant::now();
    match probes::verify_only(&settings(&options, Mode::Attach, 64)) {
        Ok(()) => check(
            Verdict::Ok,
            "BPF programs",
            format!(
                "memprof's programs verified and loaded in {} ms",
                started.elapsed().as_millis()
            ),
        ),
        Err(err) => check(
            Verdict::Fail,
            "BPF programs",
            format!("the kernel refused them: {}", one_line(&err)),
        ),
    }
}

fn session_uprobes(has_capabilities: bool) -> Check {
    match has_capabilities && probes::has_session_uprobes() {
        true => check(
            Verdict::Ok,
            "session uprobes",
            "sampled --live takes a return probe on sampled calls only",
        ),
        false => check(
            Verdict::Note,
            "session uprobes",
            "none (Linux 6.13 and later have them): sampled --live takes a return probe on every malloc-like call",
        ),
    }
}

/// The profile options the BPF check loads the object with.
#[derive(clap::Parser)]
struct DoctorOptions {
    #[command(flatten)]
    options: ProfileOptions,
}
