//! Names for stripped code. A program stripped of its
//! symbols and DWARF (tests/fixtures/stripped.c, built without frame
//! pointers) gets its names and file:line back from a separate debug file
//! found through its `.gnu_debuglink`, by build id under a debug directory,
//! or from a debuginfod server; with none, its frames print as
//! `module+0xOFFSET`, the same offset in every run, and the report carries
//! the module's build id.
//!
//! Also: names that are not mangled are shown as they are.
use std::{
    io::{Read as _, Write as _},
    net::TcpStream,
    path::{Path, PathBuf},
    process::{Command, Output, Stdio},
    time::{Duration, Instant},
};

use serde_json::Value;
use tests::*;

/// `fill_cache_entry` allocates 3000 bytes, 17 times.
const CALLS: u64 = 17;
const BYTES: u64 = 17 * 3000;

struct Stripped {
    dir: PathBuf,
    program: PathBuf,
    debug: PathBuf,
    build_id: String,
}

/// The fixture, built with DWARF, then split: `dir/stripped` (no
/// .symtab, no DWARF; with a debug link to `stripped.debug` when asked)
/// and its debug file, `dir/stripped.debug`.
fn stripped(variant: &str, debug_link: bool) -> Stripped {
    let built = fixture("stripped", &format!("{variant}-full"), no_frame_pointers());
    let dir = workspace_root().join(format!("target/fixtures/symbols-{variant}"));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    let program = dir.join("stripped");
    let debug = dir.join("stripped.debug");
    run(Command::new("objcopy")
        .arg("--only-keep-debug")
        .arg(&built)
        .arg(&debug));
    run(Command::new("strip")
        .arg("--strip-all")
        .arg("-o")
        .arg(&program)
        .arg(&built));
    if debug_link {
        run(Command::new("objcopy")
            .arg("--add-gnu-debuglink=stripped.debug")
            .arg("stripped")
            .current_dir(&dir));
    }
    let build_id = readelf_build_id(&program);
    assert_eq!(build_id, readelf_build_id(&debug));
    Stripped {
        dir,
        program,
        debug,
        build_id,
    }
}

fn run(command: &mut Command) {
    let status = command.status().expect("running a binutils tool");
    assert!(status.success(), "{command:?}");
}

/// `memprof trace --format json [extra] -- program`, with no debuginfod
/// server unless `env` names one.
fn trace(extra: &[&str], program: &Path, env: &[(&str, &str)]) -> (Output, Value) {
    let mut command = memprof_command(&[
        "trace", "--format", "json", "--top", "1000", "--depth", "64",
    ]);
    command
        .args(extra)
        .arg("--")
        .arg(program)
        .env_remove("DEBUGINFOD_URLS");
    for (key, value) in env {
        command.env(key, value);
    }
    let output = command.output().expect("running memprof");
    assert!(
        output.status.success(),
        "{}",
        String::from_utf8_lossy(&output.stderr)
    );
    let report = parse_report(&output);
    (output, report)
}

/// The stack whose frame 0 lies in the stripped program.
fn program_stack(report: &Value) -> Value {
    let stacks: Vec<&Value> = report["processes"][0]["stacks"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|s| {
            s["frames"][0]["module"]
                .as_str()
                .is_some_and(|m| m.ends_with("/stripped"))
        })
        .collect();
    assert_eq!(stacks.len(), 1, "{report:#}");
    stacks[0].clone()
}

/// The names came back: frame 0 is `fill_cache_entry` at stripped.c:10,
/// then `load_cache` and `main`, with exact counts.
fn assert_named(report: &Value) {
    let stack = program_stack(report);
    assert_eq!(stack["count"], CALLS, "{stack:#}");
    assert_eq!(stack["bytes"], BYTES, "{stack:#}");
    let functions = frame_functions(&stack);
    assert_eq!(
        &functions[..3],
        ["fill_cache_entry", "load_cache", "main"],
        "{stack:#}"
    );
    let first = &stack["frames"][0];
    assert!(
        first["file"].as_str().unwrap().ends_with("stripped.c"),
        "{first}"
    );
    assert_eq!(first["line"], 10, "{first}");
}

