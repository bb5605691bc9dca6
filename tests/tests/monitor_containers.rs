//! Containers under `memprof monitor`: a process with a C library of its
//! own (another file at the host's path, in its mount namespace) is
//! profiled, on the whole host and when named by --comm, and memprof's own
//! program is never probed; the probes of a container's library that no
//! process maps any more make room for the next one's.
use std::{
    io::Write as _,
    process::{Command, Stdio},
    time::Duration,
};

use tests::{monitor::*, *};

#[test]
fn the_whole_host_a_container_with_its_own_c_library_and_never_memprof() {
    let _serial = serial();
    let program = fixture("waiter", "container", frame_pointers());
    // The container's C library: a copy of the host's (another file, at
    // the same path in its mount namespace).
    let libc = "/usr/lib/x86_64-linux-gnu/libc.so.6";
    let copy = workspace_root().join("target/fixtures/container-libc.so.6");
    std::fs::copy(libc, &copy).unwrap();
    let cgroup = ContainerCgroup::new();
    let port = free_port();
    // Nothing named: every process.
    let monitor = start_monitor(&["--format", "json"], port);
    let mut container = Command::new("unshare")
        .args(["--mount", "--propagation", "private", "/bin/sh", "-c"])
        .arg(r#"echo $$ > "$1/cgroup.procs" && mount --bind "$2" "$3" && exec "$4""#)
        .arg("sh")
        .arg(&cgroup.0)
        .arg(&copy)
        .arg(libc)
        .arg(&program)
        .stdin(Stdio::piped())
        .spawn()
        .unwrap();
    std::thread::sleep(Duration::from_millis(500));
    writeln!(container.stdin.as_mut().unwrap()).unwrap();
    let pid = container.id();
    let container_id = ContainerCgroup::ID;
    let site = waiter_site_series(pid, "waiter-containe");
    let metrics = metrics_once_they_contain(port, &site);
    assert!(metrics.contains(&site), "{metrics}");
    assert!(
        metrics.contains(&format!(
            "memprof_allocated_bytes_total{{pid=\"{pid}\",comm=\"waiter-containe\",exe=\"{}\",container=\"{container_id}\"}}",
            program.display()
        )),
        "{metrics}"
    );
    assert!(!metrics.contains(&format!("pid=\"{}\"", monitor.id())));
    // Another process of memprof's program, started now (it waits for its
    // input): its allocator, memprof's own, is not probed for it, as it
    // was not at the start for memprof's watchdog: it would trap in
    // memprof too.
    let mut other_memprof = memprof_command(&["report", "/dev/stdin"])
        .stdin(Stdio::piped())
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    std::thread::sleep(Duration::from_millis(1500));
    // The final report, while the container still runs.
    let report: serde_json::Value = tests::report_json(&stop(monitor));
    drop(other_memprof.stdin.take());
    other_memprof.wait().unwrap();
    assert_memprof_not_probed(&report);
    drop(container.stdin.take());
    container.wait().unwrap();
    // The waiter's image (the pid ran the wrapper's shell before).
    let process = report["processes"]
        .as_array()
        .unwrap()
        .iter()
        .find(|p| {
            p["pid"] == pid
                && p["stacks"].as_array().unwrap().iter().any(|s| {
                    s["frames"]
                        .as_array()
                        .unwrap()
                        .iter()
                        .any(|f| f["function"] == "site_after_attach")
                })
        })
        .unwrap_or_else(|| panic!("no process {pid}"));
    // As docker and crictl show it, and in full.
    assert_eq!(process["container"], &container_id[..12]);
    assert_eq!(process["container_id"], container_id);
    assert!(process["cgroup"]
        .as_str()
        .unwrap()
        .ends_with(&format!("docker-{}.scope", ContainerCgroup::ID)));
    // Its own C library was probed (through its root, by the name its
    // loader or its maps give: /lib or /usr/lib) and symbolized.
    let root = format!("/proc/{pid}/root/");
    assert!(
        report["probes"].as_array().unwrap().iter().any(|p| {
            let module = p["module"].as_str().unwrap();
            module.starts_with(&root) && module.ends_with("/libc.so.6") && p["function"] == "malloc"
        }),
        "{}",
        report["probes"]
    );
    let frames: Vec<&serde_json::Value> = process["stacks"]
        .as_array()
        .unwrap()
        .iter()
        .flat_map(|s| s["frames"].as_array().unwrap())
        .collect();
    assert!(
        frames
            .iter()
            .any(|f| f["function"] == "__libc_start_call_main" && f["module"] == libc),
        "{frames:?}"
    );
}

/// No probe of `report` is in memprof's own program (its allocator is
/// mimalloc, which memprof would find there).
fn assert_memprof_not_probed(report: &serde_json::Value) {
    let memprof_file = file_identity(&memprof_bin());
    let own_probes: Vec<&serde_json::Value> = report["probes"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|p| {
            file_identity(std::path::Path::new(p["module"].as_str().unwrap())) == memprof_file
        })
        .collect();
    assert!(own_probes.is_empty(), "{own_probes:?}");
}

/// A file's device and inode (None: no such file).
fn file_identity(path: &std::path::Path) -> Option<(u64, u64)> {
    use std::os::unix::fs::MetadataExt as _;
    std::fs::metadata(path).ok().map(|m| (m.dev(), m.ino()))
}

/// Runs `program` in a mount namespace of its own where `libc` takes the
/// place of the host's C library (another file, at the same path), with
/// its standard input piped.
fn in_container(libc: &std::path::Path, program: &std::path::Path) -> std::process::Child {
    Command::new("unshare")
        .args(["--mount", "--propagation", "private", "/bin/sh", "-c"])
        .arg(r#"mount --bind "$1" "$2" && exec "$3""#)
        .arg("sh")
        .arg(libc)
        .arg("/usr/lib/x86_64-linux-gnu/libc.so.6")
        .arg(program)
        .stdin(Stdio::piped())
        .spawn()
        .unwrap()
}

/// A process named by `--comm` is adopted at its exec, while its loader
/// maps its libraries: a C library of its own (a container's) was probed
/// only if already mapped when memprof read its maps, which it never was
/// (the loader announces its libraries once, before its probe was in).
#[test]
fn a_process_named_in_a_container_with_its_own_c_library_is_profiled() {
    let _serial = serial();
    let program = fixture("waiter", "ct", frame_pointers());
    let libc = workspace_root().join("target/fixtures/container-libc-ct.so.6");
    std::fs::copy("/usr/lib/x86_64-linux-gnu/libc.so.6", &libc).unwrap();
    let port = free_port();
    let monitor = start_monitor(&["--comm", "^waiter-ct$", "--format", "json"], port);
    // Once memprof idles: it adopts the process at once, before its
    // loader has mapped the C library.
    std::thread::sleep(Duration::from_secs(2));
    let mut container = in_container(&libc, &program);
    std::thread::sleep(Duration::from_millis(500));
    writeln!(container.stdin.as_mut().unwrap()).unwrap();
    let site = waiter_site_series(container.id(), "waiter-ct");
    let metrics = metrics_once_they_contain(port, &site);
    drop(container.stdin.take());
    container.wait().unwrap();
    let report: serde_json::Value = tests::report_json(&stop(monitor));
    assert!(metrics.contains(&site), "{metrics}");
    // memprof stood in for the processes to come (its C library and
    // loader probed from the start), not its own program.
    assert_memprof_not_probed(&report);
}

#[test]
fn the_probes_of_a_library_no_process_maps_any_more_make_room_for_the_next() {
    let _serial = serial();
    let program = fixture("waiter", "container", frame_pointers());
    // Room for the host's files and one container's C library.
    let port = free_port();
    let monitor = start_monitor(&["--site-groups", "2", "--format", "json"], port);
    let metrics = || {
        get(&format!("http://127.0.0.1:{port}/metrics"))
            .text()
            .unwrap()
    };
    assert!(
        metrics().contains("memprof_table_entries{table=\"site_groups\"} 1\n"),
        "the host's files take one group at the start: {}",
        metrics()
    );
    // Three containers, one after the other, each with a C library of its
    // own: the second and third find the table full, and get the group
    // of the one before, which has ended.
    for i in 0..3 {
        let libc = workspace_root().join(format!("target/fixtures/container-libc-{i}.so.6"));
        std::fs::copy("/usr/lib/x86_64-linux-gnu/libc.so.6", &libc).unwrap();
        let mut container = in_container(&libc, &program);
        std::thread::sleep(Duration::from_millis(500));
        writeln!(container.stdin.as_mut().unwrap()).unwrap();
        let site = waiter_site_series(container.id(), "waiter-containe");
        let text = metrics_once_they_contain(port, &site);
        drop(container.stdin.take());
        container.wait().unwrap();
        assert!(text.contains(&site), "container {i}: {text}");
        assert_eq!(
            metric(&text, "memprof_evicted_total{what=\"probed_files\"}"),
            i as f64,
            "{text}"
        );
        assert_eq!(
            metric(&text, "memprof_table_entries{table=\"site_groups\"}"),
            2.0
        );
    }
    let report: serde_json::Value = tests::report_json(&stop(monitor));
    // The probes listed: the last container's C library only (reached
    // through its root; a host's program run from a memfd is reached
    // through /proc/PID/map_files).
    let container_libcs = report["probes"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|p| {
            let module = p["module"].as_str().unwrap();
            p["function"] == "malloc" && module.starts_with("/proc/") && module.contains("/root/")
        })
        .count();
    assert_eq!(container_libcs, 1, "{}", report["probes"]);
    assert!(report.get("unprobed").is_none(), "{}", report["unprobed"]);
}
