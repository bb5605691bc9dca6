//! Fuzzing the readers of input memprof does not control (issue 11): saved
//! JSON reports (`memprof report`, `memprof diff`), and the ELF and DWARF
//! files of profiled processes, as memprof's own readers take them (the
//! program's loader, the C library's allocator sites and probe offsets,
//! the loader's `r_debug` site, code segments, build ids) and as the
//! symbolizer does (blazesym, through a file). Inputs are real ones with
//! bytes flipped, overwritten, inserted, removed or truncated (most of them
//! in the ELF headers, symbol tables, notes and DWARF sections), JSON
//! reports with values replaced, removed or duplicated, and random bytes.
//!
//! Properties: nothing panics, and every error is one line.
//!
//! `cargo test fuzz` runs a short pass of each (`smoke_*`);
//! `cargo xtask fuzz --secs N` runs the ignored ones for N seconds each
//! (MEMPROF_FUZZ_SECS) and prints how many inputs each tried.
use std::{
    cell::{Cell, RefCell},
    collections::BTreeMap,
    fmt::Debug,
    fs,
    ops::Range,
    path::{Path, PathBuf},
    process::Command,
    sync::atomic::{AtomicU64, Ordering},
    time::{Duration, Instant},
};

use clap::Parser as _;
use memprof_common::notices::{LibraryNotice, NoticeKind, PATH_MAX};
use object::{
    read::elf::{ElfFile64, FileHeader as _},
    Endianness, Object as _, ObjectSection as _, ObjectSymbol as _, SymbolKind,
};
use proptest::{
    collection::vec,
    prelude::*,
    test_runner::{Config, TestCaseError, TestCaseResult, TestRunner},
};
use serde_json::{json, Value};

use crate::{
    cli::{Cli, Command as CliCommand},
    collect::catalog::{Catalog, ProcessInfo},
    discover::allocators,
    host::{elf, guard, procfs::maps::Mapping},
    report::{
        diff, flamegraph, folded, json, markdown, model::Report, options::ReportOptions, pprof,
        saved, text, tsv,
    },
    symbolize::{elf_check, Symbolizer},
};

// ---------------------------------------------------------------------
// Byte mutations

/// Where a mutation applies: anywhere in the input, or in one of its
/// interesting ranges (ELF headers, symbol tables, notes, DWARF).
#[derive(Clone, Copy, Debug)]
struct Spot {
    hot: bool,
    at: u64,
}

#[derive(Clone, Debug)]
enum Mutation {
    Flip {
        at: Spot,
        bit: u8,
    },
    Byte {
        at: Spot,
        value: u8,
    },
    /// A little-endian word of `width` bytes: a boundary value, usually.
    Word {
        at: Spot,
        value: u64,
        width: u8,
    },
    Insert {
        at: Spot,
        bytes: Vec<u8>,
    },
    Remove {
        at: Spot,
        len: u16,
    },
    Truncate {
        at: Spot,
    },
    /// Copies `len` bytes from one place over another.
    Copy {
        from: Spot,
        to: Spot,
        len: u16,
    },
}

fn place(spot: Spot, len: usize, hot: &[Range<usize>]) -> usize {
    if len == 0 {
        return 0;
    }
    if spot.hot && !hot.is_empty() {
        let range = &hot[(spot.at % hot.len() as u64) as usize];
        let within = (spot.at / hot.len() as u64) % range.len().max(1) as u64;
        return (range.start + within as usize).min(len - 1);
    }
    (spot.at % len as u64) as usize
}

fn mutate(bytes: &mut Vec<u8>, mutations: &[Mutation], hot: &[Range<usize>]) {
    for mutation in mutations {
        let len = bytes.len();
        match mutation {
            Mutation::Flip { at, bit } => {
                if len > 0 {
                    bytes[place(*at, len, hot)] ^= 1 << (bit % 8);
                }
            }
            Mutation::Byte { at, value } => {
                if len > 0 {
                    bytes[place(*at, len, hot)] = *value;
                }
            }
            Mutation::Word { at, value, width } => {
                let start = place(*at, len, hot);
                for (i, byte) in value.to_le_bytes().iter().take(*width as usize).enumerate() {
                    if let Some(slot) = bytes.get_mut(start + i) {
                        *slot = *byte;
                    }
                }
            }
            Mutation::Insert { at, bytes: new } => {
                let start = place(*at, len, hot);
                bytes.splice(start..start, new.iter().copied());
            }
            Mutation::Remove { at, len: count } => {
                let start = place(*at, len, hot);
                let end = (start + *count as usize).min(len);
                bytes.drain(start..end);
            }
            Mutation::Truncate { at } => bytes.truncate(place(*at, len, hot)),
            Mutation::Copy {
                from,
                to,
                len: count,
            } => {
                let (from, to) = (place(*from, len, hot), place(*to, len, hot));
                let count = (*count as usize).min(len - from.max(to));
                bytes.copy_within(from..from + count, to);
            }
        }
    }
}

