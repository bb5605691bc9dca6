//! `memprof trace`: exact totals per call site for every allocator
//! function, threads, forks, exec'd children, short-lived processes.
use std::time::Duration;

use tests::*;

/// (site function, bytes, calls, allocator) in tests/fixtures/allocs.c.
const ALLOCS_SITES: [(&str, u64, u64, &str); 10] = [
    ("site_malloc", 10 * 100, 10, "malloc"),
    ("site_calloc", 7 * 3 * 40, 7, "calloc"),
    ("site_realloc_null", 4 * 300, 4, "realloc"),
    ("site_reallocarray", 3 * 6 * 50, 3, "reallocarray"),
    ("site_posix_memalign", 6 * 1000, 6, "posix_memalign"),
    // glibc's aligned_alloc is memalign under another name: one probe, named memalign.
    ("site_aligned_alloc", 2 * 2048, 2, "memalign"),
    ("site_memalign", 8 * 512, 8, "memalign"),
    ("site_valloc", 3 * 777, 3, "valloc"),
    ("site_pvalloc", 2 * 5000, 2, "pvalloc"),
    // site_realloc_grow: malloc(16) then realloc(.., 4096), 5 times.
    ("site_realloc_grow", 5 * 16 + 5 * 4096, 10, "malloc,realloc"),
];

fn check_allocs_report(report: &serde_json::Value) {
    for (function, bytes, count, allocators) in ALLOCS_SITES {
        let (got_bytes, got_count, got_allocators) = site(report, function);
        assert_eq!(
            (got_bytes, got_count),
            (bytes, count),
            "{function}: bytes and calls"
        );
        if !allocators.is_empty() {
            let mut expected: Vec<&str> = allocators.split(',').collect();
            expected.sort();
            let mut got = got_allocators.clone();
            got.sort();
            assert_eq!(got, expected, "{function}: allocator functions");
        }
    }
    let process = &processes_with(report, "site_malloc")[0];
    assert_eq!(
        process["bytes"].as_u64().unwrap(),
        ALLOCS_SITES.iter().map(|s| s.1).sum::<u64>()
    );
    assert!(process["exited"].as_bool().unwrap());
    assert!(
        process["exe"].as_str().unwrap().ends_with("/allocs-fp")
            || process["exe"].as_str().unwrap().ends_with("/allocs-nofp")
    );
}

#[test]
fn every_allocator_exact_with_frame_pointers() {
    let _serial = serial();
    let program = fixture("allocs", "fp", frame_pointers());
    let (output, report) = trace_json(&[], &[program.to_str().unwrap()]);
    assert_eq!(
        output.status.code(),
        Some(3),
        "memprof exits with the command's status"
    );
    check_allocs_report(&report);
    // With frame pointers the stack goes on past the site into main.
    let process = &processes_with(&report, "site_malloc")[0];
    let stack = &stacks_at(process, "site_malloc")[0];
    assert_eq!(stack["frames"][1]["function"], "main");
    assert!(stack["frames"][0]["file"]
        .as_str()
        .unwrap()
        .ends_with("allocs.c"));
    assert_eq!(stack["frames"][0]["line"], 13);
    assert_eq!(report["lost"]["map_full"], 0);
    assert_nothing_loaded();
}

#[test]
fn every_allocator_exact_without_frame_pointers() {
    let _serial = serial();
    let program = fixture("allocs", "nofp", no_frame_pointers());
    let (output, report) = trace_json(&[], &[program.to_str().unwrap()]);
    assert_eq!(output.status.code(), Some(3));
    // Frame 0 (the direct caller) is exact even when the walk beyond it fails.
    check_allocs_report(&report);
    assert_nothing_loaded();
}

#[test]
fn group_by_caller_sums_per_site() {
    let _serial = serial();
    let program = fixture("allocs", "fp", frame_pointers());
    let (_, report) = trace_json(&["--group-by", "caller"], &[program.to_str().unwrap()]);
    assert_eq!(report["group_by"], "caller");
    assert_eq!(
        site(&report, "site_malloc"),
        (1000, 10, vec!["malloc".to_string()])
    );
    // malloc and realloc sit on two lines of site_realloc_grow: two callers.
    let (bytes, count, allocators) = site(&report, "site_realloc_grow");
    assert_eq!((bytes, count), (5 * 16 + 5 * 4096, 10));
    assert_eq!(allocators.len(), 2);
    let process = &processes_with(&report, "site_malloc")[0];
    for stack in process["stacks"].as_array().unwrap() {
        assert_eq!(stack["frames"].as_array().unwrap().len(), 1);
    }
}

