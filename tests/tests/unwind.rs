//! `--unwind dwarf`: stacks walked in the kernel with the unwind tables
//! (.eh_frame) of each mapped file. The same program built with and
//! without frame pointers must give the same stacks, frame for frame, with
//! exact counts, through glibc (strdup, qsort's callback) and threads.
use std::io::Write as _;

use serde_json::Value;
use tests::*;

/// A stack as compared: allocator, calls, bytes, partial, function names.
type Shape = (String, u64, u64, bool, Vec<String>);

/// Every stack of the report's processes, sorted.
fn shapes(report: &Value) -> Vec<Shape> {
    let mut shapes: Vec<Shape> = report["processes"]
        .as_array()
        .unwrap()
        .iter()
        .flat_map(|p| p["stacks"].as_array().unwrap().clone())
        .map(|s| {
            (
                s["allocator"].as_str().unwrap().to_string(),
                s["count"].as_u64().unwrap(),
                s["bytes"].as_u64().unwrap(),
                s["partial"].as_bool().unwrap(),
                frame_functions(&s),
            )
        })
        .collect();
    shapes.sort();
    shapes
}

fn names(list: &[&str]) -> Vec<String> {
    list.iter().map(|s| s.to_string()).collect()
}

/// The stack whose frame 0 is `leaf`, summed if several.
fn leaf<'a>(shapes: &'a [Shape], leaf: &str) -> Vec<&'a Shape> {
    shapes.iter().filter(|s| s.4[0] == leaf).collect()
}

fn assert_no_unwind_losses(report: &Value) {
    for cause in [
        "unwind_no_info",
        "unwind_unsupported",
        "unwind_read_fault",
        "unwind_too_deep",
        "unwind_table_full",
        "stack_error",
    ] {
        assert_eq!(report["lost"][cause], 0, "{cause}: {}", report["lost"]);
    }
}

/// Every frame lies in a mapped file (no garbage from a wrong walk).
fn assert_frames_in_modules(report: &Value) {
    for process in report["processes"].as_array().unwrap() {
        for stack in process["stacks"].as_array().unwrap() {
            for frame in stack["frames"].as_array().unwrap() {
                assert!(
                    frame["module"].is_string(),
                    "frame outside a module: {frame}"
                );
            }
        }
    }
}

const START: [&str; 4] = [
    "main",
    "__libc_start_call_main",
    "__libc_start_main_impl",
    "_start",
];

#[test]
fn dwarf_stacks_are_the_same_without_frame_pointers() {
    let _serial = serial();
    let mut reports = Vec::new();
    for (variant, flags) in [("fp", frame_pointers()), ("nofp", no_frame_pointers())] {
        let program = fixture("unwind", variant, flags);
        let (output, report) = trace_json(&["--unwind", "dwarf"], &[program.to_str().unwrap()]);
        assert!(
            output.status.success(),
            "{}",
            String::from_utf8_lossy(&output.stderr)
        );
        assert_no_unwind_losses(&report);
        assert_frames_in_modules(&report);
        reports.push(shapes(&report));
    }
    assert_eq!(reports[0], reports[1], "with and without frame pointers");
    let shapes = &reports[1];

    // A chain 14 frames deep to main, and on to _start.
    let chain = leaf(shapes, "chain_leaf");
    assert_eq!(chain.len(), 1, "{chain:?}");
    let mut expected = names(&["chain_leaf"]);
    expected.extend((1..=12).rev().map(|n| format!("c{n}")));
    expected.extend(names(&START));
    assert_eq!(
        (chain[0].1, chain[0].2, chain[0].4.clone()),
        (5, 120, expected)
    );

    // Recursion: 21 frames of `recurse`.
    let rec = leaf(shapes, "rec_leaf");
    assert_eq!(rec.len(), 1, "{rec:?}");
    let mut expected = names(&["rec_leaf"]);
    expected.extend(std::iter::repeat_n("recurse".to_string(), 21));
    expected.extend(names(&START));
    assert_eq!((rec[0].1, rec[0].2, rec[0].4.clone()), (3, 96, expected));

    // strdup: glibc's own frame, then its caller.
    let dup: Vec<&Shape> = shapes
        .iter()
        .filter(|s| s.4.contains(&"dup_site".to_string()))
        .collect();
    assert_eq!(dup.len(), 1, "{dup:?}");
    let mut expected = names(&["__GI___strdup", "dup_site"]);
    expected.extend(names(&START));
    assert_eq!((dup[0].1, dup[0].2, dup[0].4.clone()), (4, 28, expected));

    // qsort's callback: through glibc's merge sort, back to sorter and main.
    let cmp = leaf(shapes, "cmp_leaf");
    assert_eq!(cmp.iter().map(|s| s.1).sum::<u64>(), 3, "{cmp:?}");
    for stack in &cmp {
        let frames = &stack.4;
        assert_eq!(frames[..2], names(&["cmp_leaf", "compare"])[..]);
        assert!(frames.iter().any(|f| f == "msort_with_tmp"), "{frames:?}");
        assert_eq!(
            frames[frames.len() - 6..],
            {
                let mut tail = names(&["__GI___qsort_r", "sorter"]);
                tail.extend(names(&START));
                tail
            }[..]
        );
        assert!(!stack.3, "partial: {stack:?}");
    }

    // A second thread: down to clone3, its outermost frame.
    let thread = leaf(shapes, "w2");
    assert_eq!(thread.len(), 1, "{thread:?}");
    assert_eq!(
        (thread[0].1, thread[0].2, thread[0].4.clone()),
        (
            6,
            240,
            names(&["w2", "w1", "worker", "start_thread", "clone3"])
        )
    );
    assert_nothing_loaded();
}

