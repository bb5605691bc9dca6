//! Tests on real files and real stacks: tables of the system's libraries
//! and programs, this test binary's own stack unwound and compared with
//! libgcc's unwinder, a C program without frame pointers stopped under
//! gdb and compared with gdb's backtrace, and the cost of the tables of a
//! whole Python process.
use std::{
    arch::asm,
    ffi::c_void,
    hint::black_box,
    io::{BufRead as _, BufReader},
    path::{Path, PathBuf},
    process::{Command, Stdio},
    sync::Arc,
    time::Instant,
};

use object::{Object as _, ObjectSection as _, ObjectSymbol as _};

use super::{
    cache::UnwindCache,
    process::{parse_maps, ExecMapping, ProcessTables},
    table::{compile, CfaKind, Row, UnwindTable},
    walk::{unwind, Mapping, Regs, Stop},
};

const LIBC: &str = "/usr/lib/x86_64-linux-gnu/libc.so.6";
const LIBSTDCXX: &str = "/usr/lib/x86_64-linux-gnu/libstdc++.so.6";
const PYTHON: &str = "/usr/bin/python3";
const LIBPYTHON: &str = "/usr/lib/x86_64-linux-gnu/libpython3.11.so.1.0";
const SQLITE: &str = "/usr/bin/sqlite3";
const LIBSQLITE: &str = "/usr/lib/x86_64-linux-gnu/libsqlite3.so.0";
const LD_SO: &str = "/usr/lib/x86_64-linux-gnu/ld-linux-x86-64.so.2";
const LIBCRYPTO: &str = "/usr/lib/x86_64-linux-gnu/libcrypto.so.3";

/// Rows strictly rising, no two neighbours with the same rule, a gap
/// last.
fn check_layout(path: &str, table: &UnwindTable) {
    assert!(table.rows.len() > 1, "{path}: {} rows", table.rows.len());
    for pair in table.rows.windows(2) {
        assert!(
            pair[0].pc < pair[1].pc,
            "{path}: rows out of order: {pair:?}"
        );
        assert!(
            (pair[0].cfa_words, pair[0].aux, pair[0].kind)
                != (pair[1].cfa_words, pair[1].aux, pair[1].kind),
            "{path}: unmerged rows: {pair:?}"
        );
    }
    assert_eq!(table.rows.last().unwrap().cfa_kind(), CfaKind::Gap);
    assert_eq!(table.stats.rows, table.rows.len());
    assert_eq!(table.stats.bytes, table.rows.len() * 8);
}

fn function_address(file: &object::File<'_>, name: &str) -> u64 {
    file.dynamic_symbols()
        .chain(file.symbols())
        .find(|s| s.name() == Ok(name) && s.kind() == object::SymbolKind::Text && s.address() != 0)
        .unwrap_or_else(|| panic!("no symbol {name}"))
        .address()
}

fn describe(row: Option<Row>) -> String {
    match row {
        Some(row) => format!(
            "{:?} {:+} (rbp {:?} {})",
            row.cfa_kind(),
            row.cfa_offset(),
            row.rbp_kind(),
            row.aux
        ),
        None => "none".to_string(),
    }
}

