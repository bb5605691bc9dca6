//! `memprof diff`: what changed between two saved reports, stack by
//! stack. Stacks are matched by their symbolized frames (function,
//! file:line, module), not addresses, so reports of different runs of the
//! same program compare.
use std::{collections::BTreeMap, fmt::Write as _};

use serde::Serialize;

use super::model::{FrameReport, Report};
use crate::human::numbers::{human_bytes, thousands};

#[derive(Debug, Serialize)]
pub struct Diff {
    pub version: u32,
    /// The reports' totals.
    #[serde(flatten)]
    pub change: Change,
    /// Largest growth first.
    pub stacks: Vec<StackDelta>,
}

#[derive(Debug, Serialize)]
pub struct StackDelta {
    pub command: String,
    pub allocator: String,
    pub frames: Vec<std::sync::Arc<FrameReport>>,
    #[serde(flatten)]
    pub change: Change,
}

/// Bytes and calls in the base and the new report, and the differences.
#[derive(Debug, Default, Serialize)]
pub struct Change {
    pub base_bytes: u64,
    pub new_bytes: u64,
    pub bytes_delta: i64,
    pub base_count: u64,
    pub new_count: u64,
    pub count_delta: i64,
    /// When both reports are live (--live): bytes still allocated.
    #[serde(flatten, skip_serializing_if = "Option::is_none")]
    pub live: Option<LiveChange>,
}

#[derive(Debug, Default, Clone, Copy, Serialize)]
pub struct LiveChange {
    pub base_live_bytes: u64,
    pub new_live_bytes: u64,
    pub live_bytes_delta: i64,
}

impl Change {
    fn new(base_bytes: u64, new_bytes: u64, base_count: u64, new_count: u64) -> Change {
        Change {
            base_bytes,
            new_bytes,
            bytes_delta: delta(base_bytes, new_bytes),
            base_count,
            new_count,
            count_delta: delta(base_count, new_count),
            live: None,
        }
    }

    fn with_live(mut self, live: Option<(u64, u64)>) -> Change {
        self.live = live.map(|(base, new)| LiveChange {
            base_live_bytes: base,
            new_live_bytes: new,
            live_bytes_delta: delta(base, new),
        });
        self
    }

    fn live_delta(&self) -> i64 {
        self.live.map_or(0, |live| live.live_bytes_delta)
    }
}

/// `new - base`, held within i64 (a saved report may hold any u64).
fn delta(base: u64, new: u64) -> i64 {
    (i128::from(new) - i128::from(base)).clamp(i64::MIN.into(), i64::MAX.into()) as i64
}

/// Bytes still allocated in all processes of a live report.
fn live_bytes(report: &Report) -> u64 {
    report
        .processes
        .iter()
        .filter_map(|p| p.live.as_ref())
        .fold(0, |sum, live| sum.saturating_add(live.live_bytes))
}

/// What a frame is across runs: addresses move (ASLR), names do not; a
/// named frame is its function and file:line, wherever its library lies.
type FrameKey = (
    Option<String>,
    Option<String>,
    Option<u32>,
    Option<String>,
    bool,
);

fn frame_key(frame: &FrameReport) -> FrameKey {
    // An unnamed frame is its file's name and its offset in it (a build
    // id may be known in one report and not in the other).
    let module = match (&frame.function, &frame.module) {
        (Some(_), _) => None,
        (None, Some(module)) => Some(format!(
            "{}+{}",
            module.rsplit('/').next().unwrap_or(module),
            frame.module_offset.as_deref().unwrap_or(&frame.address)
        )),
        (None, None) => None,
    };
    (
        frame.function.clone(),
        frame.file.clone(),
        frame.line,
        module,
        frame.inlined,
    )
}

/// Both reports live: leaks are compared too, and growth of what is still
/// allocated comes first.
/// Why two reports cannot be compared stack by stack, if they cannot:
/// exact counts against estimates, or stacks against callers, would show
/// the same code as growing and shrinking at once.
pub fn incomparable(base: &Report, new: &Report) -> Option<String> {
    let kind = |report: &Report| match report.sample_bytes {
        Some(bytes) => format!("sampled (--sample-bytes {bytes})"),
        None => "exact".to_string(),
    };
    if base.exact != new.exact {
        return Some(format!(
            "the base report is {} and the new one {}: profile both the same way",
            kind(base),
            kind(new)
        ));
    }
    if base.group_by != new.group_by {
        return Some(format!(
            "the base report is grouped by {} and the new one by {}: \
             render both with the same --group-by (memprof report FILE --group-by caller --format json)",
            // As saved: any text, kept to one line.
            base.group_by.escape_debug(),
            new.group_by.escape_debug()
        ));
    }
    None
}

