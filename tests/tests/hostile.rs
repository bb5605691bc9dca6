//! What a profiled process controls cannot hang memprof, fool it, or
//! reach root's terminal through it: FIFOs where memprof reads files,
//! control characters in names, files planted where it writes.
use std::{
    fs,
    os::unix::fs::{FileTypeExt as _, PermissionsExt as _},
    path::{Path, PathBuf},
    process::{Command, Output, Stdio},
    time::{Duration, Instant},
};

use serde_json::Value;
use tests::*;

/// `site_hostile`'s exact figures.
const CALLS: u64 = 10;
const BYTES: u64 = 1000;

/// A directory of its own under target/fixtures, `mode`.
fn scratch(name: &str, mode: u32) -> PathBuf {
    let dir = workspace_root().join(format!("target/fixtures/hostile-{name}"));
    let _ = fs::remove_dir_all(&dir);
    fs::create_dir_all(&dir).unwrap();
    fs::set_permissions(&dir, fs::Permissions::from_mode(mode)).unwrap();
    dir
}

/// The fixture, copied into `dir` as `name`.
fn hostile_program(dir: &Path, name: &str) -> PathBuf {
    let built = fixture("hostile", "plain", &["-g"]);
    let program = dir.join(name);
    fs::copy(&built, &program).unwrap();
    program
}

/// `memprof ARGS`, killed if it runs past `limit` (then the test fails:
/// it hung).
fn memprof_within(args: &[&std::ffi::OsStr], limit: Duration) -> Output {
    let mut child = memprof_command(&[])
        .args(args)
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let started = Instant::now();
    while child.try_wait().unwrap().is_none() {
        if started.elapsed() > limit {
            let _ = child.kill();
            let output = child.wait_with_output().unwrap();
            panic!(
                "memprof still ran after {limit:?}: stderr: {}",
                String::from_utf8_lossy(&output.stderr)
            );
        }
        std::thread::sleep(Duration::from_millis(50));
    }
    child.wait_with_output().unwrap()
}

fn os(args: &[&str]) -> Vec<std::ffi::OsString> {
    args.iter().map(Into::into).collect()
}

fn trace_json_within(program: &Path, program_args: &[&str]) -> (Output, Value) {
    trace_json_with(&[], program, program_args)
}

fn trace_json_with(extra: &[&str], program: &Path, program_args: &[&str]) -> (Output, Value) {
    let mut args = os(&["trace", "--format", "json", "--top", "100"]);
    args.extend(os(extra));
    args.extend(os(&["--"]));
    args.push(program.into());
    args.extend(os(program_args));
    let refs: Vec<&std::ffi::OsStr> = args.iter().map(|a| a.as_os_str()).collect();
    let output = memprof_within(&refs, Duration::from_secs(60));
    let report = parse_report(&output);
    (output, report)
}

fn unsymbolized_reason(report: &Value, module: &Path) -> Option<String> {
    report["unsymbolized"]
        .as_array()?
        .iter()
        .find(|entry| entry["module"] == module.display().to_string())
        .map(|entry| entry["reason"].as_str().unwrap().to_string())
}

/// A debug link that names a FIFO beside the program: blazesym's open of
/// it would never return. In a directory only root can write to, the link
/// is checked and refused, and the program named by its own symbols; in
/// one anyone can (as /tmp), memprof reads a copy of the program, which
/// has no directory to look in.
#[test]
fn a_fifo_named_by_a_debug_link_does_not_hang_memprof() {
    let _serial = serial();
    for (mode, checked) in [(0o755, true), (0o777, false)] {
        let dir = scratch(&format!("debuglink-{mode:o}"), mode);
        let program = hostile_program(&dir, "linked");
        fs::write(dir.join("linked.debug"), b"not yet a FIFO").unwrap();
        let status = Command::new("objcopy")
            .arg("--add-gnu-debuglink=linked.debug")
            .arg("linked")
            .current_dir(&dir)
            .status()
            .unwrap();
        assert!(status.success());
        fs::remove_file(dir.join("linked.debug")).unwrap();
        nix::unistd::mkfifo(&dir.join("linked.debug"), nix::sys::stat::Mode::S_IRWXU).unwrap();

        let (output, report) = trace_json_within(&program, &[]);
        assert!(
            output.status.success(),
            "{}",
            String::from_utf8_lossy(&output.stderr)
        );
        assert_eq!(
            site(&report, "site_hostile"),
            (BYTES, CALLS, vec!["malloc".to_string()])
        );
        let reason = unsymbolized_reason(&report, &program);
        match checked {
            true => {
                let reason = reason.expect("the refused debug link is in the report");
                assert!(reason.contains("FIFO"), "{reason}");
            }
            // The copy has no file:line lost: its own DWARF is read.
            false => {
                assert_eq!(reason, None);
                let stack = first_stack(&report, "site_hostile");
                assert!(stack["frames"][0]["line"].is_u64(), "{stack}");
            }
        }
        fs::remove_dir_all(&dir).unwrap();
    }
}

