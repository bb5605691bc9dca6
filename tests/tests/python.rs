//! CPython's allocators as allocators: objects from `PyObject_Malloc`,
//! `PyMem_Calloc` and their family counted once each with their size,
//! freed ones ended in `--live`, the malloc calls and arena mappings
//! inside them not counted again; pyenv's CPython 3.8 to 3.13 and
//! Debian's python3.11, whose LTO build is profiled in part and says so.
use serde_json::Value;
use tests::*;

/// pyenv's builds (shared libpython, not LTO) and Debian's (LTO, PGO,
/// stripped, a static libpython in the program).
const PYENV: [&str; 6] = ["3.8", "3.9", "3.10", "3.11", "3.12", "3.13"];
const DEBIAN: &str = "/usr/bin/python3.11";

fn pyenv_python(version: &str) -> String {
    let versions = std::fs::read_dir("/root/.pyenv/versions").expect("pyenv's CPythons");
    let dir = versions
        .flatten()
        .map(|e| e.file_name().to_string_lossy().into_owned())
        .find(|name| {
            name.strip_prefix(version)
                .is_some_and(|rest| rest.starts_with('.'))
        })
        .unwrap_or_else(|| panic!("no pyenv CPython {version}"));
    format!("/root/.pyenv/versions/{dir}/bin/python{version}")
}

/// Calls Python's allocators through ctypes at known sizes, frees some:
/// 1,000 objects of 333 B (pymalloc) and 200 of 5,000 B (malloc, inside
/// PyObject_Malloc) of which 400 and 50 are freed; 300 blocks of 3 x 111
/// B from PyMem_Calloc, 100 freed.
const SCRIPT: &str = r#"
import ctypes
api = ctypes.pythonapi
def fn(name, result, *args):
    f = getattr(api, name)
    f.restype = result
    f.argtypes = list(args)
    return f
malloc = fn("PyObject_Malloc", ctypes.c_void_p, ctypes.c_size_t)
free = fn("PyObject_Free", None, ctypes.c_void_p)
calloc = fn("PyMem_Calloc", ctypes.c_void_p, ctypes.c_size_t, ctypes.c_size_t)
mem_free = fn("PyMem_Free", None, ctypes.c_void_p)
small = [malloc(333) for _ in range(1000)]
big = [malloc(5000) for _ in range(200)]
zeroed = [calloc(3, 111) for _ in range(300)]
for p in small[:400]:
    free(p)
for p in big[:50]:
    free(p)
for p in zeroed[:100]:
    mem_free(p)
"#;

/// The stacks of `allocator` called from ctypes (frame 0 in libffi).
fn from_ctypes<'a>(report: &'a Value, allocator: &str) -> Vec<&'a Value> {
    stacks_where(report, |stack| {
        stack["allocator"] == allocator
            && stack["frames"][0]["module"]
                .as_str()
                .is_some_and(|m| m.contains("libffi"))
    })
}

/// Whether `function` is one of Python's allocators or their
/// implementation (`_PyObject_Malloc`: the exported functions tail-call
/// it, so their own frame is gone below it).
fn in_python_allocator(function: &str) -> bool {
    ["Malloc", "Calloc", "Realloc"].iter().any(|call| {
        function.ends_with(&format!("PyObject_{call}")) || function == format!("PyMem_{call}")
    })
}

/// No malloc or mapping is counted inside one of Python's allocators.
fn nothing_counted_twice(report: &Value) {
    let inside = stacks_where(report, |stack| {
        !stack["allocator"].as_str().unwrap().starts_with("Py")
            && frame_functions(stack)
                .iter()
                .any(|f| in_python_allocator(f))
    });
    assert!(
        inside.is_empty(),
        "counted inside Python's allocators: {inside:?}"
    );
}

fn python_stacks(report: &Value) -> usize {
    stacks_where(report, |s| {
        s["allocator"].as_str().unwrap().starts_with("Py")
    })
    .len()
}

