//! `memprof attach`: a running process, until it exits, Ctrl-C or --duration.
use std::{io::Write as _, process::Command, time::Duration};

use tests::*;

/// The waiter fixture, blocked on its stdin until the test writes a line.
fn waiter() -> std::process::Child {
    spawn_waiter(&fixture("waiter", "fp", frame_pointers()))
}

#[test]
fn attach_counts_allocations_made_after_attaching() {
    let _serial = serial();
    let mut target = waiter();
    let (memprof, _stderr) = start_attach(target.id(), &[]);
    let (_, report) = release_and_report(&mut target, memprof);
    assert_eq!(
        site(&report, "site_after_attach"),
        (40 * 1024, 40, vec!["malloc".to_string()])
    );
    let process = &processes_with(&report, "site_after_attach")[0];
    assert_eq!(process["pid"].as_u64().unwrap(), target.id() as u64);
    assert!(process["command"].as_str().unwrap().starts_with("waiter"));
    assert_nothing_loaded();
}

/// A process whose main thread has ended (pthread_exit) runs on in its
/// other threads: it is attached to through them (its pid takes no perf
/// event, /proc/PID/maps is empty, /proc/PID/root gone), and its
/// calls are counted with whole stacks. Before, memprof refused it as "a
/// zombie".
#[test]
fn a_process_whose_main_thread_ended_is_attached_to() {
    let _serial = serial();
    let program = fixture("waiter", "fp", frame_pointers());
    let mut target = spawn_waiter_with(&program, &["from-a-thread"]);
    wait_for_main_thread_end(target.id());
    let (memprof, _stderr) = start_attach(target.id(), &[]);
    let (status, report) = release_and_report(&mut target, memprof);
    assert!(status.success());
    assert_eq!(
        site(&report, "site_after_attach"),
        (40 * 1024, 40, vec!["malloc".to_string()])
    );
    let process = &processes_with(&report, "site_after_attach")[0];
    assert_eq!(process["pid"].as_u64().unwrap(), target.id() as u64);
    for stack in stacks_at(process, "site_after_attach") {
        assert_whole_from(&stack, &["site_after_attach", "run", "start_thread"]);
    }
    assert_nothing_loaded();
}

/// Such a process, attached to, is followed on every thread: its scope
/// events were on one thread (the pid takes none), and once that thread
/// had ended the others' calls went unseen (lone_threads: its first
/// thread ends, then the second allocates).
#[test]
fn a_process_whose_main_thread_ended_is_followed_on_every_thread() {
    let _serial = serial();
    let program = fixture("lone_threads", "fp", frame_pointers());
    let mut target = spawn_waiter_with(&program, &[]);
    wait_for_main_thread_end(target.id());
    let (memprof, _stderr) = start_attach(target.id(), &[]);
    let (status, report) = release_and_report(&mut target, memprof);
    assert!(status.success(), "{status:?}");
    assert_eq!(
        site(&report, "site_after_first"),
        (40 * 1024, 40, vec!["malloc".to_string()]),
        "{report:#}"
    );
    assert_nothing_loaded();
}

/// tests/fixtures/threads_at_attach.c in `mode`, attached to before its
/// worker goes: its pid and the report.
fn attach_to_threads_at_attach(mode: &str) -> (u32, serde_json::Value) {
    let program = fixture("threads_at_attach", "fp", frame_pointers());
    let mut target = spawn_waiter_with(&program, &[mode]);
    let (memprof, _stderr) = start_attach(target.id(), &[]);
    let (status, report) = release_and_report(&mut target, memprof);
    assert!(status.success(), "{status:?}");
    (target.id(), report)
}

/// A thread running at the attach outlives the main thread: the scope
/// events were on the main thread alone, and once it ended (pthread_exit)
/// that thread's calls went unseen. Now they are on every thread.
#[test]
fn a_thread_running_at_the_attach_is_followed_after_the_main_thread_ends() {
    let _serial = serial();
    let (_, report) = attach_to_threads_at_attach("main-ends");
    assert_eq!(
        site(&report, "site_after_main_end"),
        (40 * 1024, 40, vec!["malloc".to_string()]),
        "{report:#}"
    );
    assert_nothing_loaded();
}

