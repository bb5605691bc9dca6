//! Many distinct stacks: what a stack memprof has not seen costs a call,
//! and what the report and the daemon's memory grow to.
use std::{path::Path, process::Command};

use anyhow::{Context as _, Result};

use super::numbers::field;
use crate::{process::run, workspace::bench_dir};

/// Programs making 10,000 and 100,000 distinct stacks, one call each: what
/// a new stack costs a call, the report's time and the daemon's RSS; then
/// saved profiles of 1,000 to 100,000 stacks, everything kept.
pub fn distinct_stacks(memprof: &Path, many_stacks: &Path) -> Result<()> {
    for (stacks, table, top) in [
        (10_000u32, "16384", "1000000"),
        (100_000, "131072", "1000000"),
        (100_000, "131072", "10"),
    ] {
        let output = run(Command::new(memprof)
            .env("MEMPROF_TIMINGS", "1")
            .args(["trace", "--top", top, "-o", "/dev/null"])
            .args(["--max-stacks", "262144", "--stack-map-size", table])
            .arg("--")
            .arg(many_stacks)
            .arg(stacks.to_string()))?;
        let stderr = String::from_utf8_lossy(&output.stderr);
        let report_ms = field(&stderr, "report_ms").context("no report timing")?;
        let reported = field(&stderr, "stacks").context("no stack count")?;
        let rss_kb = field(&stderr, "max_rss_kb").context("no max_rss_kb")?;
        // Each call the first of its stack: a new stack and site entry.
        let ns_per_call = field(&String::from_utf8_lossy(&output.stdout), "ns_per_call")
            .context("no ns_per_call")?;
        println!(
            "{stacks} distinct stacks ({reported:.0} reported), --top {top}: {:.1} us per call (each a new stack); report (read maps, symbolize, render text) {report_ms:.0} ms; daemon peak RSS {:.0} MiB.",
            ns_per_call / 1000.0,
            rss_kb / 1024.0
        );
    }
    saved_profiles(memprof, many_stacks)?;
    html_page(memprof, many_stacks)
}

/// `trace --format html` of 100,000 calls (65,538 stacks), opened in
/// Debian's chromium by tests/browser/page.mjs: the time from loading the
/// file to the page drawn.
fn html_page(memprof: &Path, many_stacks: &Path) -> Result<()> {
    let dir = bench_dir()?;
    let page = dir.join("saved-100000.html");
    run(Command::new(memprof)
        .args(["trace", "--format", "html", "-o"])
        .arg(&page)
        .arg("--")
        .arg(many_stacks)
        .arg("100000"))?;
    let size = std::fs::metadata(&page)?.len();
    let output = run(Command::new("node")
        .arg(crate::workspace::root().join("tests/browser/page.mjs"))
        .arg(&page)
        .arg(&dir)
        .arg("right"))?;
    let seen: serde_json::Value = serde_json::from_slice(&output.stdout)?;
    let load_ms = seen["load_ms"].as_f64().context("no load_ms")?;
    println!(
        "html page, 65,538 stacks: {:.1} MiB, opened and drawn in chromium in {load_ms:.0} ms.",
        size as f64 / (1024.0 * 1024.0)
    );
    let _ = std::fs::remove_file(&page);
    Ok(())
}

/// `trace --format json|pprof -o FILE` with no --top/--depth: every stack
/// and frame saved, in JSON version 2 (and zstd-compressed), version 1
/// and pprof. The report's time (maps read, symbolized, written),
/// memprof's peak RSS and the file's size, at 1,000, 10,000 and 100,000
/// calls (1,000, 10,000 and 65,538 stacks); for JSON, `memprof report`'s
/// time to text from the file.
fn saved_profiles(memprof: &Path, many_stacks: &Path) -> Result<()> {
    let dir = bench_dir()?;
    let layouts: [(&str, &str, &[&str]); 4] = [
        ("json", "json", &[]),
        ("json", "json.zst", &[]),
        ("json", "v1.json", &["--json-version", "1"]),
        ("pprof", "pb.gz", &[]),
    ];
    for (format, extension, extra) in layouts {
        for stacks in [1_000u32, 10_000, 100_000] {
            let file = dir.join(format!("saved-{stacks}.{extension}"));
            // A file replaced is deleted when renamed over: its pages'
            // write-back would be timed with the next.
            let _ = std::fs::remove_file(&file);
            let output = run(Command::new(memprof)
                .env("MEMPROF_TIMINGS", "1")
                .args(["trace", "--format", format])
                .args(extra)
                .arg("-o")
                .arg(&file)
                .args(["--max-stacks", "262144", "--stack-map-size", "131072"])
                .arg("--")
                .arg(many_stacks)
                .arg(stacks.to_string()))?;
            let stderr = String::from_utf8_lossy(&output.stderr);
            let report_ms = field(&stderr, "report_ms").context("no report timing")?;
            let rss_kb = field(&stderr, "max_rss_kb").context("no max_rss_kb")?;
            let size = std::fs::metadata(&file)?.len();
            let read_back = match format {
                "json" => {
                    let started = std::time::Instant::now();
                    run(Command::new(memprof).arg("report").arg(&file).args([
                        "-o",
                        "/dev/null",
                        "--max-report-size",
                        "8G",
                    ]))?;
                    format!(
                        "; `memprof report` to text {:.0} ms",
                        started.elapsed().as_secs_f64() * 1000.0
                    )
                }
                _ => String::new(),
            };
            println!(
                "saved {format} ({extension}), {stacks} calls, everything kept: report {report_ms:.0} ms; daemon peak RSS {:.0} MiB; file {:.1} MiB{read_back}.",
                rss_kb / 1024.0,
                size as f64 / (1024.0 * 1024.0)
            );
            let _ = std::fs::remove_file(&file);
        }
    }
    Ok(())
}
