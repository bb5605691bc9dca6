//! Saved JSON reports, as `memprof report` and `memprof diff` read them:
//! real reports with values replaced, removed or duplicated.
use std::fmt::Debug;

use clap::Parser as _;
use memprof::{
    cli::{Cli, Command as CliCommand},
    report::{
        diff, flamegraph, folded, json, markdown,
        model::Report,
        options::{JsonVersion, ReportOptions},
        pprof, saved, text, tsv,
    },
};
use proptest::{
    collection::vec,
    prelude::*,
    test_runner::{TestCaseError, TestCaseResult},
};
use serde_json::{json, Value};

use crate::{harness::*, mutate::*};

pub(crate) fn frame(
    address: u64,
    function: Option<&str>,
    file: Option<&str>,
    module: &str,
) -> Value {
    json!({
        "address": format!("{address:#x}"),
        "function": function,
        "file": file,
        "line": file.map(|_| 42),
        "module": module,
        "inlined": false,
    })
}

pub(crate) fn stack(allocator: &str, bytes: u64, count: u64, live: bool) -> Value {
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

pub(crate) fn process(pid: u32, live: bool) -> Value {
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

pub(crate) fn report(mode: &str, sample_bytes: Option<u64>, group_by: &str) -> Value {
    let live = mode == "live";
    let mut report = json!({
        "version": memprof::report::model::REPORT_VERSION,
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
pub(crate) fn report_seeds() -> Vec<Seed> {
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
            bytes: json::render(&report, JsonVersion::V1).unwrap().into_bytes(),
            hot: Vec::new(),
        }
    })
    .collect()
}

/// A place in a JSON document, as a path of keys and indexes.
#[derive(Clone, Debug)]
pub(crate) enum Step {
    Key(String),
    Index(usize),
}

pub(crate) fn json_paths(value: &Value, prefix: &mut Vec<Step>, out: &mut Vec<Vec<Step>>) {
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

pub(crate) fn json_at<'a>(value: &'a mut Value, path: &[Step]) -> Option<&'a mut Value> {
    path.iter().try_fold(value, |value, step| match step {
        Step::Key(key) => value.get_mut(key.as_str()),
        Step::Index(index) => value.get_mut(*index),
    })
}

/// Values that a report should not hold, or holds at its limits.
#[derive(Clone, Debug)]
pub(crate) enum Odd {
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
    pub(crate) fn value(&self) -> Value {
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

pub(crate) fn odd() -> impl Strategy<Value = Odd> {
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
pub(crate) struct Node {
    shallow: bool,
    index: usize,
}

#[derive(Clone, Debug)]
pub(crate) enum Edit {
    Replace { node: Node, with: Odd },
    Remove { node: Node },
    Duplicate { node: Node, times: u8 },
}

pub(crate) fn node() -> impl Strategy<Value = Node> {
    (prop::bool::weighted(0.3), any::<usize>()).prop_map(|(shallow, index)| Node { shallow, index })
}

pub(crate) fn edit() -> impl Strategy<Value = Edit> {
    prop_oneof![
        4 => (node(), odd()).prop_map(|(node, with)| Edit::Replace { node, with }),
        2 => node().prop_map(|node| Edit::Remove { node }),
        1 => (node(), 1u8..40).prop_map(|(node, times)| Edit::Duplicate { node, times }),
    ]
}

pub(crate) fn apply_edit(document: &mut Value, edit: &Edit) {
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
pub(crate) struct ReportInput {
    seed: usize,
    edits: Vec<Edit>,
    pretty: bool,
    /// Applied to the text after the edits.
    mutations: Vec<Mutation>,
}

pub(crate) fn report_input(seeds: usize) -> impl Strategy<Value = ReportInput> {
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
    pub(crate) fn text(&self, seeds: &[Seed]) -> String {
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

pub(crate) fn report_options(args: &[&str]) -> ReportOptions {
    let mut argv = vec!["memprof", "report", "saved.json"];
    argv.extend_from_slice(args);
    match Cli::try_parse_from(argv).unwrap().command {
        CliCommand::Report(args) => args.report,
        _ => unreachable!(),
    }
}

/// What `memprof report` and `memprof diff` do with a report read back:
/// every format, cut again, and compared with a real report.
pub(crate) fn check_report(text: &str, real: &Report, cuts: &[ReportOptions]) -> TestCaseResult {
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
        // Both layouts load back, as the same report.
        let mut loaded = Vec::new();
        for version in [JsonVersion::V1, JsonVersion::V2] {
            let saved_again =
                json::render(&cut, version).map_err(|e| TestCaseError::fail(e.to_string()))?;
            let again = one_line("report --format json", saved::parse(&saved_again, "again"))?
                .ok_or_else(|| TestCaseError::fail("a report memprof wrote does not load"))?;
            loaded.push(again);
        }
        if loaded[0] != loaded[1] {
            return Err(TestCaseError::fail(
                "JSON versions 1 and 2 load differently",
            ));
        }
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

pub(crate) fn fuzz_reports(budget: Budget) {
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
pub(crate) fn smoke_report_json() {
    fuzz_reports(Budget::Cases(64));
}

#[test]
#[ignore = "runs for MEMPROF_FUZZ_SECS: cargo xtask fuzz"]
pub(crate) fn fuzz_report_json() {
    fuzz_reports(fuzz_time());
}