pub fn diff(base: &Report, new: &Report, top: usize) -> Diff {
    type StackKey = (String, String, Vec<FrameKey>);
    let live = base.is_live() && new.is_live();
    let mut live_sums: BTreeMap<StackKey, (u64, u64)> = BTreeMap::new();
    let mut rows: BTreeMap<StackKey, StackDelta> = BTreeMap::new();
    for (report, is_new) in [(base, false), (new, true)] {
        for process in &report.processes {
            for stack in &process.stacks {
                let key = (
                    process.command.clone(),
                    stack.allocated(),
                    stack.frames.iter().map(|f| frame_key(f)).collect(),
                );
                let held = stack.live.map_or(0, |l| l.live_bytes);
                let sums = live_sums.entry(key.clone()).or_default();
                if is_new {
                    sums.1 = sums.1.saturating_add(held);
                } else {
                    sums.0 = sums.0.saturating_add(held);
                }
                let row = rows.entry(key).or_insert_with(|| StackDelta {
                    command: process.command.clone(),
                    allocator: stack.allocated(),
                    frames: stack.frames.clone(),
                    change: Change::default(),
                });
                let change = &mut row.change;
                if is_new {
                    change.new_bytes = change.new_bytes.saturating_add(stack.bytes);
                    change.new_count = change.new_count.saturating_add(stack.count);
                } else {
                    change.base_bytes = change.base_bytes.saturating_add(stack.bytes);
                    change.base_count = change.base_count.saturating_add(stack.count);
                }
            }
        }
    }
    let mut stacks: Vec<StackDelta> = rows
        .into_iter()
        .map(|(key, mut row)| {
            let c = &row.change;
            row.change = Change::new(c.base_bytes, c.new_bytes, c.base_count, c.new_count)
                .with_live(live.then(|| live_sums[&key]));
            row
        })
        .filter(|row| {
            row.change.bytes_delta != 0
                || row.change.count_delta != 0
                || row.change.live_delta() != 0
        })
        .collect();
    stacks.sort_by(|a, b| {
        b.change
            .live_delta()
            .cmp(&a.change.live_delta())
            .then(b.change.bytes_delta.cmp(&a.change.bytes_delta))
            .then(b.change.count_delta.cmp(&a.change.count_delta))
    });
    stacks.truncate(top);
    Diff {
        version: 1,
        change: Change::new(base.bytes, new.bytes, base.count, new.count)
            .with_live(live.then(|| (live_bytes(base), live_bytes(new)))),
        stacks,
    }
}

fn signed_bytes(delta: i64) -> String {
    let sign = if delta < 0 { "-" } else { "+" };
    format!("{sign}{}", human_bytes(delta.unsigned_abs()))
}

fn signed(delta: i64) -> String {
    let sign = if delta < 0 { "-" } else { "+" };
    format!("{sign}{}", thousands(delta.unsigned_abs()))
}

pub fn render_text(diff: &Diff) -> String {
    let mut out = String::new();
    let _ = writeln!(
        out,
        "memprof diff: {} ({} B) in {} allocations; base {} in {}, new {} in {}",
        signed_bytes(diff.change.bytes_delta),
        signed(diff.change.bytes_delta),
        signed(diff.change.count_delta),
        human_bytes(diff.change.base_bytes),
        thousands(diff.change.base_count),
        human_bytes(diff.change.new_bytes),
        thousands(diff.change.new_count),
    );
    if let Some(live) = diff.change.live {
        let _ = writeln!(
            out,
            "still allocated: {} (base {}, new {})",
            signed_bytes(live.live_bytes_delta),
            human_bytes(live.base_live_bytes),
            human_bytes(live.new_live_bytes),
        );
    }
    for row in &diff.stacks {
        let path: Vec<String> = row.frames.iter().map(|f| f.label()).collect();
        let site = row
            .frames
            .first()
            .and_then(|f| {
                Some(format!(
                    " {}:{}",
                    f.file.as_deref()?.rsplit('/').next()?,
                    f.line?
                ))
            })
            .unwrap_or_default();
        let held = row.change.live.map_or(String::new(), |l| {
            format!("{:>12} live ", signed_bytes(l.live_bytes_delta))
        });
        let _ = writeln!(
            out,
            "{held}{:>12} {:>16} B {:>12} calls  {:<8} {}{site}  [{}]",
            signed_bytes(row.change.bytes_delta),
            signed(row.change.bytes_delta),
            signed(row.change.count_delta),
            row.allocator,
            path.join(" <- "),
            row.command,
        );
    }
    out
}

pub fn render_json(diff: &Diff) -> anyhow::Result<String> {
    let mut text = serde_json::to_string_pretty(diff)?;
    text.push('\n');
    Ok(text)
}