#[test]
fn names_come_back_through_the_debug_link() {
    let _serial = serial();
    let stripped = stripped("link", true);
    let (_, report) = trace(&[], &stripped.program, &[]);
    assert_named(&report);
}

#[test]
fn names_come_back_by_build_id_under_a_debug_directory() {
    let _serial = serial();
    let stripped = stripped("build-id", false);
    let debug_dir = stripped.dir.join("debug");
    let by_id = debug_dir.join(".build-id").join(&stripped.build_id[..2]);
    std::fs::create_dir_all(&by_id).unwrap();
    std::fs::copy(
        &stripped.debug,
        by_id.join(format!("{}.debug", &stripped.build_id[2..])),
    )
    .unwrap();
    let (_, report) = trace(
        &["--debug-dir", debug_dir.to_str().unwrap()],
        &stripped.program,
        &[],
    );
    assert_named(&report);
}

#[test]
fn without_debug_files_frames_are_module_offsets_the_same_in_every_run() {
    let _serial = serial();
    let stripped = stripped("none", false);
    std::fs::remove_file(&stripped.debug).unwrap();
    let offsets = |report: &Value| -> Vec<(String, String)> {
        let stack = program_stack(report);
        assert_eq!(stack["count"], CALLS, "{stack:#}");
        stack["frames"]
            .as_array()
            .unwrap()
            .iter()
            .filter(|f| f["module"].as_str().unwrap().ends_with("/stripped"))
            .map(|f| {
                assert!(f["function"].is_null(), "{f}");
                assert_eq!(f["build_id"], stripped.build_id.as_str(), "{f}");
                (
                    f["module_offset"].as_str().unwrap().to_string(),
                    f["address"].as_str().unwrap().to_string(),
                )
            })
            .collect()
    };
    let (_, first) = trace(&[], &stripped.program, &[]);
    let (_, second) = trace(&[], &stripped.program, &[]);
    let (first, second) = (offsets(&first), offsets(&second));
    // fill_cache_entry, load_cache, main: all in the program.
    assert!(first.len() >= 3, "{first:?}");
    let offsets_only = |frames: &[(String, String)]| -> Vec<String> {
        frames.iter().map(|(offset, _)| offset.clone()).collect()
    };
    assert_eq!(offsets_only(&first), offsets_only(&second));
    // The program is position-independent: its addresses moved.
    assert_ne!(first[0].1, second[0].1);

    // `memprof diff` matches the unnamed frames of two runs by build id
    // and offset: the same program twice has no stack that changed.
    let saved: Vec<PathBuf> = (0..2)
        .map(|run| stripped.dir.join(format!("run{run}.json")))
        .collect();
    for path in &saved {
        let output = memprof(&[
            "trace",
            "--format",
            "json",
            "--top",
            "1000",
            "-o",
            path.to_str().unwrap(),
            "--",
            stripped.program.to_str().unwrap(),
        ]);
        assert!(output.status.success());
    }
    let output = memprof(&[
        "diff",
        saved[0].to_str().unwrap(),
        saved[1].to_str().unwrap(),
        "--format",
        "json",
    ]);
    assert!(output.status.success());
    let diff: Value = serde_json::from_slice(&output.stdout).unwrap();
    let changed: Vec<&Value> = diff["stacks"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|s| s["frames"].to_string().contains("/stripped\""))
        .collect();
    assert!(changed.is_empty(), "{changed:#?}");

    // The text report names them module+0xOFFSET.
    let output = memprof(&[
        "trace",
        "--top",
        "50",
        "--",
        stripped.program.to_str().unwrap(),
    ]);
    let text = String::from_utf8_lossy(&output.stdout);
    assert!(text.contains(&format!("stripped+{}", first[0].0)), "{text}");
}