#[test]
fn exec_from_a_thread_after_the_main_thread_ended_is_a_new_image() {
    let _serial = serial();
    let program = fixture("threads", "fp", frame_pointers());
    // Sampled --live puts malloc under session links, which name the main
    // thread they were made for: the exec'ing thread's new image had no
    // breakpoint from them (none of site_after's calls seen) until memprof
    // linked it again. So is a child (linked at its fork).
    for mode in ["exec-from-thread", "child-exec-from-thread"] {
        for extra in [&[][..], &["--live", "--sample-bytes", "1"][..]] {
            exec_from_a_thread_after_the_main_thread_ended(&program, mode, extra);
        }
    }
    assert_nothing_loaded();
}

fn exec_from_a_thread_after_the_main_thread_ended(
    program: &std::path::Path,
    mode: &str,
    extra: &[&str],
) {
    let (output, report) = trace_json(extra, &[program.to_str().unwrap(), mode]);
    assert!(output.status.success());
    assert_eq!(
        site(&report, "site_before"),
        (3 * 16, 3, vec!["malloc".to_string()])
    );
    // The new image's calls are its own, symbolized with its own memory map.
    assert_eq!(
        site(&report, "site_after"),
        (7 * 72, 7, vec!["malloc".to_string()])
    );
    // The second thread, after the main thread's pthread_exit, loads a
    // library: its process's memory map, and the files it names, are read
    // again through it (/proc/PID/maps is empty then, /proc/PID/root
    // gone), and each of its stacks is whole: the one before that read
    // and the one after.
    assert_eq!(
        site(&report, "site_thread_before"),
        (2 * 32, 2, vec!["malloc".to_string()])
    );
    // It runs the image its main thread ran: one process.
    let before = processes_with(&report, "site_before");
    assert_eq!(processes_with(&report, "site_thread_before"), before);
    for stack in stacks_at(&before[0], "site_thread_before") {
        assert_whole_from(
            &stack,
            &["site_thread_before", "exec_later", "start_thread"],
        );
    }
    let after = processes_with(&report, "site_after");
    assert_eq!(after.len(), 1);
    assert!(processes_with(&report, "site_before")[0] != after[0]);
    // Held at the exec until linked again: nothing unseen.
    let lost = report["lost"].as_object().unwrap();
    assert!(lost.values().all(|n| n == 0), "{mode} {extra:?}: {lost:?}");
}

#[test]
fn two_threads() {
    let _serial = serial();
    let program = fixture("threads", "fp", frame_pointers());
    let (output, report) = trace_json(&[], &[program.to_str().unwrap()]);
    assert!(output.status.success());
    assert_eq!(site(&report, "site_thread_a").0, 1000 * 64 + 64 * 48);
    assert_eq!(site(&report, "site_thread_a").1, 1064);
    assert_eq!(
        site(&report, "site_thread_b"),
        (500 * 200, 500, vec!["calloc".to_string()])
    );
    assert_nothing_loaded();
}

#[test]
fn forked_child_is_followed_and_reported_separately() {
    let _serial = serial();
    let program = fixture("forks", "fp", frame_pointers());
    let (output, report) = trace_json(&[], &[program.to_str().unwrap()]);
    assert!(output.status.success());
    assert_eq!(
        site(&report, "site_parent"),
        (20 * 256, 20, vec!["malloc".to_string()])
    );
    assert_eq!(
        site(&report, "site_child"),
        (30 * 512, 30, vec!["malloc".to_string()])
    );
    let parent = &processes_with(&report, "site_parent")[0];
    let child = &processes_with(&report, "site_child")[0];
    assert_ne!(
        parent["pid"], child["pid"],
        "each process reported separately"
    );
    assert_nothing_loaded();
}

