//! Every allocator a program uses, probed where it is defined,
//! with exact figures per call site: C++'s operators, jemalloc, tcmalloc,
//! mimalloc, a static program's own malloc, and functions named with
//! --alloc-fn/--free-fn.
use std::path::PathBuf;

use serde_json::Value;
use tests::*;

/// Frees of blocks memprof never saw allocated, in all processes.
fn unknown_frees(report: &Value) -> u64 {
    report["processes"]
        .as_array()
        .unwrap()
        .iter()
        .map(|p| p["unknown_frees"].as_u64().unwrap())
        .sum()
}

/// (bytes, calls, allocator names) at `function`, from a report.
fn at(report: &Value, function: &str) -> (u64, u64, Vec<String>) {
    site(report, function)
}

#[test]
fn cxx_new_reads_as_its_operator_from_the_caller_of_new() {
    let _serial = serial();
    let program = fixture_cpp("operators", "fp", frame_pointers());
    let (_, report) = trace_json(&[], &[program.to_str().unwrap()]);
    // Frame 0 is the function that called new. libstdc++'s operators are
    // not probed themselves (a bad_alloc must pass): their malloc call is,
    // and reads as the operator. Debian's new[] jumps to new (no frame of
    // its own): it reads as new. Aligned new asks aligned_alloc for a
    // multiple of the alignment: 48 bytes aligned to 64 are 64.
    let expected = [
        ("site_new", 80, 10, "new"),
        ("site_new_array", 108, 9, "new"),
        ("site_nothrow", 32, 4, "new(nothrow)"),
        ("site_nothrow_array", 500, 5, "new[](nothrow)"),
        ("site_align", 448, 7, "new(align)"),
        ("site_align_array", 384, 3, "new(align)"),
        ("site_align_nothrow", 128, 2, "new(align, nothrow)"),
        ("site_align_nothrow_array", 384, 6, "new[](align, nothrow)"),
        ("site_malloc", 150, 3, "malloc"),
        ("site_leak", 132, 4, "new"),
    ];
    for (function, bytes, count, allocator) in expected {
        assert_eq!(
            at(&report, function),
            (bytes, count, vec![allocator.to_string()]),
            "{function}"
        );
    }
    let probes = report["probes"].as_array().unwrap();
    assert!(
        !probes.iter().any(|p| p["function"] == "_Znwm"),
        "no return probe on libstdc++'s operator new"
    );
    assert_nothing_loaded();
}

#[test]
fn cxx_live_pairs_each_new_with_its_delete() {
    let _serial = serial();
    let program = fixture_cpp("operators", "fp", frame_pointers());
    let (_, report) = trace_json(&["--live"], &[program.to_str().unwrap()]);
    assert_eq!(live_site(&report, "site_leak"), (132, 4, 0, 0));
    for (function, count) in [
        ("site_new", 10),
        ("site_new_array", 9),
        ("site_nothrow", 4),
        ("site_nothrow_array", 5),
        ("site_align", 7),
        ("site_align_array", 3),
        ("site_align_nothrow", 2),
        ("site_align_nothrow_array", 6),
        ("site_malloc", 3),
    ] {
        assert_eq!(live_site(&report, function), (0, 0, count, 0), "{function}");
    }
    // operator delete calls free with the same block: one release, not an
    // unknown free.
    assert_eq!(unknown_frees(&report), 0);
    assert_nothing_loaded();
}

/// What the fixture's common sites add up to, whatever malloc it uses.
fn assert_common_sites(report: &Value, name: &str) {
    assert_eq!(at(report, "site_malloc").0, 1100, "{name}");
    assert_eq!(at(report, "site_malloc").1, 11, "{name}");
    assert_eq!(at(report, "site_calloc").0, 600, "{name}");
    assert_eq!(at(report, "site_calloc").1, 6, "{name}");
    // malloc(10) then realloc(.., 1000), five times.
    assert_eq!(at(report, "site_realloc").0, 5050, "{name}");
    assert_eq!(at(report, "site_realloc").1, 10, "{name}");
    assert_eq!(at(report, "site_leak").0, 231, "{name}");
    assert_eq!(at(report, "site_leak").1, 3, "{name}");
}

