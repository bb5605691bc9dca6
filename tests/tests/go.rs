//! Go programs (built here with Debian's go): never harmed. Go's runtime
//! moves goroutine stacks and walks them itself, so a return probe in Go
//! code kills the program (SIGILL at the kernel's trampoline): memprof
//! probes Go functions at their entry only, reads their arguments from
//! Go's registers, and refuses what would need a return there.
//!
//! Fixtures: tests/fixtures/go_alloc (`makeSlices` keeps 20,000 slices
//! of 4 KiB; with `wait` it first reads a line) and go_cgo (Go calling a
//! C function that mallocs 1,000 blocks of 100 bytes).
use std::{
    io::{Read as _, Write as _},
    path::Path,
    process::{Command, Stdio},
    time::Duration,
};

use memprof::discover::go::go_module_of;
use serde_json::Value;
use tests::{
    assert_nothing_loaded, assert_one_line_error, fixture_go, live_site, memprof,
    monitor::{free_port, last_report, start_monitor, stop},
    parse_report, serial, site, stacks_where, start_attach, wait_reading_stdin,
};

/// What go_alloc prints, run alone.
const KEPT: &str = "kept 20000 slices, 81920000 bytes\n";

/// mallocgc, counted at its entry with its size in Go's first register.
const MALLOCGC: [&str; 2] = ["--alloc-fn", "runtime.mallocgc:size=1"];

/// `memprof trace --format json EXTRA -- PROGRAM`, its report written to
/// a file (the program's output is on stdout); memprof must succeed.
fn trace_go(extra: &[&str], program: &Path) -> (std::process::Output, Value) {
    let report = std::env::temp_dir().join(format!("memprof-go-{}.json", std::process::id()));
    let mut args = vec![
        "trace", "--format", "json", "--top", "1000", "--depth", "64",
    ];
    args.extend(["-o", report.to_str().unwrap()]);
    args.extend(extra);
    args.extend(["--", program.to_str().unwrap()]);
    let output = memprof(&args);
    assert!(output.status.success(), "{output:?}");
    let text = std::fs::read_to_string(&report).unwrap();
    std::fs::remove_file(&report).unwrap();
    (output, serde_json::from_str(&text).unwrap())
}

fn go_alloc() -> std::path::PathBuf {
    fixture_go("go_alloc", "plain", &[])
}

/// The calls of `make([]byte, 4096)` in makeSlices, from their whole
/// stacks: (bytes, calls), summed over the report's processes.
fn make_slices_site(report: &Value) -> (u64, u64) {
    let stacks = stacks_where(report, |stack| {
        let names: Vec<&str> = stack["frames"]
            .as_array()
            .unwrap()
            .iter()
            .map(|f| f["function"].as_str().unwrap_or("?"))
            .collect();
        names.starts_with(&[
            "runtime.makeslice",
            "main.makeSlices",
            "main.main",
            "runtime.main",
        ])
    });
    for stack in &stacks {
        assert_eq!(stack["allocator"], "runtime.mallocgc", "{stack}");
        assert_eq!(stack["partial"], false, "{stack}");
    }
    let bytes = stacks.iter().map(|s| s["bytes"].as_u64().unwrap()).sum();
    let calls = stacks.iter().map(|s| s["count"].as_u64().unwrap()).sum();
    (bytes, calls)
}

#[test]
fn mallocgc_named_as_an_allocator_counts_each_call_and_the_program_runs_on() {
    let _serial = serial();
    let program = go_alloc();
    let alone = Command::new(&program).output().unwrap();
    assert!(alone.status.success());
    assert_eq!(String::from_utf8_lossy(&alone.stdout), KEPT);
    // The command that killed the program when every --alloc-fn had a
    // return probe.
    let (output, report) = trace_go(&MALLOCGC, &program);
    assert_eq!(String::from_utf8_lossy(&output.stdout), KEPT);
    // Every make, once: the probe sits past the stack check, which runs
    // again after the runtime grows the stack.
    assert_eq!(make_slices_site(&report), (20_000 * 4096, 20_000));
    assert_nothing_loaded();
}

