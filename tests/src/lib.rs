//! Helpers for memprof's integration tests: build the C fixtures, run the
//! real `memprof` binary (real BPF, real uprobes; needs root), read its
//! JSON report, and check that nothing stays loaded in the kernel.
pub mod monitor;

use std::{
    io::{BufRead as _, BufReader, Write as _},
    path::{Path, PathBuf},
    process::{Command, Output, Stdio},
    sync::Mutex,
    time::{Duration, Instant},
};

use serde_json::Value;

/// Tests that attach probes run one at a time: on 2 cores, parallel
/// runs only slow each other down and make failures hard to read.
pub static SERIAL: Mutex<()> = Mutex::new(());

pub fn serial() -> std::sync::MutexGuard<'static, ()> {
    SERIAL.lock().unwrap_or_else(|e| e.into_inner())
}

pub fn workspace_root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .unwrap()
        .to_path_buf()
}

/// The `memprof` binary under test (`cargo build --release` first).
pub fn memprof_bin() -> PathBuf {
    if let Ok(path) = std::env::var("MEMPROF_BIN") {
        return PathBuf::from(path);
    }
    let path = workspace_root().join("target/release/memprof");
    assert!(
        path.exists(),
        "{} missing: run cargo build --release first",
        path.display()
    );
    path
}

/// Compiles tests/fixtures/NAME.c with extra `flags` into target/fixtures/.
pub fn fixture(name: &str, variant: &str, flags: &[&str]) -> PathBuf {
    compile(
        "gcc",
        &format!("tests/fixtures/{name}.c"),
        &format!("{name}-{variant}"),
        flags,
    )
}

/// Compiles tests/fixtures/NAME.cpp (C++, g++) with extra `flags`.
pub fn fixture_cpp(name: &str, variant: &str, flags: &[&str]) -> PathBuf {
    compile(
        "g++",
        &format!("tests/fixtures/{name}.cpp"),
        &format!("{name}-{variant}"),
        flags,
    )
}

/// Compiles tests/fixtures/NAME.c statically against musl (musl-gcc).
pub fn fixture_musl(name: &str, variant: &str, flags: &[&str]) -> PathBuf {
    compile(
        "musl-gcc",
        &format!("tests/fixtures/{name}.c"),
        &format!("{name}-{variant}"),
        flags,
    )
}

/// Compiles tests/fixtures/NAME.rs (Rust, rustc -O: a release build)
/// with extra `flags`.
pub fn fixture_rust(name: &str, variant: &str, flags: &[&str]) -> PathBuf {
    let source = workspace_root().join(format!("tests/fixtures/{name}.rs"));
    let out_dir = workspace_root().join("target/fixtures");
    std::fs::create_dir_all(&out_dir).unwrap();
    let binary = out_dir.join(format!("{name}-{variant}"));
    let status = Command::new("rustc")
        .args(["-O", "-g", "--edition", "2021"])
        .args(flags)
        .arg("-o")
        .arg(&binary)
        .arg(&source)
        .status()
        .expect("rustc");
    assert!(status.success(), "compiling {}", source.display());
    binary
}

/// Builds the cargo project tests/fixtures/NAME (release, default flags:
/// no frame pointers) outside memprof's workspace; returns its binary.
pub fn fixture_cargo(name: &str) -> PathBuf {
    let manifest = workspace_root().join(format!("tests/fixtures/{name}/Cargo.toml"));
    let target_dir = workspace_root().join("target/fixtures/cargo");
    let status = Command::new("cargo")
        .args([
            "build",
            "--release",
            "--quiet",
            "--locked",
            "--manifest-path",
        ])
        .arg(&manifest)
        .arg("--target-dir")
        .arg(&target_dir)
        // As a user builds it, not with the flags of the test's own build.
        .env_remove("RUSTFLAGS")
        .env_remove("CARGO_ENCODED_RUSTFLAGS")
        .status()
        .expect("cargo");
    assert!(status.success(), "building {}", manifest.display());
    target_dir.join("release").join(name)
}