fn linked_with(library: &str, api: Option<&str>) -> PathBuf {
    let link = format!("-l{library}");
    let mut flags = vec![
        "-fno-omit-frame-pointer",
        "-Wl,--no-as-needed",
        link.as_str(),
    ];
    flags.extend(api);
    fixture("other_allocators", library, &flags)
}

#[test]
fn jemalloc_tcmalloc_and_mimalloc_are_exact_in_totals_and_live() {
    let _serial = serial();
    let programs = [
        ("jemalloc", Some("-DWITH_JEMALLOC_API"), Some("mallocx")),
        ("tcmalloc", None, None),
        (
            "mimalloc",
            Some("-DWITH_MIMALLOC_API"),
            Some("mi_malloc_aligned"),
        ),
    ];
    for (library, api, own) in programs {
        let program = linked_with(library, api);
        let (_, report) = trace_json(&[], &[program.to_str().unwrap()]);
        assert_common_sites(&report, library);
        if let Some(own) = own {
            assert_eq!(
                at(&report, "site_own_api"),
                (800, 4, vec![own.to_string()]),
                "{library}"
            );
        }
        let probes = report["probes"].as_array().unwrap();
        assert!(
            probes
                .iter()
                .any(|p| p["function"] == "malloc"
                    && p["module"].as_str().unwrap().contains(library)),
            "{library}'s malloc probed: {probes:?}"
        );
        let (_, report) = trace_json(&["--live"], &[program.to_str().unwrap()]);
        assert_eq!(live_site(&report, "site_leak"), (231, 3, 0, 0), "{library}");
        assert_eq!(
            live_site(&report, "site_malloc"),
            (0, 0, 11, 0),
            "{library}"
        );
        if own.is_some() {
            assert_eq!(
                live_site(&report, "site_own_api"),
                (0, 0, 4, 0),
                "{library}"
            );
        }
        assert_eq!(unknown_frees(&report), 0, "{library}");
    }
    assert_nothing_loaded();
}

#[test]
fn static_programs_are_profiled_through_their_own_malloc() {
    let _serial = serial();
    let musl = fixture_musl("other_allocators", "musl-static", &["-static"]);
    let (_, report) = trace_json(&[], &[musl.to_str().unwrap()]);
    assert_common_sites(&report, "musl");
    // Stacks are whole: the kernel held the program at its exec until its
    // tables were loaded.
    let (_, _, allocators) = at(&report, "site_malloc");
    assert_eq!(allocators, ["malloc"]);
    assert!(
        processes_with(&report, "main").len() == 1,
        "main in the stacks"
    );
    let (_, report) = trace_json(&["--live"], &[musl.to_str().unwrap()]);
    assert_eq!(live_site(&report, "site_leak"), (231, 3, 0, 0));

    let glibc = fixture("allocs", "static", &["-static"]);
    let dynamic = fixture("allocs", "fp", frame_pointers());
    let (_, static_report) = trace_json(&[], &[glibc.to_str().unwrap()]);
    let (_, dynamic_report) = trace_json(&[], &[dynamic.to_str().unwrap()]);
    for function in [
        "site_malloc",
        "site_calloc",
        "site_realloc",
        "site_memalign",
    ] {
        assert_eq!(
            at(&static_report, function),
            at(&dynamic_report, function),
            "{function}: static glibc as dynamic"
        );
    }
    assert_nothing_loaded();
}

