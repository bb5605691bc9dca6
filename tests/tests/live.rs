//! `--live`: blocks paired with their frees; what is still allocated at
//! exit, per stack, exactly (tests/fixtures/leaks.c).
use serde_json::Value;
use tests::*;

fn leaks() -> std::path::PathBuf {
    fixture("leaks", "fp", frame_pointers())
}

/// No block went untracked or unmatched, no call uncounted.
fn assert_nothing_lost(report: &serde_json::Value) {
    for cause in [
        "live_table_full",
        "missed_free",
        "thread_table_full",
        "map_full",
    ] {
        assert_eq!(report["lost"][cause], 0, "lost {cause}");
    }
}

#[test]
fn leaks_at_exit_are_exact_per_site() {
    let _serial = serial();
    assert_leaks_exact(&[]);
    assert_nothing_loaded();
}

/// Runs leaks.c's sites under `trace --live` with `extra` options, and
/// checks every site's live figures.
fn assert_leaks_exact(extra: &[&str]) {
    let program = leaks();
    // 100 ms: the fixture frees its temporaries at once and its slow
    // blocks after 300 ms; a busy machine stays well inside both.
    let mut options = vec!["--live", "--temp-threshold", "100ms"];
    options.extend_from_slice(extra);
    let (output, report) = trace_json(&options, &[program.to_str().unwrap()]);
    assert!(output.status.success(), "{output:?}");
    assert_eq!(report["mode"], "live");
    assert_eq!(report["temp_threshold_secs"], 0.1);

    // (live bytes, live blocks, temporary, untracked) and the totals.
    assert_eq!(live_site(&report, "site_leak_malloc"), (600, 6, 4, 0));
    assert_eq!(site(&report, "site_leak_malloc").0, 1000);
    assert_eq!(live_site(&report, "site_leak_calloc"), (200, 2, 0, 0));
    // Realloc chains: moved blocks leave their old site (a move is not a
    // temporary allocation); 3 of 5 kept.
    assert_eq!(live_site(&report, "site_chain_start"), (0, 0, 0, 0));
    assert_eq!(live_site(&report, "site_chain_grow"), (0, 0, 0, 0));
    assert_eq!(live_site(&report, "site_chain_final").0, 6000);
    assert_eq!(live_site(&report, "site_chain_final").1, 3);
    assert_eq!(
        site(&report, "site_chain_final"),
        (10_000, 5, vec!["realloc".into()])
    );
    // realloc(p, 0) freed its block: one call, nothing live.
    assert_eq!(
        site(&report, "site_chain_release"),
        (0, 1, vec!["realloc".into()])
    );
    assert_eq!(live_site(&report, "site_chain_release"), (0, 0, 0, 0));
    // posix_memalign returns its block through its first argument.
    assert_eq!(
        live_site(&report, "site_leak_posix_memalign"),
        (4000, 4, 0, 0)
    );
    assert_eq!(live_site(&report, "site_leak_aligned_alloc").0, 2048);
    assert_eq!(live_site(&report, "site_leak_aligned_alloc").1, 1);
    // Allocated in one thread, 30 of 50 freed in another.
    assert_eq!(live_site(&report, "site_cross_thread").0, 20 * 64);
    assert_eq!(live_site(&report, "site_cross_thread").1, 20);
    // Temporary: freed at once; not temporary: freed after 300 ms.
    assert_eq!(live_site(&report, "site_temporary"), (0, 0, 100, 0));
    assert_eq!(live_site(&report, "site_slow_free"), (0, 0, 0, 0));
    assert_eq!(
        site(&report, "site_slow_free"),
        (144, 3, vec!["malloc".into()])
    );

    let process = &processes_with(&report, "site_leak_malloc")[0];
    assert_eq!(process["exited"], true);
    // The process's live heap is the sum of its stacks (glibc's own blocks included).
    let stacks_live: u64 = process["stacks"]
        .as_array()
        .unwrap()
        .iter()
        .map(|s| s["live_bytes"].as_u64().unwrap())
        .sum();
    assert_eq!(process["live_bytes"].as_u64().unwrap(), stacks_live);
    // Every leaked block was allocated before the 300 ms sleep.
    let oldest = |function: &str| {
        stacks_at(process, function)[0]["oldest_age_secs"]
            .as_f64()
            .unwrap()
    };
    assert!(oldest("site_leak_malloc") >= 0.3);
    // A block realloc moved keeps the age of its first allocation: grown
    // after the 300 ms sleep, allocated before it.
    assert_eq!(live_site(&report, "site_grow_late"), (5000, 1, 0, 0));
    assert_eq!(live_site(&report, "site_grow_start"), (0, 0, 0, 0));
    assert!(oldest("site_grow_late") >= 0.3);
    // The peak held the leaks and the 3 slow blocks at once, at least.
    let leaked = 600 + 200 + 6000 + 4000 + 2048 + 1280;
    assert!(process["peak_live_bytes"].as_u64().unwrap() >= leaked + 144);
    assert!(!process["peak_stacks"].as_array().unwrap().is_empty());
    assert_nothing_lost(&report);
}

