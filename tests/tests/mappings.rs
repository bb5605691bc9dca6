//! Direct mappings: anonymous mmap/mremap/munmap and
//! sbrk calls the program makes itself, counted per call site; those made
//! inside malloc or an --alloc-fn are the allocator's. Fixture:
//! tests/fixtures/direct_mmap.c (and custom_alloc.c).
use serde_json::Value;
use tests::*;

const PAGE: u64 = 4096;

fn direct_mmap() -> std::path::PathBuf {
    fixture("direct_mmap", "O2", &["-O2", "-g"])
}

/// Stacks of `allocator` whose frame 0 is `function`.
fn stacks_of<'a>(report: &'a Value, allocator: &str, function: &str) -> Vec<&'a Value> {
    stacks_where(report, |stack| {
        stack["allocator"] == allocator
            && frame_functions(stack).first().map(String::as_str) == Some(function)
    })
}

fn no_mapping_inside_an_allocator(report: &Value) {
    let inside = stacks_where(report, |stack| {
        let mapping = matches!(stack["allocator"].as_str(), Some("mmap" | "mremap" | "brk"));
        mapping
            && frame_functions(stack).iter().any(|f| {
                f.contains("malloc") && !f.contains("minimal")
                    || f == "sysmalloc"
                    || f == "rt_alloc"
            })
    });
    assert!(
        inside.is_empty(),
        "mappings counted inside an allocator: {inside:?}"
    );
}

#[test]
fn direct_mappings_count_per_call_site_and_not_inside_malloc() {
    let program = direct_mmap();
    let (output, report) = trace_json(&[], &[program.to_str().unwrap()]);
    assert!(output.status.success());
    // 10 mappings of 4 pages and 1 of 2 pages, from two lines of main.
    let mmap = stacks_of(&report, "mmap", "map_pages");
    assert_eq!(
        sum_fields(&mmap, ["bytes", "count"]),
        [(10 * 4 + 2) * PAGE, 11]
    );
    // The 2-page mapping grown to 16 pages.
    let mremap = stacks_of(&report, "mremap", "grow");
    assert_eq!(sum_fields(&mremap, ["bytes", "count"]), [16 * PAGE, 1]);
    // The break raised twice by 16 pages (lowering it allocates nothing).
    let brk = stacks_of(&report, "brk", "raise_break");
    assert_eq!(sum_fields(&brk, ["bytes", "count"]), [32 * PAGE, 2]);
    // A file's pages and a PROT_NONE reservation are not memory allocated.
    assert!(
        stacks_where(&report, |s| frame_functions(s).first().map(String::as_str)
            == Some("not_counted"))
        .is_empty()
    );
    // malloc maps its 1 MiB blocks itself: counted once, as malloc's.
    let (bytes, count, allocators) = site(&report, "main");
    assert_eq!((bytes, count), (3 << 20, 3), "{allocators:?}");
    no_mapping_inside_an_allocator(&report);
}

/// A library that defines the mapping functions itself and passes the
/// call on to the C library's (tcmalloc's `sbrk`; glibc's libmemusage,
/// preloaded, wraps `mmap` and `mremap`): the program's call counts once,
/// at its own call site, not as the wrapper's call inside the allocator.
#[test]
fn a_wrapped_mapping_call_counts_once_at_the_programs_call_site() {
    let with_tcmalloc = fixture(
        "direct_mmap",
        "tcmalloc",
        &["-O2", "-g", "-Wl,--no-as-needed", "-ltcmalloc"],
    );
    let plain = direct_mmap();
    let preload = "LD_PRELOAD=/usr/lib/x86_64-linux-gnu/libmemusage.so";
    let runs = [
        ("tcmalloc", vec![with_tcmalloc.to_str().unwrap()]),
        ("libmemusage", vec!["env", preload, plain.to_str().unwrap()]),
    ];
    for (wrapper, command) in runs {
        let (output, report) = trace_json(&[], &command);
        assert!(output.status.success(), "{wrapper}");
        let sums = |allocator, function| {
            sum_fields(&stacks_of(&report, allocator, function), ["bytes", "count"])
        };
        assert_eq!(sums("mmap", "map_pages"), [42 * PAGE, 11], "{wrapper}");
        assert_eq!(sums("mremap", "grow"), [16 * PAGE, 1], "{wrapper}");
        assert_eq!(sums("brk", "raise_break"), [32 * PAGE, 2], "{wrapper}");
        let mappings = stacks_where(&report, |s| {
            matches!(s["allocator"].as_str(), Some("mmap" | "mremap" | "brk"))
        });
        assert_eq!(
            sum_fields(&mappings, ["bytes", "count"]),
            [(42 + 16 + 32) * PAGE, 14],
            "{wrapper}: only the program's: {mappings:?}"
        );
    }
}

