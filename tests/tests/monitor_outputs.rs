//! What `memprof monitor` serves and writes: /metrics scraped by a real
//! Prometheus and /debug/pprof/allocs and /heap read by go tool pprof, on
//! loopback (exact figures of the waiter fixture: 40 x 1,024 B at
//! site_after_attach once it reads a line); /healthz; reports written to a
//! directory kept within limits; a view like top on a terminal; and the
//! one-line errors when it cannot start.
use std::{
    io::Write as _,
    net::TcpListener,
    process::{Command, Stdio},
    time::{Duration, Instant},
};

use tests::{monitor::*, *};

#[test]
fn prometheus_scrapes_the_metrics_and_go_tool_pprof_reads_the_profiles() {
    let _serial = serial();
    let program = fixture("waiter", "monitor", frame_pointers());
    let port = free_port();
    // Selected by name (the fixture's comm is its file name), started
    // after the monitor.
    let monitor = start_monitor(&["--comm", "^waiter-monitor$", "--live"], port);
    let mut waiter = spawn_waiter(&program);
    std::thread::sleep(Duration::from_millis(300));
    writeln!(waiter.stdin.as_mut().unwrap()).unwrap();
    let pid = waiter.id();
    let base = format!("http://127.0.0.1:{port}");
    // Exact once the waiter has allocated.
    let deadline = Instant::now() + Duration::from_secs(20);
    let metrics = loop {
        let response = get(&format!("{base}/metrics"));
        assert_eq!(
            response.headers()["content-type"],
            "text/plain; version=0.0.4; charset=utf-8"
        );
        let text = response.text().unwrap();
        if text.contains("line=\"13\"} 40960\n") || Instant::now() > deadline {
            break text;
        }
        std::thread::sleep(Duration::from_millis(100));
    };
    let who = format!("pid=\"{pid}\",comm=\"waiter-monitor\"");
    assert!(
        metrics.contains(&format!("memprof_allocated_bytes_total{{{who},")),
        "{metrics}"
    );
    assert!(metrics.contains(&format!(
        "memprof_site_allocated_bytes_total{{{who},function=\"site_after_attach\""
    )));
    // What every exporter says of itself, and which build this is.
    for own in [
        "\nprocess_cpu_seconds_total ",
        "\nprocess_resident_memory_bytes ",
        "\nmemprof_build_info{version=\"",
    ] {
        assert!(metrics.contains(own), "{own}: {metrics}");
    }
    assert_eq!(get(&format!("{base}/healthz")).text().unwrap(), "ok\n");
    assert_eq!(get(&format!("{base}/debug/pprof/block")).status(), 404);
    for bad in ["x", "0", "301"] {
        assert_eq!(
            get(&format!("{base}/debug/pprof/allocs?seconds={bad}")).status(),
            400
        );
    }

    // A real Prometheus, on loopback, scraping every second.
    let dir = workspace_root().join("target/fixtures/prometheus");
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    let prometheus = Prometheus::start(
        &dir,
        &format!(
            "  - job_name: memprof\n    static_configs:\n      - targets: ['127.0.0.1:{port}']\n"
        ),
    );
    // Exact at the call site it uses once memprof watches it (what it
    // allocated at its start is seen or not, as the race with the exec's
    // notice goes).
    let value = prometheus.value_of(&format!(
        "memprof_site_allocated_bytes_total%7Bpid%3D%22{pid}%22%2Cfunction%3D%22site_after_attach%22%7D"
    ));
    drop(prometheus);
    assert_eq!(value.as_deref(), Some("40960"), "Prometheus's answer");

    // go tool pprof reads both profiles from their URLs.
    for (path, index, expected) in [
        ("allocs", "alloc_space", "40kB"),
        ("heap", "alloc_space", "40kB"),
        ("heap", "inuse_space", ""),
    ] {
        let output = Command::new("go")
            .args(["tool", "pprof", "-top", &format!("-sample_index={index}")])
            .arg(format!("{base}/debug/pprof/{path}?pid={pid}"))
            .env("HOME", workspace_root().join("target/fixtures"))
            .output()
            .unwrap();
        let text = String::from_utf8_lossy(&output.stdout);
        assert!(output.status.success(), "{path}: {output:?}");
        if !expected.is_empty() {
            assert!(
                text.lines().any(
                    |l| l.contains("site_after_attach") && l.trim_start().starts_with(expected)
                ),
                "{path} {index}: {text}"
            );
        }
    }

    // ?seconds=N: what was allocated over the next N seconds, as Go's
    // delta profiles (the waiter allocated before: nothing of its);
    // ?comm=NAME: that name's processes only.
    for (query, shown) in [
        ("seconds=1", false),
        ("comm=waiter-monitor", true),
        ("comm=nobody", false),
    ] {
        let output = Command::new("go")
            .args(["tool", "pprof", "-top", "-sample_index=alloc_space"])
            .arg(format!("{base}/debug/pprof/allocs?{query}"))
            .env("HOME", workspace_root().join("target/fixtures"))
            .output()
            .unwrap();
        assert!(output.status.success(), "{query}: {output:?}");
        let text = String::from_utf8_lossy(&output.stdout);
        assert_eq!(text.contains("site_after_attach"), shown, "{query}: {text}");
    }

    drop(waiter.stdin.take());
    waiter.wait().unwrap();
    let report = stop(monitor);
    assert!(report.contains("site_after_attach"), "{report}");
}