/// A debuginfod server (Debian's `debuginfod`) on loopback, serving the
/// debug files under `dir`; killed when dropped.
struct Debuginfod {
    child: std::process::Child,
    url: String,
}

impl Debuginfod {
    fn start(dir: &Path) -> Debuginfod {
        let port = std::net::TcpListener::bind("127.0.0.1:0")
            .unwrap()
            .local_addr()
            .unwrap()
            .port();
        let child = Command::new("debuginfod")
            .args(["-F", "-d", ":memory:", "-p", &port.to_string()])
            .arg(dir)
            // Never ask other servers about what it lacks.
            .env_remove("DEBUGINFOD_URLS")
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .expect("debuginfod (scripts/setup.sh installs it)");
        Debuginfod {
            child,
            url: format!("http://127.0.0.1:{port}"),
        }
    }

    /// Waits until the server has indexed `build_id` (it scans its
    /// directory after starting).
    fn wait_for(&self, build_id: &str) {
        let started = Instant::now();
        let address = self.url.trim_start_matches("http://").to_string();
        loop {
            if let Ok(mut stream) = TcpStream::connect(&address) {
                let request = format!(
                    "GET /buildid/{build_id}/debuginfo HTTP/1.0\r\nHost: {address}\r\n\r\n"
                );
                // The body is the binary debug file: only the status line
                // is text.
                let mut response = Vec::new();
                if stream.write_all(request.as_bytes()).is_ok()
                    && stream.read_to_end(&mut response).is_ok()
                    && (response.starts_with(b"HTTP/1.0 200")
                        || response.starts_with(b"HTTP/1.1 200"))
                {
                    return;
                }
            }
            assert!(
                started.elapsed() < Duration::from_secs(60),
                "debuginfod did not serve {build_id} within 60 s"
            );
            std::thread::sleep(Duration::from_millis(200));
        }
    }
}

impl Drop for Debuginfod {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

#[test]
fn names_come_back_from_a_debuginfod_server() {
    let _serial = serial();
    let stripped = stripped("debuginfod", false);
    let served = stripped.dir.join("served");
    std::fs::create_dir_all(&served).unwrap();
    std::fs::rename(&stripped.debug, served.join("stripped.debug")).unwrap();
    let server = Debuginfod::start(&served);
    server.wait_for(&stripped.build_id);
    let cache = stripped.dir.join("cache");
    let url = server.url.clone();
    let env = [
        ("DEBUGINFOD_URLS", url.as_str()),
        ("DEBUGINFOD_CACHE_PATH", cache.to_str().unwrap()),
    ];
    let (_, report) = trace(&[], &stripped.program, &env);
    assert_named(&report);
    // Cached where elfutils' client (gdb, perf) looks.
    assert!(cache.join(&stripped.build_id).join("debuginfo").is_file());

    // From the cache, with the server gone.
    drop(server);
    let (_, report) = trace(&[], &stripped.program, &env);
    assert_named(&report);
}

/// A C function's name is shown as it is, even one a C++ demangler takes
/// for a type: `t` ("unsigned short") and `f` ("float") before.
#[test]
fn c_functions_named_like_cpp_types_keep_their_names() {
    let _serial = serial();
    let program = fixture("short_names", "fp", frame_pointers());
    let (output, report) = trace_json(&[], &[program.to_str().unwrap()]);
    assert!(output.status.success());
    let stacks = stacks_at(&processes_with(&report, "t")[0], "t");
    assert_eq!(stacks.len(), 1, "{stacks:?}");
    assert_eq!(stacks[0]["bytes"], 5 * 24, "{stacks:?}");
    assert_eq!(stacks[0]["count"], 5, "{stacks:?}");
    let functions = frame_functions(&stacks[0]);
    assert_eq!(
        functions.iter().take(3).collect::<Vec<_>>(),
        ["t", "f", "main"]
    );
    assert_nothing_loaded();
}

/// A "debuginfod server" that takes connections and never answers
/// (an unreachable mirror, a hostile one); each connection is held open.
struct Silent {
    url: String,
    accepted: std::sync::Arc<std::sync::atomic::AtomicUsize>,
}

impl Silent {
    fn start() -> Silent {
        let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let url = format!("http://{}", listener.local_addr().unwrap());
        let accepted = std::sync::Arc::new(std::sync::atomic::AtomicUsize::new(0));
        let counted = accepted.clone();
        std::thread::spawn(move || {
            let mut held = Vec::new();
            for stream in listener.incoming().flatten() {
                counted.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
                held.push(stream);
            }
        });
        Silent { url, accepted }
    }