#[test]
fn functions_named_as_allocators_count_exactly() {
    let _serial = serial();
    let program = fixture("custom_alloc", "fp", frame_pointers());
    let named = [
        "--alloc-fn",
        "rt_alloc:size=1",
        "--free-fn",
        "rt_free:ptr=1",
    ];
    let (_, report) = trace_json(&named, &[program.to_str().unwrap()]);
    assert_eq!(
        at(&report, "site_rt"),
        (2000, 20, vec!["rt_alloc".to_string()])
    );
    assert_eq!(
        at(&report, "site_rt_leak"),
        (240, 6, vec!["rt_alloc".to_string()])
    );
    assert_eq!(
        at(&report, "site_malloc"),
        (128, 2, vec!["malloc".to_string()])
    );

    let mut live = vec!["--live"];
    live.extend(named);
    let (_, report) = trace_json(&live, &[program.to_str().unwrap()]);
    assert_eq!(live_site(&report, "site_rt_leak"), (240, 6, 0, 0));
    assert_eq!(live_site(&report, "site_rt"), (0, 0, 20, 0));
    assert_eq!(unknown_frees(&report), 0);
    let probes = report["probes"].as_array().unwrap();
    assert!(probes
        .iter()
        .any(|p| p["function"] == "rt_free" && p["role"] == "release"));
    assert_nothing_loaded();
}

#[test]
fn an_allocator_that_is_not_there_is_a_one_line_error() {
    let _serial = serial();
    let program = fixture("custom_alloc", "fp", frame_pointers());
    let output = memprof(&[
        "trace",
        "--alloc-fn",
        "no_such_alloc:size=1",
        "--",
        program.to_str().unwrap(),
    ]);
    assert_one_line_error(&output, 2, "no_such_alloc not found");
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(
        stderr.contains("custom_alloc-fp"),
        "names the modules searched: {stderr}"
    );
    let output = memprof(&["trace", "--alloc-fn", "rt_alloc:size=9", "--", "true"]);
    assert_one_line_error(&output, 2, "argument positions are 1 to 6");
    assert_nothing_loaded();
}

#[test]
fn verbose_lists_each_probe_and_a_program_without_allocator_is_named() {
    let _serial = serial();
    let program = fixture("allocs", "fp", frame_pointers());
    let output = memprof(&["trace", "--verbose", "--", program.to_str().unwrap()]);
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(
        stderr.lines().any(
            |l| l.starts_with("memprof: probe alloc malloc at /") && l.contains("libc.so.6+0x")
        ),
        "{stderr}"
    );
    // No malloc anywhere: a static program that only makes system calls.
    let bare = fixture("bare", "static", &["-static", "-nostdlib", "-nostartfiles"]);
    let output = memprof(&["trace", "--format", "json", "--", bare.to_str().unwrap()]);
    assert!(output.status.success());
    let report = parse_report(&output);
    let unprobed = report["unprobed"].as_array().unwrap();
    assert_eq!(unprobed.len(), 1, "{report}");
    assert!(unprobed[0]["reason"]
        .as_str()
        .unwrap()
        .contains("no allocator memprof knows"));
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(
        stderr.contains("warning") && stderr.contains("bare-static"),
        "{stderr}"
    );
    assert_nothing_loaded();
}

/// The stacks with `function` in any frame, in every process.
fn stacks_through<'a>(report: &'a Value, function: &str) -> Vec<&'a Value> {
    stacks_where(report, |stack| {
        stack["frames"]
            .as_array()
            .unwrap()
            .iter()
            .any(|f| f["function"] == function)
    })
}

/// Sum of each of `fields` over the stacks with `function` in any frame.
fn sum_through<const N: usize>(report: &Value, function: &str, fields: [&str; N]) -> [u64; N] {
    sum_fields(&stacks_through(report, function), fields)
}

/// (bytes, calls, allocators) of the stacks with `function` in any frame.
fn through(report: &Value, function: &str) -> (u64, u64, Vec<String>) {
    let [bytes, count] = sum_through(report, function, ["bytes", "count"]);
    let mut allocators: Vec<String> = stacks_through(report, function)
        .iter()
        .map(|s| s["allocator"].as_str().unwrap().to_string())
        .collect();
    allocators.sort_unstable();
    allocators.dedup();
    (bytes, count, allocators)
}

