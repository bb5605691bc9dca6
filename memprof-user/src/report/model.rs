//! The report as data; its JSON form is a contract (docs/json-schema.md):
//! add fields, rename none.
use std::{collections::BTreeMap, sync::Arc};

use serde::{Deserialize, Serialize};

pub use super::frame::FrameReport;

/// The version of the layout the model serializes to as it is (each
/// frame whole in each stack); `json` writes version 2 from it too.
pub const REPORT_VERSION: u32 = 1;

#[derive(Clone, Debug, Serialize, Deserialize, PartialEq)]
pub struct Report {
    /// Written by `json` as the layout's (not when it writes version 2).
    #[serde(skip_serializing_if = "super::frame::writing_indices")]
    pub version: u32,
    /// "alloc": totals of what each call site allocated; "live" (--live):
    /// also what is still allocated.
    pub mode: String,
    pub duration_secs: f64,
    /// When the `duration_secs` it covers began (RFC 3339, UTC, ms).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub started_at: Option<String>,
    /// True when every number is an exact count (no sampling).
    pub exact: bool,
    /// With --sample-bytes: the mean sampling interval; bytes and counts
    /// are then unbiased estimates.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub sample_bytes: Option<u64>,
    /// "stack", "caller" or "type".
    pub group_by: String,
    /// What the stacks were cut to (--top, --depth, --sort): null top or
    /// depth for every stack or frame recorded.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cut: Option<CutReport>,
    /// Sum over all processes.
    pub bytes: u64,
    pub count: u64,
    pub processes: Vec<ProcessReport>,
    /// Events not recorded in full, by cause (all causes, zeros included).
    pub lost: BTreeMap<String, u64>,
    /// Live mode only: how the live figures were taken.
    #[serde(flatten, default, skip_serializing_if = "Option::is_none")]
    pub live: Option<LiveSettingsReport>,
    /// Every function memprof put a probe on (libraries loaded later too).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub probes: Vec<ProbeReport>,
    /// Targets in which memprof found no allocator it knows: nothing of
    /// theirs is counted, which is not the same as nothing allocated.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub unprobed: Vec<UnprobedReport>,
    /// Targets profiled in part, and what their figures miss (CPython
    /// built with its allocator inlined: the objects made there).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub partly_probed: Vec<UnprobedReport>,
    /// Modules whose frames are not named in full, and why: a file that
    /// is not a regular file or is malformed, a debug file refused.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub unsymbolized: Vec<UnsymbolizedReport>,
    /// --focus, --ignore, --skip-frames: the filters the stacks went
    /// through, and what they hid in all processes.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub filters: Option<FiltersReport>,
    /// --while, --delay, --start-on, --toggle-on: which calls the figures
    /// cover (the others were not recorded).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub recording: Option<RecordingReport>,
    /// `monitor`: what ended processes left and memprof evicted, and how
    /// full its tables are.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub limits: Option<LimitsReport>,
    /// `monitor` (not `--exact`): the cost budget and the probes' measured
    /// cost; each process's estimated cost is in its `overhead`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub budget: Option<BudgetReport>,
}

/// How a report's stacks were cut.
#[derive(Clone, Debug, Default, Serialize, Deserialize, PartialEq, Eq)]
pub struct CutReport {
    /// Stacks kept per process; null: all of them.
    pub top: Option<usize>,
    /// Frames kept per stack; null: all recorded.
    pub depth: Option<usize>,
    /// The --sort key; null: the default (live bytes in a live report,
    /// else bytes).
    #[serde(default)]
    pub sort: Option<String>,
}

impl CutReport {
    /// This cut, cut again by `then`: the smaller of each.
    pub fn then(&self, then: &CutReport) -> CutReport {
        let smaller = |a: Option<usize>, b: Option<usize>| match (a, b) {
            (Some(a), Some(b)) => Some(a.min(b)),
            (a, b) => a.or(b),
        };
        CutReport {
            top: smaller(self.top, then.top),
            depth: smaller(self.depth, then.depth),
            sort: then.sort.clone().or_else(|| self.sort.clone()),
        }
    }
}

