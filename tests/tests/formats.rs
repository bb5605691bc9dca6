//! Report formats, saved reports (`memprof report`) and `memprof diff`,
//! from real traces of the demo workload.
use std::path::{Path, PathBuf};

use serde_json::Value;
use tests::*;

/// Traces the demo workload serving `requests` and saves the full JSON report.
fn saved_trace(requests: u32) -> PathBuf {
    let dir = workspace_root().join("target/fixtures");
    let path = dir.join(format!("workload-{requests}.json"));
    let program = demo_workload();
    let output = memprof(&[
        "trace",
        "--format",
        "json",
        "--top",
        "100000",
        "--depth",
        "64",
        "-o",
        path.to_str().unwrap(),
        "--",
        program.to_str().unwrap(),
        &requests.to_string(),
    ]);
    assert!(
        output.status.success(),
        "{}",
        String::from_utf8_lossy(&output.stderr)
    );
    path
}

fn render(file: &Path, args: &[&str]) -> String {
    let mut all = vec!["report", file.to_str().unwrap()];
    all.extend_from_slice(args);
    let output = memprof(&all);
    assert!(
        output.status.success(),
        "{}",
        String::from_utf8_lossy(&output.stderr)
    );
    String::from_utf8(output.stdout).unwrap()
}

/// `memprof diff BASE NEW --format json`, parsed.
fn diff_json(base: &Path, new: &Path) -> Value {
    let output = memprof(&[
        "diff",
        base.to_str().unwrap(),
        new.to_str().unwrap(),
        "--format",
        "json",
    ]);
    assert!(
        output.status.success(),
        "{}",
        String::from_utf8_lossy(&output.stderr)
    );
    serde_json::from_slice(&output.stdout).unwrap()
}

fn load(file: &Path) -> Value {
    let report = report_json(&std::fs::read_to_string(file).unwrap());
    assert_frames_in_mapped_modules(&report);
    report
}

#[test]
fn folded_tsv_and_markdown_agree_with_the_report() {
    let _serial = serial();
    let file = saved_trace(1000);
    let report = load(&file);
    let process = &processes_with(&report, "parse_request")[0];
    let stacks = process["stacks"].as_array().unwrap();
    let total = process["bytes"].as_u64().unwrap();

    let folded = render(&file, &["--format", "folded", "--top", "100000"]);
    let root = format!(
        "{} ({})",
        process["command"].as_str().unwrap(),
        process["pid"]
    );
    let mut folded_sum = 0;
    for line in folded.lines().filter(|l| l.starts_with(&root)) {
        let (path, bytes) = line.rsplit_once(' ').unwrap();
        folded_sum += bytes.parse::<u64>().unwrap();
        // Outermost first: the line ends with the allocator's caller.
        assert!(!path.ends_with(";main"), "{line}");
    }
    assert_eq!(folded_sum, total, "folded sums equal the report's totals");
    assert!(
        folded.contains(";main;handle;parse_request 256000\n"),
        "{folded}"
    );

    let tsv = render(&file, &["--format", "tsv", "--top", "100000"]);
    let rows: Vec<Vec<&str>> = tsv.lines().map(|l| l.split('\t').collect()).collect();
    assert_eq!(
        rows.len(),
        report["processes"]
            .as_array()
            .unwrap()
            .iter()
            .map(|p| p["stacks"].as_array().unwrap().len())
            .sum::<usize>()
    );
    // Unwound from glibc's CFI on to `_start`.
    assert!(
        rows.contains(&vec![
            "1000",
            "256000",
            "parse_request",
            "handle",
            "main",
            "__libc_start_call_main",
            "__libc_start_main_impl",
            "_start"
        ]),
        "{tsv}"
    );

    let markdown = render(&file, &["--format", "markdown", "--top", "3"]);
    assert!(markdown.contains("| # | bytes | calls | avg | function | call site | stack |"));
    assert!(markdown.contains("`handle` workload.c:37"), "{markdown}");
    assert_eq!(
        markdown
            .lines()
            .filter(|l| l.starts_with("| ") && !l.starts_with("| #"))
            .count(),
        3
    );
    assert!(stacks.len() > 3);
}

