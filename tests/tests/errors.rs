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
fn statically_linked_target() {
    let _serial = serial();
    let program = fixture("allocs", "static", &["-static"]);
    let output = memprof(&["trace", "--", program.to_str().unwrap()]);
    assert_one_line_error(&output, 1, "statically linked");
    assert!(
        String::from_utf8_lossy(&output.stderr).contains("libc.so.6"),
        "says what was looked for"
    );
}

#[test]
fn unknown_option() {
    let _serial = serial();
    let output = memprof(&["trace", "--no-such-option", "--", "true"]);
    assert_one_line_error(&output, 2, "--no-such-option");
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
