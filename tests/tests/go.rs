//! Go programs (built here with Debian's go 1.19, and backports' 1.23
//! where Go's table layouts matter): never harmed. Go's runtime
//! moves goroutine stacks and walks them itself, so a return probe in Go
//! code kills the program (SIGILL at the kernel's trampoline): memprof
//! probes Go functions at their entry only, reads their arguments from
//! Go's registers, and refuses what would need a return there.
//!
//! Fixtures: tests/fixtures/go_alloc (`makeSlices` keeps 20,000 slices
//! of 4 KiB; with `wait` it first reads a line) and go_cgo (Go calling a
//! C function that mallocs 1,000 blocks of 100 bytes).
use std::{
    io::{BufRead as _, Read as _, Write as _},
    path::Path,
    process::{Command, Stdio},
    time::Duration,
};

use memprof::{
    discover::go::go_module_of, host::gopclntab::go_functions_of, report::pprof::proto as pprof,
};
use serde_json::Value;
use tests::{
    assert_nothing_loaded, assert_one_line_error, fixture_go, fixture_go_by, frame_functions,
    live_site, memprof, memprof_command,
    monitor::{free_port, last_report, start_monitor, stop},
    parse_report, read_pprof, report_json, serial, site, stacks_where, start_attach, sum_fields,
    wait_reading_stdin, GoToolchain,
};

/// What go_alloc prints, run alone.
const KEPT: &str = "kept 20000 slices, 81920000 bytes\n";

/// mallocgc, counted at its entry with its size in Go's first register.
const MALLOCGC: [&str; 2] = ["--alloc-fn", "runtime.mallocgc:size=1"];

/// `memprof trace --format json EXTRA -- PROGRAM`, its report written to
/// a file (the program's output is on stdout); memprof must succeed.
fn trace_go(extra: &[&str], program: &Path) -> (std::process::Output, Value) {
    trace_go_with(extra, program, &[])
}

/// [`trace_go`] with the program's arguments.
fn trace_go_with(
    extra: &[&str],
    program: &Path,
    arguments: &[&str],
) -> (std::process::Output, Value) {
    let report = std::env::temp_dir().join(format!("memprof-go-{}.json", std::process::id()));
    let mut args = vec![
        "trace", "--format", "json", "--top", "1000", "--depth", "64",
    ];
    args.extend(["-o", report.to_str().unwrap()]);
    args.extend(extra);
    args.extend(["--", program.to_str().unwrap()]);
    args.extend(arguments);
    let output = memprof(&args);
    assert!(output.status.success(), "{output:?}");
    let text = std::fs::read_to_string(&report).unwrap();
    std::fs::remove_file(&report).unwrap();
    (output, report_json(&text))
}

fn go_alloc() -> std::path::PathBuf {
    fixture_go("go_alloc", "plain", &[])
}

/// The stacks whose frames begin with main.makeSlices, main.main and
/// runtime.main (whole), summed by allocator: (allocator, bytes, calls).
/// The runtime's frames above makeSlices are not shown: the allocator
/// names the one it called.
fn make_slices_sites(report: &Value) -> Vec<(String, u64, u64)> {
    let stacks = stacks_where(report, |stack| {
        frame_functions(stack).starts_with(&[
            "main.makeSlices".to_string(),
            "main.main".to_string(),
            "runtime.main".to_string(),
        ])
    });
    let mut sites: Vec<(String, u64, u64)> = Vec::new();
    for stack in stacks {
        assert_eq!(stack["partial"], false, "{stack}");
        let allocator = stack["allocator"].as_str().unwrap();
        let (bytes, count) = (
            stack["bytes"].as_u64().unwrap(),
            stack["count"].as_u64().unwrap(),
        );
        match sites.iter_mut().find(|(a, _, _)| a == allocator) {
            Some(site) => (site.1, site.2) = (site.1 + bytes, site.2 + count),
            None => sites.push((allocator.to_string(), bytes, count)),
        }
    }
    sites.sort();
    sites
}

