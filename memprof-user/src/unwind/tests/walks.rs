//! Walks of real stacks: this test binary's own, compared with libgcc's
//! unwinder, and a C program's without frame pointers, stopped under gdb
//! and compared with gdb's backtrace.
use std::{
    arch::asm,
    ffi::c_void,
    hint::black_box,
    path::{Path, PathBuf},
    process::{Command, Stdio},
};

use super::describe;
use crate::unwind::{
    cache::UnwindCache,
    process::{ExecMapping, ProcessTables},
    table::{CfaKind, UnwindTable},
    walk::{unwind, Mapping, Regs, Stop},
};

// ---------------------------------------------------------------------------
// This test binary's own stack, unwound and compared with libgcc's unwinder.

extern "C" {
    // libgcc_s (Rust's std links it on linux-gnu): an unwinder of its own
    // (.eh_frame_hdr through dl_iterate_phdr, its own CFI interpreter).
    fn _Unwind_Backtrace(
        trace: extern "C" fn(*mut c_void, *mut c_void) -> i32,
        argument: *mut c_void,
    ) -> i32;
    fn _Unwind_GetIP(context: *mut c_void) -> usize;
}

extern "C" fn push_ip(context: *mut c_void, argument: *mut c_void) -> i32 {
    // SAFETY: `argument` is the Vec passed to _Unwind_Backtrace below,
    // `context` the unwinder's.
    let ips = unsafe { &mut *argument.cast::<Vec<u64>>() };
    ips.push(unsafe { _Unwind_GetIP(context) } as u64);
    // _URC_NO_REASON: go on (_URC_END_OF_STACK to stop at 256).
    if ips.len() < 256 {
        0
    } else {
        5
    }
}

/// Registers and a copy of the stack, taken inside a call chain.
struct Capture {
    regs: Regs,
    stack: Vec<u8>,
    /// libgcc's frames, from the same function.
    libgcc: Vec<u64>,
    /// Written after each call returns (no tail calls).
    marks: Vec<u64>,
}

impl Capture {
    fn read_word(&self, address: u64) -> Option<u64> {
        let offset = usize::try_from(address.checked_sub(self.regs.rsp)?).ok()?;
        let bytes = self.stack.get(offset..offset.checked_add(8)?)?;
        Some(u64::from_le_bytes(bytes.try_into().unwrap()))
    }
}

/// Copies the stack from `rsp` up (256 KiB at most, never past the end of
/// its mapping). The frames above `rsp` are alive and do not change while
/// this runs below them.
#[inline(never)]
fn copy_stack(rsp: u64) -> Vec<u8> {
    let maps = std::fs::read_to_string("/proc/self/maps").unwrap();
    let end = maps
        .lines()
        .find_map(|line| {
            let (start, end) = line.split_ascii_whitespace().next()?.split_once('-')?;
            let (start, end) = (
                u64::from_str_radix(start, 16).ok()?,
                u64::from_str_radix(end, 16).ok()?,
            );
            (start <= rsp && rsp < end).then_some(end)
        })
        .expect("the stack's mapping");
    let len = (end - rsp).min(256 * 1024) as usize;
    let mut copy = vec![0u8; len];
    // SAFETY: [rsp, rsp + len) lies in this thread's stack mapping.
    unsafe { std::ptr::copy_nonoverlapping(rsp as *const u8, copy.as_mut_ptr(), len) };
    copy
}

/// The innermost function: reads rip, rsp and rbp, copies the stack and
/// asks libgcc for its backtrace.
#[inline(never)]
fn capture(n: u64) -> Capture {
    black_box(n);
    let (rip, rsp, rbp): (u64, u64, u64);
    // SAFETY: reads registers only.
    unsafe {
        asm!(
            "lea {rip}, [rip]",
            "mov {rsp}, rsp",
            "mov {rbp}, rbp",
            rip = out(reg) rip,
            rsp = out(reg) rsp,
            rbp = out(reg) rbp,
            options(nomem, nostack, preserves_flags)
        );
    }
    let stack = copy_stack(rsp);
    let mut libgcc: Vec<u64> = Vec::new();
    // SAFETY: push_ip takes the Vec back, during this call only.
    unsafe { _Unwind_Backtrace(push_ip, (&mut libgcc as *mut Vec<u64>).cast()) };
    Capture {
        regs: Regs { rip, rsp, rbp },
        stack,
        libgcc,
        marks: Vec::new(),
    }
}

