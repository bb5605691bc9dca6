//! `--sample-bytes`: Poisson sampling by bytes gives unbiased estimates.
//!
//! Sample size: with a 4 KiB mean interval the sites below get 12,000 to
//! 60,000 samples each, so an estimate's standard error is under 1%; the
//! ±5% bound is more than 5.5 standard errors away (odds of a spurious
//! failure below one in ten million per site). The random numbers are the kernel's
//! (bpf_get_prandom_u32), which cannot be seeded: the margin, not a seed,
//! is what keeps the test from being flaky.
use tests::*;

#[test]
fn sampled_totals_are_within_5_percent() {
    let _serial = serial();
    let program = fixture("many", "fp", frame_pointers());
    let (output, report) = trace_json(&["--sample-bytes", "4096"], &[program.to_str().unwrap()]);
    assert!(output.status.success(), "{output:?}");
    assert_eq!(report["exact"], false);
    assert_eq!(report["sample_bytes"], 4096);
    for (function, count, size) in [
        ("site_small", 2_000_000u64, 64u64),
        ("site_medium", 500_000, 512),
        ("site_large", 50_000, 8192),
    ] {
        let (bytes, calls, _) = site(&report, function);
        within_5_percent(bytes, count * size, &format!("{function} bytes"));
        within_5_percent(calls, count, &format!("{function} calls"));
    }
    assert_nothing_loaded();
}

/// A mean interval near the calls' size: most countdowns are drawn
/// afresh and a sample stands for a few bytes, where rounding the draw
/// down (+5% calls) and the weighed bytes down (-1.6%) showed. 790,000
/// samples: a standard error of 0.08%.
#[test]
fn sampled_estimates_hold_at_a_mean_near_the_calls_size() {
    let _serial = serial();
    let program = fixture("many", "fp", frame_pointers());
    let (output, report) = trace_json(
        &["--sample-bytes", "16"],
        &[program.to_str().unwrap(), "tiny"],
    );
    assert!(output.status.success(), "{output:?}");
    let (bytes, calls, _) = site(&report, "site_tiny");
    for (what, got, want) in [("calls", calls, 2_000_000u64), ("bytes", bytes, 16_000_000)] {
        let error = got as f64 / want as f64 - 1.0;
        assert!(
            error.abs() < 0.01,
            "site_tiny {what}: {got}, want {want} ±1%"
        );
    }
    assert_nothing_loaded();
}

#[test]
fn sampled_live_heap_is_within_5_percent() {
    let _serial = serial();
    let program = fixture("many", "fp", frame_pointers());
    let (_, report) = trace_json(
        &["--live", "--sample-bytes", "4096"],
        &[program.to_str().unwrap(), "keep"],
    );
    let (live_bytes, live_count, _, _) = live_site(&report, "site_keep");
    within_5_percent(live_bytes, 200_000 * 256, "site_keep live bytes");
    within_5_percent(live_count, 200_000, "site_keep live blocks");
    // Sampled blocks are tracked and their frees matched: none stays live.
    assert_eq!(live_site(&report, "site_churn").1, 0);
    within_5_percent(
        site(&report, "site_churn").0,
        64_000_000,
        "site_churn bytes",
    );
    assert_nothing_loaded();
}

/// `--live` with sampling on a kernel with session uprobes: a sampled
/// call's return runs (its block is tracked), an unsampled one's does not.
/// The profiled process has session links; its child gets return probes
/// after memprof reads its fork (the child waits 300 ms here), its
/// grandchild inherits them. 12,500 to 50,000 samples per site.
#[test]
fn session_probes_track_sampled_blocks_in_children_too() {
    let _serial = serial();
    let program = fixture("session_forks", "fp", frame_pointers());
    let (output, report) = trace_json(
        &["--live", "--sample-bytes", "1024", "--verbose"],
        &[program.to_str().unwrap(), "300"],
    );
    assert!(output.status.success(), "{output:?}");
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(
        stderr.contains("session uprobes on"),
        "session probes not used: {stderr}"
    );
    for (function, size) in [
        ("site_parent", 256u64),
        ("site_child", 512),
        ("site_grandchild", 1024),
    ] {
        let (live_bytes, live_count, _, untracked) = live_site(&report, function);
        within_5_percent(live_bytes, 50_000 * size, &format!("{function} live bytes"));
        within_5_percent(live_count, 50_000, &format!("{function} live blocks"));
        assert_eq!(untracked, 0, "{function}: untracked blocks");
    }
    assert_eq!(report["lost"]["no_return_probe"], 0);
    assert_nothing_loaded();
}