#[test]
fn saved_report_round_trips_through_json() {
    let _serial = serial();
    let file = saved_trace(1000);
    let again = render(
        &file,
        &["--format", "json", "--top", "100000", "--depth", "64"],
    );
    let again: Value = report_json(&again);
    assert_eq!(again, load(&file));
    // And can be cut again: --top 1 keeps the largest stack only.
    let cut: Value = report_json(&render(&file, &["--format", "json", "--top", "1"]));
    let process = &processes_with(&cut, "handle")[0];
    assert_eq!(process["stacks"].as_array().unwrap().len(), 1);
    assert_eq!(process["stacks"][0]["allocator"], "realloc");
}

#[test]
fn diff_of_two_runs_gives_the_known_deltas() {
    let _serial = serial();
    let base = saved_trace(1000);
    let new = saved_trace(3000);
    let diff = diff_json(&base, &new);
    let row = |function: &str| {
        stacks_at(&diff, function)
            .into_iter()
            .next()
            .unwrap_or_else(|| panic!("no {function} in {diff}"))
    };
    // 2,000 more requests: one 256-byte parse buffer each, a 1 KiB session every tenth.
    assert_eq!(row("parse_request")["bytes_delta"], 2000 * 256);
    assert_eq!(row("parse_request")["count_delta"], 2000);
    assert_eq!(row("remember_session")["bytes_delta"], 200 * 1024);
    assert_eq!(row("remember_session")["count_delta"], 200);
    assert_eq!(diff["count_delta"], 2000 * 4 + 200);
    // Growth first.
    let deltas: Vec<i64> = diff["stacks"]
        .as_array()
        .unwrap()
        .iter()
        .map(|s| s["bytes_delta"].as_i64().unwrap())
        .collect();
    assert!(deltas.windows(2).all(|w| w[0] >= w[1]), "{deltas:?}");
    let text = memprof(&["diff", base.to_str().unwrap(), new.to_str().unwrap()]);
    assert!(String::from_utf8_lossy(&text.stdout).contains("+512,000 B"));
}

#[test]
fn bad_report_files_get_one_line_errors() {
    let dir = workspace_root().join("target/fixtures");
    std::fs::create_dir_all(&dir).unwrap();
    let not_json = dir.join("not-json.json");
    std::fs::write(&not_json, "hello").unwrap();
    let not_report = dir.join("not-report.json");
    std::fs::write(&not_report, "{\"x\": 1}").unwrap();
    for (args, needle) in [
        (vec!["report", not_json.to_str().unwrap()], "not JSON"),
        (
            vec!["report", not_report.to_str().unwrap()],
            "not a memprof JSON report",
        ),
        (vec!["report", "/nonexistent/report.json"], "cannot read"),
        (
            vec![
                "diff",
                not_report.to_str().unwrap(),
                not_json.to_str().unwrap(),
            ],
            "not a memprof JSON report",
        ),
    ] {
        let output = memprof(&args);
        let stderr = String::from_utf8_lossy(&output.stderr);
        assert_eq!(output.status.code(), Some(1), "{args:?}: {stderr}");
        assert_eq!(stderr.lines().count(), 1, "{stderr}");
        assert!(stderr.contains(needle), "{stderr}");
    }
}