fn spot() -> impl Strategy<Value = Spot> {
    (any::<bool>(), any::<u64>()).prop_map(|(hot, at)| Spot { hot, at })
}

/// Values that sit on boundaries: sizes, counts, offsets and flags.
fn boundary() -> impl Strategy<Value = u64> {
    prop_oneof![
        Just(0u64),
        Just(1),
        Just(2),
        Just(0x7f),
        Just(0x80),
        Just(0xff),
        Just(0x100),
        Just(0xfff),
        Just(0x1000),
        Just(0x7fff),
        Just(0xffff),
        Just(0x7fff_ffff),
        Just(0x8000_0000),
        Just(0xffff_fffe),
        Just(0xffff_ffff),
        Just(i64::MAX as u64),
        Just(i64::MIN as u64),
        Just(u64::MAX - 1),
        Just(u64::MAX),
        0u64..0x10000,
        any::<u64>(),
    ]
}

fn mutation() -> impl Strategy<Value = Mutation> {
    prop_oneof![
        4 => (spot(), 0u8..8).prop_map(|(at, bit)| Mutation::Flip { at, bit }),
        3 => (spot(), any::<u8>()).prop_map(|(at, value)| Mutation::Byte { at, value }),
        4 => (spot(), boundary(), prop_oneof![Just(1u8), Just(2), Just(4), Just(8)])
            .prop_map(|(at, value, width)| Mutation::Word { at, value, width }),
        1 => (spot(), vec(any::<u8>(), 1..32))
            .prop_map(|(at, bytes)| Mutation::Insert { at, bytes }),
        1 => (spot(), 1u16..512).prop_map(|(at, len)| Mutation::Remove { at, len }),
        1 => spot().prop_map(|at| Mutation::Truncate { at }),
        1 => (spot(), spot(), 1u16..128).prop_map(|(from, to, len)| Mutation::Copy { from, to, len }),
    ]
}

/// A real input, and where in it mutations are most likely to matter.
struct Seed {
    name: String,
    bytes: Vec<u8>,
    hot: Vec<Range<usize>>,
}

/// One fuzzed input: a seed mutated, or bytes out of nothing (behind an
/// ELF header's magic, for the ELF readers, half of the time).
#[derive(Clone, Debug)]
enum Input {
    Mutated {
        seed: usize,
        mutations: Vec<Mutation>,
    },
    Random {
        magic: bool,
        bytes: Vec<u8>,
    },
}

impl Input {
    fn bytes(&self, seeds: &[Seed]) -> Vec<u8> {
        match self {
            Input::Mutated { seed, mutations } => {
                let seed = &seeds[*seed];
                let mut bytes = seed.bytes.clone();
                mutate(&mut bytes, mutations, &seed.hot);
                bytes
            }
            Input::Random { magic, bytes } => {
                let mut out = Vec::new();
                if *magic {
                    // 64-bit, little-endian, current version, System V.
                    out.extend_from_slice(b"\x7fELF\x02\x01\x01\0\0\0\0\0\0\0\0\0");
                }
                out.extend_from_slice(bytes);
                out
            }
        }
    }
}

fn input(seeds: usize) -> impl Strategy<Value = Input> {
    prop_oneof![
        12 => (0..seeds, vec(mutation(), 1..6))
            .prop_map(|(seed, mutations)| Input::Mutated { seed, mutations }),
        1 => (any::<bool>(), vec(any::<u8>(), 0..1024))
            .prop_map(|(magic, bytes)| Input::Random { magic, bytes }),
    ]
}

// ---------------------------------------------------------------------
// Running for a number of cases, or for a time

thread_local! {
    /// How the inputs of this thread's fuzzer fared, by outcome: to see
    /// that mutated inputs get past the first checks.
    static OUTCOMES: RefCell<BTreeMap<String, u64>> = const { RefCell::new(BTreeMap::new()) };
}

fn outcome(what: impl Into<String>) {
    OUTCOMES.with(|outcomes| *outcomes.borrow_mut().entry(what.into()).or_default() += 1);
}

enum Budget {
    Cases(u32),
    Time(Duration),
}

/// The time each ignored fuzzer runs: MEMPROF_FUZZ_SECS, 60 s by default.
fn fuzz_time() -> Budget {
    let secs = std::env::var("MEMPROF_FUZZ_SECS")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(60.0);
    Budget::Time(Duration::from_secs_f64(secs))
}

