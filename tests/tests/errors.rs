//! Bad input: one clear line on stderr, a non-zero exit, nothing loaded.
use std::process::Command;

use tests::*;

#[test]
fn no_such_pid() {
    let _serial = serial();
    let output = memprof(&["attach", "--pid", "999999999"]);
    assert_one_line_error(&output, 1, "no process with pid 999999999");
}

#[test]
fn kernel_thread() {
    let _serial = serial();
    // pid 2 is kthreadd.
    let output = memprof(&["attach", "--pid", "2"]);
    assert_one_line_error(&output, 1, "kernel thread");
}

#[test]
fn command_not_found_exits_127() {
    let _serial = serial();
    let output = memprof(&["trace", "--", "no-such-command-memprof"]);
    assert_one_line_error(&output, 127, "no-such-command-memprof: command not found");
}

#[test]
fn unknown_option() {
    let _serial = serial();
    let output = memprof(&["trace", "--no-such-option", "--", "true"]);
    assert_one_line_error(&output, 2, "--no-such-option");
}

/// clap's suggestion stays in the one line; a bare `memprof` says what
/// it can do.
#[test]
fn a_typo_gets_its_suggestion_and_no_command_the_short_usage() {
    let _serial = serial();
    let output = memprof(&["trace", "--formt", "json", "--", "true"]);
    assert_one_line_error(&output, 2, "a similar argument exists: '--format'");
    let output = memprof(&[]);
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert_eq!(output.status.code(), Some(2), "{stderr}");
    assert!(stderr.contains("Usage: memprof <COMMAND>"), "{stderr}");
    for command in ["trace", "attach", "monitor", "report", "diff"] {
        assert!(
            stderr.contains(&format!("\n  {command} ")),
            "{command}: {stderr}"
        );
    }
    assert!(stderr.lines().count() <= 15, "{stderr}");
}

/// Counts take K, M and G as their help says ("the default 4M rows");
/// durations take units.
#[test]
fn counts_and_durations_take_their_units() {
    let _serial = serial();
    let output = memprof(&[
        "trace",
        "--unwind-rows",
        "4M",
        "--max-stacks",
        "64K",
        "--",
        "true",
    ]);
    assert!(output.status.success(), "{output:?}");
    let output = memprof(&["trace", "--unwind-rows", "8G", "--", "true"]);
    assert_one_line_error(&output, 2, "'8G' is more than 4294967295");
    let mut sleeper = std::process::Command::new("sleep")
        .arg("30")
        .spawn()
        .unwrap();
    let started = std::time::Instant::now();
    let pid = sleeper.id().to_string();
    let output = memprof(&["attach", "--pid", &pid, "--duration", "1s"]);
    sleeper.kill().unwrap();
    sleeper.wait().unwrap();
    assert!(output.status.success(), "{output:?}");
    assert!(started.elapsed() < std::time::Duration::from_secs(20));
}

#[test]
fn bad_value() {
    let _serial = serial();
    let output = memprof(&["trace", "--min-bytes", "lots", "--", "true"]);
    assert_one_line_error(&output, 2, "lots");
}

#[test]
fn not_root() {
    let _serial = serial();
    let output = Command::new("setpriv")
        .args([
            "--reuid=65534",
            "--regid=65534",
            "--clear-groups",
            "--inh-caps=-all",
        ])
        .arg(memprof_bin())
        .args(["trace", "--", "true"])
        .output()
        .unwrap();
    assert_one_line_error(&output, 1, "must run as root");
}

/// Bad values are refused by the option parser, before anything starts,
/// naming the option.
#[test]
fn zero_sizes_and_periods_are_refused_naming_the_option() {
    let _serial = serial();
    for (option, value) in [
        ("--interval", "0"),
        ("--interval", "0s"),
        ("--depth", "0"),
        ("--max-stacks", "0"),
        ("--stack-map-size", "0"),
    ] {
        let marker = std::env::temp_dir().join(format!("memprof-ran-{}", std::process::id()));
        let _ = std::fs::remove_file(&marker);
        let output = memprof(&[
            "trace",
            option,
            value,
            "--",
            "touch",
            marker.to_str().unwrap(),
        ]);
        assert_one_line_error(&output, 2, option);
        assert!(!marker.exists(), "{option} {value}: the command ran");
    }
    let output = memprof(&["trace", "--live", "--max-live", "0", "--", "true"]);
    assert_one_line_error(&output, 2, "--max-live");
}