#[test]
fn totals_are_the_same_with_and_without_live() {
    let _serial = serial();
    let program = fixture("allocs", "fp", frame_pointers());
    let (_, plain) = trace_json(&[], &[program.to_str().unwrap()]);
    let (_, live) = trace_json(&["--live"], &[program.to_str().unwrap()]);
    for function in [
        "site_malloc",
        "site_realloc_grow",
        "site_posix_memalign",
        "site_valloc",
    ] {
        assert_eq!(site(&plain, function), site(&live, function), "{function}");
    }
    // allocs.c frees every block it allocates, whichever function made it:
    // each free was matched to its block.
    for function in [
        "site_malloc",
        "site_calloc",
        "site_realloc_grow",
        "site_realloc_null",
        "site_reallocarray",
        "site_posix_memalign",
        "site_aligned_alloc",
        "site_memalign",
        "site_valloc",
        "site_pvalloc",
    ] {
        let (live_bytes, live_count, _, untracked) = live_site(&live, function);
        assert_eq!(
            (live_bytes, live_count, untracked),
            (0, 0, 0),
            "{function} still holds blocks"
        );
        assert!(site(&live, function).1 > 0, "{function} not seen");
    }
    let process = &processes_with(&live, "site_malloc")[0];
    assert_eq!(process["unknown_frees"], 0, "every free matched a block");
    assert_nothing_loaded();
}

#[test]
fn min_age_shows_only_old_blocks() {
    let _serial = serial();
    let program = leaks();
    let (_, report) = trace_json(
        &["--live", "--min-age", "0.2"],
        &[program.to_str().unwrap()],
    );
    assert_eq!(report["min_age_secs"], 0.2);
    assert_eq!(
        live_site(&report, "site_leak_posix_memalign"),
        (4000, 4, 0, 0)
    );
    let process = &processes_with(&report, "site_leak_malloc")[0];
    // Stacks that hold nothing are left out of a leak report.
    for stack in process["stacks"].as_array().unwrap() {
        assert!(stack["live_count"].as_u64().unwrap() > 0, "{stack}");
    }
    let (_, report) = trace_json(&["--live", "--min-age", "1h"], &[program.to_str().unwrap()]);
    for process in report["processes"].as_array().unwrap() {
        assert_eq!(process["live_bytes"], 0);
        assert!(process["stacks"].as_array().unwrap().is_empty());
    }
    assert_nothing_loaded();
}

#[test]
fn a_full_pointer_table_counts_untracked_blocks() {
    let _serial = serial();
    let program = leaks();
    let (_, report) = trace_json(
        &["--live", "--max-live", "10"],
        &[program.to_str().unwrap(), "fill", "50"],
    );
    // The totals stay exact; 10 blocks tracked, 40 counted as untracked.
    assert_eq!(
        site(&report, "site_fill"),
        (3200, 50, vec!["malloc".into()])
    );
    assert_eq!(live_site(&report, "site_fill"), (640, 10, 0, 40));
    assert_eq!(report["lost"]["live_table_full"], 40);
    let process = &processes_with(&report, "site_fill")[0];
    assert_eq!(process["untracked_count"], 40);
    assert_nothing_loaded();
}