/// Runs `test` on inputs from `strategy` until the budget is spent, in
/// batches of fresh proptest runs (each seeded at random); a failing
/// input is shrunk by proptest and fails the test. Prints the count.
fn run<S>(reader: &str, budget: Budget, strategy: S, test: impl Fn(S::Value) -> TestCaseResult)
where
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
fn one_line<T>(reader: &str, result: anyhow::Result<T>) -> Result<Option<T>, TestCaseError> {
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

// ---------------------------------------------------------------------
// JSON reports

fn frame(address: u64, function: Option<&str>, file: Option<&str>, module: &str) -> Value {
    json!({
        "address": format!("{address:#x}"),
        "function": function,
        "file": file,
        "line": file.map(|_| 42),
        "module": module,
        "inlined": false,
    })
}

fn stack(allocator: &str, bytes: u64, count: u64, live: bool) -> Value {
    let mut inlined = frame(
        0x5555_0000_1234,
        Some("parse_inline"),
        Some("/src/a.c"),
        "/bin/true",
    );
    inlined["inlined"] = json!(true);
    let mut stack = json!({
        "allocator": allocator,
        "bytes": bytes,
        "count": count,
        "partial": count.is_multiple_of(2),
        "frames": [
            inlined,
            frame(0x5555_0000_1234, Some("parse"), Some("/src/a.c"), "/bin/true"),
            frame(0x5555_0000_2000, Some("main"), None, "/bin/true"),
            frame(0x7f00_0000_3000, None, None, "/opt/app/libapp.so"),
        ],
    });
    if live {
        for (key, value) in [
            ("live_bytes", json!(4096)),
            ("live_count", json!(2)),
            ("oldest_age_secs", json!(1.5)),
            ("temporary_count", json!(7)),
            ("untracked_count", json!(1)),
        ] {
            stack[key] = value;
        }
    }
    stack
}

fn process(pid: u32, live: bool) -> Value {
    let mut process = json!({
        "pid": pid,
        "command": "server",
        "exe": "/opt/app/bin/server",
        "cmdline": ["server", "--port", "80"],
        "exited": pid.is_multiple_of(2),
        "bytes": 1 << 20,
        "count": 300,
        "total_stacks": 3,
        "stacks": [
            stack("malloc", 1 << 19, 100, live),
            stack("realloc", 1 << 18, 150, live),
            stack("calloc", 1000, 0, false),
        ],
        "series": [
            {"secs": 0.5, "bytes": 1000, "count": 10},
            {"secs": 1.0, "bytes": 1 << 20, "count": 300},
        ],
    });
    if live {
        process["series"][0]["live_bytes"] = json!(500);
        process["series"][1]["live_bytes"] = json!(4096);
        for (key, value) in [
            ("live_bytes", json!(8192)),
            ("live_count", json!(4)),
            ("untracked_count", json!(1)),
            ("unknown_frees", json!(3)),
            ("peak_live_bytes", json!(1 << 16)),
            ("peak_live_count", json!(9)),
            ("peak_secs", json!(0.7)),
            ("peak_stacks", json!([stack("malloc", 1 << 19, 100, true)])),
        ] {
            process[key] = value;
        }
    }
    process
}

fn report(mode: &str, sample_bytes: Option<u64>, group_by: &str) -> Value {
    let live = mode == "live";
    let mut report = json!({
        "version": crate::report::model::REPORT_VERSION,
        "mode": mode,
        "duration_secs": 1.25,
        "exact": sample_bytes.is_none(),
        "group_by": group_by,
        "bytes": 2 << 20,
        "count": 600,
        "processes": [process(100, live), process(101, live)],
        "lost": {"map_full": 0, "stack_error": 12, "read_fault": 1},
    });
    if let Some(bytes) = sample_bytes {
        report["sample_bytes"] = json!(bytes);
    }
    if live {
        report["min_age_secs"] = json!(0.5);
        report["temp_threshold_secs"] = json!(0.001);
        report["peak_poll_secs"] = json!(0.1);
    }
    report
}

/// Reports as memprof writes them (read and written again, so that they
/// hold every field the model has now): totals and live mode, stacks and
/// callers, sampled and exact.
fn report_seeds() -> Vec<Seed> {
    [
        ("alloc", report("alloc", None, "stack")),
        ("live", report("live", None, "stack")),
        (
            "sampled callers",
            report("alloc", Some(512 * 1024), "caller"),
        ),
    ]
    .into_iter()
    .map(|(name, document)| {
        let report: Report = serde_json::from_value(document).unwrap();
        Seed {
            name: name.to_string(),
            bytes: json::render(&report).unwrap().into_bytes(),
            hot: Vec::new(),
        }
    })
    .collect()
}

/// A place in a JSON document, as a path of keys and indexes.
#[derive(Clone, Debug)]
enum Step {
    Key(String),
    Index(usize),
}

fn json_paths(value: &Value, prefix: &mut Vec<Step>, out: &mut Vec<Vec<Step>>) {
    out.push(prefix.clone());
    match value {
        Value::Object(map) => {
            for (key, child) in map {
                prefix.push(Step::Key(key.clone()));
                json_paths(child, prefix, out);
                prefix.pop();
            }
        }
        Value::Array(items) => {
            for (index, child) in items.iter().enumerate() {
                prefix.push(Step::Index(index));
                json_paths(child, prefix, out);
                prefix.pop();
            }
        }
        _ => {}
    }
}

fn json_at<'a>(value: &'a mut Value, path: &[Step]) -> Option<&'a mut Value> {
    path.iter().try_fold(value, |value, step| match step {
        Step::Key(key) => value.get_mut(key.as_str()),
        Step::Index(index) => value.get_mut(*index),
    })
}