/// A level of the chain: a frame of `$pad` bytes, work after the call.
macro_rules! level {
    ($name:ident, $next:ident, $pad:expr) => {
        #[inline(never)]
        fn $name(n: u64) -> Capture {
            let pad = black_box([n as u8; $pad]);
            let mut capture = $next(black_box(n + 1));
            capture
                .marks
                .push(u64::from(black_box(pad)[n as usize % $pad]));
            capture
        }
    };
}

level!(level1, level2, 24);
level!(level2, level3, 200);
level!(level3, level4, 40);
level!(level4, level5, 1000);
level!(level5, level6, 8);
level!(level6, capture, 64);

/// A table with every rsp-based CFA offset off by `delta` words.
fn broken(table: &UnwindTable, delta: i16) -> UnwindTable {
    let mut broken = table.clone();
    for row in &mut broken.rows {
        if row.cfa_kind() == CfaKind::Rsp {
            row.cfa_words += delta;
        }
    }
    broken
}

fn name_frames(tables: &ProcessTables, frames: &[u64]) -> String {
    frames
        .iter()
        .map(|&ip| {
            let place = tables
                .mappings
                .iter()
                .find(|m| m.start <= ip && ip < m.end)
                .map(|m| {
                    format!(
                        "{}+{:#x}",
                        m.path.file_name().unwrap_or_default().to_string_lossy(),
                        ip.wrapping_sub(m.bias)
                    )
                })
                .unwrap_or_default();
            format!("  {ip:#x} {place}\n")
        })
        .collect()
}

#[test]
fn unwind_own_stack_matches_libgcc() {
    let capture = level1(1);
    assert_eq!(capture.marks.len(), 6);
    let mut cache = UnwindCache::new(256 << 20);
    let tables = ProcessTables::for_pid(std::process::id(), &mut cache).unwrap();
    let mappings = tables.walk_mappings();
    let ours = unwind(&mappings, capture.regs, |a| capture.read_word(a), 256);
    // libgcc reports one more frame after the outermost one, with IP 0.
    let mut theirs = capture.libgcc.clone();
    if theirs.last() == Some(&0) {
        theirs.pop();
    }
    let theirs = &theirs;
    let report = format!(
        "ours ({:?}):\n{}libgcc:\n{}",
        ours.stop,
        name_frames(&tables, &ours.frames),
        name_frames(&tables, theirs)
    );
    println!("{report}");
    // Frame 0: our rip is the asm's, libgcc's the return address of its
    // own call, a few instructions further in the same function.
    assert!(ours.frames.len() > 8 && theirs.len() > 8, "{report}");
    assert!(ours.frames[0].abs_diff(theirs[0]) < 256, "{report}");
    // Every caller frame, up to the thread's first (clone3/_start).
    assert_eq!(ours.frames[1..], theirs[1..], "{report}");
    assert_eq!(ours.stop, Stop::Outermost, "{report}");
    // The chain's frames (level6..level1) were walked from rsp, not frame
    // pointers.
    for &ra in &ours.frames[1..7] {
        let mapping = mappings
            .iter()
            .find(|m| m.start <= ra && ra < m.end)
            .unwrap();
        let row = mapping.table.lookup(ra - 1 - mapping.bias);
        assert_eq!(
            row.map(|r| r.cfa_kind()),
            Some(CfaKind::Rsp),
            "{ra:#x}: {}",
            describe(row)
        );
    }

    // The same walk over tables broken on purpose no longer matches.
    for delta in [1, -1, 2] {
        let broken: Vec<UnwindTable> = tables
            .mappings
            .iter()
            .map(|m| broken(&m.table, delta))
            .collect();
        let broken_mappings: Vec<Mapping<'_>> = mappings
            .iter()
            .zip(&broken)
            .map(|(m, table)| Mapping { table, ..*m })
            .collect();
        let wrong = unwind(
            &broken_mappings,
            capture.regs,
            |a| capture.read_word(a),
            256,
        );
        assert_ne!(
            wrong.frames.get(1..),
            theirs.get(1..),
            "a CFA off by {delta} words still matched libgcc"
        );
    }
}

// ---------------------------------------------------------------------------
// A C program without frame pointers, stopped under gdb.