#[test]
fn the_heap_profile_needs_live_mode_and_the_monitor_outlives_its_processes() {
    let _serial = serial();
    let program = fixture("waiter", "monitor", frame_pointers());
    let mut waiter = spawn_waiter(&program);
    let port = free_port();
    let monitor = start_monitor(&["--pid", &waiter.id().to_string()], port);
    let heap = get(&format!("http://127.0.0.1:{port}/debug/pprof/heap"));
    assert_eq!(heap.status(), 404);
    assert!(heap.text().unwrap().contains("--live"));
    drop(waiter.stdin.take());
    waiter.wait().unwrap();
    // It runs until a signal, its processes gone or not.
    std::thread::sleep(Duration::from_millis(300));
    assert_eq!(
        get(&format!("http://127.0.0.1:{port}/healthz"))
            .text()
            .unwrap(),
        "ok\n"
    );
    stop(monitor);
}

#[test]
fn nothing_to_watch_or_a_taken_port_is_a_one_line_error() {
    let _serial = serial();
    // A cgroup that is not there; a name nothing has yet is waited for.
    let output = memprof(&[
        "monitor",
        "--cgroup",
        "/sys/fs/cgroup/memprof-no-such-group",
    ]);
    assert_one_line_error(&output, 2, "no such cgroup");
    let output = memprof(&["monitor", "--cgroup", "system.slice"]);
    assert_one_line_error(&output, 2, "--cgroup system.slice: give the cgroup's path");
    let output = memprof(&["monitor", "--usdt"]);
    assert_one_line_error(&output, 2, "--usdt needs the processes named");
    let taken = TcpListener::bind("127.0.0.1:0").unwrap();
    let address = taken.local_addr().unwrap().to_string();
    let output = memprof(&["monitor", "--pid", "1", "--listen", &address]);
    // Not 2 (a bad option): a service manager may try again.
    assert_one_line_error(&output, 75, &format!("cannot listen on {address}"));
}

#[test]
fn reports_go_to_a_directory_kept_within_limits_on_sighup_and_at_the_end() {
    let _serial = serial();
    let program = fixture("waiter", "monitor", frame_pointers());
    let mut waiter = spawn_waiter(&program);
    let dir = workspace_root().join("target/fixtures/monitor-out");
    let _ = std::fs::remove_dir_all(&dir);
    let port = free_port();
    let monitor = start_monitor(
        &[
            "--pid",
            &waiter.id().to_string(),
            "--out",
            dir.to_str().unwrap(),
            "--interval",
            "0.2",
            "--out-keep",
            "3",
        ],
        port,
    );
    writeln!(waiter.stdin.as_mut().unwrap()).unwrap();
    let files = || -> Vec<std::path::PathBuf> {
        let mut files: Vec<_> = std::fs::read_dir(&dir)
            .unwrap()
            .map(|e| e.unwrap().path())
            .collect();
        files.sort();
        files
    };
    std::thread::sleep(Duration::from_millis(1500));
    assert_eq!(files().len(), 3, "{:?}", files());
    // SIGHUP (logrotate, systemctl reload) writes one at once and does not
    // end memprof.
    let newest = files().last().cloned();
    nix::sys::signal::kill(
        nix::unistd::Pid::from_raw(monitor.id() as i32),
        nix::sys::signal::Signal::SIGHUP,
    )
    .unwrap();
    std::thread::sleep(Duration::from_millis(100));
    assert_ne!(files().last().cloned(), newest);
    drop(waiter.stdin.take());
    waiter.wait().unwrap();
    stop(monitor);
    // The last snapshot, exact.
    let last = files().pop().unwrap();
    assert!(last.to_str().unwrap().ends_with(".json"));
    let report: serde_json::Value = tests::report_json(&std::fs::read_to_string(&last).unwrap());
    assert_eq!(report["processes"][0]["bytes"], 40 * 1024);
    assert!(files().len() <= 3);
}

