//! `memprof diff`: what changed between two saved reports, stack by
//! stack. Stacks are matched by their symbolized frames (function,
//! file:line, module), not addresses, so reports of different runs of the
//! same program compare.
use std::{collections::BTreeMap, fmt::Write as _};

use serde::Serialize;

use super::{
    model::{FrameReport, Report},
    text::{human_bytes, thousands},
};

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
    pub frames: Vec<FrameReport>,
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
}

impl Change {
    fn new(base_bytes: u64, new_bytes: u64, base_count: u64, new_count: u64) -> Change {
        Change {
            base_bytes,
            new_bytes,
            bytes_delta: new_bytes as i64 - base_bytes as i64,
            base_count,
            new_count,
            count_delta: new_count as i64 - base_count as i64,
        }
    }
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
    let module = match frame.function {
        Some(_) => None,
        None => frame.module.clone(),
    };
    (
        frame.function.clone(),
        frame.file.clone(),
        frame.line,
        module,
        frame.inlined,
    )
}

pub fn diff(base: &Report, new: &Report, top: usize) -> Diff {
    type StackKey = (String, String, Vec<FrameKey>);
    let mut rows: BTreeMap<StackKey, StackDelta> = BTreeMap::new();
    for (report, is_new) in [(base, false), (new, true)] {
        for process in &report.processes {
            for stack in &process.stacks {
                let key = (
                    process.command.clone(),
                    stack.allocator.clone(),
                    stack.frames.iter().map(frame_key).collect(),
                );
                let row = rows.entry(key).or_insert_with(|| StackDelta {
                    command: process.command.clone(),
                    allocator: stack.allocator.clone(),
                    frames: stack.frames.clone(),
                    change: Change::default(),
                });
                let change = &mut row.change;
                if is_new {
                    change.new_bytes += stack.bytes;
                    change.new_count += stack.count;
                } else {
                    change.base_bytes += stack.bytes;
                    change.base_count += stack.count;
                }
            }
        }
    }
    let mut stacks: Vec<StackDelta> = rows
        .into_values()
        .map(|mut row| {
            let c = &row.change;
            row.change = Change::new(c.base_bytes, c.new_bytes, c.base_count, c.new_count);
            row
        })
        .filter(|row| row.change.bytes_delta != 0 || row.change.count_delta != 0)
        .collect();
    stacks.sort_by(|a, b| {
        b.change
            .bytes_delta
            .cmp(&a.change.bytes_delta)
            .then(b.change.count_delta.cmp(&a.change.count_delta))
    });
    stacks.truncate(top);
    Diff {
        version: 1,
        change: Change::new(base.bytes, new.bytes, base.count, new.count),
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
    for row in &diff.stacks {
        let path: Vec<String> = row.frames.iter().map(FrameReport::label).collect();
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
        let _ = writeln!(
            out,
            "{:>12} {:>16} B {:>12} calls  {:<8} {}{site}  [{}]",
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