/// A program that puts a FIFO where its executable was, before it exits:
/// memprof symbolizes it after, from the file it held open while the
/// program ran, not from the path.
#[test]
fn a_fifo_swapped_in_for_the_executable_does_not_hang_memprof() {
    let _serial = serial();
    let dir = scratch("swap", 0o755);
    let program = hostile_program(&dir, "swapper");
    let (output, report) = trace_json_within(&program, &["swap-exe"]);
    assert!(
        output.status.success(),
        "{}",
        String::from_utf8_lossy(&output.stderr)
    );
    let metadata = fs::symlink_metadata(&program).unwrap();
    assert!(metadata.file_type().is_fifo(), "the program swapped itself");
    assert_eq!(
        site(&report, "site_hostile"),
        (BYTES, CALLS, vec!["malloc".to_string()])
    );
    let stack = first_stack(&report, "site_hostile");
    assert!(
        stack["frames"][0]["line"].is_u64(),
        "named with file:line: {stack}"
    );
    fs::remove_dir_all(&dir).unwrap();
}

/// The first stack whose frame 0 is `function`.
fn first_stack<'a>(report: &'a Value, function: &str) -> &'a Value {
    stacks_where(report, |stack| stack["frames"][0]["function"] == function)
        .first()
        .copied()
        .unwrap_or_else(|| panic!("no stack at {function}: {report}"))
}

/// The name memprof sees for the program, its executable's path and its
/// arguments carry terminal control sequences (retitle, clear the
/// screen, a line feed to fake a line): no control byte reaches any text
/// output, the SVGs parse, and JSON keeps the names exact.
#[test]
fn control_sequences_in_names_reach_no_terminal() {
    let _serial = serial();
    let dir = scratch("names", 0o755);
    let name = "ev\x1b]0;pwn\x07il";
    let program = hostile_program(&dir, name);
    let argument = "\x1b[2J\nfake line";
    let (_, report) = trace_json_with(&["--timeline-period", "10ms"], &program, &[argument]);
    let process = report["processes"]
        .as_array()
        .unwrap()
        .iter()
        .find(|p| p["exe"] == program.display().to_string())
        .expect("the program's process, its exe exact");
    assert_eq!(process["cmdline"][1], argument);
    assert_eq!(site(&report, "site_hostile").1, CALLS);

    let saved = dir.join("report.json");
    fs::write(&saved, serde_json::to_vec(&report).unwrap()).unwrap();
    for format in [
        "text",
        "markdown",
        "tsv",
        "folded",
        "flamegraph",
        "timeline",
    ] {
        let output = memprof(&["report", saved.to_str().unwrap(), "--format", format]);
        assert!(
            output.status.success(),
            "{format}: {}",
            String::from_utf8_lossy(&output.stderr)
        );
        let allowed: &[u8] = if format == "tsv" { b"\n\t" } else { b"\n" };
        let control = output
            .stdout
            .iter()
            .find(|&&b| (b < 0x20 && !allowed.contains(&b)) || b == 0x7f);
        assert_eq!(control, None, "{format} prints a control byte");
        let text = String::from_utf8_lossy(&output.stdout);
        if matches!(format, "text" | "markdown") {
            assert!(text.contains("ev\\x1b]0;pwn\\x07il"), "{format}: {text}");
        }
        if matches!(format, "flamegraph" | "timeline") {
            if let Err(err) = roxmltree::Document::parse_with_options(
                &text,
                roxmltree::ParsingOptions {
                    allow_dtd: true,
                    ..Default::default()
                },
            ) {
                panic!("{format}: not well-formed XML: {err}");
            }
        }
    }
    // The live text report, as trace prints it.
    let output = memprof_within(
        &[
            "trace".as_ref(),
            "--".as_ref(),
            program.as_os_str(),
            argument.as_ref(),
        ],
        Duration::from_secs(60),
    );
    assert!(
        !output.stdout.contains(&0x1b),
        "trace's text report prints ESC"
    );
    fs::remove_dir_all(&dir).unwrap();
}