#[test]
fn rust_with_tikv_jemallocator_statically_linked() {
    let _serial = serial();
    // Built as cargo builds it by default: release, no frame pointers.
    let program = fixture_cargo("rust_jemalloc");
    let (_, report) = trace_json(&[], &[program.to_str().unwrap()]);
    assert_eq!(
        through(&report, "rust_jemalloc::site_vec"),
        (3600, 12, vec!["_rjem_malloc".to_string()])
    );
    // Aligned beyond 16: jemalloc's mallocx, with its flags.
    assert_eq!(
        through(&report, "rust_jemalloc::site_aligned"),
        (500, 5, vec!["_rjem_mallocx".to_string()])
    );
    assert_eq!(
        through(&report, "rust_jemalloc::site_leak"),
        (150, 3, vec!["_rjem_malloc".to_string()])
    );
    let (_, report) = trace_json(&["--live"], &[program.to_str().unwrap()]);
    let live = |function: &str| sum_through(&report, function, ["live_bytes", "live_count"]);
    assert_eq!(live("rust_jemalloc::site_leak"), [150, 3]);
    // Freed through _rjem_sdallocx.
    assert_eq!(live("rust_jemalloc::site_vec"), [0, 0]);
    assert_eq!(live("rust_jemalloc::site_aligned"), [0, 0]);
    assert_eq!(unknown_frees(&report), 0);
    assert_nothing_loaded();
}

#[test]
fn an_allocator_library_loaded_with_dlopen_gets_probes_when_it_appears() {
    let _serial = serial();
    let program = fixture("dlopen_alloc", "fp", &["-fno-omit-frame-pointer", "-ldl"]);
    // `trace` holds the process at the loader's notice until the probes
    // are in: every call is seen.
    let (_, report) = trace_json(&[], &[program.to_str().unwrap()]);
    // mimalloc's mi_malloc is its malloc (one address): named malloc.
    assert_eq!(
        at(&report, "site_late"),
        (1024, 8, vec!["malloc".to_string()])
    );
    assert_eq!(
        at(&report, "site_late_leak"),
        (128, 2, vec!["malloc".to_string()])
    );
    assert!(report["probes"]
        .as_array()
        .unwrap()
        .iter()
        .any(|p| p["module"].as_str().unwrap().contains("libmimalloc")));
    let (_, report) = trace_json(&["--live"], &[program.to_str().unwrap()]);
    assert_eq!(live_site(&report, "site_late_leak"), (128, 2, 0, 0));
    assert_eq!(live_site(&report, "site_late"), (0, 0, 8, 0));
    assert_eq!(unknown_frees(&report), 0);
    assert_nothing_loaded();
}

#[test]
fn a_library_loaded_after_the_main_thread_ended_is_probed_with_sampled_live() {
    let _serial = serial();
    let program = fixture("dlopen_alloc", "fp", &["-fno-omit-frame-pointer", "-ldl"]);
    // A second thread loads mimalloc once the main thread has ended
    // (pthread_exit). With sampling, --live puts malloc-like functions
    // under session links, and a link puts no breakpoint in a file mapped
    // after its process's main thread ended: before the fix none of
    // site_late's or site_late_leak's calls was seen (and none counted lost).
    // child-after-main-ends: the same in a forked child, after its parent
    // loaded mimalloc (its probes made while the parent's main thread ran:
    // the child's calls were not seen either); reload-after-main-ends: the
    // same process loaded it, and unloaded it, before; exec: the same in a
    // child that exec'd it, forked by a program that had mimalloc from the
    // start (its probes made then, for that program).
    let linked = fixture(
        "dlopen_alloc",
        "mi",
        &[
            "-fno-omit-frame-pointer",
            "-ldl",
            "-Wl,--no-as-needed",
            "-lmimalloc",
        ],
    );
    let (program, linked) = (program.to_str().unwrap(), linked.to_str().unwrap());
    let commands = [
        vec![program, "after-main-ends"],
        vec![program, "child-after-main-ends"],
        vec![program, "reload-after-main-ends"],
        vec![linked, "exec", program, "after-main-ends"],
    ];
    for command in &commands {
        for extra in [&["--live"][..], &["--live", "--sample-bytes", "1"][..]] {
            let (_, report) = trace_json(extra, command);
            let case = format!("{command:?} {extra:?}");
            assert_eq!(
                live_site(&report, "site_late_leak"),
                (128, 2, 0, 0),
                "{case}"
            );
            assert_eq!(live_site(&report, "site_late"), (0, 0, 8, 0), "{case}");
            assert_eq!(unknown_frees(&report), 0, "{case}");
        }
    }
    assert_nothing_loaded();
}