/// Values that a report should not hold, or holds at its limits.
#[derive(Clone, Debug)]
enum Odd {
    Null,
    Bool(bool),
    Unsigned(u64),
    Negative(i64),
    Float(f64),
    Text(String),
    EmptyArray,
    EmptyObject,
    /// Arrays nested this deep.
    Deep(usize),
}

impl Odd {
    fn value(&self) -> Value {
        match self {
            Odd::Null => Value::Null,
            Odd::Bool(b) => Value::Bool(*b),
            Odd::Unsigned(n) => Value::from(*n),
            Odd::Negative(n) => Value::from(*n),
            Odd::Float(x) => Value::from(*x),
            Odd::Text(text) => Value::String(text.clone()),
            Odd::EmptyArray => Value::Array(Vec::new()),
            Odd::EmptyObject => Value::Object(Default::default()),
            Odd::Deep(depth) => (0..*depth).fold(Value::Null, |v, _| Value::Array(vec![v])),
        }
    }
}

fn odd() -> impl Strategy<Value = Odd> {
    prop_oneof![
        Just(Odd::Null),
        any::<bool>().prop_map(Odd::Bool),
        boundary().prop_map(Odd::Unsigned),
        prop_oneof![Just(-1i64), Just(i64::MIN), any::<i64>()].prop_map(Odd::Negative),
        prop_oneof![
            Just(0.0f64),
            Just(-0.0),
            Just(-1.0),
            Just(0.5),
            Just(1e300),
            Just(-1e300),
            Just(f64::MAX),
            Just(f64::MIN_POSITIVE),
            Just(5e-324),
            any::<f64>(),
        ]
        .prop_map(Odd::Float),
        prop_oneof![
            Just(String::new()),
            Just("\n".to_string()),
            Just("two\nlines".to_string()),
            Just("a\0b".to_string()),
            Just("é→𝄞".to_string()),
            Just("live".to_string()),
            Just("caller".to_string()),
            Just("stack".to_string()),
            Just("0x".to_string()),
            Just("0xffffffffffffffffff".to_string()),
            Just("/".to_string()),
            Just("x".repeat(5000)),
            ".{0,20}",
        ]
        .prop_map(Odd::Text),
        Just(Odd::EmptyArray),
        Just(Odd::EmptyObject),
        prop_oneof![Just(100usize), Just(127), Just(128), Just(129), Just(600)].prop_map(Odd::Deep),
    ]
}

/// A node of the document: one of the report's own fields (`shallow`:
/// there are few of them among hundreds of frame fields), or any.
#[derive(Clone, Copy, Debug)]
struct Node {
    shallow: bool,
    index: usize,
}

#[derive(Clone, Debug)]
enum Edit {
    Replace { node: Node, with: Odd },
    Remove { node: Node },
    Duplicate { node: Node, times: u8 },
}

fn node() -> impl Strategy<Value = Node> {
    (prop::bool::weighted(0.3), any::<usize>()).prop_map(|(shallow, index)| Node { shallow, index })
}

fn edit() -> impl Strategy<Value = Edit> {
    prop_oneof![
        4 => (node(), odd()).prop_map(|(node, with)| Edit::Replace { node, with }),
        2 => node().prop_map(|node| Edit::Remove { node }),
        1 => (node(), 1u8..40).prop_map(|(node, times)| Edit::Duplicate { node, times }),
    ]
}

fn apply_edit(document: &mut Value, edit: &Edit) {
    let mut paths = Vec::new();
    json_paths(document, &mut Vec::new(), &mut paths);
    let shallow: Vec<Vec<Step>> = paths.iter().filter(|p| p.len() == 1).cloned().collect();
    let pick = |node: Node| {
        let among = if node.shallow && !shallow.is_empty() {
            &shallow
        } else {
            &paths
        };
        among[node.index % among.len()].clone()
    };
    match edit {
        Edit::Replace { node, with } => {
            if let Some(value) = json_at(document, &pick(*node)) {
                *value = with.value();
            }
        }
        Edit::Remove { node } | Edit::Duplicate { node, .. } => {
            let path = pick(*node);
            let Some((last, parent)) = path.split_last() else {
                return;
            };
            let Some(parent) = json_at(document, parent) else {
                return;
            };
            match (parent, last, edit) {
                (Value::Object(map), Step::Key(key), Edit::Remove { .. }) => {
                    map.remove(key);
                }
                (Value::Array(items), Step::Index(index), Edit::Remove { .. }) => {
                    items.remove(*index);
                }
                (Value::Array(items), Step::Index(index), Edit::Duplicate { times, .. }) => {
                    let copy = items[*index].clone();
                    for _ in 0..*times {
                        items.insert(*index, copy.clone());
                    }
                }
                _ => {}
            }
        }
    }
}