#[test]
fn unwind_tables_of_system_files() {
    let files: &[(&str, &[&str])] = &[
        (
            LIBC,
            &["malloc", "free", "calloc", "realloc", "strdup", "qsort"],
        ),
        (
            PYTHON,
            &["Py_Initialize", "PyObject_Malloc", "PyList_Append"],
        ),
        (LIBPYTHON, &["Py_Initialize", "PyObject_Malloc"]),
        (LIBSTDCXX, &["_Znwm", "_ZdlPv"]),
        (SQLITE, &[]),
        (
            LIBSQLITE,
            &["sqlite3_open", "sqlite3_malloc", "sqlite3_exec"],
        ),
        (LD_SO, &["_dl_debug_state"]),
        // OpenSSL's assembly switches stacks (CFA from rsi, rax, or a
        // saved rsp): unsupported rows, in leaf functions that never
        // allocate.
        (LIBCRYPTO, &["CRYPTO_malloc"]),
    ];
    for &(path, functions) in files {
        if (path == LIBPYTHON || path == LIBCRYPTO) && !Path::new(path).exists() {
            // Debian's python3 links libpython statically; the shared one
            // comes with the libpython3.11 package only.
            continue;
        }
        let data = std::fs::read(path).unwrap_or_else(|e| panic!("{path}: {e}"));
        let start = Instant::now();
        let table = compile(&data).unwrap_or_else(|e| panic!("{path}: {e:#}"));
        let elapsed = start.elapsed();
        let stats = table.stats;
        println!(
            "{path}: {} FDEs, {} rows ({} unsupported), {} bytes, {:.1} ms; {stats:?}",
            stats.fdes,
            stats.rows,
            stats.unsupported_rows,
            stats.bytes,
            elapsed.as_secs_f64() * 1e3
        );
        check_layout(path, &table);
        assert!(stats.fdes > 100, "{path}: {stats:?}");
        // Nearly every row is one the walk can follow.
        assert!(
            stats.unsupported_rows * 100 < stats.rows,
            "{path}: {stats:?}"
        );

        let file = object::File::parse(&*data).unwrap();
        // At a function's first instruction the return address is at rsp.
        for &name in functions {
            let address = function_address(&file, name);
            let row = table.lookup(address);
            assert!(
                row.is_some_and(|row| row.cfa_kind() == CfaKind::Rsp && row.cfa_offset() == 8),
                "{path}: {name} at {address:#x}: {}",
                describe(row)
            );
        }
        // And at most exported functions' (a few start in the middle of
        // another's code, or have no CFI).
        let exported: Vec<u64> = file
            .dynamic_symbols()
            .filter(|s| s.kind() == object::SymbolKind::Text && s.address() != 0 && s.size() > 0)
            .map(|s| s.address())
            .collect();
        let at_entry = exported
            .iter()
            .filter(|&&address| {
                table
                    .lookup(address)
                    .is_some_and(|row| row.cfa_kind() == CfaKind::Rsp && row.cfa_offset() == 8)
            })
            .count();
        println!(
            "  {at_entry} of {} exported functions start at rsp+8",
            exported.len()
        );
        assert!(
            at_entry * 100 >= exported.len() * 95,
            "{path}: only {at_entry} of {} functions start at rsp+8",
            exported.len()
        );

        if file.kind() == object::ObjectKind::Executable
            || path == PYTHON
            || path == SQLITE
            || path == LD_SO
        {
            // _start: the outermost frame (glibc's start.S says
            // `cfi_undefined (rip)`; ld.so's entry has no CFI and is made
            // outermost up to the next FDE: it runs the initializers).
            let entry = file.entry();
            let row = table.lookup(entry);
            assert_eq!(
                row.map(|row| row.cfa_kind()),
                Some(CfaKind::Outermost),
                "{path}: entry {entry:#x}: {}",
                describe(row)
            );
        }
        if let Some(plt) = file.section_by_name(".plt") {
            // PLT0 pushes once (rsp+16), then jumps (rsp+24); the stubs share
            // ld's expression.
            let plt = plt.address();
            let first = table.lookup(plt);
            assert_eq!(
                first.map(|r| (r.cfa_kind(), r.cfa_offset())),
                Some((CfaKind::Rsp, 16)),
                "{path}: .plt at {plt:#x}: {}",
                describe(first)
            );
            let stub = table.lookup(plt + 16);
            assert!(
                stub.is_some_and(|r| r.cfa_kind() == CfaKind::Plt
                    && r.cfa_offset() == 8
                    && (r.aux == 10 || r.aux == 11)),
                "{path}: first PLT stub at {:#x}: {}",
                plt + 16,
                describe(stub)
            );
        }
    }
}

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
// Cost: the tables of every file a Python process maps.

#[test]
fn unwind_tables_of_a_python_process() {
    let (mappings, files) = python_files("import json, decimal, sqlite3, ssl");
    assert!(files.len() >= 10, "{files:?}");

    let mut cache = UnwindCache::new(512 << 20);
    let mut rows = 0;
    let start = Instant::now();
    let mut tables = Vec::new();
    for path in &files {
        let started = Instant::now();
        let table = cache.get_or_compile(path).unwrap();
        let stats = table.stats;
        println!(
            "{:>8} FDEs {:>8} rows {:>4} unsupported {:>9} bytes {:>6.1} ms  {}",
            stats.fdes,
            stats.rows,
            stats.unsupported_rows,
            stats.bytes,
            started.elapsed().as_secs_f64() * 1e3,
            path.display()
        );
        rows += stats.rows;
        tables.push(table);
    }
    let cold = start.elapsed();
    let start = Instant::now();
    for (path, table) in files.iter().zip(&tables) {
        assert!(Arc::ptr_eq(&cache.get_or_compile(path).unwrap(), table));
    }
    let warm = start.elapsed();
    let stats = cache.stats();
    println!(
        "{} files: {rows} rows, {} bytes; cold {:.0} ms, from the cache {:.2} ms; {stats:?}",
        files.len(),
        stats.bytes_held,
        cold.as_secs_f64() * 1e3,
        warm.as_secs_f64() * 1e3
    );
    assert_eq!(stats.files_compiled as usize, files.len());
    assert_eq!(stats.hits as usize, files.len());
    assert_eq!(stats.evictions, 0);
    assert_eq!(stats.bytes_held, rows * 8);

    // Every mapping gets its table and load bias.
    let process = ProcessTables::for_mappings(&mappings, std::process::id(), &mut cache);
    assert!(process.skipped.is_empty(), "{:?}", process.skipped);
    assert_eq!(process.mappings.len(), mappings.len());
}

