//! A fresh host has tracefs unmounted: memprof mounts it itself, in
//! `trace` and in `attach`, and the figures are exact.
use std::{path::Path, process::Command};

use tests::*;

const TRACEFS: &str = "/sys/kernel/tracing";
const DEBUGFS: &str = "/sys/kernel/debug";

fn has_uprobe_events(root: &str) -> bool {
    Path::new(root).join("uprobe_events").exists()
}

/// Unmounts tracefs (and debugfs, which carries a second tracefs) as on a
/// freshly booted host; puts tracefs back when dropped.
struct Unmounted;

impl Unmounted {
    fn tracefs() -> Unmounted {
        for target in [TRACEFS, DEBUGFS] {
            if is_mount_point(target) {
                let status = Command::new("umount").arg(target).status().unwrap();
                assert!(status.success(), "umount {target}");
            }
        }
        assert!(!has_uprobe_events(TRACEFS) && !has_uprobe_events("/sys/kernel/debug/tracing"));
        Unmounted
    }
}

impl Drop for Unmounted {
    fn drop(&mut self) {
        if !has_uprobe_events(TRACEFS) {
            let _ = Command::new("mount")
                .args(["-t", "tracefs", "nodev", TRACEFS])
                .status();
        }
    }
}

fn is_mount_point(path: &str) -> bool {
    let mounts = std::fs::read_to_string("/proc/self/mounts").unwrap();
    mounts
        .lines()
        .any(|line| line.split_whitespace().nth(1) == Some(path))
}

#[test]
fn trace_mounts_tracefs_when_it_is_missing() {
    let _serial = serial();
    let program = fixture("allocs", "fp", frame_pointers());
    let _unmounted = Unmounted::tracefs();
    let (output, report) = trace_json(&[], &[program.to_str().unwrap()]);
    assert_eq!(
        output.status.code(),
        Some(3),
        "stderr: {}",
        String::from_utf8_lossy(&output.stderr)
    );
    assert_eq!(
        site(&report, "site_malloc"),
        (1000, 10, vec!["malloc".to_string()])
    );
    assert!(has_uprobe_events(TRACEFS), "memprof mounted tracefs");
    assert_nothing_loaded();
}

#[test]
fn attach_mounts_tracefs_when_it_is_missing() {
    let _serial = serial();
    let mut target = spawn_waiter(&fixture("waiter", "fp", frame_pointers()));
    let _unmounted = Unmounted::tracefs();
    // Each block lives microseconds; 100 ms, not the default 1 ms, so
    // that the test beside this one on a 2-core machine cannot make one
    // outlive the threshold (seen once: 39 of 40).
    let (memprof, _stderr) = start_attach(target.id(), &["--live", "--temp-threshold", "100ms"]);
    let (_, report) = release_and_report(&mut target, memprof);
    assert_eq!(live_site(&report, "site_after_attach"), (0, 0, 40, 0));
    assert_eq!(site(&report, "site_after_attach").1, 40);
    assert_nothing_loaded();
}

/// `memprof doctor` on this host: every check passes (the BPF programs
/// load and verify); with tracefs unmounted it says so and leaves it so;
/// without CAP_BPF it fails, naming it and what to do.
#[test]
fn doctor_says_what_memprof_needs_and_what_is_missing() {
    let _serial = serial();
    let doctor = |wrapper: &[&str]| {
        let mut command = match wrapper.split_first() {
            Some((program, args)) => {
                let mut command = Command::new(program);
                command.args(args).arg(memprof_bin());
                command
            }
            None => Command::new(memprof_bin()),
        };
        let output = command.arg("doctor").output().unwrap();
        (
            output.status.code(),
            String::from_utf8(output.stdout).unwrap(),
        )
    };
    let (code, text) = doctor(&[]);
    assert_eq!(code, Some(0), "{text}");
    assert!(
        text.lines().all(|l| l.starts_with("ok ")
            || l.starts_with("note ")
            || l == "memprof can run here."),
        "{text}"
    );
    for checked in [
        "kernel:",
        "capabilities:",
        "BTF:",
        "uprobes:",
        "tracefs:",
        "lockdown:",
    ] {
        assert!(text.contains(checked), "{checked}: {text}");
    }
    assert!(
        text.contains("ok    BPF programs: memprof's programs verified"),
        "{text}"
    );

    {
        let _unmounted = Unmounted::tracefs();
        let (code, text) = doctor(&[]);
        assert_eq!(code, Some(0), "{text}");
        assert!(
            text.contains("tracefs: not mounted: memprof mounts it"),
            "{text}"
        );
        assert!(!has_uprobe_events(TRACEFS), "doctor mounted tracefs");
    }

    let (code, text) = doctor(&["setpriv", "--bounding-set", "-bpf", "--inh-caps", "-bpf"]);
    assert_eq!(code, Some(1), "{text}");
    let failed: Vec<&str> = text.lines().filter(|l| l.starts_with("FAIL")).collect();
    assert!(
        failed[0].contains("capabilities: CAP_BPF missing") && failed[0].contains("sudo"),
        "{text}"
    );
    assert!(text.ends_with("above are fixed.\n"), "{text}");
}
