//! `memprof monitor --usdt`: a program that samples its own allocations
//! (tests/fixtures/usdt_sampler.c) is watched through its otel_memory
//! probes, and the USDT specs of a program no process runs any more make
//! room for the next.
use std::{
    io::Write as _,
    process::{Command, Stdio},
    time::Duration,
};

use tests::{monitor::*, *};

#[test]
fn with_usdt_a_program_sampling_itself_is_watched_through_its_probes() {
    let _serial = serial();
    let program = fixture("usdt_sampler", "monitor", frame_pointers());
    let port = free_port();
    let monitor = start_monitor(
        &["--comm", "^usdt_sampler-m", "--usdt", "--format", "json"],
        port,
    );
    let pid = run_usdt_sampler(&program);
    let report: serde_json::Value = tests::report_json(&stop(monitor));
    assert_eq!(report["exact"], false);
    let process = process_in(&report, pid);
    // The sums of its weights, through its probes only (malloc's calls of
    // this process are not probed).
    assert_eq!(process["bytes"], 1_000_000, "{process}");
    assert_eq!(process["count"], 1_000);
    assert!(process["stacks"]
        .as_array()
        .unwrap()
        .iter()
        .all(|s| s["allocator"] == "otel_memory"));
}

#[test]
fn the_usdt_specs_of_a_program_no_process_runs_any_more_make_room_for_the_next() {
    let _serial = serial();
    let program = fixture("usdt_sampler", "monitor", frame_pointers());
    // Room for two programs' probes (without --live, one each: `alloc`):
    // the third of three programs run one after the other, each a file of
    // its own, needs the first's.
    let port = free_port();
    let monitor = start_monitor(
        &[
            "--comm",
            "^usdt-reuse-",
            "--usdt",
            "--usdt-specs",
            "2",
            "--format",
            "json",
        ],
        port,
    );
    let pids: Vec<u32> = (0..3)
        .map(|i| {
            let copy = workspace_root().join(format!("target/fixtures/usdt-reuse-{i}"));
            std::fs::copy(&program, &copy).unwrap();
            run_usdt_sampler(&copy)
        })
        .collect();
    let report: serde_json::Value = tests::report_json(&stop(monitor));
    assert_eq!(report["exact"], false);
    for pid in pids {
        let process = process_in(&report, pid);
        assert_eq!(process["bytes"], 1_000_000, "{process}");
        assert_eq!(process["count"], 1_000, "{process}");
    }
    assert!(report.get("unprobed").is_none(), "{}", report["unprobed"]);
}

/// Runs tests/fixtures/usdt_sampler.c (a copy of it) once a monitor has
/// had time to adopt it, to its end; its pid.
fn run_usdt_sampler(program: &std::path::Path) -> u32 {
    let mut sampler = Command::new(program)
        .arg("wait")
        .stdin(Stdio::piped())
        .spawn()
        .unwrap();
    std::thread::sleep(Duration::from_millis(500));
    writeln!(sampler.stdin.as_mut().unwrap()).unwrap();
    assert!(sampler.wait().unwrap().success());
    sampler.id()
}