/// `monitor`'s cost budget.
#[derive(Clone, Debug, Default, Serialize, Deserialize, PartialEq)]
pub struct BudgetReport {
    /// What memprof's probes may cost each process, in CPUs
    /// (`--max-overhead` / 100).
    pub max_overhead: f64,
    /// The probes' cost per allocation on this host, measured at start
    /// (programs and traps, as configured), in ns.
    pub cost_per_call_ns: f64,
    /// How often each process's cost is estimated.
    pub period_secs: f64,
    /// True when processes over the budget have their probes in for part
    /// of each period only (`duty_cycle`); false where the cost is only
    /// measured (the whole host, `--live`).
    #[serde(default)]
    pub enforced: bool,
    /// The traps a process new to memprof may take before the kernel asks
    /// for its probes to come out (its budget for one period); each
    /// window has one for its span.
    #[serde(default)]
    pub first_allowance: u64,
    /// How a window's counts are scaled to its span: `cpu_time` (by the
    /// process's CPU time in and out of its windows, the traps'
    /// calibrated cost taken out; the only one without a PMU).
    #[serde(default)]
    pub estimator: String,
    /// How much of the report's totals is counted (processes in all
    /// along), estimated (scaled from windows) and partial.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub totals: Option<BudgetTotals>,
}

/// The report's processes by how their figures came about.
#[derive(Clone, Debug, Default, Serialize, Deserialize, PartialEq)]
pub struct BudgetTotals {
    pub counted: KindTotals,
    pub estimated: KindTotals,
    pub partial: KindTotals,
}

#[derive(Clone, Copy, Debug, Default, Serialize, Deserialize, PartialEq)]
pub struct KindTotals {
    pub processes: u64,
    pub bytes: u64,
    pub count: u64,
}

/// `monitor`'s bounds: ended processes stay `retention_secs`, then go.
/// Table fills are as of the last sweep (every few seconds).
#[derive(Clone, Debug, Default, Serialize, Deserialize, PartialEq)]
pub struct LimitsReport {
    pub retention_secs: f64,
    /// Process images evicted (ended one retention ago), in all.
    pub evicted_processes: u64,
    /// Stacks evicted (used only by evicted processes), in all.
    pub evicted_stacks: u64,
    /// Times the symbol caches were emptied (over their cap).
    pub symbol_cache_resets: u64,
    /// Entries in the kernel's process table (cap: --max-processes).
    pub processes: u64,
    /// Call sites in the kernel's totals table (cap: --max-stacks).
    pub sites: u64,
    /// Stacks in the kernel's stack table (cap: --stack-map-size).
    pub stacks: u64,
    pub max_processes: u64,
    pub max_sites: u64,
    pub max_stacks: u64,
    /// Groups of probes in the kernel's site table (each file probed
    /// takes one to three), and how many it holds.
    #[serde(default)]
    pub site_groups: u64,
    #[serde(default)]
    pub max_site_groups: u64,
    /// Files probed since the start whose probes were freed (no process
    /// mapped them any more, and the site table was full), in all.
    #[serde(default)]
    pub freed_probed_files: u64,
}

/// What a profile recorded, when it did not record every call.
#[derive(Clone, Debug, Default, Serialize, Deserialize, PartialEq)]
pub struct RecordingReport {
    /// --while: only calls made inside these functions were recorded.
    #[serde(rename = "while", default)]
    pub while_functions: Vec<String>,
    #[serde(default)]
    pub delay_secs: Option<f64>,
    /// --start-on, --toggle-on: the signals ("SIGUSR1").
    #[serde(default)]
    pub start_on: Option<String>,
    #[serde(default)]
    pub toggle_on: Option<String>,
    /// When calls were recorded: [from, to], seconds since profiling
    /// started (the profile's end for a window still open).
    pub windows: Vec<[f64; 2]>,
}

