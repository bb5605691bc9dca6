//! Which processes `memprof monitor` watches: those named by --comm, --exe
//! or --cgroup, running at its start or started later, while others never
//! trap; a program upgraded or replaced at its path; a process whose main
//! thread has ended; a --while function found in a program started later.
use std::{
    io::Write as _,
    process::{Command, Stdio},
    time::{Duration, Instant},
};

use tests::{monitor::*, *};

/// Hits of memprof's uprobes so far (tracefs's uprobe_profile).
fn memprof_probe_hits() -> u64 {
    std::fs::read_to_string("/sys/kernel/tracing/uprobe_profile")
        .unwrap_or_default()
        .lines()
        .filter(|line| line.contains("memprof"))
        .filter_map(|line| line.split_whitespace().last()?.parse::<u64>().ok())
        .sum()
}

#[test]
fn a_process_started_after_the_monitor_is_watched_and_others_never_trap() {
    let _serial = serial();
    let program = fixture("waiter", "late", frame_pointers());
    let port = free_port();
    // Nothing of that name runs yet: the probes are in, scoped to no one.
    let monitor = start_monitor(&["--comm", "^waiter-late$"], port);
    let other = Command::new("/usr/bin/python3")
        .args(["-c", "x = [str(i) for i in range(100000)]"])
        .status()
        .unwrap();
    assert!(other.success());
    assert_eq!(memprof_probe_hits(), 0, "an unwatched process trapped");
    let mut waiter = spawn_waiter(&program);
    let pid = waiter.id();
    // The exec's notice makes it watched within milliseconds.
    std::thread::sleep(Duration::from_millis(300));
    writeln!(waiter.stdin.as_mut().unwrap()).unwrap();
    // Exact from its watching on: what it allocated before (5 x 256 B at
    // its start) is seen or not, as the race with the notice goes.
    let expected = format!(
        "memprof_site_allocated_bytes_total{{pid=\"{pid}\",comm=\"waiter-late\",function=\"site_after_attach\",file=\"{}\",line=\"13\"}} 40960\n",
        workspace_root().join("tests/fixtures/waiter.c").display()
    );
    let deadline = Instant::now() + Duration::from_secs(10);
    let metrics = loop {
        let text = get(&format!("http://127.0.0.1:{port}/metrics"))
            .text()
            .unwrap();
        if text.contains(&expected) || Instant::now() > deadline {
            break text;
        }
        std::thread::sleep(Duration::from_millis(100));
    };
    assert!(metrics.contains(&expected), "{metrics}");
    // What it allocated unseen is said: lost `probed_late`, once for it
    // (it maps its C library by the time its probes are all in).
    let early = format!("pid=\"{pid}\",comm=\"waiter-late\",function=\"site_before_attach\"");
    let early_bytes: f64 = metrics
        .lines()
        .filter(|line| line.contains(&early))
        .filter_map(|line| line.rsplit(' ').next()?.parse::<f64>().ok())
        .sum();
    let late = metric(&metrics, "memprof_lost_events_total{cause=\"probed_late\"}");
    eprintln!(
        "seen before the watching on: {} B of 1280; probed_late {late}",
        early_bytes as u64
    );
    assert!(late <= 1.0, "{metrics}");
    if early_bytes < 1280.0 {
        assert_eq!(late, 1.0, "calls went unseen, unsaid: {metrics}");
    }
    drop(waiter.stdin.take());
    waiter.wait().unwrap();
    let report = stop(monitor);
    assert!(report.contains("site_after_attach"), "{report}");
}