/// A child that allocates at once: `trace` holds each process a profiled
/// one forks, stopped, until it has session links of its own, so none of
/// its blocks goes untracked (before, its first calls came before its
/// return probes: counted, untracked, lost `no_return_probe`).
#[test]
fn a_child_allocating_at_once_is_held_until_its_probes_are_in() {
    let _serial = serial();
    let program = fixture("session_forks", "fp", frame_pointers());
    let (output, report) = trace_json(
        &["--live", "--sample-bytes", "1024"],
        &[program.to_str().unwrap(), "0"],
    );
    assert!(output.status.success(), "{output:?}");
    for (function, size) in [("site_child", 512u64), ("site_grandchild", 1024)] {
        let (bytes, calls, _) = site(&report, function);
        within_5_percent(bytes, 50_000 * size, &format!("{function} bytes"));
        within_5_percent(calls, 50_000, &format!("{function} calls"));
        let (_, live_count, _, untracked) = live_site(&report, function);
        within_5_percent(live_count, 50_000, &format!("{function} live blocks"));
        assert_eq!(untracked, 0, "{function}: untracked blocks");
    }
    assert_eq!(report["lost"]["no_return_probe"], 0);
    assert_eq!(report["lost"]["fork_unheld"], 0);
    assert_nothing_loaded();
}

/// Each child of the traced process gets scope events of its own (the
/// session groups' return probes): `trace` closes those of the children
/// that ended as it goes, not at its end. 400 children, one after the
/// other: memprof's open files come back to what they were before them.
#[test]
fn the_events_of_ended_children_are_closed_while_trace_runs() {
    let _serial = serial();
    let dir = std::env::temp_dir().join(format!("memprof-fds-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let marks = dir.display();
    let script = format!(
        "touch {marks}/start; sleep 1; for i in $(seq 400); do /bin/true; done; \
         touch {marks}/looped; sleep 4"
    );
    let memprof = memprof_command(&[
        "trace",
        "--live",
        "--sample-bytes",
        "4096",
        "--verbose",
        "--",
        "sh",
        "-c",
        &script,
    ])
    .stdout(std::process::Stdio::null())
    .stderr(std::process::Stdio::piped())
    .spawn()
    .expect("running memprof");
    let open_files = || {
        std::fs::read_dir(format!("/proc/{}/fd", memprof.id()))
            .unwrap()
            .count()
    };
    let wait_for = |mark: &str| {
        let path = dir.join(mark);
        for _ in 0..300 {
            if path.exists() {
                return;
            }
            std::thread::sleep(std::time::Duration::from_millis(100));
        }
        panic!("the script never reached {mark}");
    };
    wait_for("start");
    std::thread::sleep(std::time::Duration::from_millis(500));
    let before = open_files();
    wait_for("looped");
    // Closed every 2 s.
    std::thread::sleep(std::time::Duration::from_secs(3));
    let after = open_files();
    let output = memprof.wait_with_output().unwrap();
    let _ = std::fs::remove_dir_all(&dir);
    assert!(output.status.success(), "{output:?}");
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(
        stderr.contains("session uprobes on"),
        "session probes not used: {stderr}"
    );
    assert!(
        after <= before + 10,
        "memprof had {before} files open before the children, {after} after"
    );
    assert_nothing_loaded();
}