#[test]
fn an_exited_process_leaves_the_pointer_table() {
    let _serial = serial();
    let program = leaks();
    // The child leaks 8 blocks and exits; 300 ms later the parent
    // allocates 8. With room for 10, the parent's fit only if the
    // child's were dropped when it exited.
    let (_, report) = trace_json(
        &["--live", "--max-live", "10"],
        &[program.to_str().unwrap(), "child"],
    );
    assert_eq!(live_site(&report, "site_child_leak"), (8 * 512, 8, 0, 0));
    assert_eq!(live_site(&report, "site_parent_leak"), (8 * 256, 8, 0, 0));
    assert_eq!(report["lost"]["live_table_full"], 0);
    let child = &processes_with(&report, "site_child_leak")[0];
    assert_eq!(child["exited"], true);
    assert_nothing_loaded();
}

#[test]
fn an_execd_image_leaves_the_pointer_table() {
    let _serial = serial();
    let program = leaks();
    // 8 blocks leaked, then exec: the old image's blocks leave the table
    // (the process runs on), so the new image's 8 fit in a table of 10.
    let (output, report) = trace_json(
        &["--live", "--max-live", "10"],
        &[program.to_str().unwrap(), "exec"],
    );
    assert!(output.status.success(), "{output:?}");
    assert_eq!(live_site(&report, "site_exec_leak"), (8 * 128, 8, 0, 0));
    assert_eq!(live_site(&report, "site_fill"), (8 * 64, 8, 0, 0));
    assert_eq!(report["lost"]["live_table_full"], 0);
    let old = &processes_with(&report, "site_exec_leak")[0];
    assert_eq!(old["exited"], true, "the image before the exec is over");
    assert_nothing_loaded();
}

#[test]
fn a_process_whose_main_thread_ended_is_still_tracked() {
    let _serial = serial();
    let program = leaks();
    // The main thread's exit is not the process's: blocks the other thread
    // allocated before it and freed after are freed, not left over, and
    // those it allocated after are its live heap.
    let (output, report) = trace_json(&["--live"], &[program.to_str().unwrap(), "orphan"]);
    assert!(output.status.success(), "{output:?}");
    assert_eq!(live_site(&report, "site_orphan_early"), (0, 0, 0, 0));
    assert_eq!(live_site(&report, "site_orphan_leak"), (4000, 4, 0, 0));
    // The same when the process ends before memprof looked: blocks from
    // after the main thread's end are still the process's.
    let (_, report) = trace_json(&["--live"], &[program.to_str().unwrap(), "quick"]);
    assert_eq!(live_site(&report, "site_quick_leak"), (1400, 2, 0, 0));
    let process = &processes_with(&report, "site_quick_leak")[0];
    assert_eq!(process["exited"], true);
    assert_nothing_loaded();
}

#[test]
fn two_threads_allocating_and_freeing_each_others_blocks_stay_exact() {
    let _serial = serial();
    let program = leaks();
    // Both CPUs take and free slots of the pointer table at the same time,
    // every block freed by the other thread: 200,000 freed, 14 left.
    let (output, report) = trace_json(
        &["--live", "--temp-threshold", "1h"],
        &[program.to_str().unwrap(), "churn"],
    );
    assert!(output.status.success(), "{output:?}");
    let calls = 2 * (100 * 1000 + 7);
    assert_eq!(
        site(&report, "site_churn"),
        (24 * calls, calls, vec!["malloc".into()])
    );
    assert_eq!(live_site(&report, "site_churn"), (24 * 14, 14, 200_000, 0));
    assert_nothing_lost(&report);
    assert_nothing_loaded();
}

#[test]
fn live_options_need_live() {
    let _serial = serial();
    let output = memprof(&["trace", "--max-live", "10", "--", "true"]);
    assert_one_line_error(&output, 2, "--live");
    let output = memprof(&["trace", "--live", "--min-age", "soon", "--", "true"]);
    assert_one_line_error(&output, 2, "time span");
    let output = memprof(&["trace", "--live", "--max-live", "0", "--", "true"]);
    assert_one_line_error(&output, 2, "--max-live");
    let output = memprof(&["trace", "--sample-bytes", "0", "--", "true"]);
    assert_one_line_error(&output, 2, "--sample-bytes");
}

