//! The bench's rows: which loop each runs, under what (untraced, memprof
//! with which flags, bpftrace), the targets its ratio to its floor is held
//! to; and the rows each `--*-only` flag keeps.

/// Allocator libraries the malloc loop is also linked with.
pub const ALLOCATOR_LIBRARIES: [&str; 3] = ["jemalloc", "tcmalloc", "mimalloc"];

/// The flags of a floor row: the same uprobes, empty BPF programs.
pub const FLOOR: &[&str] = &["--empty-programs"];

/// One row of the table: one way of running a malloc loop.
pub struct Row {
    pub name: String,
    pub runner: Runner,
    /// Which loop; ratios are to the floor row of the same workload.
    pub workload: Workload,
    /// The targets set for the row, as multiples of the floor; a second
    /// one is tighter, set later to cut the overhead further.
    pub targets: &'static [f64],
}

#[derive(Clone, Copy, PartialEq, Eq)]
pub enum Workload {
    /// bench/alloc_loop.c with frame pointers: 6 frames at malloc.
    AllocLoop,
    /// bench/deep_loop.c without frame pointers, this many frames at malloc.
    DeepNoFp(u32),
    /// bench/new_loop.cpp: new long[8] + delete[] (libstdc++).
    NewLoop,
    /// bench/alloc_loop.c linked with this allocator library (-lNAME).
    Linked(&'static str),
}

pub enum Runner {
    Untraced,
    Memprof(&'static [&'static str]),
    /// The loop runs alone under `memprof monitor` of the whole host with
    /// these flags.
    MonitorHost(&'static [&'static str]),
    /// bpftrace with this program (LIBC stands for the C library's path).
    Bpftrace(&'static str),
}

/// Which rows `cargo xtask bench` runs.
#[derive(Clone, Copy, PartialEq, Eq)]
pub enum Only {
    All,
    Allocators,
    Mappings,
    Regions,
    Live,
}

/// The --while and timeline rows: what --while costs where nothing is
/// recorded (the loop never runs inside printf) and where all is (inside
/// churn), and a timeline sampled every 100 ms, against the floor and
/// plain totals.
const REGION_ROWS: [&[&str]; 5] = [
    FLOOR,
    &[],
    &["--while", "printf"],
    &["--while", "churn"],
    &["--format", "timeline"],
];

/// The rows that compare direct-mapping tracking on and off.
const MAPPING_ROWS: [&[&str]; 5] = [
    FLOOR,
    &[],
    &["--no-mmap"],
    &["--live"],
    &["--live", "--no-mmap"],
];

/// Every row, in the table's order (bpftrace's only if it is installed).
pub fn all(has_bpftrace: bool) -> Vec<Row> {
    let mut rows = totals_rows();
    rows.extend(live_rows());
    rows.extend(probe_rows());
    rows.extend(deep_rows());
    rows.extend(allocator_rows());
    if has_bpftrace {
        rows.extend(bpftrace_rows());
    }
    rows
}

/// The rows `only` keeps, in their order.
pub fn select(mut rows: Vec<Row>, only: Only) -> Vec<Row> {
    match only {
        Only::All => {}
        Only::Allocators => {
            rows.retain(|r| matches!(r.workload, Workload::NewLoop | Workload::Linked(_)))
        }
        Only::Mappings => rows.retain(|r| is_loop_row_of(r, &MAPPING_ROWS)),
        Only::Regions => rows.retain(|r| is_loop_row_of(r, &REGION_ROWS)),
        Only::Live => rows.retain(is_live_row),
    }
    rows
}

/// A memprof row of the malloc loop with one of these sets of flags.
fn is_loop_row_of(row: &Row, flag_sets: &[&[&str]]) -> bool {
    row.workload == Workload::AllocLoop
        && matches!(row.runner, Runner::Memprof(flags) if flag_sets.contains(&flags))
}

/// A live-heap row of the malloc loop, or its floor.
fn is_live_row(row: &Row) -> bool {
    row.workload == Workload::AllocLoop
        && match row.runner {
            Runner::Memprof(flags) => flags.contains(&"--live") || flags == FLOOR,
            Runner::MonitorHost(_) => true,
            _ => false,
        }
}

fn row(name: &str, runner: Runner, targets: &'static [f64]) -> Row {
    Row {
        name: name.to_string(),
        runner,
        workload: Workload::AllocLoop,
        targets,
    }
}

fn deep(frames: u32, name: &str, runner: Runner, targets: &'static [f64]) -> Row {
    Row {
        workload: Workload::DeepNoFp(frames),
        ..row(name, runner, targets)
    }
}

/// The malloc loop untraced, at its floor, and under memprof's totals
/// (and the ways of cutting or narrowing them).
fn totals_rows() -> Vec<Row> {
    vec![
        row("untraced", Runner::Untraced, &[]),
        row(
            "floor: same uprobes, empty BPF programs",
            Runner::Memprof(FLOOR),
            &[],
        ),
        row(
            "memprof totals (exact, --unwind auto: CFI tables)",
            Runner::Memprof(&[]),
            &[],
        ),
        row(
            "memprof totals, --no-mmap (direct mappings not tracked)",
            Runner::Memprof(&["--no-mmap"]),
            &[],
        ),
        row(
            "memprof totals (exact, --unwind fp)",
            Runner::Memprof(&["--unwind", "fp"]),
            &[1.3, 1.26],
        ),
        row(
            "memprof --sample-bytes 512K",
            Runner::Memprof(&["--sample-bytes", "512K"]),
            &[1.05],
        ),
        row(
            "memprof --while printf (off the loop's stack: nothing recorded)",
            Runner::Memprof(&["--while", "printf"]),
            &[],
        ),
        row(
            "memprof --while churn (the loop's function: every call recorded)",
            Runner::Memprof(&["--while", "churn"]),
            &[],
        ),
        row(
            "memprof --format timeline (heap sampled every 100 ms)",
            Runner::Memprof(&["--format", "timeline"]),
            &[],
        ),
    ]
}

