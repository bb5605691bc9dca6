//! --focus, --ignore and --skip-frames: exact sums on a
//! fixture whose call sites are known, in `trace` and on a saved report.
use std::path::PathBuf;

use serde_json::Value;
use tests::*;

fn phases() -> PathBuf {
    fixture("phases", "nofp", no_frame_pointers())
}

/// `memprof trace` of `phases filters` with `filters`: the report.
fn traced(filters: &[&str]) -> Value {
    let program = phases();
    let (output, report) = trace_json(filters, &[program.to_str().unwrap(), "filters"]);
    assert!(
        output.status.success(),
        "{}",
        String::from_utf8_lossy(&output.stderr)
    );
    report
}

fn only_process(report: &Value) -> &Value {
    let processes = report["processes"].as_array().unwrap();
    assert_eq!(processes.len(), 1, "{report}");
    &processes[0]
}

/// (bytes, count) of a process and (bytes, count, stacks) of what was hidden.
fn totals(report: &Value) -> ((u64, u64), (u64, u64, u64)) {
    let process = only_process(report);
    let field = |name: &str| process[name].as_u64().unwrap_or(0);
    (
        (field("bytes"), field("count")),
        (
            field("hidden_bytes"),
            field("hidden_count"),
            field("hidden_stacks"),
        ),
    )
}

#[test]
fn focus_keeps_only_the_stacks_through_a_function() {
    let _serial = serial();
    let report = traced(&["--focus", "^parse_input$"]);
    // 20 x 200 through xmalloc, 5 x 50 directly; load_config's and
    // render's 40 calls (10 x 100 + 30 x 300) hidden, in two stacks.
    assert_eq!(totals(&report), ((4250, 25), (10_000, 40, 2)));
    assert_eq!(site(&report, "xmalloc").0, 4000);
    assert_eq!(site(&report, "parse_input").0, 250);
    let filters = &report["filters"];
    assert_eq!(filters["focus"], serde_json::json!(["^parse_input$"]));
    assert_eq!(filters["hidden_bytes"], 10_000);
}

#[test]
fn ignore_drops_the_stacks_through_a_function() {
    let _serial = serial();
    let report = traced(&["--ignore", "xmalloc"]);
    assert_eq!(totals(&report), ((250, 5), (14_000, 60, 3)));
    assert_eq!(
        site(&report, "parse_input"),
        (250, 5, vec!["malloc".into()])
    );
}

#[test]
fn skip_frames_makes_the_wrappers_callers_frame_0() {
    let _serial = serial();
    let report = traced(&["--skip-frames", "1"]);
    // Nothing hidden; xmalloc's stacks now start at its callers, and
    // parse_input's own malloc at main.
    assert_eq!(totals(&report), ((14_250, 65), (0, 0, 0)));
    assert_eq!(site(&report, "xmalloc").1, 0);
    assert_eq!(site(&report, "load_config").0, 1000);
    assert_eq!(site(&report, "parse_input").0, 4000);
    assert_eq!(site(&report, "render").0, 9000);
    assert_eq!(site(&report, "main").0, 250);
}

#[test]
fn filters_on_a_saved_report_give_the_same_sums() {
    let _serial = serial();
    let saved = workspace_root().join("target/fixtures/phases-filters.json");
    let program = phases();
    let output = memprof(&[
        "trace",
        "--format",
        "json",
        "--top",
        "1000",
        "--depth",
        "64",
        "-o",
        saved.to_str().unwrap(),
        "--",
        program.to_str().unwrap(),
        "filters",
    ]);
    assert!(output.status.success());
    let recut = |args: &[&str]| {
        let mut all = vec!["report", saved.to_str().unwrap(), "--format", "json"];
        all.extend_from_slice(args);
        parse_report(&memprof(&all))
    };
    assert_eq!(
        totals(&recut(&["--focus", "^parse_input$"])),
        ((4250, 25), (10_000, 40, 2))
    );
    let skipped = recut(&["--skip-frames", "1", "--ignore", "^render$"]);
    assert_eq!(totals(&skipped), ((5250, 35), (9000, 30, 1)));
    assert_eq!(site(&skipped, "load_config").0, 1000);
    assert_eq!(site(&skipped, "parse_input").0, 4000);
    assert_eq!(skipped["filters"]["skip_frames"], 1);
    // The text report says what was applied and what it hid.
    let text = memprof(&["report", saved.to_str().unwrap(), "--focus", "render"]);
    let text = String::from_utf8(text.stdout).unwrap();
    assert!(
        text.starts_with("memprof: 8.8 KiB in 30 allocations"),
        "{text}"
    );
    assert!(
        text.contains("filters: --focus 'render'; hid 3 stacks: 5.1 KiB in 35 allocations"),
        "{text}"
    );
}

#[test]
fn a_bad_pattern_is_a_one_line_error() {
    let _serial = serial();
    let output = memprof(&["trace", "--focus", "(", "--", "/bin/true"]);
    assert_one_line_error(&output, 2, "'(' is not a regular expression");
}