/// What gdb saw at one stop.
#[derive(Debug, Default)]
struct GdbStop {
    frames: Vec<(u64, String)>,
    regs: Option<Regs>,
    mappings: Vec<ExecMapping>,
}

const GDB_SCRIPT: &str = r#"set pagination off
set confirm off
set backtrace past-main on
set backtrace past-entry on
python
import gdb
def report(tag, directory):
    frame = gdb.newest_frame()
    while frame is not None:
        # Inlined functions and tail calls (deduced from call-site debug
        # info) are frames gdb adds; they have no stack frame of their own.
        if frame.type() not in (gdb.INLINE_FRAME, gdb.TAILCALL_FRAME):
            print("FRAME %s 0x%x %s" % (tag, frame.pc(), frame.name()))
        try:
            frame = frame.older()
        except gdb.error:
            frame = None
    value = lambda expression: int(gdb.parse_and_eval("(unsigned long)(%s)" % expression))
    rsp = value("$rsp")
    print("REGS %s %d %d %d" % (tag, value("$rip"), rsp, value("$rbp")))
    gdb.execute("dump binary memory %s/%s.bin %d %d" % (directory, tag, rsp, value("stack_end_hint")))
    for line in gdb.execute("info proc mappings", to_string=True).splitlines():
        print("MAP %s %s" % (tag, line))
end
break site
run
python report("site", "DIR")
break *malloc
continue
python report("malloc", "DIR")
kill
quit
"#;

fn parse_gdb(output: &str, tag: &str) -> GdbStop {
    let mut stop = GdbStop::default();
    for line in output.lines() {
        let mut fields = line.split_ascii_whitespace();
        let (Some(kind), Some(line_tag)) = (fields.next(), fields.next()) else {
            continue;
        };
        if line_tag != tag {
            continue;
        }
        let rest: Vec<&str> = fields.collect();
        let hex = |s: &str| u64::from_str_radix(s.trim_start_matches("0x"), 16).unwrap();
        match kind {
            "FRAME" => stop
                .frames
                .push((hex(rest[0]), rest.get(1).unwrap_or(&"?").to_string())),
            "REGS" => {
                let n: Vec<u64> = rest.iter().map(|s| s.parse().unwrap()).collect();
                stop.regs = Some(Regs {
                    rip: n[0],
                    rsp: n[1],
                    rbp: n[2],
                });
            }
            // Start, End, Size, Offset, Perms, objfile
            "MAP"
                if rest.len() == 6
                    && rest[0].starts_with("0x")
                    && rest[4].contains('x')
                    && rest[5].starts_with('/') =>
            {
                stop.mappings.push(ExecMapping {
                    start: hex(rest[0]),
                    end: hex(rest[1]),
                    offset: hex(rest[3]),
                    path: PathBuf::from(rest[5]),
                    deleted: false,
                });
            }
            _ => {}
        }
    }
    stop
}

fn installed(tool: &str) -> bool {
    Command::new(tool)
        .arg("--version")
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .status()
        .is_ok_and(|s| s.success())
}