/// Builds the Go program tests/fixtures/NAME (Debian's go, standard
/// library only) with extra `go build` flags; returns its binary.
pub fn fixture_go(name: &str, variant: &str, flags: &[&str]) -> PathBuf {
    fixture_go_by(&GoToolchain::debian(), name, variant, flags)
}

/// A Go compiler the tests build with.
#[derive(Clone, Debug)]
pub struct GoToolchain {
    /// As fixtures' names carry it: "go1.19".
    pub label: &'static str,
    pub go: PathBuf,
}

impl GoToolchain {
    /// Debian 12's (golang-go).
    pub fn debian() -> GoToolchain {
        GoToolchain {
            label: "go1.19",
            go: PathBuf::from("go"),
        }
    }

    /// Debian's go and bookworm-backports' go 1.23 (scripts/setup.sh
    /// installs it): Go's tables changed layout in 1.20, which 1.23 has.
    pub fn all() -> Vec<GoToolchain> {
        let newer = PathBuf::from("/usr/lib/go-1.23/bin/go");
        assert!(
            newer.exists(),
            "{} is missing: run scripts/setup.sh",
            newer.display()
        );
        vec![
            GoToolchain::debian(),
            GoToolchain {
                label: "go1.23",
                go: newer,
            },
        ]
    }
}

/// [`fixture_go`] built by `toolchain` (its label joins the variant's
/// name, but for Debian's).
pub fn fixture_go_by(
    toolchain: &GoToolchain,
    name: &str,
    variant: &str,
    flags: &[&str],
) -> PathBuf {
    let source = workspace_root().join(format!("tests/fixtures/{name}"));
    let out_dir = workspace_root().join("target/fixtures");
    std::fs::create_dir_all(&out_dir).unwrap();
    let binary = match toolchain.label {
        "go1.19" => out_dir.join(format!("{name}-{variant}")),
        label => out_dir.join(format!("{name}-{variant}-{label}")),
    };
    let status = Command::new(&toolchain.go)
        .arg("build")
        .args(flags)
        .arg("-o")
        .arg(&binary)
        .arg(".")
        .current_dir(&source)
        // Go's caches in the target directory: the tests' HOME may be
        // unset, and no module is fetched.
        .env("GOCACHE", out_dir.join("go-cache"))
        .env("GOPATH", out_dir.join("go-path"))
        .env("GOFLAGS", "-mod=mod")
        .env("GOPROXY", "off")
        // The toolchain asked for, never one fetched.
        .env("GOTOOLCHAIN", "local")
        .status()
        .expect("go (apt install golang-go)");
    assert!(status.success(), "building {}", source.display());
    binary
}

/// The demo workload (demo/workload.c), with frame pointers.
pub fn demo_workload() -> PathBuf {
    compile("gcc", "demo/workload.c", "workload-fp", frame_pointers())
}

/// The benchmark's program of N distinct stacks (bench/many_stacks.c:
/// 65,538 of them, ~40 frames deep, at N = 100,000), with frame pointers.
pub fn many_stacks() -> PathBuf {
    compile(
        "gcc",
        "bench/many_stacks.c",
        "many_stacks-fp",
        frame_pointers(),
    )
}

fn compile(compiler: &str, source: &str, binary_name: &str, flags: &[&str]) -> PathBuf {
    let source = workspace_root().join(source);
    let out_dir = workspace_root().join("target/fixtures");
    std::fs::create_dir_all(&out_dir).unwrap();
    let binary = out_dir.join(binary_name);
    // Built aside and renamed into place: tests running in parallel build
    // the same fixture, and one may start it while another writes it.
    static BUILDS: std::sync::atomic::AtomicU32 = std::sync::atomic::AtomicU32::new(0);
    let build = BUILDS.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
    let partial = out_dir.join(format!("{binary_name}.{}-{build}.tmp", std::process::id()));
    let status = Command::new(compiler)
        .args(["-O2", "-g", "-pthread"])
        .args(flags)
        .arg("-o")
        .arg(&partial)
        .arg(&source)
        .status()
        .expect(compiler);
    assert!(status.success(), "compiling {}", source.display());
    std::fs::rename(&partial, &binary).unwrap();
    binary
}

