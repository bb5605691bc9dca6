//! Stacks walked in the kernel with the unwind tables (.eh_frame) of each
//! mapped file (`--unwind auto`, the default, = `dwarf`). The same program
//! built with and without frame pointers must give the same stacks, frame
//! for frame, with exact counts: C through glibc (strdup, qsort's
//! callback) and threads, a library loaded with dlopen, C++ through
//! libstdc++, Rust through its standard library; and the frames equal
//! gdb's backtrace on the same calls. An attached process is never
//! stopped: what it calls before a new library's tables are loaded is
//! cut and counted, never taken for a whole stack.

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

/// `trace_json`, which must succeed with no unwind losses: the report and
/// its stacks.
fn traced_whole(extra: &[&str], cmd: &[&str]) -> (Value, Vec<Shape>) {
    let (output, report) = trace_json(extra, cmd);
    assert!(
        output.status.success(),
        "{}",
        String::from_utf8_lossy(&output.stderr)
    );
    assert_no_unwind_losses(&report);
    let shapes = shapes(&report);
    (report, shapes)
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
        let (_, shapes) = traced_whole(&["--unwind", "dwarf"], &[program.to_str().unwrap()]);
        reports.push(shapes);
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
        let (_, shapes) = traced_whole(&args, &[program.to_str().unwrap()]);
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
    let (_, report) = release_and_report(&mut target, memprof);
    assert_no_unwind_losses(&report);
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

/// The loader fixture and its plugin library, built alike.
fn loader_and_plugin(variant: &str, flags: &[&str]) -> (std::path::PathBuf, std::path::PathBuf) {
    let mut library_flags = vec!["-shared", "-fPIC"];
    library_flags.extend_from_slice(flags);
    let plugin = fixture("plugin", &format!("{variant}.so"), &library_flags);
    (fixture("loader", variant, flags), plugin)
}

fn plugin_stack() -> Vec<String> {
    let mut expected = names(&["plugin_leaf", "plugin_mid", "plugin_run", "load_and_run"]);
    expected.extend(names(&START));
    expected
}

#[test]
fn a_library_loaded_with_dlopen_is_unwound_from_its_first_allocation() {
    let _serial = serial();
    let mut sites = Vec::new();
    for (variant, flags) in [("fp", frame_pointers()), ("nofp", no_frame_pointers())] {
        let (loader, plugin) = loader_and_plugin(variant, flags);
        // `trace` holds the process while the library's tables load: no
        // unwind losses.
        let (_, shapes) = traced_whole(&[], &[loader.to_str().unwrap(), plugin.to_str().unwrap()]);
        let site = leaf(&shapes, "plugin_leaf");
        assert_eq!(site.len(), 1, "{variant}: {shapes:?}");
        assert_eq!(
            (site[0].1, site[0].2, site[0].4.clone()),
            (9, 9 * 40, plugin_stack()),
            "{variant}"
        );
        sites.push(site[0].clone());
    }
    assert_eq!(sites[0], sites[1], "with and without frame pointers");
    assert_nothing_loaded();
}

/// A library with code but no unwind tables at all is nothing lost: Debian's
/// libicudata (mapped by every process using ICU: data, and a few bytes of
/// crt stubs in an executable segment) was counted "unwind_table_full",
/// with "raise --unwind-rows", in gdb and any such process.
#[test]
fn a_library_without_unwind_tables_is_not_a_full_table() {
    let _serial = serial();
    let bare = fixture(
        "bare",
        "nocfi.so",
        &[
            "-shared",
            "-fPIC",
            "-nostartfiles",
            "-fno-asynchronous-unwind-tables",
            "-fno-unwind-tables",
            "-g0",
        ],
    );
    let (program, plugin) = many_libraries_and_plugin();
    let (_, whole) = traced_whole(
        &[],
        &[
            program.to_str().unwrap(),
            plugin.to_str().unwrap(),
            bare.to_str().unwrap(),
        ],
    );
    assert_plugin_site_whole(&whole);
    assert_nothing_loaded();
}

/// The many_libraries fixture and the plugin library it loads, both built
/// without frame pointers.
fn many_libraries_and_plugin() -> (std::path::PathBuf, std::path::PathBuf) {
    let mut flags = vec!["-shared", "-fPIC"];
    flags.extend_from_slice(no_frame_pointers());
    let plugin = fixture("plugin", "nofp.so", &flags);
    (
        fixture("many_libraries", "nofp", no_frame_pointers()),
        plugin,
    )
}

/// many_libraries' one allocation site, through the plugin it ran: 9
/// calls of 40 bytes, whole from the plugin's leaf to `_start`.
fn assert_plugin_site_whole(shapes: &[Shape]) {
    let site = leaf(shapes, "plugin_leaf");
    assert_eq!(site.len(), 1, "{shapes:?}");
    let mut expected = names(&[
        "plugin_leaf",
        "plugin_mid",
        "plugin_run",
        "load_all_and_run",
    ]);
    expected.extend(names(&START));
    assert_eq!(
        (site[0].1, site[0].2, site[0].3, site[0].4.clone()),
        (9, 9 * 40, false, expected)
    );
}

/// The many_libraries fixture with `n` copies of the plugin library:
/// `trace`'s output and report.
fn trace_with_libraries(n: usize) -> (std::process::Output, Value) {
    let (program, plugin) = many_libraries_and_plugin();
    let dir = std::env::temp_dir().join(format!("memprof-libraries-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let copies: Vec<String> = (0..n)
        .map(|i| {
            let copy = dir.join(format!("libplugin{i:03}.so"));
            std::fs::copy(&plugin, &copy).unwrap();
            copy.display().to_string()
        })
        .collect();
    let mut command = vec![program.to_str().unwrap()];
    command.extend(copies.iter().map(String::as_str));
    let traced = trace_json(&[], &command);
    std::fs::remove_dir_all(&dir).unwrap();
    traced
}

/// A process with more executable mappings than the kernel's list of a
/// process held (64 before: Debian's python3 maps 60 once a few stdlib
/// modules are imported, a large application hundreds): 200 libraries
/// loaded with dlopen. The C library, at the highest addresses, was the
/// first left out, and every stack ended there, taken for complete. Past
/// the 256 the list holds now, the mappings left out are counted, and a
/// walk that reaches one is cut and marked partial.
#[test]
fn a_process_with_hundreds_of_libraries_is_unwound_through_all_of_them() {
    let _serial = serial();
    let (output, report) = trace_with_libraries(200);
    assert!(output.status.success());
    assert_no_unwind_losses(&report);
    let whole = shapes(&report);
    assert_plugin_site_whole(&whole);

    let (output, report) = trace_with_libraries(300);
    assert!(output.status.success());
    // 300 plugins, the program, the C library and the loader: 303.
    assert_eq!(report["lost"]["unwind_table_full"], 303 - 256);
    let cut = shapes(&report);
    let site = leaf(&cut, "plugin_leaf");
    assert_eq!(site.len(), 1, "{cut:?}");
    // Cut where the walk left the mappings kept (the first plugins loaded
    // lie above the last ones, below the C library).
    assert_eq!((site[0].1, site[0].3), (9, true), "{cut:?}");
    // And the loader's own calls, through the C library, left out too.
    assert!(report["lost"]["unwind_no_info"].as_u64().unwrap() >= 9);
    assert_nothing_loaded();
}

/// Code generated at run time (an anonymous executable mapping, as Java,
/// V8 or LuaJIT make) has no unwind tables: a walk that reaches it is cut
/// there and counted, never taken for a complete stack (it was: the stack
/// [site_under_jit, jit_callee] read as whole).
#[test]
fn a_walk_that_reaches_a_jits_code_is_cut_and_counted() {
    let _serial = serial();
    let program = fixture("jit", "nofp", no_frame_pointers());
    let (output, report) = trace_json(&[], &[program.to_str().unwrap()]);
    assert!(output.status.success());
    let shapes = shapes(&report);
    let site = leaf(&shapes, "site_under_jit");
    assert_eq!(site.len(), 1, "{shapes:?}");
    assert_eq!(
        (site[0].1, site[0].2, site[0].3, site[0].4.clone()),
        (7, 7 * 48, true, names(&["site_under_jit", "jit_callee"]))
    );
    assert!(report["lost"]["unwind_no_info"].as_u64().unwrap() >= 7);
    assert_nothing_loaded();
}

/// A stack deeper than memprof keeps (`MAX_FRAMES`: 128 frames above the
/// caller) keeps its innermost frames, is marked partial and counted
/// (`unwind_too_deep`), with either walk; one that fits is whole. The
/// frame-pointer walk took a chain it had cut for a whole stack (not
/// partial, not counted), and at 64 frames 45% of a Python program's
/// calls while importing a few stdlib modules were cut. `phases
/// recursion N`: 10 calls of 64 bytes under N frames of `recurse`.
#[test]
fn a_stack_deeper_than_memprof_keeps_is_cut_and_counted_one_that_fits_is_whole() {
    let _serial = serial();
    let program = fixture("phases", "fp", frame_pointers());
    let program = program.to_str().unwrap();
    for unwind in ["fp", "dwarf"] {
        for (depth, cut) in [(101, false), (200, true)] {
            let depth_arg = depth.to_string();
            let output = memprof(&[
                "trace",
                "--unwind",
                unwind,
                "--format",
                "json",
                "--depth",
                "300",
                "--",
                program,
                "recursion",
                &depth_arg,
            ]);
            assert!(output.status.success(), "{output:?}");
            let report = parse_report(&output);
            let shapes = shapes(&report);
            assert_eq!(shapes.len(), 1, "{unwind} {depth}: {shapes:?}");
            let (allocator, calls, bytes, partial, frames) = &shapes[0];
            let context = format!("{unwind} {depth}: {frames:?}");
            assert_eq!((allocator.as_str(), *calls, *bytes), ("malloc", 10, 640));
            assert_eq!(*partial, cut, "{context}");
            let lost = &report["lost"]["unwind_too_deep"];
            assert_eq!(*lost, if cut { 10 } else { 0 }, "{context}");
            let recursion = frames.iter().take_while(|f| *f == "recurse").count();
            if cut {
                // The caller and 128 frames, all of them recurse.
                assert_eq!((frames.len(), recursion), (129, 129), "{context}");
            } else {
                assert_eq!(recursion, depth, "{context}");
                let outermost = if unwind == "fp" {
                    // glibc keeps no frame pointer: the chain ends there.
                    "__libc_start_call_main"
                } else {
                    "_start"
                };
                assert_eq!(frames[depth], "main", "{context}");
                assert_eq!(frames.last().unwrap(), outermost, "{context}");
            }
        }
    }
    assert_nothing_loaded();
}

#[test]
fn an_attached_process_that_loads_a_library_is_not_stopped_and_what_it_could_not_unwind_is_counted()
{
    use std::io::{BufRead as _, BufReader};
    let _serial = serial();
    let (loader, plugin) = loader_and_plugin("nofp", no_frame_pointers());
    let mut target = std::process::Command::new(&loader)
        .arg(&plugin)
        .arg("wait")
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    let mut ready = String::new();
    BufReader::new(target.stdout.take().unwrap())
        .read_line(&mut ready)
        .unwrap();
    assert_eq!(ready, "ready\n");
    let (memprof, _stderr) = start_attach(target.id(), &["--depth", "64"]);
    let (status, report) = release_and_report(&mut target, memprof);
    assert!(status.success());
    let shapes = shapes(&report);
    let site = leaf(&shapes, "plugin_leaf");
    // Every call counted, whether its stack is whole or was cut.
    assert_eq!(site.iter().map(|s| s.1).sum::<u64>(), 9, "{site:?}");
    assert_eq!(site.iter().map(|s| s.2).sum::<u64>(), 9 * 40, "{site:?}");
    for stack in &site {
        if stack.3 {
            // Called before the library's tables reached the kernel: cut
            // at the first frame, marked, never taken for a whole stack.
            assert_eq!(stack.4, names(&["plugin_leaf"]), "{stack:?}");
        } else {
            assert_eq!(stack.4, plugin_stack(), "{stack:?}");
        }
    }
    let partial: u64 = shapes.iter().filter(|s| s.3).map(|s| s.1).sum();
    assert_eq!(
        report["lost"]["unwind_no_info"], partial,
        "each cut stack counted: {}",
        report["lost"]
    );
    assert_nothing_loaded();
}

/// The stacks of a program built with and without frame pointers, which
/// must be equal; and the one whose frames hold `chain` in this order.
fn same_stacks_both_ways(builds: [std::path::PathBuf; 2], chain: &[&str]) -> Shape {
    let mut reports = Vec::new();
    for program in &builds {
        reports.push(traced_whole(&[], &[program.to_str().unwrap()]).1);
    }
    assert_eq!(reports[0], reports[1], "with and without frame pointers");
    let holds_chain = |frames: &[String]| {
        let mut at = 0;
        for function in chain {
            // C++ names carry their parameters: "make(int)".
            let named = |f: &String| f == function || f.starts_with(&format!("{function}("));
            match frames[at..].iter().position(named) {
                Some(found) => at += found + 1,
                None => return false,
            }
        }
        true
    };
    let found: Vec<&Shape> = reports[0].iter().filter(|s| holds_chain(&s.4)).collect();
    assert!(
        !found.is_empty(),
        "no stack through {chain:?}: {:#?}",
        reports[0]
    );
    let frames = &found[0].4;
    assert_eq!(frames[frames.len() - 4..], names(&START)[..], "{frames:?}");
    found[0].clone()
}

#[test]
fn cpp_release_builds_give_the_same_stacks_with_and_without_frame_pointers() {
    let _serial = serial();
    let builds = [
        fixture_cpp("unwind_cpp", "fp", frame_pointers()),
        fixture_cpp("unwind_cpp", "nofp", no_frame_pointers()),
    ];
    // operator new (libstdc++, no frame pointers) -> make -> fill -> build
    // -> main: reported as `new`, from the code that called it (the
    // allocator's code inlined into `make`), 10 vectors of 100-109 ints.
    let (allocator, count, bytes, _, frames) =
        same_stacks_both_ways(builds, &["make", "fill", "build", "main"]);
    assert_eq!(allocator, "new", "{frames:?}");
    assert_eq!((count, bytes), (10, (100..110).map(|n| n * 4).sum()));
    assert!(
        !frames.iter().any(|f| f.starts_with("operator new")),
        "{frames:?}"
    );
    assert_nothing_loaded();
}

#[test]
fn rust_release_builds_give_the_same_stacks_with_and_without_frame_pointers() {
    let _serial = serial();
    let builds = [
        fixture_rust("unwind_rs", "fp", &["-C", "force-frame-pointers=yes"]),
        fixture_rust("unwind_rs", "nofp", &[]),
    ];
    same_stacks_both_ways(
        builds,
        &[
            "unwind_rs::leaf",
            "unwind_rs::middle",
            "unwind_rs::outer",
            "unwind_rs::main",
            "main",
        ],
    );
    assert_nothing_loaded();
}

/// The functions of gdb's backtrace at the first stop at `breakpoint`
/// in `program` (past main, down to _start), innermost first.
fn gdb_backtrace(program: &std::path::Path, breakpoint: &str) -> Vec<String> {
    let output = std::process::Command::new("gdb")
        .args(["-batch", "-nx"])
        .args(["-ex", "set backtrace past-main on"])
        .args(["-ex", &format!("break {breakpoint}")])
        .args(["-ex", "run", "-ex", "bt"])
        .arg(program)
        .output()
        .expect("gdb (scripts/setup.sh installs it)");
    let text = String::from_utf8_lossy(&output.stdout);
    // "#0  chain_leaf () at ..." or "#1  0x... in c12 () at ...".
    text.lines()
        .filter(|line| line.starts_with('#'))
        .filter_map(|line| {
            let rest = line.split_once(' ')?.1.trim_start();
            let rest = match rest.split_once(" in ") {
                Some((address, function)) if address.starts_with("0x") => function,
                _ => rest,
            };
            rest.split_whitespace().next().map(str::to_string)
        })
        .collect()
}

#[test]
fn frames_equal_gdbs_backtrace_on_the_same_calls() {
    let _serial = serial();
    let program = fixture("unwind", "nofp", no_frame_pointers());
    let (output, report) = trace_json(&[], &[program.to_str().unwrap()]);
    assert!(output.status.success());
    let shapes = shapes(&report);
    // The chain, the recursion and the second thread, each at its
    // allocating function (gdb stops at its first line, before malloc).
    for site in ["chain_leaf", "rec_leaf", "w2"] {
        let memprof = leaf(&shapes, site);
        assert_eq!(memprof.len(), 1, "{site}: {memprof:?}");
        let gdb = gdb_backtrace(&program, site);
        assert_eq!(memprof[0].4, gdb, "{site}: memprof vs gdb");
    }
}