/// `-o` names a file another user planted in a directory anyone can
/// write to, or a FIFO: refused before profiling, left as it was.
#[test]
fn a_planted_output_file_or_fifo_is_refused() {
    let _serial = serial();
    let dir = scratch("planted", 0o1777);
    let planted = dir.join("report.txt");
    fs::write(&planted, b"theirs").unwrap();
    fs::set_permissions(&planted, fs::Permissions::from_mode(0o666)).unwrap();
    let nobody = nix::unistd::Uid::from_raw(65534);
    nix::unistd::chown(&planted, Some(nobody), None).unwrap();
    let fifo = dir.join("report.fifo");
    nix::unistd::mkfifo(&fifo, nix::sys::stat::Mode::from_bits_truncate(0o666)).unwrap();
    nix::unistd::chown(&fifo, Some(nobody), None).unwrap();
    for target in [&planted, &fifo] {
        let output = memprof(&["trace", "-o", target.to_str().unwrap(), "--", "true"]);
        assert_one_line_error(&output, 2, "belongs to another user");
    }
    assert_eq!(fs::read(&planted).unwrap(), b"theirs");
    // A file of memprof's user is replaced whole.
    let own = dir.join("own.txt");
    let output = memprof(&["trace", "-o", own.to_str().unwrap(), "--", "true"]);
    assert!(
        output.status.success(),
        "{}",
        String::from_utf8_lossy(&output.stderr)
    );
    assert!(fs::read_to_string(&own).unwrap().starts_with("memprof: "));
    fs::remove_dir_all(&dir).unwrap();
}

/// `memprof report` of a FIFO or a device: refused at once, one line.
#[test]
fn a_saved_report_that_is_a_fifo_is_refused_at_once() {
    let _serial = serial();
    let dir = scratch("saved", 0o755);
    let fifo = dir.join("report.json");
    nix::unistd::mkfifo(&fifo, nix::sys::stat::Mode::S_IRWXU).unwrap();
    let fifo_arg = fifo.clone().into_os_string();
    let output = memprof_within(
        &["report".as_ref(), fifo_arg.as_os_str()],
        Duration::from_secs(10),
    );
    assert_one_line_error(&output, 1, "FIFO");
    let output = memprof(&["report", "/dev/zero"]);
    assert_one_line_error(&output, 1, "character device");
    // Larger than --max-report-size: refused before it is read.
    let big = dir.join("big.json");
    fs::write(&big, vec![b' '; 4096]).unwrap();
    let output = memprof(&["report", big.to_str().unwrap(), "--max-report-size", "1K"]);
    assert_one_line_error(&output, 2, "--max-report-size");
    fs::remove_dir_all(&dir).unwrap();
}

/// A library loaded, run and unloaded before memprof reads the process's
/// maps again, then replaced at its path by one whose functions lie at
/// the same offsets under other names: memprof names the frames from
/// the file it held when the loader announced it, not from what the path
/// names after the program exits.
#[test]
fn a_library_unloaded_and_replaced_is_named_from_the_file_it_was() {
    let _serial = serial();
    let dir = scratch("unloaded", 0o755);
    let library = ["-shared", "-fPIC", "-fno-omit-frame-pointer"];
    let plugin = dir.join("libplugin.so");
    fs::copy(fixture("plugin", "fp.so", &library), &plugin).unwrap();
    let decoy = dir.join("decoy.so");
    fs::copy(fixture("decoy_plugin", "fp.so", &library), &decoy).unwrap();
    let program = fixture("unloader", "plain", &["-ldl"]);
    let (output, report) = trace_json_within(
        &program,
        &[plugin.to_str().unwrap(), decoy.to_str().unwrap()],
    );
    assert!(
        output.status.success(),
        "{}",
        String::from_utf8_lossy(&output.stderr)
    );
    assert!(!decoy.exists(), "the program put the decoy in its place");
    let stack = first_stack(&report, "plugin_leaf");
    assert_eq!(
        (stack["count"].as_u64(), stack["bytes"].as_u64()),
        (Some(9), Some(360))
    );
    let functions = frame_functions(stack);
    assert_eq!(
        functions[..3],
        ["plugin_leaf", "plugin_mid", "plugin_run"],
        "{stack}"
    );
    let decoys = stacks_where(&report, |s| {
        frame_functions(s).iter().any(|f| f.starts_with("decoy_"))
    });
    assert!(decoys.is_empty(), "named from the decoy: {decoys:?}");
    fs::remove_dir_all(&dir).unwrap();
}
