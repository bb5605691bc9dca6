//! Running each reader for a number of cases (the smoke tests) or for a
//! time (`cargo xtask fuzz`), and the property every reader must hold:
//! nothing panics, every error is one line.
use std::{
    cell::{Cell, RefCell},
    collections::BTreeMap,
    fmt::Debug,
    time::{Duration, Instant},
};

use memprof::host::guard;
use proptest::{
    prelude::*,
    test_runner::{Config, TestCaseError, TestCaseResult, TestRunner},
};

thread_local! {
    /// How the inputs of this thread's fuzzer fared, by outcome: to see
    /// that mutated inputs get past the first checks.
    static OUTCOMES: RefCell<BTreeMap<String, u64>> = const { RefCell::new(BTreeMap::new()) };
}

pub(crate) fn outcome(what: impl Into<String>) {
    OUTCOMES.with(|outcomes| *outcomes.borrow_mut().entry(what.into()).or_default() += 1);
}

pub(crate) enum Budget {
    Cases(u32),
    Time(Duration),
}

/// The time each ignored fuzzer runs: MEMPROF_FUZZ_SECS, 60 s by default.
pub(crate) fn fuzz_time() -> Budget {
    let secs = std::env::var("MEMPROF_FUZZ_SECS")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(60.0);
    Budget::Time(Duration::from_secs_f64(secs))
}

/// Runs `test` on inputs from `strategy` until the budget is spent, in
/// batches of fresh proptest runs (each seeded at random); a failing
/// input is shrunk by proptest and fails the test. Prints the count.
pub(crate) fn run<S>(
    reader: &str,
    budget: Budget,
    strategy: S,
    test: impl Fn(S::Value) -> TestCaseResult,
) where
    S: Strategy,
    S::Value: Debug,
{
    let started = Instant::now();
    let tried = Cell::new(0u64);
    let slowest = Cell::new(Duration::ZERO);
    let caught_before: u64 = guard::caught_panics().values().sum();
    let batch = match budget {
        Budget::Cases(cases) => cases,
        Budget::Time(_) => 32,
    };
    loop {
        let mut runner = TestRunner::new(Config {
            cases: batch,
            failure_persistence: None,
            max_shrink_iters: 4096,
            ..Config::default()
        });
        let outcome = runner.run(&strategy, |value| {
            let start = Instant::now();
            let result = test(value);
            tried.set(tried.get() + 1);
            slowest.set(slowest.get().max(start.elapsed()));
            result
        });
        if let Err(failure) = outcome {
            panic!("fuzz {reader}: {failure}");
        }
        match budget {
            Budget::Cases(_) => break,
            Budget::Time(time) if started.elapsed() >= time => break,
            Budget::Time(_) => {}
        }
    }
    let caught: u64 = guard::caught_panics().values().sum::<u64>() - caught_before;
    let outcomes = OUTCOMES.with(|outcomes| std::mem::take(&mut *outcomes.borrow_mut()));
    println!(
        "fuzz {reader}: {} inputs in {:.1} s (slowest {:.0} ms), no panic, every error one line; \
         {caught} panics inside third-party parsers contained; outcomes: {outcomes:?}",
        tried.get(),
        started.elapsed().as_secs_f64(),
        slowest.get().as_secs_f64() * 1e3,
    );
}

/// The error, all of its causes, on one line (as main prints it).
pub(crate) fn one_line<T>(
    reader: &str,
    result: anyhow::Result<T>,
) -> Result<Option<T>, TestCaseError> {
    outcome(format!(
        "{reader} {}",
        if result.is_ok() { "ok" } else { "error" }
    ));
    match result {
        Ok(value) => Ok(Some(value)),
        Err(err) => {
            let message = format!("{err:#}");
            prop_assert!(
                !message.contains('\n') && !message.is_empty(),
                "{reader}: error is not one line: {message:?}"
            );
            Ok(None)
        }
    }
}