/// The executable files mapped by a Python process that ran `code`.
fn python_files(code: &str) -> (Vec<ExecMapping>, Vec<PathBuf>) {
    let mut child = Command::new(PYTHON)
        .args([
            "-c",
            &format!("{code}\nimport sys; print('ready', flush=True); sys.stdin.read()"),
        ])
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .spawn()
        .expect("python3");
    let mut line = String::new();
    BufReader::new(child.stdout.take().unwrap())
        .read_line(&mut line)
        .unwrap();
    assert_eq!(line.trim(), "ready");
    let maps = std::fs::read_to_string(format!("/proc/{}/maps", child.id())).unwrap();
    drop(child.stdin.take());
    child.wait().unwrap();
    let mappings = parse_maps(&maps);
    let mut files: Vec<PathBuf> = mappings.iter().map(|m| m.path.clone()).collect();
    files.sort();
    files.dedup();
    (mappings, files)
}

/// Compiles `files` into a fresh cache, then looks them up again.
fn measure(what: &str, files: &[PathBuf]) {
    let file_bytes: u64 = files
        .iter()
        .map(|p| std::fs::metadata(p).unwrap().len())
        .sum();
    let mut cache = UnwindCache::new(1 << 30);
    let start = Instant::now();
    let (mut fdes, mut rows, mut unsupported) = (0, 0, 0);
    for path in files {
        let stats = cache.get_or_compile(path).unwrap().stats;
        fdes += stats.fdes;
        rows += stats.rows;
        unsupported += stats.unsupported_rows;
    }
    let cold = start.elapsed();
    let start = Instant::now();
    for path in files {
        cache.get_or_compile(path).unwrap();
    }
    let warm = start.elapsed();
    println!(
        "{what}: {} files ({:.0} MiB): {fdes} FDEs, {rows} rows ({unsupported} unsupported), \
         {:.1} MiB of rows; cold {:.0} ms, from the cache {:.2} ms",
        files.len(),
        file_bytes as f64 / 1048576.0,
        cache.stats().bytes_held as f64 / 1048576.0,
        cold.as_secs_f64() * 1e3,
        warm.as_secs_f64() * 1e3
    );
}

/// The cost of many files: a Python process that imported every
/// extension module it has (about 70 files), and the 50 largest shared
/// libraries of the system (a worst case). `cargo test --release -p
/// memprof-user -- unwind_bench --ignored --nocapture`
#[test]
#[ignore]
fn unwind_bench_many_files() {
    let (_, files) = python_files(
        "import importlib, os\n\
         for f in sorted(os.listdir('/usr/lib/python3.11/lib-dynload')):\n\
         \x20   try: importlib.import_module(f.split('.')[0])\n\
         \x20   except Exception: pass",
    );
    measure("python3, every lib-dynload module imported", &files);

    let mut libraries: Vec<(u64, PathBuf)> = std::fs::read_dir("/usr/lib/x86_64-linux-gnu")
        .unwrap()
        .filter_map(|entry| {
            let entry = entry.ok()?;
            let metadata = std::fs::metadata(entry.path()).ok()?;
            let name = entry.file_name().to_string_lossy().into_owned();
            (metadata.is_file() && name.contains(".so")).then(|| (metadata.len(), entry.path()))
        })
        .collect();
    libraries.sort_by_key(|(size, _)| std::cmp::Reverse(*size));
    let mut largest: Vec<PathBuf> = Vec::new();
    for (_, path) in libraries {
        if largest.len() == 50 {
            break;
        }
        let path = path.canonicalize().unwrap_or(path);
        let data = std::fs::read(&path).unwrap_or_default();
        if !largest.contains(&path) && compile(&data).is_ok() {
            largest.push(path);
        }
    }
    measure("the 50 largest shared libraries", &largest);
}

