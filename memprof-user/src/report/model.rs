//! The report as data; its JSON form is a contract (docs/json-schema.md):
//! add fields, rename none.
use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};

pub const REPORT_VERSION: u32 = 1;

#[derive(Clone, Debug, Serialize, Deserialize, PartialEq)]
pub struct Report {
    pub version: u32,
    /// "alloc": totals of what each call site allocated.
    pub mode: String,
    pub duration_secs: f64,
    /// True when every number is an exact count (no sampling).
    pub exact: bool,
    /// "stack" or "caller".
    pub group_by: String,
    /// Sum over all processes.
    pub bytes: u64,
    pub count: u64,
    pub processes: Vec<ProcessReport>,
    /// Events not recorded in full, by cause (all causes, zeros included).
    pub lost: BTreeMap<String, u64>,
}

#[derive(Clone, Debug, Serialize, Deserialize, PartialEq)]
pub struct ProcessReport {
    pub pid: u32,
    /// Short process name (comm).
    pub command: String,
    /// Executable path; empty when it could not be read.
    pub exe: String,
    pub cmdline: Vec<String>,
    /// The process exited before the report.
    pub exited: bool,
    /// Bytes and calls of all its stacks, including those not shown.
    pub bytes: u64,
    pub count: u64,
    /// Distinct stacks (or callers) in all, before --top and --min-bytes.
    pub total_stacks: usize,
    pub stacks: Vec<StackReport>,
    /// With --interval: totals so far at each report, oldest first.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub series: Vec<SeriesPoint>,
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
}

#[derive(Clone, Debug, Serialize, Deserialize, PartialEq)]
pub struct StackReport {
    /// Allocator function; several joined by "," when --group-by caller
    /// merged stacks of different functions.
    pub allocator: String,
    pub bytes: u64,
    pub count: u64,
    /// True when only the direct caller was recorded (see `lost`).
    pub partial: bool,
    /// Innermost first: frames[0] is the allocator's direct caller.
    pub frames: Vec<FrameReport>,
}

#[derive(Clone, Debug, Serialize, Deserialize, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct FrameReport {
    /// Return address, "0x…".
    pub address: String,
    pub function: Option<String>,
    pub file: Option<String>,
    pub line: Option<u32>,
    pub module: Option<String>,
    /// Inlined into the frame that follows it.
    pub inlined: bool,
}

impl FrameReport {
    /// A short name for the frame: its function, else its module, else
    /// its address.
    pub fn label(&self) -> String {
        match (&self.function, &self.module) {
            (Some(function), _) => function.clone(),
            (None, Some(module)) => format!("[{}]", module.rsplit('/').next().unwrap_or(module)),
            (None, None) => format!("[{}]", self.address),
        }
    }
}