#[test]
fn flamegraph_is_well_formed_svg_with_the_frames() {
    let _serial = serial();
    let file = saved_trace(1000);
    let svg = render(&file, &["--format", "flamegraph", "--top", "100000"]);
    // inferno writes the SVG 1.1 DOCTYPE: allow it, it declares no entities.
    let options = roxmltree::ParsingOptions {
        allow_dtd: true,
        ..Default::default()
    };
    let document = roxmltree::Document::parse_with_options(&svg, options).expect("well-formed XML");
    assert_eq!(document.root_element().tag_name().name(), "svg");
    let titles: Vec<&str> = document
        .descendants()
        .filter(|n| n.has_tag_name("title"))
        .filter_map(|n| n.text())
        .collect();
    // inferno titles each frame "name (N bytes, P%)".
    for function in ["parse_request", "remember_session", "handle", "main"] {
        assert!(
            titles
                .iter()
                .any(|t| t.starts_with(&format!("{function} ("))),
            "no {function} frame in {titles:?}"
        );
    }
    assert!(
        titles
            .iter()
            .any(|t| t.starts_with("parse_request (256,000 bytes")),
        "{titles:?}"
    );
    assert!(
        svg.contains("memprof alloc: workload-fp"),
        "titled with mode and command"
    );
}

/// pprof's messages, as memprof writes them.
use memprof::report::pprof::proto as pprof;

