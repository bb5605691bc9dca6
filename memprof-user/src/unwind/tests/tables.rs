//! The tables of real files: the system's libraries and programs (their
//! layout, and the rules at function entries, `_start` and the PLT), the
//! cache that keeps them, and the cost of a whole Python process's.
use std::{
    io::{BufRead as _, BufReader},
    path::{Path, PathBuf},
    process::{Command, Stdio},
    sync::Arc,
    time::Instant,
};

use object::{Object as _, ObjectSection as _, ObjectSymbol as _};

use super::describe;
use crate::unwind::{
    cache::UnwindCache,
    process::{parse_maps, ExecMapping, ProcessTables},
    table::{compile, CfaKind, UnwindTable},
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
        check_system_file(path, functions);
    }
}

/// One file's table, compiled and timed: laid out right, nearly all of
/// it supported, and with the expected rules at function entries,
/// `_start` and the PLT.
fn check_system_file(path: &str, functions: &[&str]) {
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
    check_function_entries(path, &table, &file, functions);
    check_entry_point(path, &table, &file);
    check_plt(path, &table, &file);
}

/// At a function's first instruction the return address is at rsp.
fn check_function_entries(
    path: &str,
    table: &UnwindTable,
    file: &object::File<'_>,
    functions: &[&str],
) {
    for &name in functions {
        let address = function_address(file, name);
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
}

/// `_start`, where the program has one: the outermost frame.
fn check_entry_point(path: &str, table: &UnwindTable, file: &object::File<'_>) {
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
}

/// PLT0 and the first stub, where the file has a .plt.
fn check_plt(path: &str, table: &UnwindTable, file: &object::File<'_>) {
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