#[test]
fn live_mappings_end_with_munmap_whole_or_in_part() {
    let program = direct_mmap();
    let (output, report) = trace_json(&["--live"], &[program.to_str().unwrap()]);
    assert!(output.status.success());
    let live = |stacks: Vec<&Value>| sum_fields(&stacks, ["live_bytes", "live_count"]);
    // 7 of the 4-page mappings live: 4 whole, 3 less a page (head, tail,
    // middle: one allocation in two pieces still counts once).
    assert_eq!(
        live(stacks_of(&report, "mmap", "map_pages")),
        [25 * PAGE, 7]
    );
    // The grown mapping lives on at grow's call.
    assert_eq!(live(stacks_of(&report, "mremap", "grow")), [16 * PAGE, 1]);
    // The second raise of the break was taken back.
    assert_eq!(
        live(stacks_of(&report, "brk", "raise_break")),
        [16 * PAGE, 1]
    );
    let process = &report["processes"][0];
    let mapped_live: u64 = stacks_where(&report, |s| {
        matches!(s["allocator"].as_str(), Some("mmap" | "mremap" | "brk"))
    })
    .iter()
    .map(|s| s["live_bytes"].as_u64().unwrap())
    .sum();
    assert_eq!(process["mapped_live_bytes"].as_u64(), Some(mapped_live));
    // The most was mapped just before the break came down by 16 pages;
    // nothing was mapped after that.
    assert_eq!(
        process["mapped_peak_bytes"].as_u64(),
        Some(mapped_live + 16 * PAGE)
    );
    no_mapping_inside_an_allocator(&report);
}

/// `--no-mmap`, and `--unwind fp` (without whole stacks malloc's own
/// mappings could not be told from the program's).
#[test]
fn no_mmap_or_frame_pointer_walks_count_no_mappings() {
    // Frame pointers for the frame-pointer walk.
    let program = fixture("direct_mmap", "fp", frame_pointers());
    for flags in [&["--no-mmap"][..], &["--unwind", "fp"]] {
        let (output, report) = trace_json(flags, &[program.to_str().unwrap()]);
        assert!(output.status.success());
        let mappings = stacks_where(&report, |s| {
            matches!(s["allocator"].as_str(), Some("mmap" | "mremap" | "brk"))
        });
        assert!(mappings.is_empty(), "{flags:?}: {mappings:?}");
        assert_eq!(site(&report, "main").1, 3);
    }
}

#[test]
fn a_custom_allocators_chunk_mappings_are_its_own() {
    let program = fixture("custom_alloc", "O2", &["-O2", "-g"]);
    let program = program.to_str().unwrap();
    // Without --alloc-fn, rt_alloc's chunk is a direct mapping of 1 MiB...
    let (output, report) = trace_json(&[], &[program]);
    assert!(output.status.success());
    let chunk = stacks_of(&report, "mmap", "rt_alloc");
    assert_eq!(sum_fields(&chunk, ["bytes", "count"]), [1 << 20, 1]);
    // ...with it, that memory is rt_alloc's blocks: not counted again.
    let (output, report) = trace_json(
        &[
            "--alloc-fn",
            "rt_alloc:size=1",
            "--free-fn",
            "rt_free:ptr=1",
        ],
        &[program],
    );
    assert!(output.status.success());
    assert!(stacks_of(&report, "mmap", "rt_alloc").is_empty());
    no_mapping_inside_an_allocator(&report);
}

#[test]
fn attached_mappings_count_from_the_attach_on() {
    let program = direct_mmap();
    let mut target = std::process::Command::new(&program)
        .arg("wait")
        .stdin(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    let (memprof, _stderr) = start_attach(target.id(), &["--live"]);
    let (status, report) = release_and_report(&mut target, memprof);
    assert!(status.success());
    let mmap = stacks_of(&report, "mmap", "map_pages");
    assert_eq!(
        sum_fields(&mmap, ["bytes", "count", "live_bytes"]),
        [42 * PAGE, 11, 25 * PAGE]
    );
    let mremap = stacks_of(&report, "mremap", "grow");
    assert_eq!(
        sum_fields(&mremap, ["bytes", "count", "live_bytes"]),
        [16 * PAGE, 1, 16 * PAGE]
    );
    // sbrk returns the old break: its first call after the attach counts.
    let brk = stacks_of(&report, "brk", "raise_break");
    assert_eq!(
        sum_fields(&brk, ["bytes", "count", "live_bytes"]),
        [32 * PAGE, 2, 16 * PAGE]
    );
}

/// jemalloc, tcmalloc and mimalloc map their memory themselves, often from
/// a function their malloc tail-calls (jemalloc's `malloc_default`): that
/// is their blocks' memory, never a direct mapping of the program's.
#[test]
fn other_allocators_own_mappings_are_not_counted_again() {
    for library in ["jemalloc", "tcmalloc", "mimalloc"] {
        let link = format!("-l{library}");
        let program = fixture(
            "other_allocators",
            library,
            &["-fno-omit-frame-pointer", "-Wl,--no-as-needed", &link],
        );
        let (output, report) = trace_json(&[], &[program.to_str().unwrap()]);
        assert!(output.status.success(), "{library}");
        let mappings = stacks_where(&report, |s| {
            matches!(s["allocator"].as_str(), Some("mmap" | "mremap" | "brk"))
        });
        assert!(mappings.is_empty(), "{library}: {mappings:?}");
    }
}
