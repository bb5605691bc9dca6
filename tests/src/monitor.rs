//! Running `memprof monitor` for the tests of tests/tests/monitor_*.rs:
//! started on a free loopback port, its endpoints read, ended with
//! SIGTERM; the figures it serves and reports picked out.
use std::{
    io::{BufRead as _, BufReader},
    net::TcpListener,
    process::{Child, Stdio},
    time::{Duration, Instant},
};

use crate::{assert_nothing_loaded, memprof_command, workspace_root};

/// A port free on loopback now.
pub fn free_port() -> u16 {
    TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port()
}

/// A running `memprof monitor`, ended with SIGTERM by [`stop`], or killed
/// if a test fails first (it would stay attached for the next tests).
pub struct Monitor(Option<Child>);

impl Drop for Monitor {
    fn drop(&mut self) {
        if let Some(mut child) = self.0.take() {
            // SIGTERM, so that memprof takes its probes out (a kill would
            // leave its tracefs events to fail the next test); SIGKILL if
            // it does not end.
            let _ = nix::sys::signal::kill(
                nix::unistd::Pid::from_raw(child.id() as i32),
                nix::sys::signal::Signal::SIGTERM,
            );
            let deadline = Instant::now() + Duration::from_secs(10);
            while Instant::now() < deadline {
                if let Ok(Some(_)) = child.try_wait() {
                    return;
                }
                std::thread::sleep(Duration::from_millis(50));
            }
            let _ = child.kill();
            let _ = child.wait();
        }
    }
}

impl Monitor {
    pub fn id(&self) -> u32 {
        self.0.as_ref().map_or(0, Child::id)
    }
}

/// `memprof monitor ARGS --listen 127.0.0.1:PORT`, once it serves and is
/// attached.
pub fn start_monitor(args: &[&str], port: u16) -> Monitor {
    start_monitor_saying(args, port).0
}

/// [`start_monitor`], and what memprof printed until it was attached.
pub fn start_monitor_saying(args: &[&str], port: u16) -> (Monitor, String) {
    let listen = format!("127.0.0.1:{port}");
    let (monitor, seen) = start_monitor_on(&listen, args);
    assert!(
        seen.contains(&format!("serving http://127.0.0.1:{port}/metrics")),
        "{seen}"
    );
    (monitor, seen)
}

/// `memprof monitor --listen LISTEN ARGS` once it is attached, and what
/// it printed until then.
pub fn start_monitor_on(listen: &str, args: &[&str]) -> (Monitor, String) {
    // Exact counts unless the test is about the budget or sampling.
    let budgeted = args
        .iter()
        .any(|a| ["--max-overhead", "--sample-bytes", "--budget"].contains(a));
    let mut monitor = memprof_command(&["monitor", "--listen", listen])
        .args(args)
        .args(if budgeted { &[][..] } else { &["--exact"][..] })
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let mut stderr = BufReader::new(monitor.stderr.take().unwrap());
    let mut seen = String::new();
    while !seen.contains("attached") {
        let mut line = String::new();
        assert!(
            stderr.read_line(&mut line).unwrap() > 0,
            "memprof ended: {seen}"
        );
        seen.push_str(&line);
    }
    // What it says later (warnings) goes on being read: a closed pipe
    // would fail memprof's next line.
    std::thread::spawn(move || {
        for line in stderr.lines().map_while(Result::ok) {
            eprintln!("memprof monitor: {line}");
        }
    });
    (Monitor(Some(monitor)), seen)
}

/// GET `url` (30 s at most).
pub fn get(url: &str) -> reqwest::blocking::Response {
    reqwest::blocking::Client::builder()
        .timeout(Duration::from_secs(30))
        .build()
        .unwrap()
        .get(url)
        .send()
        .unwrap()
}

/// `/metrics` once it contains `needle`, or as it is after 20 s.
pub fn metrics_once_they_contain(port: u16, needle: &str) -> String {
    let deadline = Instant::now() + Duration::from_secs(20);
    loop {
        let text = get(&format!("http://127.0.0.1:{port}/metrics"))
            .text()
            .unwrap();
        if text.contains(needle) || Instant::now() > deadline {
            return text;
        }
        std::thread::sleep(Duration::from_millis(100));
    }
}

/// One metric's value: the first row whose name and labels start with
/// `series` (`name{labels`).
pub fn metric(metrics: &str, series: &str) -> f64 {
    metrics
        .lines()
        .find(|line| line.starts_with(series))
        .and_then(|line| line.rsplit(' ').next())
        .and_then(|value| value.parse().ok())
        .unwrap_or_else(|| panic!("no {series} in {metrics}"))
}

/// The series of the waiter fixture's site after its line on stdin, for
/// process `pid` named `comm`: 40 x 1 KiB, exactly.
pub fn waiter_site_series(pid: u32, comm: &str) -> String {
    format!(
        "memprof_site_allocated_bytes_total{{pid=\"{pid}\",comm=\"{comm}\",function=\"site_after_attach\",file=\"{}\",line=\"13\"}} 40960\n",
        workspace_root().join("tests/fixtures/waiter.c").display()
    )
}