#[test]
fn a_two_millisecond_spike_is_the_exact_peak_held_by_its_site() {
    let _serial = serial();
    let program = fixture("spike", "fp", frame_pointers());
    let (output, report) = trace_json(&["--live"], &[program.to_str().unwrap()]);
    assert!(output.status.success(), "{output:?}");
    assert_nothing_lost(&report);
    let process = &processes_with(&report, "site_spike")[0];
    const MIB: u64 = 1 << 20;
    assert_eq!(process["live_bytes"], 3 * MIB);
    assert_eq!(process["live_count"], 1026);
    assert_eq!(process["peak_exact"], true);
    assert_eq!(process["peak_live_bytes"], 41 * MIB, "{process:#}");
    assert_eq!(process["peak_live_count"], 1064);
    // The sites were captured while the spike was held. The kernel asks
    // for a capture each time the peak grows by 1/16, so the capture
    // holds at least 15/16 of the peak (all of it, unless the machine is
    // too busy to read the sites again before the last allocations).
    let held = process["peak_stacks_bytes"].as_u64().unwrap();
    assert!(
        (41 * MIB / 16 * 15..=41 * MIB).contains(&held),
        "{process:#}"
    );
    let peak_stacks = process["peak_stacks"].as_array().unwrap();
    assert_eq!(peak_stacks[0]["frames"][0]["function"], "site_spike");
    assert_eq!(peak_stacks[0]["live_bytes"], held - MIB);
    assert_eq!(peak_stacks[1]["frames"][0]["function"], "site_steady");
    assert_eq!(peak_stacks[1]["live_bytes"], MIB);
}

/// glibc's thread exit hands back its per-thread caches with free: blocks
/// it took without malloc's entry. They are its own, not unknown frees.
#[test]
fn sixty_four_threads_leave_no_unknown_frees() {
    let _serial = serial();
    let program = fixture("many_threads", "fp", frame_pointers());
    // Threads wait for a CPU between malloc and free: every block is
    // temporary only with a generous threshold.
    let (output, report) = trace_json(
        &["--live", "--temp-threshold", "1m"],
        &[program.to_str().unwrap()],
    );
    assert!(output.status.success(), "{output:?}");
    assert_nothing_lost(&report);
    assert_eq!(site(&report, "site_thread_loop").1, 64_000);
    assert_eq!(live_site(&report, "site_thread_loop"), (0, 0, 64_000, 0));
    let process = &processes_with(&report, "site_thread_loop")[0];
    assert_eq!(process["unknown_frees"], 0, "{process:#}");
    assert!(process["internal_frees"].as_u64().unwrap() >= 64);
}

/// (live bytes, live count, temporary count, untracked count) of the
/// stacks whose allocator is `allocator`, over all processes.
fn live_of_allocator(report: &Value, allocator: &str) -> (u64, u64, u64, u64) {
    let stacks = stacks_where(report, |stack| stack["allocator"] == allocator);
    let [bytes, count, temporary, untracked] = sum_fields(
        &stacks,
        [
            "live_bytes",
            "live_count",
            "temporary_count",
            "untracked_count",
        ],
    );
    (bytes, count, temporary, untracked)
}

/// What heap_patterns.cpp says it holds at exit: (blocks, bytes).
fn held_by_fixture(output: &std::process::Output) -> (u64, u64) {
    let stderr = String::from_utf8_lossy(&output.stderr);
    let line = stderr
        .lines()
        .find(|line| line.starts_with("live_blocks "))
        .unwrap_or_else(|| panic!("no live_blocks line in {stderr}"));
    let words: Vec<&str> = line.split_whitespace().collect();
    (words[1].parse().unwrap(), words[3].parse().unwrap())
}

/// Runs heap_patterns.cpp holding `blocks` under `trace --live` with
/// `extra` options: memprof's live figures for the fixture's two sites
/// (every C++ allocation, and its malloc'd arrays) are what it holds.
fn assert_heap_patterns_exact(blocks: u64, extra: &[&str]) {
    let program = fixture_cpp("heap_patterns", "fp", frame_pointers());
    let mut options = vec!["--live"];
    options.extend_from_slice(extra);
    let (output, report) = trace_json(&options, &[program.to_str().unwrap(), &blocks.to_string()]);
    assert!(output.status.success(), "{output:?}");
    let (held, held_bytes) = held_by_fixture(&output);
    assert_eq!(held, blocks);
    assert_nothing_lost(&report);
    // The program's own operator new is probed itself: its blocks are
    // under the callers of `new`, named "new".
    let new = live_of_allocator(&report, "new");
    let arrays = live_site(&report, "site_cpp_array");
    assert!(
        new.1 > blocks / 2 && arrays.1 > blocks / 20,
        "{new:?} {arrays:?}"
    );
    assert_eq!(
        (new.0 + arrays.0, new.1 + arrays.1, new.3 + arrays.3),
        (held_bytes, held, 0),
        "live bytes, blocks, untracked"
    );
    let process = &processes_with(&report, "site_cpp_array")[0];
    assert_eq!(process["untracked_count"], 0);
    assert_eq!(process["exited"], true);
}