#[test]
fn an_attached_process_that_loads_an_allocator_library_gets_its_probes() {
    use std::io::{BufRead as _, BufReader, Write as _};
    let _serial = serial();
    let program = fixture("dlopen_alloc", "fp", &["-fno-omit-frame-pointer", "-ldl"]);
    let mut target = std::process::Command::new(&program)
        .arg("wait")
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    let mut stdout = BufReader::new(target.stdout.take().unwrap());
    let mut line = String::new();
    stdout.read_line(&mut line).unwrap();
    assert_eq!(line, "ready\n");
    let (memprof, mut stderr) = start_attach(target.id(), &["--verbose", "--live"]);
    let mut stdin = target.stdin.take().unwrap();
    stdin.write_all(b"load\n").unwrap();
    line.clear();
    stdout.read_line(&mut line).unwrap();
    assert_eq!(line, "loaded\n");
    // The library is loaded; its probes go in once memprof has read the
    // loader's notice: --verbose says when.
    loop {
        line.clear();
        assert!(stderr.read_line(&mut line).unwrap() > 0, "memprof ended");
        if line.starts_with("memprof: probe alloc") && line.contains("libmimalloc") {
            break;
        }
    }
    target.stdin = Some(stdin);
    let (status, report) = release_and_report(&mut target, memprof);
    assert!(status.success());
    assert_eq!(
        at(&report, "site_late"),
        (1024, 8, vec!["malloc".to_string()])
    );
    assert_eq!(live_site(&report, "site_late_leak"), (128, 2, 0, 0));
    assert_eq!(live_site(&report, "site_late"), (0, 0, 8, 0));
    assert_nothing_loaded();
}

#[test]
fn a_bad_alloc_thrown_by_operator_new_is_still_caught_by_the_program() {
    let _serial = serial();
    let program = fixture_cpp("bad_alloc", "fp", frame_pointers());
    for extra in [&[][..], &["--live"][..]] {
        let (output, _) = trace_json(extra, &[program.to_str().unwrap()]);
        let stderr = String::from_utf8_lossy(&output.stderr);
        assert!(output.status.success(), "{extra:?}: {stderr}");
        assert!(
            stderr.contains("caught 3, nothrow null"),
            "{extra:?}: {stderr}"
        );
    }
    assert_nothing_loaded();
}

/// A program built without PIE that takes malloc's and free's addresses in
/// its code (as CPython does; Debian's python3.11 is built so) gives the
/// imported functions their PLT stubs' addresses in its dynamic symbols:
/// undefined symbols, not code of theirs to probe. Probed, every call was
/// seen twice (totals doubled, each free "unknown" in live mode).
#[test]
fn imported_functions_with_canonical_addresses_are_not_probed_twice() {
    let _serial = serial();
    let program = fixture("canonical_plt", "nopie", &["-fno-pie", "-no-pie"]);
    let program = program.to_str().unwrap();
    let (_, totals) = trace_json(&[], &[program]);
    let (_, live) = trace_json(&["--live"], &[program]);
    for report in [&totals, &live] {
        let process = &report["processes"][0];
        assert_eq!(process["count"], 150, "{report}");
        assert_eq!(process["bytes"], 100 * 100 + 50 * 10);
        assert!(
            report["probes"]
                .as_array()
                .unwrap()
                .iter()
                .all(|p| !p["module"]
                    .as_str()
                    .unwrap()
                    .ends_with("canonical_plt-nopie")),
            "{}",
            report["probes"]
        );
    }
    assert_eq!(unknown_frees(&live), 0);
    assert_eq!(live["processes"][0]["live_bytes"], 0);
}