/// The last of the reports `--format json` wrote (one per interval): the
/// one made at SIGTERM.
pub fn last_report(out: &str) -> serde_json::Value {
    let last = serde_json::Deserializer::from_str(out)
        .into_iter()
        .map(Result::unwrap)
        .last()
        .expect("no report");
    crate::in_version_1_shape(last)
}

/// Process `pid` in a JSON report.
pub fn process_in(report: &serde_json::Value, pid: u32) -> &serde_json::Value {
    report["processes"]
        .as_array()
        .unwrap()
        .iter()
        .find(|p| p["pid"] == pid)
        .unwrap_or_else(|| panic!("no process {pid}: {report}"))
}

/// A real Prometheus on loopback with `scrape_configs` (YAML, under the
/// key), its data in `dir`; killed on drop.
pub struct Prometheus {
    child: Child,
    pub port: u16,
}

impl Drop for Prometheus {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

impl Prometheus {
    pub fn start(dir: &std::path::Path, scrape_configs: &str) -> Prometheus {
        let config = dir.join("prometheus.yml");
        std::fs::write(
            &config,
            format!("global: {{scrape_interval: 1s}}\nscrape_configs:\n{scrape_configs}"),
        )
        .unwrap();
        let port = free_port();
        let child = std::process::Command::new("prometheus")
            .arg(format!("--config.file={}", config.display()))
            .arg(format!(
                "--storage.tsdb.path={}",
                dir.join("data").display()
            ))
            .arg(format!("--web.listen-address=127.0.0.1:{port}"))
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .expect("running prometheus (scripts/setup.sh installs it)");
        Prometheus { child, port }
    }

    /// The first value of the PromQL `query` (URL-encoded), once there is
    /// one, or None after 60 s.
    pub fn value_of(&self, query: &str) -> Option<String> {
        let url = format!("http://127.0.0.1:{}/api/v1/query?query={query}", self.port);
        let deadline = Instant::now() + Duration::from_secs(60);
        loop {
            let answer = reqwest::blocking::get(&url)
                .ok()
                .and_then(|r| r.text().ok())
                .and_then(|text| serde_json::from_str::<serde_json::Value>(&text).ok());
            let value = answer.as_ref().and_then(|a| {
                a["data"]["result"][0]["value"][1]
                    .as_str()
                    .map(str::to_string)
            });
            if value.is_some() || Instant::now() > deadline {
                return value;
            }
            std::thread::sleep(Duration::from_millis(500));
        }
    }
}

/// SIGTERM: the final report, and nothing left in the kernel.
pub fn stop(mut monitor: Monitor) -> String {
    let monitor = monitor.0.take().unwrap();
    nix::sys::signal::kill(
        nix::unistd::Pid::from_raw(monitor.id() as i32),
        nix::sys::signal::Signal::SIGTERM,
    )
    .unwrap();
    let output = monitor.wait_with_output().unwrap();
    assert!(output.status.success(), "{output:?}");
    assert_nothing_loaded();
    String::from_utf8(output.stdout).unwrap()
}

/// A cgroup named as docker names a container's, under the unified
/// hierarchy (or the first cgroup mount): removed on drop.
pub struct ContainerCgroup(pub std::path::PathBuf);

// `new` makes a directory: no default value.
#[allow(clippy::new_without_default)]
impl ContainerCgroup {
    pub const ID: &'static str = "6d656d70726f66746573746964000000000000000000000000000000000000aa";

    pub fn new() -> ContainerCgroup {
        let mounts = std::fs::read_to_string("/proc/self/mounts").unwrap();
        let mount = mounts
            .lines()
            .map(|line| line.split(' ').collect::<Vec<_>>())
            .filter(|fields| fields[2] == "cgroup2" || fields[2] == "cgroup")
            .min_by_key(|fields| fields[2] != "cgroup2")
            .map(|fields| fields[1].to_string())
            .expect("a cgroup mount");
        let dir = std::path::Path::new(&mount).join(format!("docker-{}.scope", Self::ID));
        let _ = std::fs::remove_dir(&dir);
        std::fs::create_dir(&dir).unwrap();
        ContainerCgroup(dir)
    }
}

impl Drop for ContainerCgroup {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir(&self.0);
    }
}

/// Runs `attempt` (a whole scenario: its own monitor and program), and
/// once more if it fails. For the budget's verdicts on one short run
/// (scaled or partial), which hang on when the kernel's and /proc's reads
/// fall on a loaded machine: seen failing once in three full runs, never
/// alone. A regression fails both attempts; the first one's panic is
/// printed.
pub fn with_one_retry(attempt: impl Fn() + std::panic::RefUnwindSafe) {
    if std::panic::catch_unwind(&attempt).is_err() {
        eprintln!("first attempt failed (above); once more");
        attempt();
    }
}