/// Real heap addresses cluster (arenas, size classes), and a table
/// sized for random ones would lose blocks of a C++ program well below
/// --max-live. 0.9 x --max-live blocks of a std::map of strings, list
/// nodes, grown vectors and arrays: none lost, the figures exact.
#[test]
fn real_heap_patterns_below_max_live_lose_nothing() {
    let _serial = serial();
    assert_heap_patterns_exact(180_000, &["--max-live", "200000"]);
    assert_nothing_loaded();
}

/// Blocks whose window of the table is full go to the overflow map: with
/// a table far too small (a hidden option for tests), nearly every block
/// is there, and every figure stays exact: leaks.c's sites (realloc
/// chains, aligned blocks, frees in another thread, ages), two threads
/// freeing each other's blocks, a real C++ heap, an exited process's
/// blocks dropped, and --max-live counting both.
#[test]
fn blocks_beyond_their_window_go_to_the_overflow_map_and_stay_exact() {
    let _serial = serial();
    assert_leaks_exact(&["--live-slots", "1"]);
    assert_heap_patterns_exact(180_000, &["--max-live", "200000", "--live-slots", "4096"]);
    let program = leaks();
    let program = program.to_str().unwrap();
    let (output, report) = trace_json(
        &["--live", "--temp-threshold", "1h", "--live-slots", "1"],
        &[program, "churn"],
    );
    assert!(output.status.success(), "{output:?}");
    assert_eq!(live_site(&report, "site_churn"), (24 * 14, 14, 200_000, 0));
    assert_nothing_lost(&report);
    // The child's 8 blocks leave the overflow map when it exits: the
    // parent's 8 fit in --max-live 10.
    let (_, report) = trace_json(
        &["--live", "--max-live", "10", "--live-slots", "1"],
        &[program, "child"],
    );
    assert_eq!(live_site(&report, "site_child_leak"), (8 * 512, 8, 0, 0));
    assert_eq!(live_site(&report, "site_parent_leak"), (8 * 256, 8, 0, 0));
    assert_eq!(report["lost"]["live_table_full"], 0);
    // --max-live counts the blocks in both.
    let (_, report) = trace_json(
        &["--live", "--max-live", "10", "--live-slots", "1"],
        &[program, "fill", "50"],
    );
    assert_eq!(live_site(&report, "site_fill"), (640, 10, 0, 40));
    assert_eq!(report["lost"]["live_table_full"], 40);
    assert_nothing_loaded();
}

/// `trace` frees the heap slots of ended images (their exact heaps read),
/// so with 16 slots, 60 short processes in a row next to one that
/// allocates all along leave it its slot: no `heap_untracked`. Before,
/// slots were freed only by `monitor`, and once all had been taken each
/// new image took a running one's.
#[test]
fn trace_gives_the_heap_slots_of_ended_processes_to_new_ones() {
    let _serial = serial();
    let steady = fixture("steady", "tslots", &["-O2"]);
    let short = fixture("short", "tslots", &[]);
    let script = format!(
        "{} 3 30000 >/dev/null & i=0; while [ $i -lt 60 ]; do {}; i=$((i+1)); done; wait",
        steady.display(),
        short.display()
    );
    let (output, report) = trace_json(
        &["--live", "--heap-slots", "16"],
        &["/bin/sh", "-c", &script],
    );
    assert!(output.status.success(), "{output:?}");
    assert_eq!(report["lost"]["heap_untracked"], 0, "{}", report["lost"]);
    let shorts = report["processes"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|p| p["exe"].as_str().unwrap().ends_with("/short-tslots"))
        .count();
    assert_eq!(shorts, 60);
}