#[test]
fn unwind_cache_evicts_least_recently_used() {
    let sizes: Vec<usize> = [LIBC, LIBSTDCXX, LIBSQLITE]
        .iter()
        .map(|path| {
            UnwindCache::new(usize::MAX)
                .get_or_compile(Path::new(path))
                .unwrap()
                .stats
                .bytes
        })
        .collect();
    // Room for libc and libstdc++, not all three.
    let bound = sizes[0] + sizes[1];
    let mut cache = UnwindCache::new(bound);
    let libc = cache.get_or_compile(Path::new(LIBC)).unwrap();
    cache.get_or_compile(Path::new(LIBSTDCXX)).unwrap();
    // libc used last: libstdc++ goes first.
    assert!(Arc::ptr_eq(
        &cache.get_or_compile(Path::new(LIBC)).unwrap(),
        &libc
    ));
    cache.get_or_compile(Path::new(LIBSQLITE)).unwrap();
    let stats = cache.stats();
    assert_eq!(stats.files_compiled, 3);
    assert!(stats.evictions >= 1, "{stats:?}");
    assert!(stats.bytes_held <= bound, "{stats:?}");
    assert!(Arc::ptr_eq(
        &cache.get_or_compile(Path::new(LIBC)).unwrap(),
        &libc
    ));
    assert_eq!(cache.stats().files_compiled, 3);
    cache.get_or_compile(Path::new(LIBSTDCXX)).unwrap();
    assert_eq!(cache.stats().files_compiled, 4, "libstdc++ was evicted");

    // A table larger than the bound is returned, not kept.
    let mut tiny = UnwindCache::new(1);
    tiny.get_or_compile(Path::new(LIBC)).unwrap();
    assert_eq!(tiny.stats().bytes_held, 0);
    assert_eq!(tiny.stats().tables_held, 0);

    // Two paths of one file: compiled once (libc.so.6 is reachable
    // through /lib too on merged-/usr systems; a hard copy would do too).
    let mut cache = UnwindCache::new(usize::MAX);
    cache.get_or_compile(Path::new(LIBC)).unwrap();
    let other = Path::new("/lib/x86_64-linux-gnu/libc.so.6");
    if other.exists() {
        cache.get_or_compile(other).unwrap();
        assert_eq!(cache.stats().files_compiled, 1);
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
    let source = Path::new(env!("CARGO_MANIFEST_DIR")).join("../tests/fixtures/deep_nofp.c");
    let program = dir.join("deep_nofp");
    let status = Command::new("gcc")
        .args(["-O2", "-g", "-fomit-frame-pointer", "-o"])
        .arg(&program)
        .arg(&source)
        .status()
        .expect("gcc");
    assert!(status.success(), "gcc {}", source.display());
    let script = dir.join("script.gdb");
    std::fs::write(&script, GDB_SCRIPT.replace("DIR", dir.to_str().unwrap())).unwrap();
    let output = Command::new("timeout")
        .args(["120", "gdb", "-batch", "-nx", "-x"])
        .arg(&script)
        .arg(&program)
        .stdin(Stdio::null())
        .output()
        .expect("gdb");
    let stdout = String::from_utf8_lossy(&output.stdout);
    let gdb_output = format!("{stdout}\n{}", String::from_utf8_lossy(&output.stderr));

    let mut cache = UnwindCache::new(256 << 20);
    for tag in ["site", "malloc"] {
        let stop = parse_gdb(&stdout, tag);
        let regs = stop
            .regs
            .unwrap_or_else(|| panic!("no registers at {tag}:\n{gdb_output}"));
        let stack = std::fs::read(dir.join(format!("{tag}.bin"))).unwrap();
        let read_word = |address: u64| {
            let offset = usize::try_from(address.checked_sub(regs.rsp)?).ok()?;
            let bytes = stack.get(offset..offset.checked_add(8)?)?;
            Some(u64::from_le_bytes(bytes.try_into().unwrap()))
        };
        let tables = ProcessTables::for_mappings(&stop.mappings, std::process::id(), &mut cache);
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
        // Mostly rsp-based frames, and b3's (alloca) from rbp.
        let kinds: Vec<Option<CfaKind>> = ours
            .frames
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

        // The chain is what the fixture says: deep, through glibc's qsort
        // to the callback, and (at malloc) through strdup.
        let in_libc = |ip: &u64| {
            tables.mappings.iter().any(|m| {
                m.start <= *ip && *ip < m.end && m.path.to_string_lossy().contains("libc.so")
            })
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
    let _ = std::fs::remove_dir_all(&dir);
}