/// The calls of `make([]byte, 4096)` in makeSlices: (bytes, calls).
fn make_slices_site(report: &Value) -> (u64, u64) {
    make_slices_sites(report)
        .into_iter()
        .find(|(allocator, _, _)| allocator == "runtime.makeslice")
        .map_or((0, 0), |(_, bytes, count)| (bytes, count))
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
fn go_heap_is_counted_without_a_flag_as_go_itself_counts_it() {
    let _serial = serial();
    for toolchain in GoToolchain::all() {
        let program = fixture_go_by(&toolchain, "go_alloc", "plain", &[]);
        let (report, go_counts) = traced_with_go_profile(&program);
        // makeSlices' 20,000 makes and its slice's growths, each once.
        let sites = make_slices_sites(&report);
        let growths = match toolchain.label {
            "go1.19" => ("runtime.growslice".to_string(), 2_535_400, 22),
            _ => ("runtime.growslice".to_string(), 2_279_208, 21),
        };
        assert_eq!(
            sites,
            [
                growths,
                ("runtime.makeslice".to_string(), 81_920_000, 20_000),
            ],
            "{}",
            toolchain.label
        );
        // Go's profile has every stack through makeSlices: those, and what
        // the runtime allocated inside its allocations there (a collection
        // starting), which memprof shows with the runtime's frames.
        let through = stacks_where(&report, |stack| {
            frame_functions(stack)
                .iter()
                .any(|f| f == "main.makeSlices")
        });
        let calls: u64 = through.iter().map(|s| s["count"].as_u64().unwrap()).sum();
        let bytes: u64 = through.iter().map(|s| s["bytes"].as_u64().unwrap()).sum();
        eprintln!(
            "{}: makeSlices: memprof {calls} calls, {bytes} B; Go's profile {go_counts:?}",
            toolchain.label
        );
        // Every call, as Go counts them. Go's profile records each object
        // at its size class (an 88-byte request as 96), memprof the size
        // asked for: a few bytes of the runtime's own odd sizes apart.
        let (go_calls, go_bytes) = go_counts;
        assert_eq!(calls, go_calls, "{}", toolchain.label);
        assert!(
            bytes <= go_bytes && go_bytes - bytes <= go_bytes / 100_000,
            "{}: {bytes} B against Go's {go_bytes} B",
            toolchain.label
        );
        assert_nothing_loaded();
    }
}

/// memprof's report of `program` run with Go's own record of every
/// allocation (MemProfileRate 1), the oracle: the report, and what Go's
/// profile counts through makeSlices.
fn traced_with_go_profile(program: &Path) -> (Value, (u64, u64)) {
    let profile = std::env::temp_dir().join(format!("memprof-go-{}.pb.gz", std::process::id()));
    let output = memprof_command(&[
        "trace", "--format", "json", "--top", "1000", "--depth", "64", "--",
    ])
    .arg(program)
    .env("GO_ALLOC_PROFILE", &profile)
    .output()
    .unwrap();
    assert!(output.status.success(), "{output:?}");
    let stdout = String::from_utf8(output.stdout).unwrap();
    let (kept, report) = stdout.split_once('\n').unwrap();
    assert_eq!(format!("{kept}\n"), KEPT);
    let report: Value = report_json(report);
    let go_counts = go_profile_in_make_slices(&profile);
    std::fs::remove_file(&profile).unwrap();
    (report, go_counts)
}

/// (objects, bytes) Go's allocs profile at `path` records in stacks
/// through main.makeSlices.
fn go_profile_in_make_slices(path: &Path) -> (u64, u64) {
    let profile = read_pprof(path);
    let text = |i: i64| profile.string_table[i as usize].as_str();
    let function = |id: u64| {
        let f = profile.function.iter().find(|f| f.id == id).unwrap();
        text(f.name)
    };
    let in_make_slices = |sample: &pprof::Sample| {
        sample.location_id.iter().any(|&id| {
            let location = profile.location.iter().find(|l| l.id == id).unwrap();
            location
                .line
                .iter()
                .any(|line| function(line.function_id) == "main.makeSlices")
        })
    };
    let types: Vec<&str> = profile.sample_type.iter().map(|t| text(t.r#type)).collect();
    assert_eq!(&types[..2], ["alloc_objects", "alloc_space"]);
    profile
        .sample
        .iter()
        .filter(|sample| in_make_slices(sample))
        .fold((0, 0), |(objects, bytes), sample| {
            (
                objects + sample.value[0] as u64,
                bytes + sample.value[1] as u64,
            )
        })
}

/// What go_alloc prints with `types`.
const TYPES_KEPT: &str = "kept 3000 records, 2000 lists, 500 maps\n";

/// (calls, bytes) of the stacks that allocated Go type `name`.
fn of_type(report: &Value, name: &str) -> [u64; 2] {
    sum_fields(
        &stacks_where(report, |s| s["type"] == name),
        ["count", "bytes"],
    )
}

#[test]
fn group_by_type_names_each_go_type_with_its_exact_count() {
    let _serial = serial();
    // Types are named from the binary's type data, which stripping keeps.
    let programs = GoToolchain::all().into_iter().flat_map(|toolchain| {
        [
            fixture_go_by(&toolchain, "go_alloc", "plain", &[]),
            fixture_go_by(&toolchain, "go_alloc", "stripped", &["-ldflags=-s -w"]),
        ]
    });
    for program in programs {
        let (output, report) = trace_go_with(&["--group-by", "type"], &program, &["types"]);
        assert_eq!(String::from_utf8_lossy(&output.stdout), TYPES_KEPT);
        assert_eq!(report["group_by"], "type");
        // types.go: 3,000 records of 32 bytes; 2,000 arrays of 8 record
        // pointers and records' own 3,000; lists' 2,000 slice headers.
        assert_eq!(of_type(&report, "main.record"), [3_000, 96_000]);
        assert_eq!(of_type(&report, "*main.record"), [2_001, 152_000]);
        assert_eq!(of_type(&report, "[]*main.record"), [1, 48_000]);
        let [buckets, _] = of_type(&report, "map.bucket[string]int");
        assert!(buckets >= 500, "{buckets} bucket arrays");
        // One row per type, shown with its largest stack.
        let records = stacks_where(&report, |s| s["type"] == "main.record");
        assert_eq!(records.len(), 1);
        assert_eq!(records[0]["allocator"], "runtime.newobject");
        assert_eq!(records[0]["frames"][0]["function"], "main.makeRecords");
        assert_eq!(records[0]["frames"][0]["line"], 23);
    }
    // By stack (the default) each Go stack still says its type, in JSON
    // and in the text (`allocator(type)`), and a saved profile regroups.
    let (_, by_stack) = trace_go_with(&[], &go_alloc(), &["types"]);
    assert_eq!(of_type(&by_stack, "main.record"), [3_000, 96_000]);
    let saved = std::env::temp_dir().join(format!("memprof-go-types-{}.json", std::process::id()));
    std::fs::write(&saved, by_stack.to_string()).unwrap();
    let output = memprof(&["report", saved.to_str().unwrap(), "--group-by", "type"]);
    std::fs::remove_file(&saved).unwrap();
    let text = String::from_utf8_lossy(&output.stdout);
    assert!(output.status.success(), "{output:?}");
    assert!(text.contains(" types; "), "{text}");
    let row = text
        .lines()
        .find(|l| l.ends_with("runtime.makeslice(*main.record)"))
        .unwrap_or_else(|| panic!("{text}"));
    assert!(
        row.contains("152,000 B") && row.contains("2,001 calls"),
        "{row}"
    );
}

#[test]
fn live_says_go_heap_is_not_followed() {
    let _serial = serial();
    let program = go_alloc();
    let (output, report) = trace_go(&["--live"], &program);
    assert_eq!(String::from_utf8_lossy(&output.stdout), KEPT);
    let unprobed = report["unprobed"].as_array().unwrap();
    assert_eq!(unprobed.len(), 1, "{report}");
    let reason = unprobed[0]["reason"].as_str().unwrap();
    assert!(reason.starts_with("a Go program (go1."), "{reason}");
    assert!(
        reason.contains("--live does not follow Go's heap"),
        "{reason}"
    );
    assert!(report["partly_probed"].is_null(), "said once: {report}");
}

#[test]
fn a_stripped_go_program_is_probed_walked_and_named_from_its_own_tables() {
    let _serial = serial();
    for toolchain in GoToolchain::all() {
        stripped_go_program_is_named_from_its_own_tables(&toolchain);
    }
}

/// No symbols, no DWARF, no CFI: .gopclntab names runtime.mallocgc,
/// frame pointers walk the stacks, .gopclntab names the frames.
fn stripped_go_program_is_named_from_its_own_tables(toolchain: &GoToolchain) {
    let stripped = fixture_go_by(toolchain, "go_alloc", "stripped", &["-ldflags=-s -w"]);
    let (output, report) = trace_go(&[], &stripped);
    assert_eq!(String::from_utf8_lossy(&output.stdout), KEPT);
    // As in the build with symbols (see the oracle's test).
    let plain = fixture_go_by(toolchain, "go_alloc", "plain", &[]);
    let (_, with_dwarf) = trace_go(&[], &plain);
    let sites = make_slices_sites(&report);
    assert_eq!(sites, make_slices_sites(&with_dwarf), "{}", toolchain.label);
    assert_eq!(
        sites.iter().find(|s| s.0 == "runtime.makeslice"),
        Some(&("runtime.makeslice".to_string(), 81_920_000, 20_000))
    );
    let stack = &stacks_where(&report, |s| s["allocator"] == "runtime.makeslice")[0];
    let frame = &stack["frames"][0];
    assert_eq!(frame["function"], "main.makeSlices");
    assert!(
        frame["file"]
            .as_str()
            .unwrap()
            .ends_with("tests/fixtures/go_alloc/main.go"),
        "{frame}"
    );
    assert_eq!(frame["line"], 22);
    // Inlined calls named as the runtime names them: as in the build
    // with DWARF, which blazesym reads.
    let inlined = |report: &Value| -> Vec<Vec<String>> {
        let mut stacks: Vec<Vec<String>> = stacks_where(report, |s| {
            s["frames"]
                .as_array()
                .unwrap()
                .iter()
                .any(|f| f["inlined"] == true)
        })
        .iter()
        .map(|s| {
            s["frames"]
                .as_array()
                .unwrap()
                .iter()
                .take(3)
                .map(|f| format!("{} {} {}", f["function"], f["line"], f["inlined"]))
                .collect()
        })
        .collect();
        stacks.sort();
        stacks.dedup();
        stacks
    };
    let (stripped_inlined, dwarf_inlined) = (inlined(&report), inlined(&with_dwarf));
    assert!(!stripped_inlined.is_empty());
    let shared = stripped_inlined
        .iter()
        .filter(|s| dwarf_inlined.contains(s))
        .count();
    assert!(
        shared * 10 >= stripped_inlined.len() * 9,
        "{shared} of {} stacks with inlined frames as DWARF names them",
        stripped_inlined.len()
    );
}

#[test]
fn goroutines_allocating_at_once_are_each_counted() {
    let _serial = serial();
    let program = go_alloc();
    let (output, report) = trace_go_with(&[], &program, &["goroutines"]);
    assert_eq!(
        String::from_utf8_lossy(&output.stdout),
        "made 10240000 bytes in 8 goroutines\n"
    );
    // 8 goroutines on 2 cores, each 5,000 makes of 256 B and its slice
    // of 5,000 records (120,000 B).
    let work = |line: u64| {
        let stacks = stacks_where(&report, |s| {
            s["allocator"] == "runtime.makeslice"
                && s["frames"][0]["function"] == "main.work"
                && s["frames"][0]["line"] == line
        });
        let calls: u64 = stacks.iter().map(|s| s["count"].as_u64().unwrap()).sum();
        let bytes: u64 = stacks.iter().map(|s| s["bytes"].as_u64().unwrap()).sum();
        (calls, bytes)
    };
    assert_eq!(work(31), (40_000, 40_000 * 256));
    assert_eq!(work(29), (8, 8 * 120_000));
    assert_nothing_loaded();
}

#[test]
fn attached_to_a_go_http_server_under_load_its_answers_and_exit_are_unchanged() {
    let _serial = serial();
    let program = fixture_go("go_server", "plain", &[]);
    let mut server = Command::new(&program)
        .stdout(Stdio::piped())
        .spawn()
        .unwrap();
    let mut port = String::new();
    std::io::BufReader::new(server.stdout.take().unwrap())
        .read_line(&mut port)
        .unwrap();
    let url = format!("http://127.0.0.1:{}", port.trim());
    let get = |path: &str| tests::monitor::get(&format!("{url}{path}")).text().unwrap();
    assert_eq!(get("/alloc?n=10"), "made 10\n");
    let (memprof, _stderr) = start_attach(server.id(), &[]);
    // Requests from 4 threads at once, while attached.
    std::thread::scope(|scope| {
        for _ in 0..4 {
            scope.spawn(|| {
                for _ in 0..25 {
                    assert_eq!(get("/alloc?n=1000"), "made 1000\n");
                }
            });
        }
    });
    nix::sys::signal::kill(
        nix::unistd::Pid::from_raw(memprof.id() as i32),
        nix::sys::signal::Signal::SIGINT,
    )
    .unwrap();
    let output = memprof.wait_with_output().unwrap();
    assert!(output.status.success(), "{output:?}");
    assert_nothing_loaded();
    // Detached: it serves on as before, and ends as it would.
    assert_eq!(get("/alloc?n=10"), "made 10\n");
    assert_eq!(get("/quit"), "bye\n");
    assert!(server.wait().unwrap().success());
    let report = parse_report(&output);
    let records = |allocator: &str| {
        let stacks = stacks_where(&report, |s| {
            s["allocator"] == allocator && s["frames"][0]["function"] == "main.makeRecords"
        });
        stacks
            .iter()
            .map(|s| s["count"].as_u64().unwrap())
            .sum::<u64>()
    };
    // 100 requests: 1,000 records each, and each request's slice.
    assert_eq!(records("runtime.makeslice"), 100 * 1000 + 100);
}

#[test]
fn attached_to_a_running_go_program_it_counts_and_leaves_it_unharmed() {
    let _serial = serial();
    let program = go_alloc();
    let mut target = spawn_waiting(&program);
    let (memprof, _stderr) = start_attach(target.id(), &[]);
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
fn monitor_counts_go_heap_and_refuses_what_needs_a_return_in_go_code() {
    let _serial = serial();
    let program = go_alloc();
    let exe = program.to_str().unwrap();
    let monitor = start_monitor(&["--exe", exe, "--format", "json"], free_port());
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
    // The runtime maps its heap through the C library here (x_cgo_mmap):
    // those mappings hold the objects mallocgc counts, not the program's
    // own mappings (5.8 MiB of arenas and stacks counted twice before).
    let (_, totals) = trace_go(&[], &program);
    let mapped = stacks_where(&totals, |s| {
        s["allocator"] == "mmap" || frame_functions(s).contains(&"x_cgo_mmap".to_string())
    });
    assert!(mapped.is_empty(), "{mapped:?}");
    assert_eq!(site(&totals, "c_alloc").0, 100_000);
    let bytes = totals["processes"][0]["bytes"].as_u64().unwrap();
    assert!(bytes < 1 << 20, "{bytes} bytes: arenas counted?");
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
    let stripped = fixture_go("go_alloc", "stripped", &["-ldflags=-s -w"]);
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
    // Go's function table, as the stripped build keeps it, gives each
    // function's entry as the plain build's symbols do.
    let data = std::fs::read(&stripped).unwrap();
    let file = object::File::parse(&*data).unwrap();
    let functions = go_functions_of(&file).expect(".gopclntab");
    assert!(functions.len() > 1000, "{}", functions.len());
    for name in [
        "runtime.mallocgc",
        "main.makeSlices",
        "main.main",
        "runtime.newobject",
    ] {
        let function = functions.functions().find(|f| f.name == name).unwrap();
        assert_eq!(function.entry, readelf_symbol(&plain, name), "{name}");
    }
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