/// The stack filters applied (in `memprof report` too, added to those a
/// saved report had), and what they hid.
#[derive(Clone, Debug, Default, Serialize, Deserialize, PartialEq)]
pub struct FiltersReport {
    /// --focus patterns, in the order applied: a stack is kept when a
    /// frame's function or file matches each.
    #[serde(default)]
    pub focus: Vec<String>,
    /// --ignore patterns: a stack with a matching frame is dropped.
    #[serde(default)]
    pub ignore: Vec<String>,
    /// --skip-frames: innermost frames dropped from every stack, in all.
    #[serde(default)]
    pub skip_frames: usize,
    #[serde(flatten)]
    pub hidden: HiddenReport,
}

/// What filters hid: stacks, and their bytes and calls (left out of the
/// totals next to it).
#[derive(Clone, Copy, Debug, Default, Serialize, Deserialize, PartialEq)]
pub struct HiddenReport {
    pub hidden_bytes: u64,
    pub hidden_count: u64,
    pub hidden_stacks: u64,
}

impl HiddenReport {
    pub fn add(&mut self, other: HiddenReport) {
        self.hidden_bytes += other.hidden_bytes;
        self.hidden_count += other.hidden_count;
        self.hidden_stacks += other.hidden_stacks;
    }
}

/// One probed function.
#[derive(Clone, Debug, Serialize, Deserialize, PartialEq)]
pub struct ProbeReport {
    /// The file, as memprof opened it.
    pub module: String,
    /// Its symbol (the first of its aliases memprof knows).
    pub function: String,
    /// "alloc", "free" (the C library's) or "release" (operator delete,
    /// mi_free, --free-fn...).
    pub role: String,
    /// How stacks name an allocator's calls ("new[]" for `_Znam`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub allocator: Option<String>,
    /// Where the probe sits in the file, hex.
    pub offset: String,
}

/// A target memprof could not profile, and why.
#[derive(Clone, Debug, Serialize, Deserialize, PartialEq)]
pub struct UnprobedReport {
    pub program: String,
    pub reason: String,
}

/// A module whose frames are not named in full.
#[derive(Clone, Debug, Serialize, Deserialize, PartialEq)]
pub struct UnsymbolizedReport {
    /// Its path, as its processes map it.
    pub module: String,
    /// Why, and how its frames are shown (one line).
    pub reason: String,
}

impl Report {
    pub fn is_live(&self) -> bool {
        self.mode == "live"
    }
}

/// How the live figures of a report were taken (--live).
#[derive(Clone, Debug, Serialize, Deserialize, PartialEq)]
pub struct LiveSettingsReport {
    /// --min-age: live figures count only blocks at least this old.
    pub min_age_secs: Option<f64>,
    /// --temp-threshold: blocks freed sooner are temporary.
    pub temp_threshold_secs: f64,
    /// The longest time between two polls of the call sites' live
    /// figures. Peaks themselves are exact (`peak_exact`); the sites
    /// holding them are captured when a peak grows and at each poll.
    pub peak_poll_secs: f64,
}