/// A thread running at the attach forks: the child is followed, as a
/// fork of the main thread is (the child inherits the events of the
/// thread that forked it, which had none before).
#[test]
fn a_fork_of_a_thread_running_at_the_attach_is_followed() {
    let _serial = serial();
    let (pid, report) = attach_to_threads_at_attach("thread-forks");
    assert_eq!(
        site(&report, "site_in_forked_child"),
        (40 * 2048, 40, vec!["malloc".to_string()]),
        "{report:#}"
    );
    let child = &processes_with(&report, "site_in_forked_child")[0];
    assert_ne!(child["pid"].as_u64().unwrap(), pid as u64);
    assert_nothing_loaded();
}

#[test]
fn live_attach_counts_frees_of_blocks_allocated_before() {
    let _serial = serial();
    let mut target = waiter();
    // The waiter allocated its 5 early blocks before it reads stdin.
    std::thread::sleep(Duration::from_millis(100));
    let (memprof, _stderr) = start_attach(target.id(), &["--live"]);
    let (_, report) = release_and_report(&mut target, memprof);
    // 40 blocks allocated and freed at once; 5 frees of blocks memprof
    // never saw allocated: counted, attributed to no stack.
    assert_eq!(
        live_site(&report, "site_after_attach"),
        (0, 0, 40, 0),
        "{report:#}"
    );
    let process = &processes_with(&report, "site_after_attach")[0];
    assert_eq!(process["unknown_frees"], 5);
    assert_eq!(process["live_bytes"], 0);
    assert_eq!(site(&report, "site_before_attach").1, 0);
    assert_nothing_loaded();
}

#[test]
fn sigterm_prints_final_report_and_detaches() {
    let _serial = serial();
    let mut target = waiter();
    let (memprof, _stderr) = start_attach(target.id(), &[]);
    let mut stdin = target.stdin.take().unwrap();
    stdin.write_all(b"go\n").unwrap();
    std::thread::sleep(Duration::from_millis(300));
    nix_kill(memprof.id(), libc_sigterm());
    let output = memprof.wait_with_output().unwrap();
    let report = parse_report(&output);
    assert_eq!(
        site(&report, "site_after_attach"),
        (40 * 1024, 40, vec!["malloc".to_string()])
    );
    assert_nothing_loaded();
    // The target was only observed: it still runs, unharmed.
    drop(stdin);
    assert!(target.wait().unwrap().success());
}

#[test]
fn duration_ends_the_profile() {
    let _serial = serial();
    let mut target = waiter();
    let (memprof, _stderr) = start_attach(target.id(), &["--duration", "0.5"]);
    let output = memprof.wait_with_output().unwrap();
    assert!(output.status.success());
    let report = parse_report(&output);
    assert_eq!(site(&report, "site_after_attach").1, 0);
    assert_nothing_loaded();
    drop(target.stdin.take());
    target.wait().unwrap();
}

#[test]
fn untraced_processes_do_not_hit_the_probes() {
    let _serial = serial();
    let allocs = fixture("allocs", "fp", frame_pointers());
    let mut target = waiter();
    let (memprof, _stderr) = start_attach(target.id(), &[]);
    let hits_before = uprobe_hits();
    // An unrelated process allocating while memprof traces another one.
    let status = Command::new(&allocs).status().unwrap();
    assert_eq!(status.code(), Some(3));
    let hits_after = uprobe_hits();
    assert_eq!(
        hits_after, hits_before,
        "the untraced process trapped into memprof's uprobes"
    );
    drop(target.stdin.take());
    target.wait().unwrap();
    let report = parse_report(&memprof.wait_with_output().unwrap());
    assert_eq!(
        site(&report, "site_malloc").1,
        0,
        "untraced allocations must not be reported"
    );
    assert_nothing_loaded();
}