#[test]
fn shell_wrapper_and_short_lived_exec_child() {
    let _serial = serial();
    let program = fixture("allocs", "fp", frame_pointers());
    // The shell forks and execs the program, which lives a few milliseconds.
    let script = format!("{} ; exit 7", program.display());
    let (output, report) = trace_json(&[], &["sh", "-c", &script]);
    assert_eq!(output.status.code(), Some(7));
    // Symbolized although the process was gone long before the report.
    check_allocs_report(&report);
    assert_nothing_loaded();
}

#[test]
fn text_report_shows_sites_and_lost_counters() {
    let _serial = serial();
    let program = fixture("allocs", "fp", frame_pointers());
    let output = memprof(&[
        "trace",
        "--top",
        "3",
        "--depth",
        "2",
        "--",
        program.to_str().unwrap(),
    ]);
    let text = String::from_utf8_lossy(&output.stdout);
    assert!(text.contains("site_realloc_grow"), "{text}");
    assert!(text.contains("20,480 B"), "{text}");
    assert!(text.contains("lost events:"), "{text}");
    assert!(text.contains("3 shown"), "{text}");
    // --min-bytes hides the smaller stacks.
    let output = memprof(&[
        "trace",
        "--min-bytes",
        "10000",
        "--format",
        "json",
        "--",
        program.to_str().unwrap(),
    ]);
    let report = parse_report(&output);
    let process = &processes_with(&report, "site_realloc_grow")[0];
    assert!(process["stacks"]
        .as_array()
        .unwrap()
        .iter()
        .all(|s| s["bytes"].as_u64().unwrap() >= 10000));
    assert_nothing_loaded();
}

#[test]
fn short_lived_processes_are_symbolized_while_the_cpus_are_busy() {
    use std::sync::atomic::{AtomicBool, Ordering};
    let _serial = serial();
    let allocs = fixture("allocs", "fp", frame_pointers());
    let forks = fixture("forks", "fp", frame_pointers());
    // Every core busy: memprof cannot count on reading /proc before these
    // processes, which live well under a millisecond after their first
    // allocation, are gone.
    let stop = AtomicBool::new(false);
    /// Stops the spinners also when an assertion fails (else the scope
    /// would wait for them forever).
    struct StopOnDrop<'a>(&'a AtomicBool);
    impl Drop for StopOnDrop<'_> {
        fn drop(&mut self) {
            self.0.store(true, Ordering::Relaxed);
        }
    }
    std::thread::scope(|scope| {
        let _stop = StopOnDrop(&stop);
        for _ in 0..2 {
            scope.spawn(|| {
                while !stop.load(Ordering::Relaxed) {
                    std::hint::spin_loop();
                }
            });
        }
        for _ in 0..5 {
            let (_, report) = trace_json(&[], &[allocs.to_str().unwrap()]);
            assert_eq!(site(&report, "site_malloc").1, 10, "exec'd program");
            let (_, report) = trace_json(&[], &[forks.to_str().unwrap()]);
            assert_eq!(site(&report, "site_child").1, 30, "forked child");
        }
    });
    assert_nothing_loaded();
}

/// A child of the traced command that ran a child of its own, which has
/// ended, then execs a program: the kernel may have swapped the two
/// children's perf contexts at a context switch, and the program's calls
/// all went unprobed (10 runs in 12 before). And every frame lies in a
/// mapped module: the forked shell's C library went unnamed when /proc
/// was read while its old address space was torn down (its next image
/// already running): 3 runs in 30 before, none in 60 after.
#[test]
fn a_child_that_execs_after_a_child_of_its_own_ended_is_profiled() {
    let _serial = serial();
    let program = fixture("allocs", "fp", frame_pointers());
    let script = format!(
        "/bin/sh -c '/bin/true; /bin/sleep 0.05; exec {}' | cat",
        program.display()
    );
    for run in 0..16 {
        let (_, report) = trace_json(&[], &["/bin/sh", "-c", &script]);
        assert_eq!(site(&report, "site_malloc").1, 10, "run {run}");
    }
}