#[derive(Clone, Debug)]
struct ReportInput {
    seed: usize,
    edits: Vec<Edit>,
    pretty: bool,
    /// Applied to the text after the edits.
    mutations: Vec<Mutation>,
}

fn report_input(seeds: usize) -> impl Strategy<Value = ReportInput> {
    (
        0..seeds,
        vec(edit(), 0..5),
        any::<bool>(),
        prop_oneof![
            3 => Just(Vec::new()),
            1 => vec(mutation(), 1..4),
        ],
    )
        .prop_map(|(seed, edits, pretty, mutations)| ReportInput {
            seed,
            edits,
            pretty,
            mutations,
        })
}

impl ReportInput {
    fn text(&self, seeds: &[Seed]) -> String {
        let seed = &seeds[self.seed];
        let mut document: Value = serde_json::from_slice(&seed.bytes).unwrap();
        for edit in &self.edits {
            apply_edit(&mut document, edit);
        }
        // serde_json writes deep documents; reading them is what is tried.
        let mut bytes = if self.pretty {
            serde_json::to_vec_pretty(&document)
        } else {
            serde_json::to_vec(&document)
        }
        .unwrap();
        mutate(&mut bytes, &self.mutations, &[]);
        // A file that is not UTF-8 stops at reading; its text is still tried.
        String::from_utf8_lossy(&bytes).into_owned()
    }
}

fn report_options(args: &[&str]) -> ReportOptions {
    let mut argv = vec!["memprof", "report", "saved.json"];
    argv.extend_from_slice(args);
    match Cli::try_parse_from(argv).unwrap().command {
        CliCommand::Report(args) => args.report,
        _ => unreachable!(),
    }
}

/// What `memprof report` and `memprof diff` do with a report read back:
/// every format, cut again, and compared with a real report.
fn check_report(text: &str, real: &Report, cuts: &[ReportOptions]) -> TestCaseResult {
    let Some(report) = one_line("report", saved::parse(text, "fuzzed.json"))? else {
        return Ok(());
    };
    for options in cuts {
        let cut = saved::recut(report.clone(), options);
        text::render(&cut);
        text::render_for(
            &cut,
            text::Terminal {
                color: true,
                width: Some(40),
            },
        );
        let saved_again = json::render(&cut).map_err(|e| TestCaseError::fail(e.to_string()))?;
        one_line("report --format json", saved::parse(&saved_again, "again"))?
            .ok_or_else(|| TestCaseError::fail("a report memprof wrote does not load"))?;
        folded::render(&cut);
        tsv::render(&cut);
        markdown::render(&cut);
        one_line("report --format flamegraph", flamegraph::render(&cut))?;
        one_line("report --format pprof", pprof::render(&cut))?;
    }
    for (base, new) in [(real, &report), (&report, real), (&report, &report)] {
        if let Some(reason) = diff::incomparable(base, new) {
            prop_assert!(!reason.contains('\n'), "diff: not one line: {reason:?}");
        }
        let changes = diff::diff(base, new, 20);
        diff::render_text(&changes);
        one_line("diff --format json", diff::render_json(&changes))?;
    }
    Ok(())
}

fn fuzz_reports(budget: Budget) {
    let seeds = report_seeds();
    let reals: Vec<Report> = seeds
        .iter()
        .map(|seed| saved::parse(std::str::from_utf8(&seed.bytes).unwrap(), &seed.name).unwrap())
        .collect();
    let cuts = [
        report_options(&[]),
        report_options(&["--group-by", "caller", "--top", "1", "--depth", "1"]),
        report_options(&["--min-bytes", "1K", "--top", "100000", "--depth", "1000"]),
    ];
    run(
        "report/diff JSON",
        budget,
        report_input(seeds.len()),
        |input| {
            let text = input.text(&seeds);
            check_report(&text, &reals[input.seed], &cuts)
        },
    );
}

#[test]
fn smoke_report_json() {
    fuzz_reports(Budget::Cases(64));
}

#[test]
#[ignore = "runs for MEMPROF_FUZZ_SECS: cargo xtask fuzz"]
fn fuzz_report_json() {
    fuzz_reports(fuzz_time());
}

// ---------------------------------------------------------------------
// ELF and DWARF files