/// `SCRIPT` under `trace` with every stack kept: a ctypes call's first
/// runs take the interpreter's generic path (later ones its specialized
/// one), a stack of its own too small for a top 1,000.
fn trace_script(python: &str, extra: &[&str]) -> Value {
    let (output, report) = trace_json_top("1000000", extra, &[python, "-c", SCRIPT]);
    assert!(output.status.success(), "{python}: {output:?}");
    report
}

#[test]
fn every_object_counts_once_with_its_size() {
    let _serial = serial();
    for version in PYENV {
        let python = pyenv_python(version);
        let report = trace_script(&python, &[]);
        let objects = from_ctypes(&report, "PyObject_Malloc");
        assert_eq!(
            sum_fields(&objects, ["bytes", "count"]),
            [1000 * 333 + 200 * 5000, 1200],
            "{python}"
        );
        let zeroed = from_ctypes(&report, "PyMem_Calloc");
        assert_eq!(
            sum_fields(&zeroed, ["bytes", "count"]),
            [300 * 333, 300],
            "{python}"
        );
        nothing_counted_twice(&report);
        assert!(
            report.get("partly_probed").is_none(),
            "{python}: {}",
            report["partly_probed"]
        );
    }
}

#[test]
fn freed_objects_end_in_live_mode() {
    let _serial = serial();
    for version in PYENV {
        let python = pyenv_python(version);
        let report = trace_script(&python, &["--live"]);
        let objects = from_ctypes(&report, "PyObject_Malloc");
        assert_eq!(
            sum_fields(&objects, ["live_bytes", "live_count"]),
            [600 * 333 + 150 * 5000, 750],
            "{python}"
        );
        let zeroed = from_ctypes(&report, "PyMem_Calloc");
        assert_eq!(
            sum_fields(&zeroed, ["live_bytes", "live_count"]),
            [200 * 333, 200],
            "{python}"
        );
        nothing_counted_twice(&report);
    }
}

#[test]
fn no_python_allocators_counts_only_what_reaches_malloc() {
    let _serial = serial();
    let python = pyenv_python("3.12");
    let report = trace_script(&python, &["--no-python-allocators"]);
    assert_eq!(python_stacks(&report), 0);
    // The 200 big objects reach malloc, counted there now: under ctypes'
    // call (pymalloc tail-calls its way to malloc: frame 0 may be
    // libffi's), at their size.
    let big = stacks_where(&report, |s| {
        s["allocator"] == "malloc"
            && s["frames"]
                .as_array()
                .unwrap()
                .iter()
                .any(|f| f["module"].as_str().is_some_and(|m| m.contains("libffi")))
    });
    assert_eq!(sum_fields(&big, ["bytes", "count"]), [200 * 5000, 200]);
}

#[test]
fn an_lto_build_is_profiled_in_part_and_says_so() {
    let _serial = serial();
    // Its exported functions are probed: the calls through them count.
    let report = trace_script(DEBIAN, &[]);
    let objects = from_ctypes(&report, "PyObject_Malloc");
    assert_eq!(
        sum_fields(&objects, ["bytes", "count"]),
        [1000 * 333 + 200 * 5000, 1200]
    );
    nothing_counted_twice(&report);
    let partial = report["partly_probed"].as_array().expect("a partial note");
    assert_eq!(partial.len(), 1, "{partial:?}");
    assert!(partial[0]["program"]
        .as_str()
        .unwrap()
        .ends_with("python3.11"));
    assert!(partial[0]["reason"].as_str().unwrap().contains("inlines"));
    // --live: left out (a free in the inlined code would go unseen).
    let report = trace_script(DEBIAN, &["--live"]);
    assert_eq!(python_stacks(&report), 0);
    assert!(report["partly_probed"][0]["reason"]
        .as_str()
        .unwrap()
        .contains("--live"));
}