/// memprof killed with SIGKILL while it holds a process of the command
/// (stopped at its fork, exec or `dlopen` until its probes are in): its
/// watchdog lets the process go once memprof is gone, and exits. memprof
/// is stopped first, so that the next fork is surely held and never let
/// go by memprof itself. Before the watchdog the shell waited for good.
#[test]
fn a_process_memprof_held_runs_on_when_memprof_is_killed() {
    use nix::{
        sys::signal::{kill, Signal},
        unistd::Pid,
    };
    let _serial = serial();
    // Its stderr in a file: a pipe would be held open by the shell.
    let stderr_path =
        std::env::temp_dir().join(format!("memprof-killed-{}.err", std::process::id()));
    let traced = memprof_command(&[
        "trace",
        "--live",
        "--sample-bytes",
        "4096",
        "--",
        "/bin/sh",
        "-c",
        "while :; do /bin/true; done",
    ])
    .stdout(std::process::Stdio::null())
    .stderr(std::fs::File::create(&stderr_path).unwrap())
    .spawn()
    .unwrap();
    /// Whatever happens, nothing is left running or stopped: memprof, the
    /// shell (once known: memprof's children if not) and the shell's
    /// children (listed before any is killed).
    struct Cleanup {
        memprof: std::process::Child,
        shell: Option<u32>,
    }
    impl Drop for Cleanup {
        fn drop(&mut self) {
            let shells = match self.shell {
                Some(shell) => vec![shell],
                None => children_of(self.memprof.id()),
            };
            let _ = self.memprof.kill();
            let _ = self.memprof.wait();
            for shell in shells {
                let children = children_of(shell);
                for pid in std::iter::once(shell).chain(children) {
                    let _ = kill(Pid::from_raw(pid as i32), Signal::SIGKILL);
                }
            }
        }
    }
    let memprof_pid = traced.id();
    let mut run = Cleanup {
        memprof: traced,
        shell: None,
    };
    let wait_for = |what: &str, found: &dyn Fn() -> Option<u32>| -> u32 {
        let deadline = std::time::Instant::now() + Duration::from_secs(10);
        loop {
            if let Some(pid) = found() {
                return pid;
            }
            assert!(std::time::Instant::now() < deadline, "no {what} in 10 s");
            std::thread::sleep(Duration::from_millis(5));
        }
    };
    let child_named = |name: &str| {
        children_of(memprof_pid)
            .into_iter()
            .find(|&pid| comm_of(pid) == name)
    };
    let shell = wait_for("shell", &|| {
        child_named("sh").filter(|&pid| !children_of(pid).is_empty())
    });
    run.shell = Some(shell);
    let watchdog = child_named("memprof-wd").expect("the watchdog runs");
    kill(Pid::from_raw(memprof_pid as i32), Signal::SIGSTOP).unwrap();
    // Stopped for sure (every thread), so none lets a process go now.
    wait_for("stopped memprof", &|| {
        threads_of(memprof_pid)
            .into_iter()
            .all(|thread| state_of_thread(memprof_pid, thread) == Some('T'))
            .then_some(memprof_pid)
    });
    let held = wait_for("held process", &|| {
        children_of(shell)
            .into_iter()
            .find(|&pid| state_of(pid) == Some('T'))
    });
    run.memprof.kill().unwrap();
    run.memprof.wait().unwrap();
    let deadline = std::time::Instant::now() + Duration::from_secs(10);
    while state_of(held) == Some('T') || !matches!(state_of(watchdog), None | Some('Z')) {
        if std::time::Instant::now() > deadline {
            let stderr = std::fs::read_to_string(&stderr_path).unwrap_or_default();
            panic!(
                "10 s after memprof was killed: process {held} {:?}, the watchdog {:?}; \
                 memprof's stderr: {stderr}",
                state_of(held),
                state_of(watchdog)
            );
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    // The shell runs on.
    assert!(
        !matches!(state_of(shell), None | Some('T' | 'Z')),
        "{:?}",
        state_of(shell)
    );
    drop(run);
    let _ = std::fs::remove_file(&stderr_path);
    // The uprobe events memprof defined in tracefs outlive it; the next
    // memprof removes those of a memprof that is gone.
    let output = memprof(&["trace", "--", "/bin/true"]);
    assert!(output.status.success(), "{output:?}");
    assert_nothing_loaded();
}

fn threads_of(pid: u32) -> Vec<u32> {
    std::fs::read_dir(format!("/proc/{pid}/task"))
        .into_iter()
        .flatten()
        .flatten()
        .filter_map(|entry| entry.file_name().to_str()?.parse().ok())
        .collect()
}

fn state_of_thread(pid: u32, thread: u32) -> Option<char> {
    state_in(&format!("/proc/{pid}/task/{thread}/stat"))
}

/// Process `pid`'s children, from every process's parent.
fn children_of(pid: u32) -> Vec<u32> {
    std::fs::read_dir("/proc")
        .into_iter()
        .flatten()
        .flatten()
        .filter_map(|entry| entry.file_name().to_str()?.parse::<u32>().ok())
        .filter(|&child| parent_of(child) == Some(pid))
        .collect()
}

fn parent_of(pid: u32) -> Option<u32> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    stat[stat.rfind(')')? + 1..]
        .split_whitespace()
        .nth(1)?
        .parse()
        .ok()
}

fn comm_of(pid: u32) -> String {
    std::fs::read_to_string(format!("/proc/{pid}/comm"))
        .unwrap_or_default()
        .trim()
        .to_string()
}

/// The state letter in /proc/PID/stat; None once the process is gone.
fn state_of(pid: u32) -> Option<char> {
    state_in(&format!("/proc/{pid}/stat"))
}

/// The state letter in a stat file (after the name, which may hold
/// anything).
fn state_in(stat_path: &str) -> Option<char> {
    let stat = std::fs::read_to_string(stat_path).ok()?;
    stat[stat.rfind(')')? + 1..].trim_start().chars().next()
}

/// An interactive shell under `trace --live --sample-bytes` (session
/// links: what a linked process forks is held, stopped, until it is linked
/// too). At the fork its job is still in its process group and it is not
/// waiting yet, so the job was held; the shell, waiting with `WUNTRACED`
/// a moment later, printed "Stopped" and left it stopped: it never ran. A
/// parent that ignores SIGTSTP, as a job-control shell does, has its
/// children linked without the stop, each counted lost `fork_unheld`.
#[test]
fn an_interactive_shells_jobs_run_under_sampled_live() {
    use std::io::Write as _;
    let _serial = serial();
    let program = fixture("allocs", "fp", frame_pointers());
    let report_file = workspace_root().join("target/fixtures/interactive-shell.json");
    let _ = std::fs::remove_file(&report_file);
    // `--foreground`: timeout stays in the terminal's foreground process
    // group. Else, started by `sh -c` (script runs $SHELL, which a clean
    // environment lacks), it makes a group of its own in the background,
    // and bash -i stops that whole group, memprof too, with SIGTTIN until
    // it is in the foreground: a hang (as bash -i without memprof).
    let command = format!(
        "timeout --foreground -k 1 60 {} trace --live --sample-bytes 1 --format json -o {} \
         -- bash --norc --noprofile -i",
        memprof_bin().display(),
        report_file.display()
    );
    // `script` gives the shell a terminal: job control is on.
    let mut script = std::process::Command::new("script")
        .args(["-qec", &command, "/dev/null"])
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::piped())
        .spawn()
        .expect("script (util-linux)");
    let mut typed = script.stdin.take().unwrap();
    // Each job waits in a subshell until it is linked (its calls until
    // then go unseen, counted `fork_unheld`: a job that allocates at once
    // raced memprof for them, and lost on a loaded host; 0.3 s lost one
    // run in eight here with the whole suite running), then runs the
    // program in its place.
    let job = format!("(sleep 1; exec {})", program.display());
    for line in [&job[..], &job, "exit"] {
        std::thread::sleep(Duration::from_millis(1500));
        // (A shell gone already fails the test below, with its output.)
        let _ = writeln!(typed, "{line}");
    }
    let output = script.wait_with_output().unwrap();
    let terminal = String::from_utf8_lossy(&output.stdout);
    assert!(!terminal.contains("Stopped"), "{terminal}");
    let report: serde_json::Value =
        tests::report_json(&std::fs::read_to_string(&report_file).expect(&terminal));
    // Both jobs ran. A job's program is not held at its exec (the shell
    // would see the stop): where its probes came in after it had started
    // allocating, its first calls went unseen and it is counted
    // `probed_late`. Every other job's calls are all seen (sampled at each
    // byte: exact): the fixture makes 55, 10 of them 100 bytes at
    // site_malloc.
    let lost = &report["lost"];
    let jobs = processes_with(&report, "site_malloc");
    assert_eq!(jobs.len(), 2, "{lost}");
    let mut cut_short = 0;
    for job in &jobs {
        let calls = job["count"].as_u64().unwrap();
        assert!(calls <= 55, "{calls} calls, {lost}");
        if calls < 55 {
            cut_short += 1;
            continue;
        }
        let at_site = stacks_at(job, "site_malloc");
        let at_site: Vec<&serde_json::Value> = at_site.iter().collect();
        assert_eq!(
            sum_fields(&at_site, ["bytes", "count"]),
            [10 * 100, 10],
            "{lost}"
        );
    }
    assert!(
        cut_short <= lost["probed_late"].as_u64().unwrap(),
        "{cut_short} cut short, {lost}"
    );
    assert_eq!(lost["fork_unheld"], 2, "{lost}");
    assert_nothing_loaded();
}