/// The malloc loop under memprof's live heap: its floor, exact and
/// sampled, in `trace` and under `monitor` of the whole host.
fn live_rows() -> Vec<Row> {
    vec![
        row(
            "live floor: live's uprobes (+ returns, + free), empty programs",
            Runner::Memprof(&["--live", "--empty-programs"]),
            &[],
        ),
        row(
            "memprof --live (exact)",
            Runner::Memprof(&["--live"]),
            &[3.0, 2.5],
        ),
        row(
            "memprof --live, --no-mmap",
            Runner::Memprof(&["--live", "--no-mmap"]),
            &[],
        ),
        row(
            "memprof --live --sample-bytes 512K (session uprobes: returns only where sampled)",
            Runner::Memprof(&["--live", "--sample-bytes", "512K"]),
            &[2.1],
        ),
        row(
            "memprof --live --sample-bytes 512K, children not held at fork: the parent keeps a shared entry event (--no-fork-hold)",
            Runner::Memprof(&["--live", "--sample-bytes", "512K", "--no-fork-hold"]),
            &[],
        ),
        row(
            "memprof --live --sample-bytes 512K, a return on every call (--no-session-probes)",
            Runner::Memprof(&["--live", "--sample-bytes", "512K", "--no-session-probes"]),
            &[],
        ),
        row(
            "memprof monitor --live (whole host; sampling at 512K)",
            Runner::MonitorHost(&["--live"]),
            &[2.1],
        ),
        row(
            "memprof --live --no-probe-offsets",
            Runner::Memprof(&["--live", "--no-probe-offsets"]),
            &[],
        ),
    ]
}

/// One probe alone, its program empty: what each uprobe costs.
fn probe_rows() -> Vec<Row> {
    vec![
        row(
            "one empty probe: malloc",
            Runner::Memprof(&["--bench-probe", "malloc"]),
            &[],
        ),
        row(
            "one empty probe: free (at its first emulated instruction)",
            Runner::Memprof(&["--bench-probe", "free"]),
            &[],
        ),
        row(
            "one empty probe: free at +0 (--no-probe-offsets)",
            Runner::Memprof(&["--bench-probe", "free", "--no-probe-offsets"]),
            &[],
        ),
    ]
}

/// A program without frame pointers, 11 frames at malloc (and 31, for
/// the cost per frame).
fn deep_rows() -> Vec<Row> {
    vec![
        deep(
            11,
            "no frame pointers, 11 frames: floor (empty programs)",
            Runner::Memprof(FLOOR),
            &[],
        ),
        deep(
            11,
            "no frame pointers, 11 frames: memprof totals (exact, full stacks)",
            Runner::Memprof(&[]),
            &[2.5],
        ),
        deep(
            11,
            "no frame pointers, 11 frames: memprof --sample-bytes 512K",
            Runner::Memprof(&["--sample-bytes", "512K"]),
            &[1.1],
        ),
        deep(
            11,
            "no frame pointers, 11 frames: memprof --unwind fp (cut stacks)",
            Runner::Memprof(&["--unwind", "fp"]),
            &[],
        ),
        deep(
            31,
            "no frame pointers, 31 frames: memprof totals (exact, full stacks)",
            Runner::Memprof(&[]),
            &[],
        ),
    ]
}

/// C++'s operators and other allocators, each to its own floor.
fn allocator_rows() -> Vec<Row> {
    let workloads = std::iter::once(Workload::NewLoop).chain(
        ALLOCATOR_LIBRARIES
            .iter()
            .map(|&library| Workload::Linked(library)),
    );
    let mut rows = Vec::new();
    for workload in workloads {
        let name = match workload {
            Workload::NewLoop => "new[]+delete[] (libstdc++)".to_string(),
            Workload::Linked(library) => format!("{library}'s malloc+free"),
            _ => unreachable!(),
        };
        // The 1.3 target is the probes' own cost: frame-pointer stacks, as
        // for glibc's row (CFI unwinding costs the same whatever the
        // allocator: see the rows without frame pointers).
        for (what, runner, targets) in [
            ("floor (empty programs)", Runner::Memprof(FLOOR), &[][..]),
            (
                "memprof totals (exact, --unwind auto)",
                Runner::Memprof(&[]),
                &[][..],
            ),
            (
                "memprof totals (exact, --unwind fp)",
                Runner::Memprof(&["--unwind", "fp"]),
                &[1.3][..],
            ),
        ] {
            rows.push(Row {
                workload,
                ..row(&format!("{name}: {what}"), runner, targets)
            });
        }
    }
    rows
}

/// bpftrace on the same loop, for comparison.
fn bpftrace_rows() -> [Row; 2] {
    [
        row(
            "bpftrace: count malloc hits",
            Runner::Bpftrace("uprobe:LIBC:malloc { @calls = count(); }"),
            &[],
        ),
        row(
            "bpftrace: count malloc calls by user stack",
            Runner::Bpftrace("uprobe:LIBC:malloc { @[ustack] = count(); }"),
            &[],
        ),
    ]
}
