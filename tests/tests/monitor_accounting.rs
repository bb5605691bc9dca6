//! What a sampling or exact `memprof monitor` counts for the processes it
//! takes on as they start. Under sampling, a process's totals are the
//! kernel's exact counts of its calls and bytes, sampled or not, also for a
//! process no sample picked, a child forked without an exec, a program
//! exec'd and the image it replaced, and the calls made after the last
//! read. A new process's first stacks stop in the C library, and what its
//! allocator maps (glibc's malloc, jemalloc, mimalloc) stays the
//! allocator's, the program's own mappings the program's.
use std::{path::Path, process::Command, time::Duration};

use tests::{monitor::*, *};

/// Under the budget the kernel counts every call of each process and the
/// bytes it asked for, sampled or not: a process's totals are those
/// counts (its call sites' are estimates from the samples). `allocs` makes
/// 55 calls of 51,023 bytes in all (tests/tests/trace.rs) and ends at once;
/// sampled at 4 KiB, about 12 of them are samples, each standing for
/// 4096/size calls: totals summed from its sites come out near those
/// figures, rarely on them.
#[test]
fn under_the_budget_a_processs_totals_are_the_kernels_exact_counts() {
    let _serial = serial();
    let program = fixture("allocs", "fp", frame_pointers());
    let port = free_port();
    let monitor = start_monitor(&["--sample-bytes", "4K", "--format", "json"], port);
    let allocs = Command::new(&program).spawn().unwrap();
    let pid = allocs.id();
    assert_eq!(allocs.wait_with_output().unwrap().status.code(), Some(3));
    // Its counts are read at the next period's end (1 s).
    std::thread::sleep(Duration::from_millis(2500));
    let report: serde_json::Value = tests::report_json(&stop(monitor));
    assert_eq!(report["exact"], false, "sampled: the sites are estimates");
    let process = process_in(&report, pid);
    // Named as the program it exec'd, not as the test that forked it.
    assert_eq!(process["command"], "allocs-fp", "{process}");
    assert!(
        process["exe"].as_str().unwrap().ends_with("/allocs-fp"),
        "{process}"
    );
    // The break malloc grows its heap by is malloc's (no direct mapping).
    assert_eq!(totals_of(process), (Some(55), Some(51_023)), "{process}");
}

/// Under the budget a process none of whose calls was sampled (here 55
/// calls, 51 KiB, sampled every GiB) was in no report: reports were made
/// of call sites. The kernel counted its calls all the same: it is
/// listed with those totals and no stacks, in /metrics and in JSON.
#[test]
fn under_the_budget_a_process_none_of_whose_calls_was_sampled_is_listed() {
    let _serial = serial();
    let program = fixture("allocs", "fp", frame_pointers());
    let port = free_port();
    let monitor = start_monitor(&["--sample-bytes", "1G", "--format", "json"], port);
    let allocs = Command::new(&program).spawn().unwrap();
    let pid = allocs.id();
    assert_eq!(allocs.wait_with_output().unwrap().status.code(), Some(3));
    let series = format!("memprof_allocations_total{{pid=\"{pid}\"");
    let metrics = metrics_once_they_contain(port, &series);
    assert_eq!(metric(&metrics, &series), 55.0);
    let report: serde_json::Value = tests::report_json(&stop(monitor));
    let process = process_in(&report, pid);
    assert_eq!(process["command"], "allocs-fp", "{process}");
    assert_eq!(totals_of(process), (Some(55), Some(51_023)), "{process}");
    assert_eq!(process["stacks"], serde_json::json!([]), "{process}");
}

/// The same for a child forked without an exec that runs on (`forks
/// 2500`: 30 calls of 512 bytes, then 2.5 s): only a sampled call
/// announced a process, so its count had no process to go to. User space
/// now enters it at the first read that finds it running.
#[test]
fn under_the_budget_an_unsampled_child_forked_without_exec_is_listed() {
    let _serial = serial();
    tests::monitor::with_one_retry(|| {
        let program = fixture("forks", "fp", frame_pointers());
        let port = free_port();
        let monitor = start_monitor(&["--sample-bytes", "1G", "--format", "json"], port);
        let forks = Command::new(&program).arg("2500").spawn().unwrap();
        let pid = forks.id();
        assert!(forks.wait_with_output().unwrap().status.success());
        let report: serde_json::Value = tests::report_json(&stop(monitor));
        let parent = process_in(&report, pid);
        assert_eq!(totals_of(parent), (Some(20), Some(20 * 256)), "{parent}");
        let child = report["processes"]
            .as_array()
            .unwrap()
            .iter()
            .find(|p| p["command"] == "forks-fp" && p["pid"] != pid)
            .unwrap_or_else(|| panic!("no child of {pid}: {report}"));
        assert_eq!(totals_of(child), (Some(30), Some(30 * 512)), "{child}");
        assert_eq!(child["stacks"], serde_json::json!([]), "{child}");
        assert_eq!(child["exited"], true, "{child}");
    });
}