/// Total hits of memprof's uprobes (kernel counter, counts every trap).
fn uprobe_hits() -> u64 {
    let profile = std::fs::read_to_string("/sys/kernel/tracing/uprobe_profile").unwrap();
    profile
        .lines()
        .filter(|l| l.contains("_0"))
        .filter_map(|l| l.split_whitespace().last()?.parse::<u64>().ok())
        .sum()
}

fn libc_sigterm() -> i32 {
    15
}

fn nix_kill(pid: u32, signal: i32) {
    let status = Command::new("kill")
        .arg(format!("-{signal}"))
        .arg(pid.to_string())
        .status()
        .unwrap();
    assert!(status.success());
}

/// memprof killed with SIGKILL cannot clean up: the kernel drops its
/// programs and links with its fds, the target runs on unharmed, and the
/// uprobe events it left in tracefs go at the next start.
#[test]
fn sigkill_leaves_the_target_running_and_the_next_start_cleans_up() {
    let _serial = serial();
    let mut target = waiter();
    let (mut killed, _stderr) = start_attach(target.id(), &[]);
    let group = format!("memprof_{}/", killed.id());
    nix_kill(killed.id(), 9);
    killed.wait().unwrap();
    let events = std::fs::read_to_string("/sys/kernel/tracing/uprobe_events").unwrap();
    assert!(events.contains(&group), "expected stale events:\n{events}");
    // The target still runs and finishes its work.
    let mut stdin = target.stdin.take().unwrap();
    stdin.write_all(b"go\n").unwrap();
    drop(stdin);
    assert!(target.wait().unwrap().success());
    // The next memprof removes what the killed one left.
    let output = memprof(&["trace", "--", "true"]);
    assert!(output.status.success());
    let events = std::fs::read_to_string("/sys/kernel/tracing/uprobe_events").unwrap();
    assert!(!events.contains(&group), "stale events left:\n{events}");
    assert_nothing_loaded();
}