#[test]
fn a_zombie_is_refused_as_exited() {
    let _serial = serial();
    // Not waited for: a zombie until this test ends.
    let mut child = Command::new("true").spawn().unwrap();
    let zombie = child.id().to_string();
    std::thread::sleep(std::time::Duration::from_millis(200));
    let output = memprof(&["attach", "--pid", &zombie]);
    assert_one_line_error(&output, 1, "has exited");
    child.wait().unwrap();
}

#[test]
fn byte_units_are_powers_of_1024_and_the_report_says_what_was_asked() {
    let _serial = serial();
    let (output, report) = trace_json(&["--sample-bytes", "512K"], &["true"]);
    assert!(output.status.success());
    assert_eq!(report["sample_bytes"], 512 * 1024);
    let output = memprof(&["trace", "--sample-bytes", "512KiB", "--", "true"]);
    let text = String::from_utf8_lossy(&output.stdout);
    assert!(
        text.contains("one per 512.0 KiB"),
        "the report names the rate asked for: {text}"
    );
}

/// `-h` is a screenful per command, `--help` the long form with every
/// option and the examples.
#[test]
fn short_help_is_a_screenful_and_long_help_has_the_rest() {
    let _serial = serial();
    let text = |args: &[&str]| {
        let output = memprof(args);
        assert!(output.status.success(), "{args:?}: {output:?}");
        String::from_utf8(output.stdout).unwrap()
    };
    for command in ["", "trace", "attach", "monitor", "report", "diff"] {
        let with = |flag: &'static str| -> Vec<&str> {
            [command, flag]
                .into_iter()
                .filter(|a| !a.is_empty())
                .collect()
        };
        let short = text(&with("-h"));
        let long = text(&with("--help"));
        assert!(short.lines().count() <= 40, "{command} -h:\n{short}");
        assert!(short.contains("--help"), "{command} -h:\n{short}");
        assert!(long.lines().count() > short.lines().count(), "{command}");
    }
    let (short, long) = (text(&["trace", "-h"]), text(&["trace", "--help"]));
    for hidden in ["--max-stacks", "--unwind-rows", "--symbol-time-limit"] {
        assert!(!short.contains(hidden), "{hidden} in trace -h");
        assert!(long.contains(hidden), "{hidden} not in trace --help");
    }
    assert!(long.contains("Examples:"), "{long}");
    // --version: the build, then what this host's kernel has.
    let version = text(&["--version"]);
    let lines: Vec<&str> = version.lines().collect();
    assert!(lines[0].starts_with("memprof 0."), "{version}");
    assert!(
        lines[1].starts_with("kernel ") && lines[1].contains("session uprobes yes"),
        "{version}"
    );
}

/// Completions load in bash; the man pages are roff, one per command.
#[test]
fn completions_load_in_bash_and_every_command_has_a_man_page() {
    let _serial = serial();
    let script = format!(
        "source <({} completions bash) && complete -p memprof",
        memprof_bin().display()
    );
    let output = Command::new("bash").args(["-c", &script]).output().unwrap();
    let stdout = String::from_utf8_lossy(&output.stdout);
    assert!(output.status.success(), "{output:?}");
    assert!(stdout.contains("-F _memprof memprof"), "{stdout}");
    for (args, title) in [
        (&["man"][..], ".TH memprof 1"),
        (&["man", "trace"], ".TH memprof-trace 1"),
        (&["man", "monitor"], ".TH memprof-monitor 1"),
    ] {
        let output = memprof(args);
        let page = String::from_utf8_lossy(&output.stdout);
        assert!(output.status.success(), "{args:?}: {output:?}");
        assert!(page.contains(title), "{args:?}: {page}");
        assert!(
            page.contains(".SH OPTIONS") || page.contains(".SH SUBCOMMANDS"),
            "{page}"
        );
    }
    let (long, page) = (
        String::from_utf8(memprof(&["trace", "--help"]).stdout).unwrap(),
        String::from_utf8(memprof(&["man", "trace"]).stdout).unwrap(),
    );
    assert!(long.contains("--max-stacks") && page.contains("max\\-stacks"));
    let output = memprof(&["man", "nosuch"]);
    assert_one_line_error(&output, 2, "no command \"nosuch\"");
}