#[test]
fn pprof_decodes_with_exact_totals() {
    let _serial = serial();
    let file = saved_trace(1000);
    let report = load(&file);
    let out = workspace_root().join("target/fixtures/workload-1000.pb.gz");
    let output = memprof(&[
        "report",
        file.to_str().unwrap(),
        "--format",
        "pprof",
        "--top",
        "100000",
        "-o",
        out.to_str().unwrap(),
    ]);
    assert!(
        output.status.success(),
        "{}",
        String::from_utf8_lossy(&output.stderr)
    );

    let profile = read_pprof(&out);
    let text = |i: i64| profile.string_table[i as usize].as_str();
    let types: Vec<(&str, &str)> = profile
        .sample_type
        .iter()
        .map(|t| (text(t.r#type), text(t.unit)))
        .collect();
    assert_eq!(
        types,
        [("alloc_objects", "count"), ("alloc_space", "bytes")]
    );
    let objects: i64 = profile.sample.iter().map(|s| s.value[0]).sum();
    let space: i64 = profile.sample.iter().map(|s| s.value[1]).sum();
    assert_eq!(objects as u64, report["count"].as_u64().unwrap());
    assert_eq!(space as u64, report["bytes"].as_u64().unwrap());
    // Leaf location of the parse_request sample: function, file and line.
    let function_name = |id: u64| text(profile.function[id as usize - 1].name);
    let parse = profile
        .sample
        .iter()
        .find(|s| {
            let leaf = &profile.location[s.location_id[0] as usize - 1];
            function_name(leaf.line[0].function_id) == "parse_request"
        })
        .expect("a parse_request sample");
    assert_eq!(parse.value, [1000, 256_000]);
    let leaf = &profile.location[parse.location_id[0] as usize - 1];
    assert_eq!(leaf.line[0].line, 14);
    let function = &profile.function[leaf.line[0].function_id as usize - 1];
    assert!(text(function.filename).ends_with("workload.c"));
    let mapping = &profile.mapping[leaf.mapping_id as usize - 1];
    assert!(text(mapping.filename).ends_with("workload-fp"));
    assert_eq!(text(mapping.build_id).len(), 40, "a GNU build id in hex");
    assert!(parse
        .label
        .iter()
        .any(|l| text(l.key) == "process" && text(l.str) == "workload-fp"));

    // And go tool pprof reads it, when Go is installed.
    if std::process::Command::new("go")
        .arg("version")
        .output()
        .is_ok()
    {
        let go = |args: &[&str]| {
            let cache = workspace_root().join("target/go-cache");
            let output = std::process::Command::new("go")
                .env("GOCACHE", &cache)
                .env("HOME", workspace_root().join("target"))
                .arg("tool")
                .arg("pprof")
                .args(args)
                .arg(&out)
                .output()
                .unwrap();
            assert!(
                output.status.success(),
                "{}",
                String::from_utf8_lossy(&output.stderr)
            );
            String::from_utf8(output.stdout).unwrap()
        };
        let top = go(&["-sample_index=alloc_objects", "-top"]);
        assert!(
            top.contains(&format!("Total samples = {}", report["count"])),
            "{top}"
        );
        assert!(top.contains("parse_request"), "{top}");
        let traces = go(&["-traces"]);
        assert!(traces.contains("process:  workload-fp"), "{traces}");
    }
}

#[test]
fn interval_keeps_a_series_per_process() {
    let _serial = serial();
    let program = demo_workload();
    let script = format!("{} 2000; sleep 0.6", program.display());
    let output = memprof(&[
        "trace",
        "--interval",
        "0.2",
        "--format",
        "json",
        "-o",
        workspace_root()
            .join("target/fixtures/series.json")
            .to_str()
            .unwrap(),
        "--",
        "sh",
        "-c",
        &script,
    ]);
    assert!(
        output.status.success(),
        "{}",
        String::from_utf8_lossy(&output.stderr)
    );
    let report = load(&workspace_root().join("target/fixtures/series.json"));
    let process = &processes_with(&report, "parse_request")[0];
    let series = process["series"]
        .as_array()
        .expect("a series with --interval");
    assert!(series.len() >= 2, "{series:?}");
    let bytes: Vec<u64> = series
        .iter()
        .map(|p| p["bytes"].as_u64().unwrap())
        .collect();
    assert!(
        bytes.windows(2).all(|w| w[0] <= w[1]),
        "totals so far only grow: {bytes:?}"
    );
    assert_eq!(*bytes.last().unwrap(), process["bytes"].as_u64().unwrap());
    assert_eq!(series.last().unwrap()["count"], process["count"]);
    let times: Vec<f64> = series.iter().map(|p| p["secs"].as_f64().unwrap()).collect();
    assert!(times.windows(2).all(|w| w[0] < w[1]), "{times:?}");
    // Without --interval there is no series.
    let (_, plain) = trace_json(&[], &[program.to_str().unwrap(), "10"]);
    assert!(processes_with(&plain, "parse_request")[0]
        .get("series")
        .is_none());
    assert_nothing_loaded();
}

#[test]
fn text_is_plain_when_piped_and_coloured_to_the_width_of_a_terminal() {
    let _serial = serial();
    let program = demo_workload();
    let command = format!(
        "{} trace --top 2 --depth 2 -- {} 100",
        memprof_bin().display(),
        program.display()
    );
    let piped = memprof(&[
        "trace",
        "--top",
        "2",
        "--",
        program.to_str().unwrap(),
        "100",
    ]);
    assert!(
        !String::from_utf8_lossy(&piped.stdout).contains('\u{1b}'),
        "no escapes in a pipe"
    );

    // `script` gives memprof a pseudo-terminal of 60 columns.
    let on_terminal = |no_color: bool| {
        let mut script = std::process::Command::new("script");
        script.args([
            "-qec",
            &format!("stty rows 24 cols 60; {command}"),
            "/dev/null",
        ]);
        if no_color {
            script.env("NO_COLOR", "1");
        } else {
            script.env_remove("NO_COLOR");
        }
        let output = script.output().expect("script (util-linux)");
        String::from_utf8_lossy(&output.stdout).into_owned()
    };
    let coloured = on_terminal(false);
    assert!(coloured.contains("\u{1b}[1m"), "{coloured}");
    assert!(coloured.contains("handle"), "{coloured}");
    let plain = on_terminal(true);
    assert!(!plain.contains("\u{1b}[1m"), "NO_COLOR: {plain}");
    for line in plain.lines() {
        let line = line.trim_end_matches('\r');
        // The status line on stderr is erased with \r and escape codes; count the report only.
        if line.contains('\u{1b}') {
            continue;
        }
        assert!(
            line.chars().count() <= 60,
            "{line:?} is wider than the terminal"
        );
    }
    assert_nothing_loaded();
}

#[test]
fn live_reports_carry_inuse_values_and_live_series() {
    let _serial = serial();
    let program = fixture("leaks", "fp", frame_pointers());
    let saved = workspace_root().join("target/fixtures/leaks-live.json");
    let output = memprof(&[
        "trace",
        "--live",
        "--interval",
        "0.1",
        "--format",
        "json",
        "--top",
        "1000",
        "-o",
        saved.to_str().unwrap(),
        "--",
        program.to_str().unwrap(),
    ]);
    assert!(
        output.status.success(),
        "{}",
        String::from_utf8_lossy(&output.stderr)
    );
    let report = load(&saved);
    let process = &processes_with(&report, "site_leak_malloc")[0];
    let live_bytes = process["live_bytes"].as_u64().unwrap();
    // The series has the live heap at each report; the last is the end.
    let series = process["series"].as_array().unwrap();
    assert!(series.len() >= 2, "{series:?}");
    assert!(series.iter().all(|p| p["live_bytes"].is_u64()));
    assert_eq!(series.last().unwrap()["live_bytes"], live_bytes);

    let out = workspace_root().join("target/fixtures/leaks-live.pb.gz");
    // Every stack (the loader's mappings live too, besides the leaks).
    render(
        &saved,
        &[
            "--format",
            "pprof",
            "--top",
            "1000",
            "-o",
            out.to_str().unwrap(),
        ],
    );
    let profile = read_pprof(&out);
    let text = |i: i64| profile.string_table[i as usize].as_str();
    let types: Vec<&str> = profile.sample_type.iter().map(|t| text(t.r#type)).collect();
    assert_eq!(
        types,
        [
            "alloc_objects",
            "alloc_space",
            "inuse_objects",
            "inuse_space"
        ]
    );
    let inuse_space: i64 = profile.sample.iter().map(|s| s.value[3]).sum();
    let inuse_objects: i64 = profile.sample.iter().map(|s| s.value[2]).sum();
    assert_eq!(inuse_space as u64, live_bytes);
    assert_eq!(inuse_objects, process["live_count"].as_i64().unwrap());

    // Folded stacks in live mode weigh what is still allocated.
    let folded = render(&saved, &["--format", "folded", "--top", "1000"]);
    let sum: u64 = folded
        .lines()
        .map(|l| l.rsplit(' ').next().unwrap().parse::<u64>().unwrap())
        .sum();
    assert_eq!(sum, live_bytes);
    // A saved live report renders back to the same JSON.
    let again: Value = report_json(&render(&saved, &["--format", "json", "--top", "1000"]));
    assert_eq!(again, report);
    // And the text report names the leaks.
    let text_report = render(&saved, &[]);
    assert!(
        text_report.contains("still allocated at exit"),
        "{text_report}"
    );
    assert!(text_report.contains("site_chain_final"), "{text_report}");
    assert_nothing_loaded();
}

#[test]
fn diff_of_live_runs_gives_the_growth_of_what_is_still_allocated() {
    let _serial = serial();
    let program = fixture("leaks", "fp", frame_pointers());
    let dir = workspace_root().join("target/fixtures");
    let run = |blocks: &str| {
        let path = dir.join(format!("fill-{blocks}.json"));
        let output = memprof(&[
            "trace",
            "--live",
            "--format",
            "json",
            "--top",
            "100",
            "-o",
            path.to_str().unwrap(),
            "--",
            program.to_str().unwrap(),
            "fill",
            blocks,
        ]);
        assert!(output.status.success());
        path
    };
    let (base, new) = (run("10"), run("30"));
    let diff = diff_json(&base, &new);
    // 20 more blocks of 64 bytes, none freed.
    assert_eq!(diff["live_bytes_delta"], 1280);
    let fill = &diff["stacks"][0];
    assert_eq!(fill["frames"][0]["function"], "site_fill");
    assert_eq!(fill["live_bytes_delta"], 1280);
    assert_eq!(fill["base_live_bytes"], 640);
    assert_eq!(fill["bytes_delta"], 1280);
    assert_eq!(fill["count_delta"], 20);
    assert_nothing_loaded();
}

#[test]
fn diff_refuses_reports_that_cannot_be_compared() {
    let _serial = serial();
    let exact = saved_trace(1000);
    let sampled = workspace_root().join("target/fixtures/workload-sampled.json");
    let output = memprof(&[
        "trace",
        "--format",
        "json",
        "--sample-bytes",
        "64K",
        "-o",
        sampled.to_str().unwrap(),
        "--",
        demo_workload().to_str().unwrap(),
        "1000",
    ]);
    assert!(output.status.success());
    let output = memprof(&["diff", exact.to_str().unwrap(), sampled.to_str().unwrap()]);
    assert_one_line_error(&output, 1, "exact and the new one sampled");
    // Stacks against callers.
    let callers = workspace_root().join("target/fixtures/workload-callers.json");
    let output = memprof(&[
        "report",
        exact.to_str().unwrap(),
        "--group-by",
        "caller",
        "--format",
        "json",
        "-o",
        callers.to_str().unwrap(),
    ]);
    assert!(output.status.success());
    let output = memprof(&["diff", exact.to_str().unwrap(), callers.to_str().unwrap()]);
    assert_one_line_error(&output, 1, "--group-by");
}

/// A frame in code no file holds (a JIT's stub, walked through by frame
/// pointer) still has a mapping in pprof: consumers such as Pyroscope
/// fail on a location without one. The profile says when it began.
#[test]
fn pprof_gives_every_location_a_mapping_and_its_start_time() {
    let _serial = serial();
    let program = fixture("jit", "fp", frame_pointers());
    let out = workspace_root().join("target/fixtures/jit-fp.pb.gz");
    let before = std::time::SystemTime::now();
    let output = memprof(&[
        "trace",
        "--unwind",
        "fp",
        "--format",
        "pprof",
        "-o",
        out.to_str().unwrap(),
        "--",
        program.to_str().unwrap(),
    ]);
    assert!(output.status.success(), "{output:?}");
    let profile = read_pprof(&out);
    let text = |i: i64| profile.string_table[i as usize].as_str();
    let unknown: Vec<&pprof::Mapping> = profile
        .mapping
        .iter()
        .filter(|m| text(m.filename) == "[unknown]")
        .collect();
    assert_eq!(unknown.len(), 1, "the stub's mapping");
    for location in &profile.location {
        assert_ne!(location.mapping_id, 0, "{location:?}");
        assert!(profile.mapping.iter().any(|m| m.id == location.mapping_id));
    }
    // The stub's location is in it: 7 calls of 48 bytes went through.
    let stub = profile
        .location
        .iter()
        .find(|l| l.mapping_id == unknown[0].id)
        .expect("the stub's location");
    let through: i64 = profile
        .sample
        .iter()
        .filter(|s| s.location_id.contains(&stub.id))
        .map(|s| s.value[0])
        .sum();
    assert_eq!(through, 7);
    let began = std::time::UNIX_EPOCH + std::time::Duration::from_nanos(profile.time_nanos as u64);
    let since = began
        .duration_since(before)
        .unwrap_or_else(|e| panic!("began before: {e}"));
    assert!(since < std::time::Duration::from_secs(30), "{since:?}");
    assert!(profile.duration_nanos > 0);
}

/// What identifies a stack across runs: its allocator, figures and the
/// function, file and line of each frame (addresses move with ASLR).
fn stack_readings(report: &Value) -> Vec<Value> {
    let process = &processes_with(report, "leaf")[0];
    process["stacks"]
        .as_array()
        .unwrap()
        .iter()
        .map(|stack| {
            let frames: Vec<Value> = stack["frames"]
                .as_array()
                .unwrap()
                .iter()
                .map(|f| serde_json::json!([f["function"], f["file"], f["line"], f["inlined"]]))
                .collect();
            serde_json::json!([stack["allocator"], stack["bytes"], stack["count"], frames])
        })
        .collect()
}

#[test]
fn a_saved_profile_keeps_everything_and_recuts_as_a_direct_run() {
    let _serial = serial();
    let saved = workspace_root().join("target/fixtures/stacks-everything.json");
    let program = fixture("stacks", "fp", frame_pointers());
    let program = program.to_str().unwrap();
    // 30 stacks 17 frames deep (leaf, 12 levels with `step` inlined into
    // each, main, libc's start), 3 calls each of 16 + 8 x path bytes.
    let traced = |args: &[&str]| {
        let mut all = vec!["trace"];
        all.extend_from_slice(args);
        all.extend_from_slice(&["--", program, "sized", "30"]);
        let output = memprof(&all);
        assert!(
            output.status.success(),
            "{}",
            String::from_utf8_lossy(&output.stderr)
        );
        output
    };
    traced(&["--format", "json", "-o", saved.to_str().unwrap()]);
    let everything = load(&saved);
    // No --top, no --depth: every stack, every frame, and the cut says so.
    assert_eq!(
        everything["cut"]["top"],
        Value::Null,
        "{}",
        everything["cut"]
    );
    assert_eq!(everything["cut"]["depth"], Value::Null);
    let leaves = stacks_at(&processes_with(&everything, "leaf")[0], "leaf");
    assert_eq!(leaves.len(), 30);
    let expected: u64 = (0..30).map(|bits| 3 * (16 + 8 * bits)).sum();
    let bytes: u64 = leaves.iter().map(|s| s["bytes"].as_u64().unwrap()).sum();
    assert_eq!(bytes, expected);
    for stack in &leaves {
        let functions = frame_functions(stack);
        assert!(functions.len() > 12, "{functions:?}");
        assert!(functions.contains(&"main".to_string()), "{functions:?}");
    }
    // Text keeps its defaults: 10 stacks of at most 12 frames.
    let text = render(&saved, &[]);
    assert!(text.contains("#10 "), "{text}");
    assert!(!text.contains("#11 "), "{text}");
    assert!(!text.contains("main "), "{text}");

    // Recut, it reads as a direct run with the same cut.
    for cut in [
        &["--top", "3", "--depth", "4"][..],
        &["--top", "5", "--sort", "calls"],
        &["--top", "4", "--sort", "average", "--depth", "2"],
        &["--group-by", "caller", "--top", "6"],
        &["--focus", "right", "--min-bytes", "300", "--depth", "3"],
    ] {
        let mut args = vec!["--format", "json"];
        args.extend_from_slice(cut);
        let direct = parse_report(&traced(&args));
        let recut: Value = report_json(&render(&saved, &args));
        assert_eq!(stack_readings(&recut), stack_readings(&direct), "{cut:?}");
        assert_eq!(recut["cut"], direct["cut"], "{cut:?}");
    }
    // Folded lines keep everything too: 30 lines rooted at main.
    let folded = render(&saved, &["--format", "folded"]);
    let leaf_lines: Vec<&str> = folded.lines().filter(|l| l.contains(";leaf")).collect();
    assert_eq!(leaf_lines.len(), 30, "{folded}");
    assert!(leaf_lines.iter().all(|l| l.contains(";main;")), "{folded}");
    // --sort live needs a live profile, a saved one too.
    let output = memprof(&["report", saved.to_str().unwrap(), "--sort", "live"]);
    assert_one_line_error(&output, 2, "--sort live needs a live profile");
}

/// One run saved in both JSON layouts, and compressed: version 2 lists
/// each frame once (stacks hold indices), version 1 holds every frame
/// whole; the test's own reader of version 2 (docs/json-schema.md) gives
/// exactly memprof's version 1; `report` and `diff` read every one alike.
#[test]
fn json_versions_1_and_2_and_compressed_files_hold_the_same_report() {
    let _serial = serial();
    let v2 = saved_trace(1000);
    let dir = workspace_root().join("target/fixtures");
    let file = |name: &str| dir.join(name);
    let convert = |from: &Path, to: &Path, extra: &[&str]| {
        let mut args = vec!["--format", "json", "-o", to.to_str().unwrap()];
        args.extend_from_slice(extra);
        render(from, &args);
    };
    let v1 = file("workload-1000.v1.json");
    convert(&v2, &v1, &["--json-version", "1"]);
    let v2_again = file("workload-1000.v2.json");
    convert(&v1, &v2_again, &[]);
    let raw = |path: &Path| -> Value {
        serde_json::from_str(&std::fs::read_to_string(path).unwrap()).unwrap()
    };
    let (raw_v1, raw_v2) = (raw(&v1), raw(&v2));
    assert_eq!(raw_v1["version"], 1);
    assert_eq!(raw_v2["version"], 2);
    let first_stack = |report: &Value| report["processes"][0]["stacks"][0].clone();
    assert!(first_stack(&raw_v1)["frames"][0].is_object());
    assert!(first_stack(&raw_v2)["frames"][0].is_u64());
    assert!(!raw_v2["locations"].as_array().unwrap().is_empty());
    assert!(raw_v1.get("locations").is_none());
    // Same numbers, same frames, both ways.
    assert_eq!(in_version_1_shape(raw_v2.clone()), raw_v1);
    assert_eq!(raw(&v2_again), raw_v2);
    let size = |path: &Path| std::fs::metadata(path).unwrap().len();
    assert!(size(&v2) * 2 < size(&v1), "{} vs {}", size(&v2), size(&v1));

    // Compressed by name, read by content.
    let (gz, zst) = (
        file("workload-1000.json.gz"),
        file("workload-1000.json.zst"),
    );
    convert(&v2, &gz, &[]);
    convert(&v2, &zst, &[]);
    let magic = |path: &Path| std::fs::read(path).unwrap()[..4].to_vec();
    assert_eq!(magic(&gz)[..2], [0x1f, 0x8b]);
    assert_eq!(magic(&zst), [0x28, 0xb5, 0x2f, 0xfd]);
    assert!(size(&zst) < size(&v2) / 4);
    let text = render(&v1, &["--top", "5"]);
    assert!(text.contains("parse_request"), "{text}");
    for saved in [&v2, &gz, &zst] {
        assert_eq!(render(saved, &["--top", "5"]), text, "{}", saved.display());
    }
    // A diff across layouts and compressions finds nothing changed.
    for (base, new) in [(&v1, &v2), (&gz, &zst)] {
        let diff = diff_json(base, new);
        assert_eq!(diff["count_delta"], 0, "{diff}");
        assert_eq!(diff["bytes_delta"], 0, "{diff}");
        assert!(
            diff["stacks"]
                .as_array()
                .unwrap()
                .iter()
                .all(|s| s["bytes_delta"] == 0 && s["count_delta"] == 0),
            "{diff}"
        );
    }

    // What a reader refuses, in one line each: an index past the table,
    // a file larger than --max-report-size once decompressed.
    let mut broken = raw_v2.clone();
    broken["processes"][0]["stacks"][0]["frames"][0] = Value::from(99_999);
    let broken_file = file("workload-1000.broken.json");
    std::fs::write(&broken_file, serde_json::to_string(&broken).unwrap()).unwrap();
    let refused = [
        (
            vec!["report", broken_file.to_str().unwrap()],
            "frame 99999 is not in the frame table",
        ),
        (
            vec!["report", gz.to_str().unwrap(), "--max-report-size", "4K"],
            "once decompressed",
        ),
    ];
    for (args, needle) in refused {
        let output = memprof(&args);
        let stderr = String::from_utf8_lossy(&output.stderr);
        assert!(!output.status.success(), "{args:?}");
        assert_eq!(stderr.lines().count(), 1, "{stderr}");
        assert!(stderr.contains(needle), "{stderr}");
    }
}