/// The ranges of an ELF file that its readers interpret: the file header,
/// program and section headers, symbol and string tables, dynamic
/// section, notes, debug link and DWARF sections.
fn elf_hot_ranges(data: &[u8]) -> Vec<Range<usize>> {
    let mut hot: Vec<Range<usize>> = Vec::new();
    hot.push(0..64);
    if let Ok(file) = ElfFile64::<Endianness>::parse(data) {
        let endian = file.endian();
        let header = file.elf_header();
        let table = |offset: u64, count: u16, size: u16| {
            let start = offset as usize;
            start..start + usize::from(count) * usize::from(size)
        };
        hot.push(table(
            header.e_phoff(endian),
            header.e_phnum(endian),
            header.e_phentsize(endian),
        ));
        hot.push(table(
            header.e_shoff(endian),
            header.e_shnum(endian),
            header.e_shentsize(endian),
        ));
        for section in file.sections() {
            let name = section.name().unwrap_or("");
            let interesting = [
                ".dynsym",
                ".dynstr",
                ".symtab",
                ".strtab",
                ".dynamic",
                ".interp",
                ".gnu.hash",
                ".hash",
                ".gnu_debuglink",
                ".gnu_debugdata",
                ".eh_frame_hdr",
            ]
            .contains(&name)
                || name.starts_with(".note")
                || name.starts_with(".debug_")
                || name.starts_with(".zdebug_");
            if let (true, Some((offset, size))) = (interesting, section.file_range()) {
                // A huge section (.debug_info) is hot near its start:
                // unit headers, abbreviations.
                let size = size.min(64 * 1024);
                hot.push(offset as usize..(offset + size) as usize);
            }
        }
    }
    hot.into_iter()
        .map(|r| r.start.min(data.len())..r.end.min(data.len()))
        .filter(|r| !r.is_empty())
        .collect()
}

/// File offsets of up to `most` functions of an ELF file (evenly picked).
fn function_offsets(data: &[u8], most: usize) -> Vec<u64> {
    let Ok(file) = object::File::parse(data) else {
        return Vec::new();
    };
    let mut offsets: Vec<u64> = file
        .symbols()
        .chain(file.dynamic_symbols())
        .filter(|s| s.kind() == SymbolKind::Text && s.size() > 0)
        .filter_map(|s| elf::vaddr_to_file_offset(&file, s.address() + s.size() / 2))
        .collect();
    offsets.sort_unstable();
    offsets.dedup();
    let step = offsets.len().div_ceil(most).max(1);
    offsets.into_iter().step_by(step).collect()
}

/// A small program with DWARF (inlined functions, several files' lines),
/// built with gcc when it is there.
fn small_program(dir: &Path) -> Option<PathBuf> {
    let source = dir.join("small.c");
    fs::write(
        &source,
        "#include <stdlib.h>\n\
         static inline __attribute__((always_inline)) void *grow(size_t n) { return malloc(n * 2); }\n\
         struct node { struct node *next; int value; };\n\
         __attribute__((noinline)) struct node *push(struct node *head, int value) {\n\
           struct node *n = grow(sizeof *n); n->next = head; n->value = value; return n; }\n\
         int main(int argc, char **argv) { struct node *h = 0;\n\
           for (int i = 0; i < argc * 10; i++) h = push(h, i);\n\
           return h ? h->value : 0; }\n",
    )
    .ok()?;
    let program = dir.join("small");
    let built = Command::new("gcc")
        .args(["-g", "-O1", "-o"])
        .arg(&program)
        .arg(&source)
        .status()
        .ok()?;
    built.success().then_some(program)
}

/// The separate debug file of an ELF file (by build id), when installed.
fn debug_file(path: &Path) -> Option<PathBuf> {
    let id = elf::build_id(fs::read(path).ok()?.as_slice())?;
    let hex: String = id.iter().map(|b| format!("{b:02x}")).collect();
    let debug = PathBuf::from(format!(
        "/usr/lib/debug/.build-id/{}/{}.debug",
        &hex[..2],
        &hex[2..]
    ));
    debug.exists().then_some(debug)
}

fn elf_seed(path: &Path) -> Option<Seed> {
    let bytes = fs::read(path).ok()?;
    Some(Seed {
        name: path.display().to_string(),
        hot: elf_hot_ranges(&bytes),
        bytes,
    })
}

struct ElfSeeds {
    seeds: Vec<Seed>,
    /// Per seed: file offsets of some of its functions.
    functions: Vec<Vec<u64>>,
    dir: PathBuf,
}

impl Drop for ElfSeeds {
    fn drop(&mut self) {
        let _ = fs::remove_dir_all(&self.dir);
    }
}

/// Real programs and libraries, and (for the symbolizer) DWARF.
fn elf_seeds(dwarf: bool) -> ElfSeeds {
    static RUN: AtomicU64 = AtomicU64::new(0);
    let dir = std::env::temp_dir().join(format!(
        "memprof-fuzz-{}-{}",
        std::process::id(),
        RUN.fetch_add(1, Ordering::Relaxed)
    ));
    fs::create_dir_all(&dir).unwrap();
    let libc = fs::canonicalize("/usr/lib/x86_64-linux-gnu/libc.so.6").unwrap();
    let mut paths = vec![
        PathBuf::from("/bin/true"),
        libc.clone(),
        fs::canonicalize("/lib64/ld-linux-x86-64.so.2").unwrap(),
    ];
    paths.extend(small_program(&dir));
    if dwarf {
        paths.extend(debug_file(&libc));
    }
    let seeds: Vec<Seed> = paths.iter().filter_map(|p| elf_seed(p)).collect();
    let functions = seeds
        .iter()
        .map(|seed| function_offsets(&seed.bytes, 24))
        .collect();
    ElfSeeds {
        seeds,
        functions,
        dir,
    }
}

