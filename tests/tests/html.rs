//! The HTML page (`--format html`) in a real browser: Debian's chromium
//! driven by playwright-core (tests/browser/page.mjs), as a user would
//! use it: load, search, click into a frame, switch views, drag a range
//! on the heap's timeline. The figures it shows are checked against the
//! JSON report of the same run; screenshots of each step are left in
//! target/html/ to look at. And speedscope's format, from the same run.
use std::{path::Path, process::Command};

use serde_json::Value;
use tests::*;

/// What page.mjs saw of `page`, driving it with `function`.
fn drive(page: &Path, shots: &Path, function: &str) -> Value {
    std::fs::create_dir_all(shots).unwrap();
    let output = Command::new("node")
        .arg(workspace_root().join("tests/browser/page.mjs"))
        .arg(page)
        .arg(shots)
        .arg(function)
        .output()
        .expect("node (scripts/setup.sh installs playwright-core)");
    assert!(output.status.success(), "{output:?}");
    let seen: Value = serde_json::from_slice(&output.stdout).unwrap();
    assert_eq!(seen["errors"], serde_json::json!([]), "{seen}");
    seen
}

fn memprof_ok(args: &[&str]) {
    let output = memprof(args);
    assert!(
        output.status.success(),
        "{args:?}: {}",
        String::from_utf8_lossy(&output.stderr)
    );
}

/// `phases timeline`: 20 blocks of 1 MiB from `grow`, held, freed; the
/// live heap sampled every 50 ms. Saved as JSON, its names made hostile
/// (a process controls its command line), then rendered as a page.
#[test]
fn the_page_shows_the_runs_figures_and_answers_search_zoom_views_and_ranges() {
    let _serial = serial();
    let dir = workspace_root().join("target/html");
    std::fs::create_dir_all(&dir).unwrap();
    let saved = dir.join("phases.json");
    let program = fixture("phases", "nofp", no_frame_pointers());
    memprof_ok(&[
        "trace",
        "--live",
        "--timeline-period",
        "50ms",
        "--format",
        "json",
        "-o",
        saved.to_str().unwrap(),
        "--",
        program.to_str().unwrap(),
        "timeline",
    ]);
    let mut report: Value =
        serde_json::from_str(&std::fs::read_to_string(&saved).unwrap()).unwrap();
    const HOSTILE: &str = "</script><img src=x onerror=alert(1)><!--";
    report["processes"][0]["cmdline"] = serde_json::json!([HOSTILE]);
    std::fs::write(&saved, serde_json::to_string(&report).unwrap()).unwrap();
    let page = dir.join("phases.html");
    memprof_ok(&[
        "report",
        saved.to_str().unwrap(),
        "--format",
        "html",
        "-o",
        page.to_str().unwrap(),
    ]);
    let html = std::fs::read_to_string(&page).unwrap();
    assert!(!html.contains(HOSTILE), "the name went into the page raw");

    let seen = drive(&page, &dir.join("phases"), "grow");
    // Loaded: the run's totals, the name shown as text; the allocated
    // view first, as nothing was left live.
    assert_eq!(seen["loaded"]["view"], "bytes");
    let summary = seen["loaded"]["summary"].as_str().unwrap();
    assert!(
        summary.starts_with("20.0 MiB in 20 allocations, 1 process"),
        "{summary}"
    );
    assert!(
        seen["loaded"]["settings"]
            .as_str()
            .unwrap()
            .contains(HOSTILE),
        "{seen}"
    );
    assert!(seen["loaded"]["drawn"].as_u64().unwrap() >= 5, "{seen}");
    // Searched in the allocated view: grow holds every byte.
    assert_eq!(seen["searched"]["view"], "bytes");
    assert_eq!(seen["searched"]["matched"], "matched 20.0 MiB (100.0%)");
    // Clicked into grow's frame: the graph is grow's, exactly 20 MiB.
    assert_eq!(seen["zoomed"]["focus"], "grow");
    assert_eq!(seen["zoomed"]["matched"], 20u64 << 20);
    // Calls: its 20 calls.
    assert_eq!(seen["calls"]["view"], "count");
    assert_eq!(seen["calls"]["matched"], 20);
    assert!(seen["calls"]["label"]
        .as_str()
        .unwrap()
        .starts_with("width: calls"));
    // A range on the timeline: what grow's band grew by between its ends.
    let range = &seen["range"];
    let (from, to) = (
        range["selection"]["from"].as_u64().unwrap() as usize,
        range["selection"]["to"].as_u64().unwrap() as usize,
    );
    assert!(from < to, "{range}");
    let band = &report["processes"][0]["timeline"]["stacks"][0]["values"];
    let grown = band[to]
        .as_u64()
        .unwrap()
        .saturating_sub(band[from].as_u64().unwrap());
    assert_eq!(range["matched"], grown, "{range}");
    assert!(
        range["label"].as_str().unwrap().starts_with("grown from"),
        "{range}"
    );
    assert!(range["header"]
        .as_array()
        .unwrap()
        .iter()
        .any(|h| h == "In the selection"));
    assert_eq!(seen["sorted"][0], "grow phases.c:69");
    for shot in ["1-loaded", "2-searched", "3-zoomed", "4-range"] {
        let png = std::fs::read(dir.join(format!("phases/{shot}.png"))).unwrap();
        assert!(png.starts_with(b"\x89PNG") && png.len() > 10_000, "{shot}");
    }

    // The same run in speedscope's format: live and allocated profiles.
    let speedscope = dir.join("phases.speedscope.json");
    memprof_ok(&[
        "report",
        saved.to_str().unwrap(),
        "--format",
        "speedscope",
        "-o",
        speedscope.to_str().unwrap(),
    ]);
    let file: Value = serde_json::from_str(&std::fs::read_to_string(&speedscope).unwrap()).unwrap();
    assert_eq!(
        file["$schema"],
        "https://www.speedscope.app/file-format-schema.json"
    );
    let profiles = file["profiles"].as_array().unwrap();
    assert_eq!(profiles.len(), 2);
    assert_eq!(profiles[0]["endValue"], 20u64 << 20);
    assert_eq!(profiles[1]["endValue"], 0, "all freed by the end");
    let names: Vec<&str> = file["shared"]["frames"]
        .as_array()
        .unwrap()
        .iter()
        .map(|f| f["name"].as_str().unwrap())
        .collect();
    let sample = profiles[0]["samples"][0].as_array().unwrap();
    let innermost = sample.last().unwrap().as_u64().unwrap() as usize;
    assert_eq!(names[innermost], "grow");
}

/// The benchmark's 65,538 stacks, traced straight to a page: it opens
/// and draws (how fast is `cargo xtask bench`'s to say).
#[test]
fn a_page_of_65538_stacks_opens_and_draws() {
    let _serial = serial();
    let dir = workspace_root().join("target/html");
    std::fs::create_dir_all(&dir).unwrap();
    let page = dir.join("many-stacks.html");
    let program = many_stacks();
    memprof_ok(&[
        "trace",
        "--format",
        "html",
        "-o",
        page.to_str().unwrap(),
        "--",
        program.to_str().unwrap(),
        "100000",
    ]);
    let seen = drive(&page, &dir.join("many-stacks"), "right");
    assert!(seen["loaded"]["drawn"].as_u64().unwrap() > 100, "{seen}");
    assert_eq!(seen["zoomed"]["focus"], "right");
    assert!(seen["loaded"]["summary"]
        .as_str()
        .unwrap()
        .contains("100,001 allocations"));
}
