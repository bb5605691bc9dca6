//! What is recorded, and when: --while FUNCTION,
//! --start-on/--toggle-on SIGNAL, --delay; exact sums on a fixture whose
//! phases are known (tests/fixtures/phases.c).
use std::path::PathBuf;

use serde_json::Value;
use tests::*;

fn phases() -> PathBuf {
    fixture("phases", "nofp", no_frame_pointers())
}

/// `memprof trace --format json ARGS -- phases MODE`: the report.
fn traced(args: &[&str], mode: &str) -> Value {
    let program = phases();
    let (output, report) = trace_json(args, &[program.to_str().unwrap(), mode]);
    assert!(
        output.status.success(),
        "{}",
        String::from_utf8_lossy(&output.stderr)
    );
    report
}

/// Every frame's function in the report ("?" for none).
fn functions_of(report: &Value) -> Vec<String> {
    stacks_where(report, |_| true)
        .into_iter()
        .flat_map(frame_functions)
        .collect()
}

fn totals(report: &Value) -> (u64, u64) {
    (
        report["bytes"].as_u64().unwrap(),
        report["count"].as_u64().unwrap(),
    )
}

#[test]
fn while_records_only_the_calls_inside_the_function_with_whole_stacks() {
    let _serial = serial();
    for mode in [
        &["--while", "parse_input"][..],
        &["--while", "parse_input", "--live"],
    ] {
        let report = traced(mode, "filters");
        // 20 x 200 through xmalloc and 5 x 50 directly, nothing else.
        assert_eq!(totals(&report), (4250, 25), "{mode:?}");
        assert_eq!(site(&report, "xmalloc").0, 4000);
        assert_eq!(site(&report, "parse_input").0, 250);
        // The return probe's trampoline does not cut the stacks.
        for stack in stacks_where(&report, |_| true) {
            let functions = frame_functions(stack);
            assert!(functions.contains(&"main".to_string()), "{functions:?}");
            assert_eq!(stack["partial"], false);
        }
        assert_eq!(
            report["recording"]["while"],
            serde_json::json!(["parse_input"])
        );
        assert!(report["probes"]
            .as_array()
            .unwrap()
            .iter()
            .any(|p| p["role"] == "region" && p["function"] == "parse_input"));
        if mode.contains(&"--live") {
            // The blocks allocated outside were never seen: their frees
            // are not unknown ones.
            let process = &report["processes"][0];
            assert_eq!(process["unknown_frees"], 0);
            assert_eq!(process["live_bytes"], 0);
        }
    }
}

#[test]
fn frame_pointer_stacks_go_through_the_region_function_too() {
    let _serial = serial();
    let program = fixture("phases", "fp", frame_pointers());
    let (output, report) = trace_json(
        &["--while", "parse_input", "--unwind", "fp"],
        &[program.to_str().unwrap(), "filters"],
    );
    assert!(output.status.success());
    assert_eq!(totals(&report), (4250, 25));
    let through_xmalloc = &stacks_at(&report["processes"][0], "xmalloc")[0];
    let functions = frame_functions(through_xmalloc);
    assert_eq!(
        functions[..3],
        ["xmalloc", "parse_input", "main"],
        "{functions:?}"
    );
}

#[test]
fn recursion_deeper_than_the_kept_calls_is_cut_and_counted() {
    let _serial = serial();
    let with_fp = fixture("phases", "fp", frame_pointers());
    for (depth, unwind) in [("3", "auto"), ("6", "auto"), ("3", "fp"), ("6", "fp")] {
        let program = if unwind == "fp" {
            with_fp.clone()
        } else {
            phases()
        };
        let (output, report) = trace_json(
            &["--while", "recurse", "--unwind", unwind],
            &[program.to_str().unwrap(), "recursion", depth],
        );
        assert!(output.status.success());
        assert_eq!(totals(&report), (640, 10), "{depth} {unwind}");
        assert!(
            !functions_of(&report).contains(&"?".to_string()),
            "{report}"
        );
        let stack = &stacks_at(&report["processes"][0], "recurse")[0];
        let functions = frame_functions(stack);
        let cut = report["lost"]["unwind_no_info"].as_u64().unwrap();
        if depth == "3" {
            // Every region call kept: the whole stack.
            assert_eq!(stack["partial"], false, "{functions:?}");
            assert!(functions.contains(&"main".to_string()), "{functions:?}");
            assert_eq!(cut, 0);
        } else {
            // The 4 innermost calls' frames, then the cut: never a
            // trampoline read as a frame or as the stack's end.
            assert_eq!(stack["partial"], true, "{functions:?}");
            assert_eq!(functions.iter().filter(|f| *f == "recurse").count(), 5);
            // One per call; with the tables also glibc's first sbrk calls
            // inside malloc, whose stacks are walked to tell it is malloc's.
            match unwind {
                "fp" => assert_eq!(cut, 10),
                _ => assert!((10..=12).contains(&cut), "{cut}"),
            }
        }
    }
}