/// `trace` stops a process at its loader until its code's tables and
/// probes are in. A parent that waits for its children's stops takes that
/// for a stop of its own: su, runuser and sudo stop themselves (the trace
/// hung: `trace -- runuser -u root -- CMD` never ended), a job-control
/// shell prints "Stopped" and takes the terminal back. A child in a process
/// group of its own (a shell's job) is not stopped; one whose parent takes
/// the stop as its own, with nothing watching that parent's stops, is, and
/// is let go through its parent (continued, it continues the child).
#[test]
fn a_parent_watching_its_childs_stops_is_not_fooled_nor_left_stopped() {
    let _serial = serial();
    let watcher = fixture("stop_watcher", "plain", &[]);
    let program = fixture("allocs", "fp", frame_pointers());
    let (watcher, program) = (watcher.to_str().unwrap(), program.to_str().unwrap());
    // A hang fails the test instead of stalling it.
    let within_a_minute = ["timeout", "-k", "1", "60"];
    // Walks cut for want of tables, or allocators probed after calls.
    let partial = |report: &serde_json::Value| {
        (
            report["lost"]["unwind_no_info"].as_u64().unwrap(),
            report["lost"]["probed_late"].as_u64().unwrap(),
        )
    };
    // "signal wait": sudo running su, each stopping itself for its
    // child's stop (the outer one was left stopped: a hang).
    for mode in ["wait", "job", "signal", "poll", "signal wait"] {
        let watchers = mode.split(' ').flat_map(|mode| [watcher, mode]);
        let command: Vec<&str> = within_a_minute
            .into_iter()
            .chain(watchers)
            .chain([program])
            .collect();
        let (output, report) = trace_json(&[], &command);
        let stderr = String::from_utf8_lossy(&output.stderr);
        assert_eq!(output.status.code(), Some(3), "{mode}: {stderr}");
        check_allocs_report(&report);
        if mode == "job" {
            // Its shell would print "Stopped": not held.
            assert!(stderr.contains("stops seen: 0"), "{mode}: {stderr}");
        } else {
            // Nothing watches the parent's own stops: the child is held
            // (its stacks whole) and let go through its parent.
            assert_eq!(partial(&report), (0, 0), "{mode}: {}", report["lost"]);
        }
    }
    // The real ones (util-linux, as su): their command's counts exact and
    // stacks whole; python loads a dozen modules in quick succession, each
    // held (a SIGCONT of su's coming late cancelled the next hold).
    let command = [
        &within_a_minute[..],
        &["runuser", "-u", "root", "--", program],
    ]
    .concat();
    let (output, report) = trace_json(&[], &command);
    assert_eq!(
        output.status.code(),
        Some(3),
        "{}",
        String::from_utf8_lossy(&output.stderr)
    );
    check_allocs_report(&report);
    assert_eq!(partial(&report), (0, 0), "{}", report["lost"]);
    let imports = "import json, decimal, ctypes, sqlite3, ssl, hashlib, zlib, bz2, \
                   lzma, csv, socket, select, array, datetime, pickle, uuid, asyncio";
    let python = [
        "runuser",
        "-u",
        "root",
        "--",
        "/usr/bin/python3",
        "-c",
        imports,
    ];
    let (output, report) = trace_json(&[], &[&within_a_minute[..], &python].concat());
    assert!(
        output.status.success(),
        "{}",
        String::from_utf8_lossy(&output.stderr)
    );
    assert_eq!(partial(&report), (0, 0), "{}", report["lost"]);
    assert_nothing_loaded();
}