pub fn frame_pointers() -> &'static [&'static str] {
    &["-fno-omit-frame-pointer"]
}

pub fn no_frame_pointers() -> &'static [&'static str] {
    &["-fomit-frame-pointer"]
}

/// Runs `memprof ARGS` and returns its output. As root itself, not as
/// under sudo (scripts/test.sh runs under `sudo -E`): the traced command
/// runs as root. (tests/tests/privileges.rs sets SUDO_UID itself.)
pub fn memprof(args: &[&str]) -> Output {
    memprof_command(args).output().expect("running memprof")
}

/// `memprof ARGS` to run, as `memprof` runs it (to add to).
pub fn memprof_command(args: &[&str]) -> Command {
    let mut command = Command::new(memprof_bin());
    command
        .args(args)
        .env_remove("SUDO_UID")
        .env_remove("SUDO_GID");
    command
}

/// The pprof profile memprof wrote at `path` (a gzipped protobuf).
pub fn read_pprof(path: &Path) -> memprof::report::pprof::proto::Profile {
    use std::io::Read as _;

    use prost::Message as _;
    let mut raw = Vec::new();
    flate2::read::GzDecoder::new(std::fs::File::open(path).unwrap())
        .read_to_end(&mut raw)
        .expect("gzip");
    memprof::report::pprof::proto::Profile::decode(&*raw).expect("a pprof protobuf")
}

/// `memprof trace --format json [extra] -- cmd...`: exit status and report.
pub fn trace_json(extra: &[&str], cmd: &[&str]) -> (Output, Value) {
    trace_json_top("1000", extra, cmd)
}

/// [`trace_json`] keeping the `top` stacks of each process.
pub fn trace_json_top(top: &str, extra: &[&str], cmd: &[&str]) -> (Output, Value) {
    let mut args = vec!["trace", "--format", "json", "--top", top, "--depth", "64"];
    args.extend_from_slice(extra);
    args.push("--");
    args.extend_from_slice(cmd);
    let output = memprof(&args);
    let report = parse_report(&output);
    (output, report)
}

pub fn parse_report(output: &Output) -> Value {
    let report = serde_json::from_slice(&output.stdout).unwrap_or_else(|e| {
        panic!(
            "memprof output is not JSON ({e}); stderr: {}",
            String::from_utf8_lossy(&output.stderr)
        )
    });
    let report = in_version_1_shape(report);
    assert_frames_in_mapped_modules(&report);
    report
}

/// No garbage frames: every frame of every stack lies in a file the
/// process mapped (its `module`), and unnamed ones carry their offset in
/// it. Applied to every JSON report the tests read.
pub fn assert_frames_in_mapped_modules(report: &Value) {
    let Some(processes) = report["processes"].as_array() else {
        return;
    };
    for process in processes {
        for stack in process["stacks"].as_array().into_iter().flatten() {
            for frame in stack["frames"].as_array().into_iter().flatten() {
                assert!(
                    frame["module"].is_string(),
                    "a frame outside every mapped module: {frame} in {stack}"
                );
            }
        }
    }
}

/// Bytes, calls and allocator names of the stacks whose frame 0 is `function`,
/// summed over all processes.
pub fn site(report: &Value, function: &str) -> (u64, u64, Vec<String>) {
    let mut bytes = 0;
    let mut count = 0;
    let mut allocators = Vec::new();
    for stack in report_stacks_at(report, function) {
        bytes += stack["bytes"].as_u64().unwrap();
        count += stack["count"].as_u64().unwrap();
        let allocator = stack["allocator"].as_str().unwrap().to_string();
        if !allocators.contains(&allocator) {
            allocators.push(allocator);
        }
    }
    (bytes, count, allocators)
}

/// The stacks of every process of `report` that `keep` accepts.
pub fn stacks_where(report: &Value, keep: impl Fn(&Value) -> bool) -> Vec<&Value> {
    report["processes"]
        .as_array()
        .unwrap()
        .iter()
        .flat_map(|p| p["stacks"].as_array().unwrap())
        .filter(|stack| keep(stack))
        .collect()
}