#[derive(Clone, Debug, Serialize, Deserialize, PartialEq)]
pub struct ProcessReport {
    pub pid: u32,
    /// Which image of the pid (memprof's own numbering; not in JSON).
    #[serde(skip)]
    pub generation: u32,
    /// Short process name (comm).
    pub command: String,
    /// Executable path; empty when it could not be read.
    pub exe: String,
    pub cmdline: Vec<String>,
    /// Its cgroup, as /proc/PID/cgroup names it (the unified hierarchy's).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cgroup: Option<String>,
    /// The container it runs in, when its cgroup names one (12 hex digits).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub container: Option<String>,
    /// That container's full id (64 hex digits), as other tools join on it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub container_id: Option<String>,
    /// The Kubernetes pod it runs in, when its cgroup names one: its UID.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub pod_uid: Option<String>,
    /// The process exited before the report.
    pub exited: bool,
    /// `monitor` (not `--exact`): what memprof's probes cost the process
    /// over the last period, estimated, in CPUs (its calls per second
    /// times the cost per call measured at start).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub overhead: Option<f64>,
    /// `monitor` (not `--exact`): the share of the last period its probes
    /// were in (1: all along; less: the budget kept them out the rest,
    /// and its figures are estimates scaled from those windows).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub duty_cycle: Option<f64>,
    /// `monitor`, while its figures are scaled (duty cycle under 1): of
    /// its CPU time in its last window, the share memprof's traps took
    /// (its calls times the cost per call). The scaling takes the traps
    /// out of that CPU time: above ~0.5 what is left, and so the
    /// estimate, leans on the calibrated cost, and comes out low.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub trap_share: Option<f64>,
    /// `monitor`: true when its figures count only part of its life and
    /// could not be scaled to the rest (its probes were out for part of
    /// it, and too little was seen, or nothing to scale by): a floor, not
    /// an estimate of its totals.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub partial: bool,
    /// `monitor`, when its figures are estimates: the most memprof's
    /// probes can have cost it, in CPUs (the share of its time they were
    /// in). Its `overhead` leans on the calibrated cost per call; where
    /// its traps took most of its window (`trap_share` over 0.5) that can
    /// be several times off, and this bound holds regardless.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub overhead_bound: Option<f64>,
    /// `monitor`, when its figures are estimates: the calls the kernel
    /// counted with its probes in, which they are scaled from.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub counted: Option<u64>,
    /// `monitor`: true when the budget could not keep this process under
    /// `--max-overhead` over its last span (its probes in for the
    /// shortest window there is, or their cost only measured).
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub over_budget: bool,
    /// `monitor`, while its figures are scaled: its estimated bytes per
    /// second over its last span (the terminal view's rate; the figures
    /// grow only at span ends). Not in JSON: a counter's rate is the
    /// reader's to take.
    #[serde(skip)]
    pub span_rate: Option<f64>,
    /// Bytes and calls of all its stacks, including those not shown.
    pub bytes: u64,
    pub count: u64,
    /// Distinct stacks (or callers) in all, before --top and --min-bytes.
    pub total_stacks: usize,
    /// With --focus/--ignore: what they hid of this process (not in
    /// `bytes`, `count`, `total_stacks`; the live heap's own figures are
    /// the whole process's).
    #[serde(flatten, default, skip_serializing_if = "Option::is_none")]
    pub hidden: Option<HiddenReport>,
    pub stacks: Vec<StackReport>,
    /// With --interval: totals so far at each report, oldest first.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub series: Vec<SeriesPoint>,
    /// With a timeline (--format timeline/chrome, or --timeline-period):
    /// the process's heap sampled over time.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub timeline: Option<TimelineReport>,
    /// Live mode only: the process's heap.
    #[serde(flatten, default, skip_serializing_if = "Option::is_none")]
    pub live: Option<LiveProcessReport>,
}