/// A library upgraded under a running process (the package manager
/// replaces the file; the process keeps the old one, which its maps mark
/// "(deleted)"): its path names another file now. memprof probes,
/// unwinds and counts the file mapped (through /proc/PID/map_files), not
/// the one at the path, which the process never calls (nothing counted,
/// nothing said, before).
#[test]
fn a_c_library_replaced_under_a_running_process_is_profiled_as_mapped() {
    let _serial = serial();
    let maps = std::fs::read_to_string("/proc/self/maps").unwrap();
    let libc = maps
        .lines()
        .filter_map(|line| line.split_whitespace().nth(5))
        .find(|path| path.ends_with("/libc.so.6"))
        .expect("the tests' own C library")
        .to_string();
    let dir = std::env::temp_dir().join(format!("memprof-upgraded-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let copy = dir.join("libc.so.6");
    std::fs::copy(&libc, &copy).unwrap();
    let program = fixture("waiter", "nofp", no_frame_pointers());
    let mut target = Command::new(&program)
        .env("LD_LIBRARY_PATH", &dir)
        .stdin(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    let mapped = format!("{} (deleted)", copy.display());
    let target_maps = || std::fs::read_to_string(format!("/proc/{}/maps", target.id())).unwrap();
    while !target_maps().contains(&copy.display().to_string()) {
        std::thread::sleep(Duration::from_millis(10));
    }
    // The upgrade: a new file at the old path.
    std::fs::remove_file(&copy).unwrap();
    std::fs::copy(&libc, &copy).unwrap();
    assert!(target_maps().contains(&mapped));

    let (memprof, _stderr) = start_attach(target.id(), &[]);
    let (_, report) = release_and_report(&mut target, memprof);
    std::fs::remove_dir_all(&dir).unwrap();
    assert_eq!(
        site(&report, "site_after_attach"),
        (40 * 1024, 40, vec!["malloc".to_string()])
    );
    // Unwound through the old file's CFI (no frame pointers) to `_start`,
    // its frames named from it (held open: the process has exited).
    let stacks = stacks_where(&report, |stack| {
        frame_functions(stack).first().map(String::as_str) == Some("site_after_attach")
    });
    assert_eq!(stacks.len(), 1, "{report:#}");
    let frames = frame_functions(stacks[0]);
    assert_eq!(
        frames.first().map(String::as_str),
        Some("site_after_attach")
    );
    assert_eq!(frames.get(1).map(String::as_str), Some("main"));
    assert!(
        frames.iter().any(|f| f == "__libc_start_call_main"),
        "{frames:?}"
    );
    assert_eq!(
        frames.last().map(String::as_str),
        Some("_start"),
        "{frames:?}"
    );
    assert_nothing_loaded();
}

/// A program run from a memfd (as runc runs itself, and sandboxes their
/// backends): its maps name "/memfd:NAME (deleted)", no file memprof can
/// open by that path. memprof reads it through /proc/PID/map_files while
/// it runs, and holds it open: the report, made once the process has
/// exited (and the memfd with it), names its frames. It refused the whole
/// attach before ("reading /memfd:...").
#[test]
fn a_program_run_from_a_memfd_is_profiled() {
    let _serial = serial();
    let program = fixture("waiter", "fp", frame_pointers());
    let script = "import os, sys\n\
                  fd = os.memfd_create('waiter-memfd', 0)\n\
                  os.write(fd, open(sys.argv[1], 'rb').read())\n\
                  os.execv(f'/proc/self/fd/{fd}', ['waiter-memfd'])\n";
    let mut target = Command::new("/usr/bin/python3")
        .args(["-c", script])
        .arg(&program)
        .stdin(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    while !std::fs::read_link(format!("/proc/{}/exe", target.id()))
        .is_ok_and(|exe| exe.to_string_lossy().starts_with("/memfd:waiter-memfd"))
    {
        std::thread::sleep(Duration::from_millis(10));
    }
    let (memprof, _stderr) = start_attach(target.id(), &[]);
    let (_, report) = release_and_report(&mut target, memprof);
    assert_eq!(
        site(&report, "site_after_attach"),
        (40 * 1024, 40, vec!["malloc".to_string()])
    );
    let stacks = stacks_where(&report, |_| true);
    assert_eq!(stacks.len(), 1, "{report:#}");
    let frames = stacks[0]["frames"].as_array().unwrap();
    assert_eq!(frames[0]["module"], "/memfd:waiter-memfd", "{frames:?}");
    assert_eq!(frames[1]["function"], "main", "{frames:?}");
    assert_nothing_loaded();
}

/// A process attached to while its loader runs, before it maps its C
/// library (here held there by gdb's `starti`): memprof said "no allocator
/// memprof knows" and, though it probed the C library as the loader
/// announced it and counted what came after, kept saying so in the
/// report, and its calls before the probes were in went unseen, unsaid.
/// Now the report lists it as profiled and counts the late probes (lost
/// `probed_late`, once for this process and file).
#[test]
fn a_process_attached_during_its_start_is_profiled_and_the_late_probes_counted() {
    let _serial = serial();
    let program = fixture("waiter", "fp", frame_pointers());
    let dir = std::env::temp_dir().join(format!("memprof-starti-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir(&dir).unwrap();
    let (flag, input) = (dir.join("go"), dir.join("stdin"));
    nix::unistd::mkfifo(&input, nix::sys::stat::Mode::S_IRWXU).unwrap();
    // gdb stops the waiter at its first instruction (in the loader) and
    // lets it go once the flag exists; the waiter reads the FIFO (gdb
    // keeps its own stdin).
    let wait_for_flag = format!(
        "shell while [ ! -e {} ]; do sleep 0.02; done",
        flag.display()
    );
    let mut gdb = Command::new("gdb")
        .args([
            "-batch",
            "-nx",
            "-ex",
            &format!("starti < {}", input.display()),
        ])
        .args(["-ex", &wait_for_flag, "-ex", "continue", "--args"])
        .arg(&program)
        .stdin(std::process::Stdio::null())
        .stdout(std::process::Stdio::null())
        .spawn()
        .expect("gdb (scripts/setup.sh installs it)");
    // A failure leaves no gdb waiting for the flag, nor its waiter.
    let _cleanup = KillOnDrop(gdb.id());
    // Opened once the waiter's shell opens it to read.
    let mut stdin = std::fs::OpenOptions::new()
        .write(true)
        .open(&input)
        .unwrap();
    let deadline = std::time::Instant::now() + Duration::from_secs(20);
    let pid = loop {
        if let Some(pid) = child_stopped_in_loader(gdb.id()) {
            break pid;
        }
        assert!(
            std::time::Instant::now() < deadline,
            "gdb never ran the waiter"
        );
        std::thread::sleep(Duration::from_millis(20));
    };
    let mut memprof = memprof_command(&["attach", "--verbose", "--pid", &pid.to_string()])
        .args(["--format", "json"])
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    let mut stderr = std::io::BufReader::new(memprof.stderr.take().unwrap());
    let mut said = String::new();
    while !said.contains("attached") {
        let mut line = String::new();
        assert!(
            std::io::BufRead::read_line(&mut stderr, &mut line).unwrap() > 0,
            "{said}"
        );
        said.push_str(&line);
    }
    assert!(said.contains("no allocator memprof knows"), "{said}");
    std::fs::write(&flag, b"").unwrap();
    // The loader announces the C library; memprof probes it meanwhile
    // (--verbose says so once the probes are in).
    while !said
        .lines()
        .any(|l| l.contains("probe alloc malloc at") && l.contains("libc.so"))
    {
        let mut line = String::new();
        assert!(
            std::io::BufRead::read_line(&mut stderr, &mut line).unwrap() > 0,
            "{said}"
        );
        said.push_str(&line);
    }
    wait_reading_stdin(pid);
    stdin.write_all(b"go\n").unwrap();
    drop(stdin);
    assert!(gdb.wait().unwrap().success());
    let _ = std::fs::remove_dir_all(&dir);
    let mut out = Vec::new();
    std::io::Read::read_to_end(&mut memprof.stdout.take().unwrap(), &mut out).unwrap();
    assert!(memprof.wait().unwrap().success());
    let report: serde_json::Value = tests::report_json(std::str::from_utf8(&out).unwrap());
    // Its C library probed before the line was written: every call after.
    assert_eq!(
        site(&report, "site_after_attach"),
        (40 * 1024, 40, vec!["malloc".to_string()])
    );
    assert_eq!(report["lost"]["probed_late"], 1, "{}", report["lost"]);
    let unprobed = report["unprobed"].as_array().map_or(0, Vec::len);
    assert_eq!(unprobed, 0, "{}", report["unprobed"]);
    assert_nothing_loaded();
}

/// gdb's child, once it is stopped in the loader (no C library mapped).
fn child_stopped_in_loader(gdb: u32) -> Option<u32> {
    let children = std::fs::read_to_string(format!("/proc/{gdb}/task/{gdb}/children")).ok()?;
    let pid: u32 = children.split_whitespace().next()?.parse().ok()?;
    let maps = std::fs::read_to_string(format!("/proc/{pid}/maps")).ok()?;
    let in_loader = maps.contains("ld-linux") && !maps.contains("libc.so");
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    let traced = stat
        .rsplit_once(") ")
        .is_some_and(|(_, rest)| rest.starts_with('t'));
    (in_loader && traced).then_some(pid)
}

/// Kills a process and its children when dropped.
struct KillOnDrop(u32);

impl Drop for KillOnDrop {
    fn drop(&mut self) {
        let (parent, pid) = (["-KILL", "-P"], self.0.to_string());
        let _ = Command::new("pkill").args(parent).arg(&pid).status();
        let _ = Command::new("kill").args(["-KILL", &pid]).status();
    }
}