/// A process that execs another program (a shell's subshell running a
/// command): the kernel counts by pid, and the image exec'd over made
/// 1,000 calls no sample could pick (malloc(0), unsampled then), so
/// nothing said where the program's count began: they were the
/// program's. The kernel now starts the count afresh at the exec.
#[test]
fn under_the_budget_an_execd_programs_totals_leave_out_the_image_before() {
    let _serial = serial();
    let (pid, report) = monitor_exec_after(&[]);
    let process = process_in(&report, pid);
    assert_eq!(process["command"], "allocs-fp", "{process}");
    assert_eq!(totals_of(process), (Some(55), Some(51_023)), "{process}");
}

/// The image exec'd over, reported (a 1 MiB call, surely sampled): its
/// count was what the last period's read had seen of it, here nothing
/// (it ran for milliseconds), so it was estimated from its samples (1
/// call, or 4,097 with one malloc(0) sampled); calls of its last period
/// were lost alike. The kernel now sums its count at the exec.
#[test]
fn under_the_budget_an_image_execd_over_keeps_its_whole_count() {
    let _serial = serial();
    let (pid, report) = monitor_exec_after(&["-b"]);
    let image = |command: &str| {
        report["processes"]
            .as_array()
            .unwrap()
            .iter()
            .find(|p| p["pid"] == pid && p["command"] == command)
            .unwrap_or_else(|| panic!("no {command} as {pid}: {report}"))
    };
    let before = image("exec_after-O2");
    assert_eq!(totals_of(before), (Some(1_001), Some(1 << 20)), "{before}");
    let after = image("allocs-fp");
    assert_eq!(totals_of(after), (Some(55), Some(51_023)), "{after}");
}

/// `exec_after ARGS allocs` (allocs exits 3) under a monitor sampling at
/// 4 KiB, stopped once a period's read has seen its end: its pid, and the
/// monitor's report.
fn monitor_exec_after(args: &[&str]) -> (u32, serde_json::Value) {
    let program = fixture("allocs", "fp", frame_pointers());
    let exec_after = fixture("exec_after", "O2", &["-O2"]);
    let port = free_port();
    let monitor = start_monitor(&["--sample-bytes", "4K", "--format", "json"], port);
    let child = Command::new(&exec_after)
        .args(args)
        .arg(&program)
        .spawn()
        .unwrap();
    let pid = child.id();
    assert_eq!(child.wait_with_output().unwrap().status.code(), Some(3));
    std::thread::sleep(Duration::from_millis(2500));
    (pid, tests::report_json(&stop(monitor)))
}

/// A process's (or image's) totals in a report: (calls, bytes).
fn totals_of(process: &serde_json::Value) -> (Option<u64>, Option<u64>) {
    (process["count"].as_u64(), process["bytes"].as_u64())
}

/// A process that ends between two periods' reads, then the monitor:
/// the final report (like one between periods) took a process's count
/// from the kernel only while the notices said its pid was running, so
/// the calls it made after the last read were missing (here `render`'s
/// 30 of 300 bytes: 10 calls reported, or 40 when a period's read fell
/// between its end and the report). `phases delay 1500`: 10 calls of 100
/// bytes, 1.5 s, 30 of 300.
#[test]
fn the_final_report_has_the_calls_a_process_made_after_the_last_read() {
    let _serial = serial();
    let program = fixture("phases", "fp", frame_pointers());
    let port = free_port();
    let monitor = start_monitor(&["--sample-bytes", "256", "--format", "json"], port);
    let child = Command::new(&program)
        .args(["delay", "1500"])
        .spawn()
        .unwrap();
    let pid = child.id();
    assert!(child.wait_with_output().unwrap().status.success());
    let report: serde_json::Value = tests::report_json(&stop(monitor));
    let process = process_in(&report, pid);
    assert_eq!(totals_of(process), (Some(40), Some(10_000)), "{process}");
}