/// A process's live heap (--live).
#[derive(Clone, Debug, Serialize, Deserialize, PartialEq)]
pub struct LiveProcessReport {
    /// Bytes and blocks still allocated (at exit, for an exited process),
    /// counting only blocks at least --min-age old when it is given.
    pub live_bytes: u64,
    pub live_count: u64,
    /// Blocks allocated and not tracked (pointer table full, or see `lost`).
    pub untracked_count: u64,
    /// Frees of blocks memprof never saw allocated: allocated before it
    /// attached, or untracked. Counted, not attributed to any stack.
    pub unknown_frees: u64,
    /// Frees the C library made, from its own code, of blocks it took
    /// without going through malloc's entry (glibc's per-thread caches,
    /// handed back at each thread's exit): not the program's, not counted
    /// in `unknown_frees`.
    #[serde(default)]
    pub internal_frees: u64,
    /// The largest live heap (bytes) and the most live blocks at once:
    /// exact when `peak_exact` (the kernel updates them at every
    /// allocation and free), else the largest a poll saw.
    pub peak_live_bytes: u64,
    pub peak_live_count: u64,
    /// When the byte peak was reached, in seconds since profiling started.
    pub peak_secs: f64,
    /// The stacks that held the most at the peak, largest first: from the
    /// capture of the call sites closest to the peak (see
    /// `peak_stacks_bytes`).
    pub peak_stacks: Vec<StackReport>,
    /// True when `peak_live_bytes` and `peak_live_count` are exact.
    #[serde(default)]
    pub peak_exact: bool,
    /// What all call sites held at that capture, and when it was taken:
    /// `peak_stacks_bytes / peak_live_bytes` says how close the
    /// attribution is to the exact peak.
    #[serde(default)]
    pub peak_stacks_bytes: u64,
    #[serde(default)]
    pub peak_stacks_secs: f64,
    /// Direct mappings (allocators "mmap", "mremap", "brk"): the bytes
    /// they hold (part of `live_bytes`), and the most they held at once,
    /// exact, with its time. `peak_live_bytes` counts the allocators'
    /// blocks only.
    #[serde(default)]
    pub mapped_live_bytes: u64,
    #[serde(default)]
    pub mapped_peak_bytes: u64,
    #[serde(default)]
    pub mapped_peak_secs: f64,
}

/// A process's totals at one moment of the profile.
#[derive(Clone, Copy, Debug, Serialize, Deserialize, PartialEq)]
pub struct SeriesPoint {
    /// Seconds since profiling started.
    pub secs: f64,
    /// Bytes allocated so far.
    pub bytes: u64,
    /// Calls so far.
    pub count: u64,
    /// Live mode: bytes still allocated at that moment.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub live_bytes: Option<u64>,
}

/// A process's heap over time, sampled from the kernel's per-call-site
/// counters every --timeline-period (nothing is paid per allocation).
#[derive(Clone, Debug, Serialize, Deserialize, PartialEq)]
pub struct TimelineReport {
    /// The period asked for; `secs` holds when each sample was taken.
    pub period_secs: f64,
    /// "live_bytes" (--live): bytes allocated and not yet freed at each
    /// sample; "allocated_bytes": bytes allocated so far (the rate is the
    /// difference between two samples over their time apart).
    pub metric: String,
    /// Seconds since profiling started, ascending.
    pub secs: Vec<f64>,
    /// The process's figure at each sample (all its stacks).
    pub total: Vec<u64>,
    /// The figures of the first stacks of `stacks` (the largest; at most
    /// [`TIMELINE_STACKS`]). What `total` holds beyond them is the rest.
    pub stacks: Vec<TimelineStack>,
}

impl Report {
    /// `started_at` as a time, if it reads as one.
    pub fn started(&self) -> Option<std::time::SystemTime> {
        humantime::parse_rfc3339(self.started_at.as_deref()?).ok()
    }
}

impl TimelineReport {
    pub fn is_live(&self) -> bool {
        self.metric == "live_bytes"
    }
}

/// Stacks a timeline follows one by one, per process.
pub const TIMELINE_STACKS: usize = 20;

/// One stack's figures in a timeline.
#[derive(Clone, Debug, Serialize, Deserialize, PartialEq)]
pub struct TimelineStack {
    /// Index into the process's `stacks`.
    pub stack: usize,
    /// One per sample, as `total`.
    pub values: Vec<u64>,
}

