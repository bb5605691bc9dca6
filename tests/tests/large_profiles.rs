//! A large profile (the benchmark's 65,538 distinct stacks, ~40 frames
//! each) saves within bounds: memprof's peak RSS, as the kernel accounts
//! it, and the file's size. Generous bounds, so that a regression (a
//! report assembled whole, frames repeated in every stack) fails them
//! and a noisy machine does not; the timings are the benchmark's
//! (`cargo xtask bench --stacks-only`).
use std::{os::unix::process::ExitStatusExt as _, path::Path, process::ExitStatus};

use tests::*;

/// Runs `memprof ARGS` to its end: its exit status and its peak RSS in
/// KiB (wait4's `ru_maxrss`: the largest of it, its children, and the
/// copy of this process it was forked as, until its exec).
fn memprof_peak_kib(args: &[&str]) -> (ExitStatus, u64) {
    // Reaped by wait4 below, which std's Child cannot give the usage of.
    #[allow(clippy::zombie_processes)]
    let child = memprof_command(args)
        .stdout(std::process::Stdio::null())
        .spawn()
        .expect("running memprof");
    let mut status = 0;
    // SAFETY: plain data the kernel fills in.
    let mut usage: libc::rusage = unsafe { std::mem::zeroed() };
    // SAFETY: waits for the child just spawned, whose pid is ours to reap.
    let waited = unsafe { libc::wait4(child.id() as i32, &mut status, 0, &mut usage) };
    assert_eq!(waited, child.id() as i32, "wait4");
    (ExitStatus::from_raw(status), usage.ru_maxrss as u64)
}

#[test]
fn a_profile_of_65538_stacks_saves_in_bounded_memory_and_size() {
    let _serial = serial();
    let program = many_stacks();
    let dir = workspace_root().join("target/fixtures");
    for (name, format) in [("many-stacks.json", "json"), ("many-stacks.pb.gz", "pprof")] {
        let saved = dir.join(name);
        let (status, peak_kib) = memprof_peak_kib(&[
            "trace",
            "--format",
            format,
            "-o",
            saved.to_str().unwrap(),
            "--",
            program.to_str().unwrap(),
            "100000",
        ]);
        assert!(status.success(), "{format}: {status:?}");
        // 171-184 MiB measured (2026-12-04); 1 GiB and more before the
        // report was streamed and JSON listed each frame once.
        assert!(peak_kib < 400 << 10, "{format}: peak RSS {peak_kib} KiB");
        let size = std::fs::metadata(&saved).unwrap().len();
        assert!(size < 50 << 20, "{format}: {size} bytes");
    }
    // All of it was saved, and reads back. (Measured before this test
    // holds the report: a child's peak counts what it was forked with.)
    let saved = dir.join("many-stacks.json");
    let (status, peak_kib) = memprof_peak_kib(&["report", path_str(&saved)]);
    assert!(status.success());
    assert!(peak_kib < 400 << 10, "report: peak RSS {peak_kib} KiB");
    let report: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(&saved).unwrap()).unwrap();
    let process = &report["processes"][0];
    assert_eq!(process["total_stacks"], 65_538);
    assert_eq!(process["stacks"].as_array().unwrap().len(), 65_538);
    assert_eq!(process["count"], 100_001);
}

fn path_str(path: &Path) -> &str {
    path.to_str().unwrap()
}