#[test]
fn on_a_terminal_a_view_like_top_is_redrawn() {
    let _serial = serial();
    let program = fixture("waiter", "monitor", frame_pointers());
    let mut waiter = spawn_waiter(&program);
    let port = free_port();
    // `script` gives memprof a terminal; timeout ends it with SIGTERM.
    let command = format!(
        "timeout -s TERM 3 {} monitor --exact --pid {} --interval 0.3 --listen 127.0.0.1:{port}",
        memprof_bin().display(),
        waiter.id()
    );
    let view = Command::new("script")
        .args(["-qfec", &command, "/dev/null"])
        .stdout(Stdio::piped())
        .spawn()
        .unwrap();
    // Once it is attached (it serves then), the waiter allocates.
    let deadline = Instant::now() + Duration::from_secs(10);
    while reqwest::blocking::get(format!("http://127.0.0.1:{port}/healthz")).is_err() {
        assert!(Instant::now() < deadline, "memprof monitor did not start");
        std::thread::sleep(Duration::from_millis(50));
    }
    writeln!(waiter.stdin.as_mut().unwrap()).unwrap();
    let output = view.wait_with_output().unwrap();
    let screen = String::from_utf8_lossy(&output.stdout);
    assert!(screen.contains("\x1b[H\x1b[2J"), "{screen}");
    assert!(screen.contains("memprof monitor"), "{screen}");
    assert!(screen.contains("PID  COMMAND"), "{screen}");
    assert!(screen.contains("waiter-monitor"), "{screen}");
    assert!(screen.contains("site_after_attach (waiter.c:"), "{screen}");
    drop(waiter.stdin.take());
    waiter.wait().unwrap();
    assert_nothing_loaded();
}

/// --out-interval and --retention each say one of the things --interval
/// sets when they are not given.
#[test]
fn out_interval_and_retention_override_the_interval() {
    let _serial = serial();
    let program = fixture("waiter", "monitor", frame_pointers());
    let mut waiter = spawn_waiter(&program);
    let dir = workspace_root().join("target/fixtures/monitor-out-interval");
    let _ = std::fs::remove_dir_all(&dir);
    let port = free_port();
    let monitor = start_monitor(
        &[
            "--pid",
            &waiter.id().to_string(),
            "--out",
            dir.to_str().unwrap(),
            "--interval",
            "30",
            "--out-interval",
            "0.2",
            "--retention",
            "7",
        ],
        port,
    );
    writeln!(waiter.stdin.as_mut().unwrap()).unwrap();
    std::thread::sleep(Duration::from_millis(1500));
    // Every 0.2 s, not every 30 s.
    let written = std::fs::read_dir(&dir).unwrap().count();
    assert!(written >= 4, "{written} reports in 1.5 s");
    drop(waiter.stdin.take());
    waiter.wait().unwrap();
    stop(monitor);
    let mut files: Vec<_> = std::fs::read_dir(&dir)
        .unwrap()
        .map(|e| e.unwrap().path())
        .collect();
    files.sort();
    let report: serde_json::Value =
        tests::report_json(&std::fs::read_to_string(files.last().unwrap()).unwrap());
    assert_eq!(
        report["limits"]["retention_secs"], 7.0,
        "{}",
        report["limits"]
    );
    assert_eq!(report["processes"][0]["bytes"], 40 * 1024);
}

/// The Grafana dashboard in packaging/ queries only series memprof
/// serves: every metric name in its expressions is on /metrics, of a
/// monitor under its budget or of one with --live.
#[test]
fn the_grafana_dashboard_uses_the_metrics_memprof_serves() {
    let _serial = serial();
    let dashboard: serde_json::Value = serde_json::from_str(
        &std::fs::read_to_string(workspace_root().join("packaging/grafana-dashboard.json"))
            .unwrap(),
    )
    .unwrap();
    let mut used = std::collections::BTreeSet::new();
    for panel in dashboard["panels"].as_array().unwrap() {
        for target in panel["targets"].as_array().unwrap() {
            let expr = target["expr"].as_str().unwrap();
            used.extend(
                expr.split(|c: char| !(c.is_ascii_lowercase() || c == '_'))
                    .filter(|word| word.starts_with("memprof_") || word.starts_with("process_"))
                    .map(str::to_string),
            );
        }
    }
    assert!(used.len() >= 12, "{used:?}");
    let program = fixture("waiter", "monitor", frame_pointers());
    let mut served = String::new();
    // The tests' monitors count exactly unless given a budget.
    for (extra, needle) in [
        (
            &["--max-overhead", "1"][..],
            "# TYPE memprof_duty_cycle_ratio",
        ),
        (&["--live"], "memprof_site_live_bytes{"),
    ] {
        let mut waiter = spawn_waiter(&program);
        let port = free_port();
        let pid = waiter.id().to_string();
        let mut args = vec!["--pid", pid.as_str()];
        args.extend_from_slice(extra);
        let monitor = start_monitor(&args, port);
        writeln!(waiter.stdin.as_mut().unwrap()).unwrap();
        metrics_once_they_contain(port, "site_after_attach");
        served.push_str(&metrics_once_they_contain(port, needle));
        drop(waiter.stdin.take());
        waiter.wait().unwrap();
        stop(monitor);
    }
    for name in &used {
        assert!(
            served.contains(&format!("# TYPE {name} ")),
            "{name} is not served"
        );
    }
}