#[test]
fn a_while_function_that_is_nowhere_is_a_one_line_error() {
    let _serial = serial();
    let program = phases();
    let output = memprof(&[
        "trace",
        "--while",
        "no_such_function",
        "--",
        program.to_str().unwrap(),
    ]);
    assert_one_line_error(&output, 2, "function no_such_function not found");
}

#[test]
fn toggle_on_pauses_and_resumes_at_each_signal() {
    let _serial = serial();
    let report = traced(&["--toggle-on", "USR1"], "signals");
    // load_config (1,000 B) and render (9,000 B); parse_input paused.
    assert_eq!(totals(&report), (10_000, 40));
    assert_eq!(site(&report, "parse_input").1, 0);
    let windows = report["recording"]["windows"].as_array().unwrap();
    assert_eq!(windows.len(), 2, "{windows:?}");
    assert_eq!(report["recording"]["toggle_on"], "SIGUSR1");
}

#[test]
fn start_on_records_from_the_first_signal() {
    let _serial = serial();
    let report = traced(&["--start-on", "usr1"], "signals");
    // parse_input (4,250 B) and render (9,000 B).
    assert_eq!(totals(&report), (13_250, 55));
    assert_eq!(report["recording"]["windows"].as_array().unwrap().len(), 1);
}

#[test]
fn delay_skips_the_start() {
    let _serial = serial();
    let report = traced(&["--delay", "300ms", "--live"], "delay");
    // render's 30 x 300 B only; load_config's frees are not unknown.
    assert_eq!(totals(&report), (9000, 30));
    assert_eq!(report["processes"][0]["unknown_frees"], 0);
    let window = &report["recording"]["windows"][0];
    assert!(
        (0.29..0.5).contains(&window[0].as_f64().unwrap()),
        "{window}"
    );
}

#[test]
fn a_mapping_made_outside_the_region_still_ends_the_one_it_replaces() {
    let _serial = serial();
    let report = traced(&["--live", "--while", "map_pages"], "fixed");
    // map_pages's 4 pages counted; main's MAP_FIXED over them is not, but
    // they are gone.
    let [bytes, count, live] = sum_fields(
        &stacks_where(&report, |s| s["allocator"] == "mmap"),
        ["bytes", "count", "live_bytes"],
    );
    assert_eq!((bytes, count, live), (4 * 4096, 1, 0), "{report}");
    assert_eq!(report["processes"][0]["mapped_live_bytes"], 0);
}

#[test]
fn a_probed_allocator_cannot_be_a_region() {
    let _serial = serial();
    let output = memprof(&["trace", "--while", "malloc", "--", "/bin/true"]);
    assert_one_line_error(
        &output,
        2,
        "malloc is a function memprof probes as an allocator",
    );
}

#[test]
fn signals_that_end_the_profile_are_refused() {
    let _serial = serial();
    for bad in ["INT", "SIGTERM", "KILL", "NOPE"] {
        let output = memprof(&["trace", "--toggle-on", bad, "--", "/bin/true"]);
        assert_one_line_error(&output, 2, "--toggle-on");
    }
    let output = memprof(&[
        "trace",
        "--start-on",
        "USR1",
        "--toggle-on",
        "SIGUSR1",
        "--",
        "/bin/true",
    ]);
    assert_one_line_error(&output, 2, "need different signals");
}