/// Each of `fields` summed over `stacks` (every one must have them all).
pub fn sum_fields<const N: usize>(stacks: &[&Value], fields: [&str; N]) -> [u64; N] {
    let mut sum = [0; N];
    for stack in stacks {
        for (total, field) in sum.iter_mut().zip(fields) {
            *total += stack[field]
                .as_u64()
                .unwrap_or_else(|| panic!("{field} missing in {stack}"));
        }
    }
    sum
}

/// The stacks of `parent` (a process of a report, or a diff) whose frame 0
/// is `function`.
pub fn stacks_at(parent: &Value, function: &str) -> Vec<Value> {
    parent["stacks"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|s| s["frames"][0]["function"] == function)
        .cloned()
        .collect()
}

/// The stacks of every process of `report` whose frame 0 is `function`.
fn report_stacks_at(report: &Value, function: &str) -> Vec<Value> {
    report["processes"]
        .as_array()
        .unwrap()
        .iter()
        .flat_map(|process| stacks_at(process, function))
        .collect()
}

/// The process entries whose frames mention `function` anywhere.
pub fn processes_with(report: &Value, function: &str) -> Vec<Value> {
    report["processes"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|p| {
            p["stacks"].as_array().unwrap().iter().any(|s| {
                s["frames"]
                    .as_array()
                    .unwrap()
                    .iter()
                    .any(|f| f["function"].as_str() == Some(function))
            })
        })
        .cloned()
        .collect()
}

/// Names of memprof's BPF programs (as the kernel truncates them).
const PROGRAM_NAMES: [&str; 12] = [
    "site_enter",
    "site_return",
    "alloc_enter",
    "release_enter",
    "mapping_enter",
    "mapping_return",
    "noop_enter",
    "noop_return",
    "on_libraries",
    "on_exec",
    "on_fork",
    "on_exit",
];

/// The tracepoints memprof's raw tracepoint links hang on.
const TRACEPOINTS: [&str; 3] = [
    "'sched_process_exec'",
    "'sched_process_fork'",
    "'sched_process_exit'",
];

