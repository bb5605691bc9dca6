//! `--usdt`: a program that samples its own allocations and announces
//! them through the otel_memory USDT probes (tests/fixtures/usdt_sampler.c:
//! 100 samples of weight 10,000 B among 1,000 allocations of 1,000 B, 20
//! of them kept) is profiled through those probes, not malloc's: its
//! estimates are exactly the sums of its weights. Its call site: the
//! sampler (sampled_malloc, called from site_sampled), where its probe is
//! and malloc is called.
use tests::*;

fn sampler() -> std::path::PathBuf {
    fixture("usdt_sampler", "fp", frame_pointers())
}

#[test]
fn the_programs_own_samples_give_its_figures_instead_of_mallocs() {
    let _serial = serial();
    let program = sampler();
    let (output, report) = trace_json(&["--usdt", "--live"], &[program.to_str().unwrap()]);
    assert!(output.status.success(), "{output:?}");
    // Estimates (the program's), marked as such.
    assert_eq!(report["exact"], false);
    let (bytes, count, allocators) = site(&report, "sampled_malloc");
    assert_eq!((bytes, count), (1_000_000, 1_000));
    assert_eq!(allocators, ["otel_memory"]);
    // 20 sampled blocks kept, each standing for 10: 200 blocks, 200,000 B.
    let (live_bytes, live_count, _, untracked) = live_site(&report, "sampled_malloc");
    assert_eq!((live_bytes, live_count, untracked), (200_000, 200, 0));
    // The allocators' entry points were not probed: nothing else counted.
    let probed: Vec<&str> = report["probes"]
        .as_array()
        .unwrap()
        .iter()
        .map(|p| p["function"].as_str().unwrap())
        .collect();
    assert!(probed.contains(&"otel_memory:alloc"), "{probed:?}");
    assert!(probed.contains(&"otel_memory:free"), "{probed:?}");
    assert!(!probed.contains(&"malloc"), "{probed:?}");
    assert_eq!(report["bytes"], 1_000_000);
    assert!(report["lost"].as_object().unwrap().values().all(|n| n == 0));
    let text = String::from_utf8_lossy(
        &memprof(&["trace", "--usdt", "--", program.to_str().unwrap()]).stdout,
    )
    .into_owned();
    assert!(
        text.contains("estimates from the programs' own samples (USDT)"),
        "{text}"
    );
    assert_nothing_loaded();
}

#[test]
fn without_usdt_malloc_counts_every_call_and_the_probes_stay_silent() {
    let _serial = serial();
    let program = sampler();
    let (output, report) = trace_json(&[], &[program.to_str().unwrap()]);
    assert!(output.status.success(), "{output:?}");
    assert_eq!(report["exact"], true);
    // Exact: the 1,000 calls of 1,000 B, by malloc; no semaphore raised,
    // so the program sampled nothing.
    let (bytes, count, allocators) = site(&report, "sampled_malloc");
    assert_eq!((bytes, count), (1_000_000, 1_000));
    assert_eq!(allocators, ["malloc"]);
    assert_nothing_loaded();
}