/// A process started after the monitor: its first calls come before its
/// unwind tables are loaded, so their stacks stop in the C library. The
/// break malloc grows and the big blocks it maps there were counted as the
/// program's own (twice: as malloc's too) in most runs; the kernel now
/// tells them by the return address. The program's own stay counted, a
/// thread's stack (mapped by the C library, `MAP_STACK`) too.
#[test]
fn a_new_processs_malloc_mappings_are_malloc_s_though_its_stacks_stop_in_libc() {
    let _serial = serial();
    let program = fixture("direct_mmap", "O2", &["-O2", "-g"]);
    let threaded = fixture("thread_stack", "O2", &["-O2", "-g", "-pthread"]);
    let port = free_port();
    let monitor = start_monitor(&["--format", "json"], port);
    let run = |program: &Path| {
        let child = Command::new(program).spawn().unwrap();
        let pid = child.id();
        assert!(child.wait_with_output().unwrap().status.success());
        pid
    };
    let (pid, threaded_pid) = (run(&program), run(&threaded));
    std::thread::sleep(Duration::from_millis(1500));
    let report: serde_json::Value = tests::report_json(&stop(monitor));
    let process = process_in(&report, pid);
    assert_own_mappings_of_direct_mmap(process, "glibc");
    // Its three 1 MiB blocks, once, as malloc's.
    let malloc = sum_of(process, "malloc");
    assert_eq!(malloc[0] >> 20, 3, "{process}");
    // The thread's 1 MiB stack, without a guard page.
    let threaded = process_in(&report, threaded_pid);
    assert_eq!(sum_of(threaded, "mmap"), [1 << 20, 1], "{threaded}");
}

/// What a process's stacks of `allocator` sum to: [bytes, count].
fn sum_of(process: &serde_json::Value, allocator: &str) -> [u64; 2] {
    let stacks: Vec<_> = process["stacks"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|s| s["allocator"] == allocator)
        .collect();
    sum_fields(&stacks, ["bytes", "count"])
}

/// tests/fixtures/direct_mmap.c's own mappings, and no other: 11 mmaps
/// (42 pages), 1 mremap (to 16), the break raised twice by 16 pages.
fn assert_own_mappings_of_direct_mmap(process: &serde_json::Value, malloc: &str) {
    assert_eq!(
        sum_of(process, "mmap"),
        [42 * 4096, 11],
        "{malloc}: {process}"
    );
    assert_eq!(
        sum_of(process, "mremap"),
        [16 * 4096, 1],
        "{malloc}: {process}"
    );
    assert_eq!(
        sum_of(process, "brk"),
        [32 * 4096, 2],
        "{malloc}: {process}"
    );
}

/// The same with jemalloc and mimalloc as libraries: they map their heap
/// from functions no probe is on, so a stack cut short leaves only such a
/// frame (and the loader names them by a symlink maps do not show). The
/// first run has the library probed; the next two are new processes.
/// (tcmalloc is left out: its heap sampler's libunwind maps pages too,
/// which a stack cut in libunwind cannot tell from the program's.)
#[test]
fn a_new_processs_allocator_library_mappings_are_the_allocators() {
    let _serial = serial();
    let port = free_port();
    let monitor = start_monitor(&["--format", "json"], port);
    let mut runs = Vec::new();
    for library in ["jemalloc", "mimalloc"] {
        let link = format!("-l{library}");
        let program = fixture(
            "direct_mmap",
            library,
            &["-O2", "-g", "-Wl,--no-as-needed", &link],
        );
        for run in 0..3 {
            let child = Command::new(&program).spawn().unwrap();
            let pid = child.id();
            assert!(child.wait_with_output().unwrap().status.success());
            // The first may end before its library is probed.
            if run == 0 {
                std::thread::sleep(Duration::from_millis(1000));
            } else {
                runs.push((library, pid));
            }
        }
    }
    std::thread::sleep(Duration::from_millis(1500));
    let report: serde_json::Value = tests::report_json(&stop(monitor));
    for (library, pid) in runs {
        assert_own_mappings_of_direct_mmap(process_in(&report, pid), library);
    }
}