#[test]
fn what_needs_a_return_probe_in_go_code_is_refused_before_the_program_runs() {
    let _serial = serial();
    let program = go_alloc();
    let program = program.to_str().unwrap();
    for (args, needle) in [
        (
            vec!["--live", MALLOCGC[0], MALLOCGC[1]],
            "--live with runtime.mallocgc: it is Go code",
        ),
        (
            vec!["--while", "main.makeSlices"],
            "--while main.makeSlices: it is Go code",
        ),
        (
            vec!["--live", "--free-fn", "main.makeSlices:ptr=1"],
            "--live with main.makeSlices: it is Go code",
        ),
    ] {
        let mut command = vec!["trace"];
        command.extend(&args);
        command.extend(["--", program]);
        let output = memprof(&command);
        assert_one_line_error(&output, 2, needle);
        assert!(
            output.stdout.is_empty(),
            "{args:?}: the program ran: {output:?}"
        );
    }
}

#[test]
fn a_go_program_without_alloc_fn_is_named_as_go_with_what_to_do() {
    let _serial = serial();
    let program = go_alloc();
    let (output, report) = trace_go(&[], &program);
    assert_eq!(String::from_utf8_lossy(&output.stdout), KEPT);
    let unprobed = report["unprobed"].as_array().unwrap();
    assert_eq!(unprobed.len(), 1, "{report}");
    let reason = unprobed[0]["reason"].as_str().unwrap();
    assert!(reason.starts_with("a Go program (go1."), "{reason}");
    assert!(
        reason.contains("--alloc-fn runtime.mallocgc:size=1"),
        "{reason}"
    );
}

#[test]
fn attached_to_a_running_go_program_it_counts_and_leaves_it_unharmed() {
    let _serial = serial();
    let program = go_alloc();
    let mut target = spawn_waiting(&program);
    let (memprof, _stderr) = start_attach(target.id(), &MALLOCGC);
    let (status, out) = release(&mut target);
    assert!(status.success(), "{status}");
    assert_eq!(out, format!("waiting\n{KEPT}"));
    let output = memprof.wait_with_output().unwrap();
    assert!(output.status.success());
    let report = parse_report(&output);
    assert_eq!(make_slices_site(&report), (20_000 * 4096, 20_000));
    assert_nothing_loaded();
}

/// go_alloc `wait`, once it reads its stdin.
fn spawn_waiting(program: &Path) -> std::process::Child {
    let target = Command::new(program)
        .arg("wait")
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .spawn()
        .unwrap();
    wait_reading_stdin(target.id());
    target
}

/// Lets a `spawn_waiting` target go; its exit status and output.
fn release(target: &mut std::process::Child) -> (std::process::ExitStatus, String) {
    target.stdin.take().unwrap().write_all(b"go\n").unwrap();
    let status = target.wait().unwrap();
    let mut out = String::new();
    target
        .stdout
        .take()
        .unwrap()
        .read_to_string(&mut out)
        .unwrap();
    (status, out)
}

/// Runs go_alloc `wait` under a monitor already watching it; returns its
/// exit status and output.
fn run_watched(program: &Path) -> (std::process::ExitStatus, String) {
    let mut target = spawn_waiting(program);
    // The exec's notice makes it probed within milliseconds.
    std::thread::sleep(Duration::from_secs(1));
    release(&mut target)
}