#[test]
fn dwarf_stacks_with_sampling_and_live() {
    let _serial = serial();
    let program = fixture("unwind", "nofp", no_frame_pointers());
    let mut expected = names(&["chain_leaf"]);
    expected.extend((1..=12).rev().map(|n| format!("c{n}")));
    expected.extend(names(&START));
    for extra in [&["--live"][..], &["--sample-bytes", "1"][..]] {
        let mut args = vec!["--unwind", "dwarf"];
        args.extend_from_slice(extra);
        let (output, report) = trace_json(&args, &[program.to_str().unwrap()]);
        assert!(
            output.status.success(),
            "{}",
            String::from_utf8_lossy(&output.stderr)
        );
        assert_no_unwind_losses(&report);
        let shapes = shapes(&report);
        let chain = leaf(&shapes, "chain_leaf");
        assert_eq!(chain.len(), 1, "{extra:?}: {chain:?}");
        assert_eq!(chain[0].4, expected, "{extra:?}");
        assert!(!chain[0].3, "{extra:?}: partial");
        if extra[0] == "--live" {
            assert_eq!((chain[0].1, chain[0].2), (5, 120));
        }
    }
    assert_nothing_loaded();
}

#[test]
fn dwarf_stacks_of_an_attached_process() {
    let _serial = serial();
    let mut target = spawn_waiter(&fixture("waiter", "nofp", no_frame_pointers()));
    let (memprof, _stderr) = start_attach(target.id(), &["--depth", "64", "--unwind", "dwarf"]);
    let mut stdin = target.stdin.take().unwrap();
    stdin.write_all(b"go\n").unwrap();
    drop(stdin);
    target.wait().unwrap();
    let output = memprof.wait_with_output().unwrap();
    assert!(output.status.success());
    let report = parse_report(&output);
    assert_no_unwind_losses(&report);
    assert_frames_in_modules(&report);
    let shapes = shapes(&report);
    let site = leaf(&shapes, "site_after_attach");
    assert_eq!(site.len(), 1, "{shapes:?}");
    let mut expected = names(&["site_after_attach"]);
    expected.extend(names(&START));
    assert_eq!(
        (site[0].1, site[0].2, site[0].4.clone()),
        (40, 40 * 1024, expected)
    );
    assert_nothing_loaded();
}

#[test]
fn unwind_mode_is_checked() {
    let output = memprof(&["trace", "--unwind", "sideways", "--", "true"]);
    assert_one_line_error(&output, 2, "sideways");
}
