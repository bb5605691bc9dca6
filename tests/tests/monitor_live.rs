//! `memprof monitor --live` through session uprobes: the whole host's live
//! heap estimated from samples (a session link per file), and grandchildren
//! that outlive the process that forked them keep their return probes.
use std::{
    process::{Command, Stdio},
    time::Duration,
};

use tests::{monitor::*, *};

/// `--live` on the whole host, sampling: one session link per file for
/// every process (the kernel has session uprobes): a sampled call's
/// return pairs it with its block, an unsampled one takes none. The
/// estimates are those of `trace` (tests/tests/sampling.rs: 12,500 samples
/// of the kept site, each within 5%). A process running with jemalloc at
/// the start puts two files' malloc-like functions in the probes made
/// then: a session link per file (one link for both, on the first file,
/// left the other's malloc unlinked, and nothing was counted).
#[test]
fn the_whole_host_live_heap_through_session_probes() {
    let _serial = serial();
    let program = fixture("many", "fp", frame_pointers());
    const JEMALLOC: &str = "/usr/lib/x86_64-linux-gnu/libjemalloc.so.2";
    let mut with_jemalloc = Command::new(fixture("waiter", "fp", frame_pointers()))
        .env("LD_PRELOAD", JEMALLOC)
        .stdin(Stdio::piped())
        .spawn()
        .unwrap();
    while !std::fs::read_to_string(format!("/proc/{}/maps", with_jemalloc.id()))
        .unwrap()
        .contains(JEMALLOC)
    {
        std::thread::sleep(Duration::from_millis(10));
    }
    let port = free_port();
    let (monitor, seen) = start_monitor_saying(
        &[
            "--live",
            "--sample-bytes",
            "4096",
            "--verbose",
            "--format",
            "json",
        ],
        port,
    );
    assert!(seen.contains("session uprobes on"), "{seen}");
    for preload in ["", JEMALLOC] {
        let status = Command::new(&program)
            .arg("keep")
            .env("LD_PRELOAD", preload)
            .status()
            .unwrap();
        assert!(status.success());
    }
    let report: serde_json::Value = tests::report_json(&stop(monitor));
    drop(with_jemalloc.stdin.take());
    with_jemalloc.wait().unwrap();
    // Each run's, with the C library's malloc and with jemalloc's.
    for process in processes_with(&report, "site_keep") {
        let one = serde_json::json!({"processes": [process]});
        let (live_bytes, live_count, _, untracked) = live_site(&one, "site_keep");
        let allocator = &site(&one, "site_keep").2;
        within_5_percent(
            live_bytes,
            200_000 * 256,
            &format!("{allocator:?} live bytes"),
        );
        within_5_percent(live_count, 200_000, &format!("{allocator:?} live blocks"));
        assert_eq!(untracked, 0);
        // Its frees were seen: nothing of the churn stays live.
        assert_eq!(live_site(&one, "site_churn").1, 0);
        within_5_percent(site(&one, "site_churn").1, 1_000_000, "site_churn calls");
    }
    assert_eq!(processes_with(&report, "site_keep").len(), 2, "{report:#}");
}

/// `session_forks 1500 MODE` under `monitor` with session probes
/// (samples of 1 KiB), until its grandchild has exited (it holds stdout):
/// the grandchild's 50,000 blocks of 1 KiB, live at its exit, estimated
/// within 5% from its samples, none untracked.
fn assert_grandchild_tracked(mode: &str) {
    let _serial = serial();
    let program = fixture("session_forks", "fp", frame_pointers());
    let args = [
        "--comm",
        "^session_forks",
        "--live",
        "--sample-bytes",
        "1024",
        "--interval",
        "1",
        "--format",
        "json",
    ];
    let monitor = start_monitor(&args, free_port());
    let mut root = Command::new(&program)
        .args(["1500", mode])
        .stdout(Stdio::piped())
        .spawn()
        .unwrap();
    let mut held = root.stdout.take().unwrap();
    assert!(root.wait().unwrap().success());
    let mut rest = Vec::new();
    std::io::Read::read_to_end(&mut held, &mut rest).unwrap();
    let report = last_report(&stop(monitor));
    let (live_bytes, live_count, _, untracked) = live_site(&report, "site_grandchild");
    within_5_percent(live_bytes, 50_000 * 1024, "site_grandchild live bytes");
    within_5_percent(live_count, 50_000, "site_grandchild live blocks");
    assert_eq!(untracked, 0);
    assert_eq!(report["lost"]["no_return_probe"], 0);
}

/// Session probes in a watched process's tree: its child got return
/// probes of its own (after its fork), which the grandchild inherited;
/// the child ends first. Before memprof closes the child's events, the
/// grandchild gets its own, or its calls would wait for returns that
/// never come (and count as nested: not at all). 50,000 samples.
#[test]
fn an_orphaned_grandchild_keeps_its_return_probes() {
    assert_grandchild_tracked("orphan");
}

/// The same, and then the watched process ends too, before the grandchild
/// allocates: the grandchild, which had its own return probes from the
/// child's, still inherited its entry probes from the root; it gets those
/// of its own as well (before: it was no longer counted at all).
#[test]
fn a_grandchild_outliving_its_parent_and_the_root_stays_probed() {
    assert_grandchild_tracked("rootless");
}
