//! Least privilege: under sudo the traced command runs as the user who ran
//! sudo (`--user` names another, `--user root` keeps root); report files
//! are created mode 0600 and a symbolic link is not followed; a saved
//! report naming a device or a pipe does not make `memprof report` read it.
use std::{
    os::unix::fs::{MetadataExt as _, PermissionsExt as _},
    path::{Path, PathBuf},
    process::{Command, Output, Stdio},
    time::{Duration, Instant},
};

use serde_json::Value;
use tests::*;

/// nobody and nogroup on Debian.
const NOBODY: u32 = 65534;

/// A fresh directory under /tmp that every user can write.
fn scratch_dir(name: &str) -> PathBuf {
    let dir =
        std::env::temp_dir().join(format!("memprof-privileges-{name}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir(&dir).unwrap();
    std::fs::set_permissions(&dir, std::fs::Permissions::from_mode(0o777)).unwrap();
    dir
}

/// `memprof ARGS` as if run with `sudo` by the user `sudo_uid`.
fn memprof_under_sudo(sudo_uid: u32, args: &[&str], cwd: &Path) -> Output {
    Command::new(memprof_bin())
        .args(args)
        .env("SUDO_UID", sudo_uid.to_string())
        .env("SUDO_GID", sudo_uid.to_string())
        .current_dir(cwd)
        .output()
        .expect("running memprof")
}

fn path_str(path: &Path) -> &str {
    path.to_str().unwrap()
}

fn stderr(output: &Output) -> String {
    String::from_utf8_lossy(&output.stderr).into_owned()
}

#[test]
fn under_sudo_the_command_runs_as_the_sudo_user_and_the_report_is_0600() {
    let _serial = serial();
    let dir = scratch_dir("sudo");
    let out = dir.join("out.txt");
    let report = dir.join("report.json");
    let output = memprof_under_sudo(
        NOBODY,
        &[
            "trace",
            "--format",
            "json",
            "-o",
            path_str(&report),
            "--",
            "sh",
            "-c",
            r#"id -u > "$1"; id -G >> "$1"; echo "$HOME" >> "$1"; echo "$USER" >> "$1""#,
            "sh",
            path_str(&out),
        ],
        &dir,
    );
    assert!(output.status.success(), "{}", stderr(&output));
    let said = std::fs::read_to_string(&out).expect("the command wrote its file");
    let lines: Vec<&str> = said.lines().collect();
    assert_eq!(
        lines,
        ["65534", "65534", "/nonexistent", "nobody"],
        "uid, groups, HOME and USER of the command"
    );
    assert_eq!(
        std::fs::metadata(&out).unwrap().uid(),
        NOBODY,
        "the command's files belong to the user"
    );

    let metadata = std::fs::metadata(&report).unwrap();
    assert_eq!(metadata.mode() & 0o777, 0o600, "report mode");
    assert_eq!(
        metadata.uid(),
        NOBODY,
        "the report belongs to the sudo user"
    );
    let report: Value = report_json(&std::fs::read_to_string(&report).unwrap());
    assert_frames_in_mapped_modules(&report);
    assert!(!report["processes"].as_array().unwrap().is_empty());
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn user_root_keeps_root_and_user_names_another() {
    let _serial = serial();
    let dir = scratch_dir("user");
    // One report file per run: the first is given to the sudo user, and
    // root without sudo does not write into another user's file.
    let report = dir.join("report.json");
    let root_report = dir.join("root-report.json");
    let uid_of = |output: &Output| {
        assert!(output.status.success(), "{}", stderr(output));
        String::from_utf8_lossy(&output.stdout).trim().to_string()
    };
    // With -o, stdout holds only the command's output.
    let as_root = memprof_under_sudo(
        NOBODY,
        &[
            "trace",
            "--user",
            "root",
            "-o",
            path_str(&report),
            "--",
            "id",
            "-u",
        ],
        &dir,
    );
    assert_eq!(uid_of(&as_root), "0", "--user root keeps root under sudo");
    for user in ["nobody", "65534"] {
        let output = memprof(&[
            "trace",
            "--user",
            user,
            "-o",
            path_str(&root_report),
            "--",
            "id",
            "-u",
        ]);
        assert_eq!(uid_of(&output), "65534", "--user {user}");
    }
    let plain = memprof(&["trace", "-o", path_str(&root_report), "--", "id", "-u"]);
    assert_eq!(uid_of(&plain), "0", "as root without sudo: root");
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn unknown_user_is_one_line_before_anything_runs() {
    let _serial = serial();
    let dir = scratch_dir("unknown");
    let marker = dir.join("ran");
    let output = memprof(&[
        "trace",
        "--user",
        "no-such-user-xyz",
        "--",
        "touch",
        path_str(&marker),
    ]);
    assert_one_line_error(&output, 2, "--user no-such-user-xyz: no such user");
    assert!(!marker.exists(), "the command did not run");
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn output_symlinks_and_directories_are_refused_before_the_command_runs() {
    let _serial = serial();
    let dir = scratch_dir("output");
    let marker = dir.join("ran");
    let trace_to = |output: &Path, command: &[&str]| {
        let mut args = vec!["trace", "--format", "json", "-o", path_str(output), "--"];
        args.extend_from_slice(command);
        memprof(&args)
    };
    let touch = ["touch", path_str(&marker)];

    // A symbolic link, to a file or to nothing: not followed.
    let real = dir.join("real.json");
    std::fs::write(&real, "old").unwrap();
    let link = dir.join("link.json");
    std::os::unix::fs::symlink(&real, &link).unwrap();
    let output = trace_to(&link, &touch);
    assert_one_line_error(&output, 2, "link.json is a symbolic link");
    assert!(!marker.exists(), "the command did not run");
    assert_eq!(std::fs::read_to_string(&real).unwrap(), "old");
    let dangling = dir.join("dangling.json");
    let nowhere = dir.join("nowhere.json");
    std::os::unix::fs::symlink(&nowhere, &dangling).unwrap();
    let output = trace_to(&dangling, &touch);
    assert_one_line_error(&output, 2, "dangling.json is a symbolic link");
    assert!(!nowhere.exists() && !marker.exists());

    // A directory.
    let output = trace_to(&dir, &touch);
    assert_one_line_error(&output, 2, "is a directory");
    assert!(!marker.exists(), "the command did not run");

    // A new file is not left behind when profiling fails.
    let new = dir.join("new.json");
    let output = trace_to(&new, &["no-such-command-memprof"]);
    assert_one_line_error(&output, 127, "command not found");
    assert!(!new.exists(), "no empty report left behind");

    // An existing file of the user who ran sudo is replaced and keeps
    // its owner and mode; root, not under sudo, does not write into it
    // (in a directory anyone can write to, it may have been planted).
    let existing = dir.join("existing.json");
    std::fs::write(&existing, "old").unwrap();
    std::fs::set_permissions(&existing, std::fs::Permissions::from_mode(0o644)).unwrap();
    std::os::unix::fs::chown(&existing, Some(NOBODY), Some(NOBODY)).unwrap();
    let output = trace_to(&existing, &["true"]);
    assert_one_line_error(&output, 2, "belongs to another user (uid 65534)");
    assert_eq!(std::fs::read_to_string(&existing).unwrap(), "old");
    let output = memprof_under_sudo(
        NOBODY,
        &[
            "trace",
            "--format",
            "json",
            "-o",
            path_str(&existing),
            "--",
            "true",
        ],
        &dir,
    );
    assert!(output.status.success(), "{}", stderr(&output));
    let metadata = std::fs::metadata(&existing).unwrap();
    assert_eq!((metadata.mode() & 0o777, metadata.uid()), (0o644, NOBODY));
    let _: Value = serde_json::from_str(&std::fs::read_to_string(&existing).unwrap())
        .expect("the report replaced the old content");

    // As root, not under sudo: a new report is 0600, root's.
    let fresh = dir.join("fresh.json");
    let output = trace_to(&fresh, &["true"]);
    assert!(output.status.success(), "{}", stderr(&output));
    let metadata = std::fs::metadata(&fresh).unwrap();
    assert_eq!((metadata.mode() & 0o777, metadata.uid()), (0o600, 0));
    let _ = std::fs::remove_dir_all(&dir);
}

/// The GNU build id of an ELF file, as `readelf -n` prints it.
#[test]
fn a_report_naming_a_device_or_a_pipe_does_not_make_memprof_read_them() {
    use std::io::Read as _;

    let _serial = serial();
    let dir = scratch_dir("crafted");
    let program = fixture("allocs", "fp", frame_pointers());
    let saved = dir.join("saved.json");
    let output = memprof(&[
        "trace",
        "--format",
        "json",
        "--top",
        "100",
        "-o",
        path_str(&saved),
        "--",
        path_str(&program),
    ]);
    // allocs exits with 3.
    assert_eq!(output.status.code(), Some(3), "{}", stderr(&output));

    // Every frame outside the program (the C library's) now names
    // /dev/zero or a named pipe nobody writes to.
    let fifo = dir.join("fifo");
    let status = Command::new("mkfifo").arg(&fifo).status().unwrap();
    assert!(status.success());
    let mut report: Value = report_json(&std::fs::read_to_string(&saved).unwrap());
    let exe = report["processes"][0]["exe"].as_str().unwrap().to_string();
    let mut replaced = 0;
    for process in report["processes"].as_array_mut().unwrap() {
        for stack in process["stacks"].as_array_mut().unwrap() {
            for frame in stack["frames"].as_array_mut().unwrap() {
                if frame["module"].as_str().is_some_and(|m| m != exe) {
                    let to = if replaced % 2 == 0 {
                        "/dev/zero"
                    } else {
                        path_str(&fifo)
                    };
                    frame["module"] = Value::from(to);
                    // Without the build id read at the time: memprof
                    // would have to read the file for one.
                    frame["build_id"] = Value::Null;
                    replaced += 1;
                }
            }
        }
    }
    assert!(replaced >= 2, "frames outside the program: {replaced}");
    let crafted = dir.join("crafted.json");
    std::fs::write(&crafted, serde_json::to_string(&report).unwrap()).unwrap();

    let pb = dir.join("out.pb.gz");
    let mut child = Command::new(memprof_bin())
        .args(["report", path_str(&crafted), "--format", "pprof", "-o"])
        .arg(&pb)
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let started = Instant::now();
    let status = loop {
        if let Some(status) = child.try_wait().unwrap() {
            break status;
        }
        if started.elapsed() > Duration::from_secs(20) {
            let _ = child.kill();
            let _ = child.wait();
            panic!(
                "memprof report did not finish in 20 s: it reads /dev/zero or waits on the pipe"
            );
        }
        std::thread::sleep(Duration::from_millis(50));
    };
    let mut err = String::new();
    child
        .stderr
        .take()
        .unwrap()
        .read_to_string(&mut err)
        .unwrap();
    assert!(status.success(), "{err}");
    assert_eq!(
        std::fs::metadata(&pb).unwrap().mode() & 0o777,
        0o600,
        "report mode"
    );

    // The mappings: no build id for the device and the pipe, the
    // program's own from its notes.
    let profile = read_pprof(&pb);
    let string = |index: i64| profile.string_table[index as usize].as_str();
    let build_id_of = |file: &str| {
        let mapping = profile
            .mapping
            .iter()
            .find(|m| string(m.filename) == file)
            .unwrap_or_else(|| panic!("no mapping of {file}"));
        string(mapping.build_id).to_string()
    };
    assert_eq!(build_id_of("/dev/zero"), "");
    assert_eq!(build_id_of(path_str(&fifo)), "");
    assert_eq!(build_id_of(&exe), readelf_build_id(Path::new(&exe)));
    let _ = std::fs::remove_dir_all(&dir);
}

/// Once attached, memprof keeps only the capabilities a profile uses
/// (host/privileges.rs): none of its threads can bind a port, change its
/// user or load a module; each keeps BPF, perf events and SYS_ADMIN for
/// libraries loaded later. The profile is exact and ends clean after it.
#[test]
fn once_attached_memprof_keeps_only_the_capabilities_it_uses() {
    let _serial = serial();
    let program = fixture("waiter", "privileges", frame_pointers());
    let mut target = spawn_waiter(&program);
    let (memprof, _stderr) = start_attach(target.id(), &[]);
    let bits = |status: &str, field: &str| -> u64 {
        let line = status
            .lines()
            .find(|line| line.starts_with(field))
            .unwrap_or_else(|| panic!("no {field}: {status}"));
        u64::from_str_radix(line[field.len()..].trim(), 16).unwrap()
    };
    // capability.h: SETUID 7, NET_BIND_SERVICE 10, SYS_MODULE 16,
    // SYS_ADMIN 21, PERFMON 38, BPF 39.
    let threads = std::fs::read_dir(format!("/proc/{}/task", memprof.id())).unwrap();
    for thread in threads.flatten() {
        let status = std::fs::read_to_string(thread.path().join("status")).unwrap();
        for field in ["CapEff:", "CapPrm:", "CapBnd:"] {
            let caps = bits(&status, field);
            for dropped in [7, 10, 16] {
                assert_eq!(caps & (1 << dropped), 0, "{field} has {dropped}: {status}");
            }
            if field != "CapBnd:" {
                for kept in [21, 38, 39] {
                    assert_ne!(caps & (1 << kept), 0, "{field} lacks {kept}: {status}");
                }
            }
        }
    }
    let (status, report) = release_and_report(&mut target, memprof);
    assert!(status.success());
    assert_eq!(site(&report, "site_after_attach").1, 40);
    assert_nothing_loaded();
}