    fn accepted(&self) -> usize {
        self.accepted.load(std::sync::atomic::Ordering::SeqCst)
    }
}

/// The stripped program's stack is exact, shown as module+offset, and its
/// module is listed as not symbolized for a reason that says `why`.
fn assert_unnamed_for(report: &Value, why: &str) {
    let stack = program_stack(report);
    assert_eq!(stack["count"], CALLS, "{stack:#}");
    assert_eq!(stack["bytes"], BYTES, "{stack:#}");
    assert!(stack["frames"][0]["function"].is_null(), "{stack:#}");
    assert!(stack["frames"][0]["module_offset"].is_string(), "{stack:#}");
    let reasons: Vec<&str> = report["unsymbolized"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|u| {
            u["module"]
                .as_str()
                .is_some_and(|m| m.ends_with("/stripped"))
        })
        .filter_map(|u| u["reason"].as_str())
        .collect();
    assert!(
        reasons.iter().any(|r| r.contains(why)),
        "{:#}",
        report["unsymbolized"]
    );
}

/// A debuginfod server that never answers costs the time limit, not the
/// download's own 30 s: the file is then shown as module+offset.
#[test]
fn a_debuginfod_server_that_never_answers_costs_only_the_time_limit() {
    let _serial = serial();
    let stripped = stripped("silent-server", false);
    let server = Silent::start();
    let cache = stripped.dir.join("cache");
    let env = [
        ("DEBUGINFOD_URLS", server.url.as_str()),
        ("DEBUGINFOD_CACHE_PATH", cache.to_str().unwrap()),
    ];
    let started = Instant::now();
    let (_, report) = trace(&["--symbol-time-limit", "2"], &stripped.program, &env);
    let took = started.elapsed();
    assert!(server.accepted() >= 1, "memprof never asked the server");
    assert!(took < Duration::from_secs(12), "{took:?}");
    assert_unnamed_for(&report, "took over 2 s");
}

/// SIGTERM while a download hangs: memprof ends within 2 s, with its
/// report (exact, the module waited for shown as module+offset).
#[test]
fn sigterm_while_a_download_hangs_gives_the_report_within_2_s() {
    let _serial = serial();
    let stripped = stripped("silent-sigterm", false);
    let server = Silent::start();
    let cache = stripped.dir.join("cache");
    let child = memprof_command(&[
        "trace", "--format", "json", "--top", "1000", "--depth", "64", "--",
    ])
    .arg(&stripped.program)
    .env("DEBUGINFOD_URLS", &server.url)
    .env("DEBUGINFOD_CACHE_PATH", &cache)
    .stdout(Stdio::piped())
    .stderr(Stdio::piped())
    .spawn()
    .unwrap();
    // The program has ended and the report is being made once memprof
    // asks the server.
    let started = Instant::now();
    while server.accepted() == 0 {
        assert!(
            started.elapsed() < Duration::from_secs(60),
            "memprof never asked the server"
        );
        std::thread::sleep(Duration::from_millis(20));
    }
    let signalled = Instant::now();
    let status = Command::new("kill")
        .args(["-TERM", &child.id().to_string()])
        .status()
        .unwrap();
    assert!(status.success());
    let output = child.wait_with_output().unwrap();
    let took = signalled.elapsed();
    assert!(
        took < Duration::from_secs(2),
        "{took:?}: {}",
        String::from_utf8_lossy(&output.stderr)
    );
    assert_unnamed_for(&parse_report(&output), "stopping");
}