/// `--exe` selects a program's processes, running and started later; one
/// that runs the program as it was before an upgrade replaced the file
/// (its /proc/PID/exe reads "PATH (deleted)") is still that program's,
/// and is profiled through the file it maps.
#[test]
fn an_executable_selects_its_processes_also_those_running_it_from_before_an_upgrade() {
    let _serial = serial();
    let built = fixture("waiter", "exe", frame_pointers());
    let dir = std::env::temp_dir().join(format!("memprof-exe-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let program = dir.join("waiter-exe");
    std::fs::copy(&built, &program).unwrap();
    let mut before = spawn_waiter(&program);
    // Once it runs: its program is the file it exec'd.
    while !std::fs::read_link(format!("/proc/{}/exe", before.id())).is_ok_and(|exe| exe == program)
    {
        std::thread::sleep(Duration::from_millis(10));
    }
    // The upgrade.
    std::fs::remove_file(&program).unwrap();
    std::fs::copy(&built, &program).unwrap();
    let port = free_port();
    let monitor = start_monitor(&["--exe", program.to_str().unwrap()], port);
    let mut after = spawn_waiter(&program);
    // The exec's notice makes it watched within milliseconds.
    std::thread::sleep(Duration::from_millis(300));
    for waiter in [&mut before, &mut after] {
        writeln!(waiter.stdin.as_mut().unwrap()).unwrap();
    }
    let mut series: Vec<String> = [before.id(), after.id()]
        .map(|pid| waiter_site_series(pid, "waiter-exe"))
        .into();
    let metrics = metrics_once_they_contain(port, &series[1]);
    let metrics = match metrics.contains(&series[0]) {
        true => metrics,
        false => metrics_once_they_contain(port, &series[0]),
    };
    for waiter in [&mut before, &mut after] {
        drop(waiter.stdin.take());
        waiter.wait().unwrap();
    }
    stop(monitor);
    std::fs::remove_dir_all(&dir).unwrap();
    // Named as the program it runs, upgraded or not: one series a process.
    for pid in [before.id(), after.id()] {
        series.push(format!(
            "memprof_allocations_total{{pid=\"{pid}\",comm=\"waiter-exe\",exe=\"{}\"}}",
            program.display()
        ));
    }
    for series in series {
        assert!(metrics.contains(&series), "{series} in:\n{metrics}");
    }
}

/// A process whose main thread has ended (pthread_exit) while a thread
/// runs on, running when the monitor starts, is selected by its
/// executable: /proc/PID/exe goes with the main thread (as its root does,
/// and /proc/PID/cgroup then reads the hierarchies' roots), and such a
/// process was never selected; it is read through the live thread now.
#[test]
fn a_process_whose_main_thread_ended_is_selected_by_its_executable() {
    let _serial = serial();
    let program = fixture("waiter", "lone", frame_pointers());
    let mut target = spawn_waiter_with(&program, &["from-a-thread"]);
    wait_for_main_thread_end(target.id());
    let port = free_port();
    let monitor = start_monitor(&["--exe", program.to_str().unwrap()], port);
    writeln!(target.stdin.as_mut().unwrap()).unwrap();
    let series = waiter_site_series(target.id(), "waiter-lone");
    let metrics = metrics_once_they_contain(port, &series);
    drop(target.stdin.take());
    target.wait().unwrap();
    stop(monitor);
    assert!(metrics.contains(&series), "{series} in:\n{metrics}");
}

/// A program replaced at its path while memprof runs (an upgrade): a
/// process started after runs the new file, named from its own symbols.
/// The symbol caches were keyed by path: the new program's frames took
/// the names the old one had at the same offsets.
#[test]
fn a_program_replaced_at_its_path_is_named_from_the_new_file() {
    let _serial = serial();
    let old = fixture("waiter", "swap-old", frame_pointers());
    // The same code, the site renamed: its offsets are the old one's.
    let new = fixture(
        "waiter",
        "swap-new",
        &[
            "-fno-omit-frame-pointer",
            "-Dsite_after_attach=site_renamed",
        ],
    );
    let dir = std::env::temp_dir().join(format!("memprof-swap-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let program = dir.join("waiter-swap");
    std::fs::copy(&old, &program).unwrap();
    let port = free_port();
    let monitor = start_monitor(&["--comm", "^waiter-swap$"], port);
    for (build, function) in [(&old, "site_after_attach"), (&new, "site_renamed")] {
        // The upgrade: a new file at the path.
        let _ = std::fs::remove_file(&program);
        std::fs::copy(build, &program).unwrap();
        let mut waiter = spawn_waiter(&program);
        std::thread::sleep(Duration::from_millis(300));
        writeln!(waiter.stdin.as_mut().unwrap()).unwrap();
        let series = format!(
            "memprof_site_allocated_bytes_total{{pid=\"{}\",comm=\"waiter-swap\",function=\"{function}\",file=\"{}\",line=\"13\"}} 40960\n",
            waiter.id(),
            workspace_root().join("tests/fixtures/waiter.c").display()
        );
        let metrics = metrics_once_they_contain(port, &series);
        drop(waiter.stdin.take());
        waiter.wait().unwrap();
        assert!(metrics.contains(&series), "{series} in:\n{metrics}");
    }
    stop(monitor);
    std::fs::remove_dir_all(&dir).unwrap();
}

#[test]
fn a_cgroup_selects_the_processes_in_it_started_later_too() {
    let _serial = serial();
    let program = fixture("waiter", "cgroup", frame_pointers());
    let cgroup = ContainerCgroup::new();
    let port = free_port();
    let monitor = start_monitor(&["--cgroup", cgroup.0.to_str().unwrap()], port);
    // One joins the cgroup, then runs the waiter; one stays out.
    let mut inside = Command::new("/bin/sh")
        .args(["-c", r#"echo $$ > "$1/cgroup.procs" && exec "$2""#, "sh"])
        .arg(&cgroup.0)
        .arg(&program)
        .stdin(Stdio::piped())
        .spawn()
        .unwrap();
    let mut outside = spawn_waiter(&program);
    std::thread::sleep(Duration::from_millis(500));
    for waiter in [&mut inside, &mut outside] {
        writeln!(waiter.stdin.as_mut().unwrap()).unwrap();
    }
    let site = |pid: u32| {
        format!(
            "memprof_site_allocated_bytes_total{{pid=\"{pid}\",comm=\"waiter-cgroup\",function=\"site_after_attach\""
        )
    };
    let metrics = metrics_once_they_contain(port, &site(inside.id()));
    assert!(metrics.contains(&site(inside.id())), "{metrics}");
    assert!(
        !metrics.contains(&format!("pid=\"{}\"", outside.id())),
        "{metrics}"
    );
    stop(monitor);
    for mut waiter in [inside, outside] {
        drop(waiter.stdin.take());
        waiter.wait().unwrap();
    }
}

/// A `--while` function in no file mapped at the start (the program
/// selected starts later) was an error ("not found", searched memprof's
/// own files): it is looked for in the files of the processes selected.
#[test]
fn a_while_function_is_looked_for_in_the_processes_selected_later() {
    let _serial = serial();
    let program = fixture("steady", "later", &["-O2"]);
    let port = free_port();
    let (monitor, said) = start_monitor_saying(
        &[
            "--comm",
            "^steady-later$",
            "--while",
            "region_batch",
            "--format",
            "json",
        ],
        port,
    );
    assert!(
        said.contains("region_batch: in no file mapped now"),
        "{said}"
    );
    let output = Command::new(&program)
        .args(["0.5", "2000", "0", "regions"])
        .output()
        .unwrap();
    assert!(output.status.success());
    let inside: u64 = String::from_utf8(output.stdout)
        .unwrap()
        .trim()
        .parse()
        .unwrap();
    let report: serde_json::Value = tests::report_json(&stop(monitor));
    assert_eq!(report["exact"], true);
    let process = report["processes"]
        .as_array()
        .unwrap()
        .iter()
        .find(|p| p["command"] == "steady-later")
        .unwrap_or_else(|| panic!("not profiled: {report}"));
    for stack in process["stacks"].as_array().unwrap() {
        assert_eq!(stack["frames"][0]["function"], "site_in_region", "{stack}");
    }
    // Its probes go in as it starts, unheld: its first batch may start
    // before them.
    let count = process["count"].as_u64().unwrap();
    assert!(count > 0 && count <= inside, "{count} of {inside} inside");
}
