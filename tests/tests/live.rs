//! `--live`: blocks paired with their frees; what is still allocated at
//! exit, per stack, exactly (tests/fixtures/leaks.c).
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
    let program = leaks();
    // 100 ms: the fixture frees its temporaries at once and its slow
    // blocks after 300 ms; a busy machine stays well inside both.
    let (output, report) = trace_json(
        &["--live", "--temp-threshold", "100ms"],
        &[program.to_str().unwrap()],
    );
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
    assert_nothing_loaded();
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