/// memprof's own ELF readers on one file's bytes.
fn check_elf(data: &[u8], offsets: bool) -> TestCaseResult {
    one_line("interpreter", elf::interpreter(data))?;
    one_line("code segments", elf::code_segments(data))?;
    elf::build_id(data);
    one_line(
        "allocator sites",
        allocators::module_sites_in(data, Path::new("libc.so.6"), offsets, &[]),
    )?;
    one_line("loader site", allocators::loader_site_in(data, "fuzzed.so"))?;
    one_line("symbolizer's check", elf_check::check(data))?;
    Ok(())
}

fn fuzz_elf_readers(budget: Budget) {
    let ElfSeeds { ref seeds, .. } = elf_seeds(false);
    let strategy = (input(seeds.len()), any::<bool>());
    run("ELF readers", budget, strategy, |(input, offsets)| {
        let data = input.bytes(seeds);
        // Branch targets of all of a C library's code take a while: with
        // probe offsets on the smaller files only.
        check_elf(&data, offsets && data.len() < 512 * 1024)
    });
}

#[test]
fn smoke_elf_readers() {
    fuzz_elf_readers(Budget::Cases(64));
}

#[test]
#[ignore = "runs for MEMPROF_FUZZ_SECS: cargo xtask fuzz"]
fn fuzz_elf() {
    fuzz_elf_readers(fuzz_time());
}

fn c_path(path: &Path) -> [u8; PATH_MAX] {
    let mut out = [0u8; PATH_MAX];
    let bytes = path.as_os_str().as_encoded_bytes();
    out[..bytes.len()].copy_from_slice(bytes);
    out
}

/// A profiled process maps the file: the notice path (its code segments)
/// and the symbolizer (blazesym: ELF, symbols, DWARF, through the file).
fn check_symbolize(
    symbolizer: &mut Symbolizer,
    path: &Path,
    len: u64,
    offsets: &[u64],
) -> TestCaseResult {
    const PID: u32 = 4_000_000;
    let mut catalog = Catalog::default();
    catalog.on_library(&LibraryNotice {
        kind: NoticeKind::Library as u32,
        tgid: PID,
        generation: 0,
        index: 1,
        held: 0,
        _reserved: 0,
        base: 0x7f00_0000_0000,
        path: c_path(path),
    });
    let from_notice = catalog.get(PID, 0).cloned().unwrap_or_default();
    one_line(
        "symbolizer's check of the file",
        elf_check::readable_by_blazesym(path, &[PathBuf::from("/usr/lib/debug")]),
    )?;
    // The whole file mapped at one place, as /proc/PID/maps could show it.
    let mapped = ProcessInfo {
        pid: PID,
        mappings: vec![Mapping {
            start: 0x10_0000,
            end: 0x10_0000 + len.max(1),
            file_offset: 0,
            path: path.display().to_string(),
            deleted: false,
        }],
        ..Default::default()
    };
    let addresses: Vec<u64> = offsets.iter().map(|o| 0x10_0000 + o + 1).collect();
    let frames = symbolizer.symbolize(Some(&mapped), &addresses);
    prop_assert_eq!(frames.len(), addresses.len());
    let named = frames
        .iter()
        .flatten()
        .filter(|f| f.function.is_some())
        .count();
    let lines = frames.iter().flatten().filter(|f| f.line.is_some()).count();
    let inlined = frames.iter().flatten().filter(|f| f.inlined).count();
    outcome(match (named, lines, inlined) {
        (0, _, _) => "no frame named",
        (_, 0, _) => "frames named, no file:line",
        (_, _, 0) => "frames named with file:line",
        _ => "frames named with file:line and inlined",
    });
    outcome(format!(
        "code segments from the notice: {}",
        from_notice.mappings.len().min(3)
    ));
    let notice_addresses: Vec<u64> = from_notice
        .mappings
        .iter()
        .flat_map(|m| {
            [
                m.start,
                m.start.wrapping_add(m.end.wrapping_sub(m.start) / 2),
            ]
        })
        .collect();
    symbolizer.symbolize(Some(&from_notice), &notice_addresses);
    Ok(())
}