#[test]
fn unwind_matches_gdb_on_code_without_frame_pointers() {
    // scripts/setup.sh installs gdb: a missing one is a failure, not a skip.
    assert!(
        installed("gdb"),
        "gdb is not installed (scripts/setup.sh installs it)"
    );
    let dir = std::env::temp_dir().join(format!("memprof-unwind-gdb-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let program = compile_fixture(&dir);
    let (stdout, gdb_output) = run_gdb(&dir, &program);

    let mut cache = UnwindCache::new(256 << 20);
    for tag in ["site", "malloc"] {
        check_gdb_stop(&dir, &stdout, &gdb_output, tag, &mut cache);
    }
    let _ = std::fs::remove_dir_all(&dir);
}

/// Builds the fixture, `deep_nofp.c`, without frame pointers into `dir`.
fn compile_fixture(dir: &Path) -> PathBuf {
    let source = Path::new(env!("CARGO_MANIFEST_DIR")).join("../tests/fixtures/deep_nofp.c");
    let program = dir.join("deep_nofp");
    let status = Command::new("gcc")
        .args(["-O2", "-g", "-fomit-frame-pointer", "-o"])
        .arg(&program)
        .arg(&source)
        .status()
        .expect("gcc");
    assert!(status.success(), "gcc {}", source.display());
    program
}

/// Runs the gdb script on `program`: gdb's stdout, then all gdb wrote.
fn run_gdb(dir: &Path, program: &Path) -> (String, String) {
    let script = dir.join("script.gdb");
    std::fs::write(&script, GDB_SCRIPT.replace("DIR", dir.to_str().unwrap())).unwrap();
    let output = Command::new("timeout")
        .args(["120", "gdb", "-batch", "-nx", "-x"])
        .arg(&script)
        .arg(program)
        .stdin(Stdio::null())
        .output()
        .expect("gdb");
    let stdout = String::from_utf8_lossy(&output.stdout);
    let gdb_output = format!("{stdout}\n{}", String::from_utf8_lossy(&output.stderr));
    (stdout.into_owned(), gdb_output)
}

/// At gdb's stop `tag`, our walk gives gdb's frames, through the rules
/// and the functions the fixture says.
fn check_gdb_stop(dir: &Path, stdout: &str, gdb_output: &str, tag: &str, cache: &mut UnwindCache) {
    let stop = parse_gdb(stdout, tag);
    let regs = stop
        .regs
        .unwrap_or_else(|| panic!("no registers at {tag}:\n{gdb_output}"));
    let stack = std::fs::read(dir.join(format!("{tag}.bin"))).unwrap();
    let read_word = |address: u64| {
        let offset = usize::try_from(address.checked_sub(regs.rsp)?).ok()?;
        let bytes = stack.get(offset..offset.checked_add(8)?)?;
        Some(u64::from_le_bytes(bytes.try_into().unwrap()))
    };
    let tables = ProcessTables::for_mappings(&stop.mappings, std::process::id(), cache);
    assert!(tables.skipped.is_empty(), "{:?}", tables.skipped);
    let ours = unwind(&tables.walk_mappings(), regs, read_word, 128);
    let gdb: Vec<u64> = stop.frames.iter().map(|f| f.0).collect();
    let names: Vec<&str> = stop.frames.iter().map(|f| f.1.as_str()).collect();
    let report = format!(
        "at {tag}: ours ({:?}):\n{}gdb: {names:?}\n{}",
        ours.stop,
        name_frames(&tables, &ours.frames),
        name_frames(&tables, &gdb)
    );
    println!("{report}");
    assert_eq!(ours.frames, gdb, "{report}\n{gdb_output}");
    assert_eq!(ours.stop, Stop::Outermost, "{report}");
    check_cfa_kinds(&tables, &ours.frames);
    check_chain(tag, &tables, &gdb, &names, &report);
}

/// Mostly rsp-based frames, and b3's (alloca) from rbp.
fn check_cfa_kinds(tables: &ProcessTables, frames: &[u64]) {
    let kinds: Vec<Option<CfaKind>> = frames
        .iter()
        .enumerate()
        .map(|(index, &ip)| {
            let lookup = if index == 0 { ip } else { ip - 1 };
            let mapping = tables
                .mappings
                .iter()
                .find(|m| m.start <= lookup && lookup < m.end)?;
            Some(mapping.table.lookup(lookup - mapping.bias)?.cfa_kind())
        })
        .collect();
    assert!(kinds.contains(&Some(CfaKind::Rbp)), "{kinds:?}");
    assert!(
        kinds.iter().filter(|k| **k == Some(CfaKind::Rsp)).count() >= 15,
        "{kinds:?}"
    );
}

/// The chain is what the fixture says: deep, through glibc's qsort to
/// the callback, and (at malloc) through strdup.
fn check_chain(tag: &str, tables: &ProcessTables, gdb: &[u64], names: &[&str], report: &str) {
    let in_libc = |ip: &u64| {
        tables
            .mappings
            .iter()
            .any(|m| m.start <= *ip && *ip < m.end && m.path.to_string_lossy().contains("libc.so"))
    };
    let position = |name: &str| names.iter().position(|n| *n == name);
    let (compare, sorter) = (position("compare").unwrap(), position("sorter").unwrap());
    assert!(
        position("site").is_some() && position("main").is_some(),
        "{report}"
    );
    assert!(
        gdb[compare + 1..sorter]
            .iter()
            .filter(|ip| in_libc(ip))
            .count()
            >= 2,
        "qsort's frames: {report}"
    );
    assert!(gdb.len() >= 15, "{report}");
    if tag == "malloc" {
        assert!(
            in_libc(&gdb[0]) && in_libc(&gdb[1]),
            "malloc <- strdup: {report}"
        );
    }
}
