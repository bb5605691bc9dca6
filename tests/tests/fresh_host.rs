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