/// Asserts that no memprof link or uprobe is left in the kernel, and that
/// its programs are freed. Detaching is immediate; the kernel frees a
/// detached program later, after an RCU grace period or from a work
/// queue (a program array's entries), so programs get a moment to go.
pub fn assert_nothing_loaded() {
    let links = Command::new("bpftool")
        .args(["link", "show"])
        .output()
        .expect("bpftool (apt install bpftool)");
    let links = String::from_utf8_lossy(&links.stdout);
    for name in PROGRAM_NAMES.iter().chain(&TRACEPOINTS) {
        assert!(
            !links.contains(name),
            "a link of {name} is still attached:\n{links}"
        );
    }
    for root in ["/sys/kernel/tracing", "/sys/kernel/debug/tracing"] {
        if let Ok(events) = std::fs::read_to_string(format!("{root}/uprobe_events")) {
            assert!(
                !events.contains("memprof_"),
                "memprof uprobes left in {root}:\n{events}"
            );
        }
    }
    let deadline = std::time::Instant::now() + Duration::from_secs(2);
    loop {
        let progs = Command::new("bpftool")
            .args(["prog", "show"])
            .output()
            .unwrap();
        let progs = String::from_utf8_lossy(&progs.stdout);
        let left: Vec<&str> = PROGRAM_NAMES
            .into_iter()
            .filter(|name| progs.contains(&format!(" name {name} ")))
            .collect();
        if left.is_empty() {
            return;
        }
        assert!(
            std::time::Instant::now() < deadline,
            "BPF programs {left:?} still loaded 2 s after memprof ended:\n{progs}"
        );
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// Asserts a failed run: non-zero exit `code`, exactly one line on stderr
/// containing `needle`, nothing loaded.
pub fn assert_one_line_error(output: &Output, code: i32, needle: &str) {
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert_eq!(
        output.status.code(),
        Some(code),
        "exit status; stderr: {stderr}"
    );
    assert_eq!(
        stderr.lines().count(),
        1,
        "expected one line on stderr, got:\n{stderr}"
    );
    assert!(
        stderr.contains(needle),
        "stderr should mention {needle:?}: {stderr}"
    );
    assert_nothing_loaded();
}

/// Live mode: (live bytes, live count, temporary count, untracked count)
/// of the stacks whose frame 0 is `function`, summed over all processes.
pub fn live_site(report: &Value, function: &str) -> (u64, u64, u64, u64) {
    let stacks = report_stacks_at(report, function);
    let [bytes, count, temporary, untracked] = sum_fields(
        &stacks.iter().collect::<Vec<_>>(),
        [
            "live_bytes",
            "live_count",
            "temporary_count",
            "untracked_count",
        ],
    );
    (bytes, count, temporary, untracked)
}

/// Starts `memprof attach --format json` on `pid` with `extra` options, waits for its "attached" line on stderr.
pub fn start_attach(
    pid: u32,
    extra: &[&str],
) -> (std::process::Child, BufReader<std::process::ChildStderr>) {
    let mut memprof = Command::new(memprof_bin())
        .args([
            "attach",
            "--pid",
            &pid.to_string(),
            "--format",
            "json",
            "--top",
            "100",
        ])
        .args(extra)
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let mut stderr = BufReader::new(memprof.stderr.take().unwrap());
    loop {
        let mut line = String::new();
        stderr.read_line(&mut line).unwrap();
        if line.contains("attached") {
            break;
        }
        // --verbose lists the probes first.
        assert!(
            line.starts_with("memprof: probe "),
            "unexpected line before 'attached': {line}"
        );
    }
    (memprof, stderr)
}

/// The function names of a stack's frames, innermost first ("?" unnamed).
/// The stack is complete (not partial) and its frames begin with
/// `functions`.
pub fn assert_whole_from(stack: &Value, functions: &[&str]) {
    let frames = frame_functions(stack);
    assert_eq!(
        frames.iter().take(functions.len()).collect::<Vec<_>>(),
        functions,
        "{stack:?}"
    );
    assert_eq!(stack["partial"], false, "{stack:?}");
}

pub fn frame_functions(stack: &Value) -> Vec<String> {
    stack["frames"]
        .as_array()
        .unwrap()
        .iter()
        .map(|f| f["function"].as_str().unwrap_or("?").to_string())
        .collect()
}

/// Starts the waiter fixture (`tests/fixtures/waiter.c`, built as
/// `program`), blocked on its stdin until the test writes a line.
pub fn spawn_waiter(program: &Path) -> std::process::Child {
    spawn_waiter_with(program, &[])
}

/// `spawn_waiter` with arguments (`from-a-thread`).
pub fn spawn_waiter_with(program: &Path, args: &[&str]) -> std::process::Child {
    let child = Command::new(program)
        .args(args)
        .stdin(Stdio::piped())
        .spawn()
        .unwrap();
    wait_reading_stdin(child.id());
    child
}

/// Waits until process `pid`'s main thread has ended (a zombie while its
/// other threads run on).
pub fn wait_for_main_thread_end(pid: u32) {
    let deadline = Instant::now() + Duration::from_secs(10);
    let stat = format!("/proc/{pid}/stat");
    let ended = || {
        std::fs::read_to_string(&stat).is_ok_and(|stat| {
            stat.rsplit_once(')')
                .is_some_and(|(_, rest)| rest.trim_start().starts_with('Z'))
        })
    };
    while !ended() {
        assert!(Instant::now() < deadline, "{pid}'s main thread never ended");
        std::thread::sleep(Duration::from_millis(5));
    }
}

/// Waits until a thread of process `pid` blocks reading its stdin
/// (`read(0, ...)`, as /proc/PID/task/TID/syscall shows): past its loader
/// and its start. Attached sooner, on a cold host, memprof met a waiter
/// that had mapped only itself and the loader ("no allocator memprof
/// knows").
pub fn wait_reading_stdin(pid: u32) {
    let deadline = Instant::now() + Duration::from_secs(10);
    let reading = || {
        std::fs::read_dir(format!("/proc/{pid}/task"))
            .into_iter()
            .flatten()
            .flatten()
            .any(|thread| {
                std::fs::read_to_string(thread.path().join("syscall"))
                    .is_ok_and(|now| now.starts_with("0 0x0 "))
            })
    };
    while !reading() {
        assert!(Instant::now() < deadline, "{pid} never read its stdin");
        std::thread::sleep(Duration::from_millis(5));
    }
}

/// Lets an attached target that waits for a line on stdin go ("go", then
/// EOF: it allocates and exits, which ends the profile), waits for it and
/// for memprof, and returns the target's exit status and memprof's report
/// (memprof must succeed).
pub fn release_and_report(
    target: &mut std::process::Child,
    memprof: std::process::Child,
) -> (std::process::ExitStatus, Value) {
    let mut stdin = target.stdin.take().unwrap();
    stdin.write_all(b"go\n").unwrap();
    drop(stdin);
    let status = target.wait().unwrap();
    let output = memprof.wait_with_output().unwrap();
    assert!(output.status.success());
    (status, parse_report(&output))
}

/// The GNU build id of an ELF file, as readelf prints it (hex).
pub fn readelf_build_id(path: &Path) -> String {
    let output = Command::new("readelf")
        .arg("-n")
        .arg(path)
        .output()
        .expect("readelf");
    String::from_utf8_lossy(&output.stdout)
        .lines()
        .find_map(|line| line.trim().strip_prefix("Build ID: "))
        .unwrap_or_else(|| panic!("no build id in {}", path.display()))
        .to_string()
}

/// An estimate (sampling) within 5% of the exact figure.
pub fn within_5_percent(estimate: u64, exact: u64, what: &str) {
    let error = estimate as f64 / exact as f64 - 1.0;
    assert!(
        error.abs() <= 0.05,
        "{what}: estimated {estimate}, exact {exact} ({:+.2}%)",
        error * 100.0
    );
}

/// A memprof JSON report from its text, in version 1's shape whatever
/// its version (see [`in_version_1_shape`]).
pub fn report_json(text: &str) -> Value {
    in_version_1_shape(serde_json::from_str(text).expect("a JSON report"))
}

/// A JSON report in version 1's shape: a version-2 report's stacks (and
/// peak stacks) hold indices into its tables, replaced here by the frames
/// they name, read as docs/json-schema.md says (not by memprof's reader:
/// the schema is checked on its own), the tables dropped, the version 1.
pub fn in_version_1_shape(mut report: Value) -> Value {
    if report["version"] != 2 {
        return report;
    }
    let table = |name: &str| report[name].as_array().cloned().unwrap_or_default();
    let (modules, files, functions) = (table("modules"), table("files"), table("functions"));
    let frames: Vec<Value> = table("locations")
        .iter()
        .map(|location| {
            let at = |list: &[Value], index: &Value| -> Value {
                index
                    .as_u64()
                    .map_or(Value::Null, |i| list[i as usize].clone())
            };
            let module = at(&modules, &location["module"]);
            let function = at(&functions, &location["function"]);
            serde_json::json!({
                "address": location["address"],
                "function": function["name"],
                "file": at(&files, &function["file"]),
                "line": location["line"],
                "module": module["path"],
                "inlined": location["inlined"],
                "module_offset": location["module_offset"],
                "build_id": module["build_id"],
            })
        })
        .collect();
    let expand = |stacks: &mut Value| {
        for stack in stacks.as_array_mut().into_iter().flatten() {
            let indices = stack["frames"].as_array().cloned().unwrap_or_default();
            stack["frames"] = indices
                .iter()
                .map(|i| frames[i.as_u64().expect("a frame index") as usize].clone())
                .collect();
        }
    };
    for process in report["processes"].as_array_mut().into_iter().flatten() {
        expand(&mut process["stacks"]);
        if process.get("peak_stacks").is_some() {
            expand(&mut process["peak_stacks"]);
        }
    }
    let document = report.as_object_mut().expect("a JSON object");
    for table in ["modules", "files", "functions", "locations"] {
        document.remove(table);
    }
    document.insert("version".into(), Value::from(1));
    report
}