#[derive(Clone, Debug, Serialize, Deserialize, PartialEq)]
pub struct StackReport {
    /// Allocator function; several joined by "," when --group-by caller
    /// or type merged stacks of different functions.
    pub allocator: String,
    /// Go: the type `runtime.mallocgc` was asked for (a slice's or map's
    /// element type, `[untyped]` for the pointer-free data the runtime
    /// allocates by size, `[type 0xADDR]` where its name was not read).
    /// Absent for other allocators.
    #[serde(rename = "type", default, skip_serializing_if = "Option::is_none")]
    pub go_type: Option<String>,
    pub bytes: u64,
    pub count: u64,
    /// True when only the direct caller was recorded (see `lost`).
    pub partial: bool,
    /// With --sample-bytes: how many sampled calls the estimates rest on.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub samples: Option<u64>,
    /// Innermost first: frames[0] is the allocator's direct caller.
    /// Shared: a frame is one allocation however many stacks hold it.
    /// Saved whole, or as indices into a table (`frame`).
    #[serde(
        serialize_with = "super::frame::serialize",
        deserialize_with = "super::frame::deserialize"
    )]
    pub frames: Vec<Arc<FrameReport>>,
    /// While a report is built: the stack's return addresses, whose frames
    /// are written out only for the stacks shown. Never saved.
    #[serde(skip)]
    pub addresses: Vec<u64>,
    /// While a report is built: the kernel's call sites summed here (the
    /// timeline follows them). Never saved.
    #[serde(skip)]
    pub sites: Vec<memprof_common::sites::AllocKey>,
    /// While a saved report is cut again: this stack's timeline values
    /// (see [`TimelineStack`]). Never saved here.
    #[serde(skip)]
    pub band: Option<Vec<u64>>,
    /// Live mode only: what this stack still holds.
    #[serde(flatten, default, skip_serializing_if = "Option::is_none")]
    pub live: Option<LiveStackReport>,
}

/// What one stack still holds (--live).
#[derive(Clone, Copy, Debug, Default, Serialize, Deserialize, PartialEq)]
pub struct LiveStackReport {
    /// Bytes and blocks allocated here and not freed (at least --min-age
    /// old when given).
    pub live_bytes: u64,
    pub live_count: u64,
    /// Age of the oldest of them, in seconds; null when none is live.
    pub oldest_age_secs: Option<f64>,
    /// Blocks freed within --temp-threshold of their allocation.
    pub temporary_count: u64,
    /// Blocks allocated here that could not be tracked (pointer table full,
    /// or see `lost`).
    pub untracked_count: u64,
}

impl LiveStackReport {
    /// Two stacks' figures as one (merged or grouped stacks).
    pub fn merged(self, other: LiveStackReport) -> LiveStackReport {
        LiveStackReport {
            live_bytes: self.live_bytes + other.live_bytes,
            live_count: self.live_count + other.live_count,
            oldest_age_secs: match (self.oldest_age_secs, other.oldest_age_secs) {
                (Some(a), Some(b)) => Some(a.max(b)),
                (a, b) => a.or(b),
            },
            temporary_count: self.temporary_count + other.temporary_count,
            untracked_count: self.untracked_count + other.untracked_count,
        }
    }
}

impl StackReport {
    /// Adds `other`'s figures to this stack's: two stacks that read as one
    /// (merged, or grouped by caller). A timeline band stays only when
    /// both had one.
    pub fn absorb(&mut self, other: StackReport) {
        self.bytes += other.bytes;
        self.count += other.count;
        self.samples = match (self.samples, other.samples) {
            (None, None) => None,
            (a, b) => Some(a.unwrap_or(0) + b.unwrap_or(0)),
        };
        self.live = match (self.live, other.live) {
            (Some(a), Some(b)) => Some(a.merged(b)),
            (a, b) => a.or(b),
        };
        self.sites.extend(other.sites);
        self.band = match (self.band.take(), other.band) {
            (Some(a), Some(b)) => Some(a.iter().zip(&b).map(|(x, y)| x + y).collect()),
            _ => None,
        };
    }

    /// The bytes a report ranks this stack by: live bytes in live mode.
    /// The allocator, with the Go type it was asked for:
    /// `runtime.makeslice(int)` as `make([]int, n)` calls it.
    pub fn allocated(&self) -> String {
        match &self.go_type {
            Some(go_type) => format!("{}({go_type})", self.allocator),
            None => self.allocator.clone(),
        }
    }

    pub fn rank_bytes(&self) -> u64 {
        self.live.map_or(self.bytes, |live| live.live_bytes)
    }
}
