//! `--sample-bytes`: Poisson sampling by bytes gives unbiased estimates.
//!
//! Sample size: with a 4 KiB mean interval the sites below get 12,000 to
//! 60,000 samples each, so an estimate's standard error is under 1%; the
//! ±5% bound is more than 5.5 standard errors away (odds of a spurious
//! failure below one in ten million per site). The random numbers are the kernel's
//! (bpf_get_prandom_u32), which cannot be seeded: the margin, not a seed,
//! is what keeps the test from being flaky.
use tests::*;

fn within_5_percent(estimate: u64, exact: u64, what: &str) {
    let error = estimate as f64 / exact as f64 - 1.0;
    assert!(
        error.abs() <= 0.05,
        "{what}: estimated {estimate}, exact {exact} ({:+.2}%)",
        error * 100.0
    );
}

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