fn fuzz_symbolizer(budget: Budget) {
    let seeds = elf_seeds(true);
    let counter = Cell::new(0u64);
    let symbolizer = RefCell::new(Symbolizer::new());
    let strategy = (input(seeds.seeds.len()), vec(any::<u64>(), 0..4));
    run(
        "symbolizer (blazesym ELF/DWARF)",
        budget,
        strategy,
        |(input, random)| {
            let data = input.bytes(&seeds.seeds);
            let n = counter.get();
            counter.set(n + 1);
            // blazesym keeps every file it opened: start afresh now and
            // then, so that the deleted inputs are let go.
            if n.is_multiple_of(16) {
                *symbolizer.borrow_mut() = Symbolizer::new();
            }
            let path = seeds.dir.join(format!("input-{n}.so"));
            fs::write(&path, &data).unwrap();
            let mut offsets: Vec<u64> = match &input {
                Input::Mutated { seed, .. } => seeds.functions[*seed].clone(),
                Input::Random { .. } => Vec::new(),
            };
            let len = data.len() as u64;
            offsets.extend(random.iter().map(|r| r % len.max(1)));
            let result = check_symbolize(&mut symbolizer.borrow_mut(), &path, len, &offsets);
            let _ = fs::remove_file(&path);
            result
        },
    );
    let caught = guard::caught_panics();
    if !caught.is_empty() {
        println!("panics contained so far (location: count): {caught:?}");
    }
}

#[test]
fn smoke_symbolizer() {
    fuzz_symbolizer(Budget::Cases(32));
}

#[test]
#[ignore = "runs for MEMPROF_FUZZ_SECS: cargo xtask fuzz"]
fn fuzz_symbolize() {
    fuzz_symbolizer(fuzz_time());
}

// ---------------------------------------------------------------------
// One malformed file among a process's libraries

/// Symbolizing a malformed library leaves its frames unknown, and the
/// frames of the process's other files (and of other processes) as they
/// are.
#[test]
fn a_malformed_library_does_not_stop_the_others() {
    let seeds = elf_seeds(false);
    let small = seeds
        .seeds
        .iter()
        .position(|s| s.name.ends_with("/small"))
        .expect("gcc builds the small program");
    let good = PathBuf::from(&seeds.seeds[small].name);
    let offset = seeds.functions[small][0];
    let mut broken_bytes = seeds.seeds[small].bytes.clone();
    // Section headers past the end of the file, a truncated symbol table.
    broken_bytes[0x28..0x30].copy_from_slice(&u64::MAX.to_le_bytes());
    broken_bytes.truncate(broken_bytes.len() * 2 / 3);
    let broken = seeds.dir.join("broken.so");
    fs::write(&broken, &broken_bytes).unwrap();
    let process = |pid: u32, path: &Path| ProcessInfo {
        pid,
        mappings: vec![Mapping {
            start: 0x10_0000,
            end: 0x20_0000,
            file_offset: 0,
            path: path.display().to_string(),
            deleted: false,
        }],
        ..Default::default()
    };
    let mut symbolizer = Symbolizer::new();
    let address = 0x10_0000 + offset + 1;
    let frames = symbolizer.symbolize(Some(&process(1, &broken)), &[address]);
    assert_eq!(frames[0].len(), 1);
    assert_eq!(frames[0][0].function, None, "{:?}", frames[0]);
    assert_eq!(frames[0][0].module.as_deref(), broken.to_str());
    let frames = symbolizer.symbolize(Some(&process(2, &good)), &[address]);
    assert!(
        frames[0].iter().any(|f| f.function.is_some()),
        "{:?}",
        frames[0]
    );

    // The notice path: no code segments from the broken file, and the
    // good one's as ever.
    let mut catalog = Catalog::default();
    for (index, path) in [(1, &broken), (2, &good)] {
        catalog.on_library(&LibraryNotice {
            kind: NoticeKind::Library as u32,
            tgid: 3,
            generation: 0,
            index,
            held: 0,
            _reserved: 0,
            base: 0x5000_0000,
            path: c_path(path),
        });
    }
    let mapped: BTreeMap<&str, usize> =
        catalog
            .get(3, 0)
            .unwrap()
            .mappings
            .iter()
            .fold(BTreeMap::new(), |mut counts, m| {
                *counts.entry(m.path.as_str()).or_default() += 1;
                counts
            });
    assert_eq!(mapped.get(good.to_str().unwrap()), Some(&1), "{mapped:?}");
    assert_eq!(mapped.get(broken.to_str().unwrap()), None, "{mapped:?}");
}

#[test]
fn diff_deltas_hold_any_saved_numbers() {
    let seeds = report_seeds();
    let mut big = saved::parse(std::str::from_utf8(&seeds[0].bytes).unwrap(), "a").unwrap();
    let small = big.clone();
    big.bytes = u64::MAX;
    for stack in &mut big.processes[0].stacks {
        stack.bytes = u64::MAX;
    }
    let grew = diff::diff(&small, &big, 10);
    assert_eq!(grew.change.bytes_delta, i64::MAX);
    let shrank = diff::diff(&big, &small, 10);
    assert_eq!(shrank.change.bytes_delta, i64::MIN);
}
