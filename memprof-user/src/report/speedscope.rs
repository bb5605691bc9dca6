//! speedscope's file format (https://www.speedscope.app/file-format-schema.json):
//! per process a "sampled" profile weighted by bytes allocated (and, in a
//! live report, one by bytes still live), its frames shared by all.
use std::collections::HashMap;

use anyhow::Result;
use serde_json::{json, Value};

use super::model::Report;

/// What makes two frames one in speedscope: file, module, line, name.
type FrameKey<'a> = (Option<&'a str>, Option<&'a str>, Option<u32>, String);

pub fn render(report: &Report) -> Result<String> {
    let mut frames: Vec<Value> = Vec::new();
    let mut index: HashMap<FrameKey, usize> = HashMap::new();
    let mut profiles = Vec::new();
    for process in &report.processes {
        let mut samples = Vec::with_capacity(process.stacks.len());
        let (mut bytes, mut live) = (Vec::new(), Vec::new());
        for stack in &process.stacks {
            // speedscope's samples go from the root down: outermost first.
            let sample: Vec<usize> = stack
                .frames
                .iter()
                .rev()
                .map(|frame| {
                    let label = frame.label();
                    let key = (
                        frame.file.as_deref(),
                        frame.module.as_deref(),
                        frame.line,
                        label,
                    );
                    *index
                        .entry(key)
                        .or_insert_with_key(|(file, module, line, label)| {
                            let mut entry = json!({"name": label});
                            match file {
                                Some(file) => entry["file"] = json!(file),
                                None => entry["file"] = json!(module),
                            }
                            if let Some(line) = line {
                                entry["line"] = json!(line);
                            }
                            frames.push(entry);
                            frames.len() - 1
                        })
                })
                .collect();
            samples.push(sample);
            bytes.push(stack.bytes);
            live.push(stack.live.map_or(0, |l| l.live_bytes));
        }
        let name = format!("{} (pid {})", process.command, process.pid);
        let estimated = if report.exact { "" } else { ", estimated" };
        let profile = |what: &str, weights: &[u64]| {
            json!({
                "type": "sampled",
                "name": format!("{name}: {what}{estimated}"),
                "unit": "bytes",
                "startValue": 0,
                "endValue": weights.iter().sum::<u64>(),
                "samples": samples,
                "weights": weights,
            })
        };
        profiles.push(profile("bytes allocated", &bytes));
        if report.is_live() {
            profiles.push(profile("bytes live", &live));
        }
    }
    let document = json!({
        "$schema": "https://www.speedscope.app/file-format-schema.json",
        "exporter": format!("memprof {}", env!("CARGO_PKG_VERSION")),
        "name": "memprof",
        "activeProfileIndex": 0,
        "shared": {"frames": frames},
        "profiles": profiles,
    });
    Ok(serde_json::to_string(&document)?)
}