#[test]
fn monitor_probes_go_code_at_entry_and_refuses_it_what_needs_a_return() {
    let _serial = serial();
    let program = go_alloc();
    let exe = program.to_str().unwrap();
    let monitor = start_monitor(
        &["--exe", exe, MALLOCGC[0], MALLOCGC[1], "--format", "json"],
        free_port(),
    );
    let (status, out) = run_watched(&program);
    assert!(status.success(), "{status}");
    assert_eq!(out, format!("waiting\n{KEPT}"));
    let report = last_report(&stop(monitor));
    assert_eq!(make_slices_site(&report), (20_000 * 4096, 20_000));

    // --while on a Go function: that program is left unprobed, and says
    // why; it runs as it would alone.
    let monitor = start_monitor(
        &[
            "--exe",
            exe,
            "--while",
            "main.makeSlices",
            "--format",
            "json",
        ],
        free_port(),
    );
    let (status, out) = run_watched(&program);
    assert!(status.success(), "{status}");
    assert_eq!(out, format!("waiting\n{KEPT}"));
    let report = last_report(&stop(monitor));
    let unprobed = report["unprobed"].as_array().unwrap();
    assert!(
        unprobed.iter().any(|u| u["reason"]
            .as_str()
            .unwrap()
            .starts_with("--while main.makeSlices: it is Go code")),
        "{report}"
    );
}

#[test]
fn c_called_from_go_runs_on_the_threads_own_stack_and_takes_return_probes() {
    let _serial = serial();
    let program = fixture_go("go_cgo", "plain", &[]);
    // --live: malloc and mmap have return probes; their caller is C code
    // (c_alloc, the runtime's cgo mmap), run on the thread's stack.
    let (output, report) = trace_go(&["--live"], &program);
    assert_eq!(
        String::from_utf8_lossy(&output.stdout),
        "freed 1000 blocks\n"
    );
    assert_eq!(
        site(&report, "c_alloc"),
        (100_000, 1000, vec!["malloc".into()])
    );
    // Each block paired with its free (none live, none untracked).
    assert_eq!(live_site(&report, "c_alloc"), (0, 0, 0, 0));
    assert_nothing_loaded();
}

#[test]
fn go_code_is_found_in_plain_stripped_and_cgo_builds() {
    let _serial = serial();
    let version = Command::new("go")
        .args(["env", "GOVERSION"])
        .output()
        .unwrap();
    let version = String::from_utf8(version.stdout).unwrap();
    let minor: u32 = version.trim().split('.').nth(1).unwrap().parse().unwrap();
    let plain = go_alloc();
    let stripped = fixture_go("go_alloc", "stripped", &["-ldflags=-s"]);
    let cgo = fixture_go("go_cgo", "plain", &[]);
    // runtime.text and runtime.etext bound Go's code; the stripped build
    // has no symbols, its .gopclntab says the same.
    let (start, end) = (
        readelf_symbol(&plain, "runtime.text"),
        readelf_symbol(&plain, "runtime.etext"),
    );
    for binary in [&plain, &stripped] {
        let go = go_module_of(binary).expect("a Go module");
        assert_eq!(go.version, Some((1, minor)), "{}", binary.display());
        assert_eq!(go.code, (start, end), "{}", binary.display());
        assert!(go.passes_in_registers());
    }
    // In the cgo build, the C function is outside Go's code.
    let go = go_module_of(&cgo).expect("a Go module");
    assert!(go.holds(readelf_symbol(&cgo, "main.main")));
    assert!(!go.holds(readelf_symbol(&cgo, "c_alloc")));
    assert!(go_module_of(Path::new("/usr/bin/python3")).is_none());
}

/// A symbol's address, as readelf prints it.
fn readelf_symbol(binary: &Path, name: &str) -> u64 {
    let output = Command::new("readelf")
        .arg("-sW")
        .arg(binary)
        .output()
        .unwrap();
    let text = String::from_utf8_lossy(&output.stdout);
    let address = text
        .lines()
        .find_map(|line| {
            let fields: Vec<&str> = line.split_whitespace().collect();
            (fields.len() >= 8 && fields[7] == name).then(|| fields[1].to_string())
        })
        .unwrap_or_else(|| panic!("no {name} in {}", binary.display()));
    u64::from_str_radix(&address, 16).unwrap()
}
