//! pprof: the gzipped protobuf profile of Go's and jemalloc's heap
//! profiles, read by `go tool pprof`, Pyroscope, Parca and Grafana.
//! Messages follow github.com/google/pprof/proto/profile.proto
//! (`proto`; the tests decode memprof's profiles with them too).
pub mod proto;

use std::{collections::HashMap, io::Write as _, sync::Arc};

use anyhow::Result;
use flate2::{write::GzEncoder, Compression};
use prost::Message as _;

use self::proto::{Function, Label, Line, Location, Mapping, Profile, Sample, ValueType};
use super::{
    model::{FrameReport, StackReport},
    Report,
};

/// Builds the tables of a profile: strings, functions, locations and
/// mappings, each deduplicated, ids from 1.
#[derive(Default)]
struct Builder {
    profile: Profile,
    strings: HashMap<String, i64>,
    functions: HashMap<(String, String), u64>,
    locations: HashMap<(u64, Vec<(u64, i64)>), u64>,
    /// Locations by their first frame's allocation and their length:
    /// stacks built together share their frames, so most are found here
    /// without reading their names again.
    shared_locations: HashMap<(usize, usize), u64>,
    /// By module and load bias (address − file offset): one library
    /// mapped at different addresses in several processes is several
    /// mappings.
    mappings: HashMap<(String, u64), u64>,
}

impl Builder {
    fn string(&mut self, text: &str) -> i64 {
        if let Some(&index) = self.strings.get(text) {
            return index;
        }
        let index = self.profile.string_table.len() as i64;
        self.profile.string_table.push(text.to_string());
        self.strings.insert(text.to_string(), index);
        index
    }

    fn function(&mut self, name: &str, file: &str) -> u64 {
        if let Some(&id) = self.functions.get(&(name.to_string(), file.to_string())) {
            return id;
        }
        let id = self.profile.function.len() as u64 + 1;
        let (name_index, file_index) = (self.string(name), self.string(file));
        self.profile.function.push(Function {
            id,
            name: name_index,
            system_name: name_index,
            filename: file_index,
        });
        self.functions
            .insert((name.to_string(), file.to_string()), id);
        id
    }

    /// The module's mapping, grown to hold `address`. Its file offset
    /// makes `address - memory_start + file_offset` the address's offset
    /// in the file, so a backend can symbolize it from the build id.
    fn mapping(&mut self, frame: &FrameReport, module: &str, address: u64) -> u64 {
        let offset = frame
            .module_offset
            .as_deref()
            .and_then(|o| u64::from_str_radix(o.trim_start_matches("0x"), 16).ok());
        let key = (
            module.to_string(),
            offset.map_or(0, |offset| address.wrapping_sub(offset)),
        );
        if let Some(&id) = self.mappings.get(&key) {
            let mapping = &mut self.profile.mapping[id as usize - 1];
            if address < mapping.memory_start {
                let lower = mapping.memory_start - address;
                mapping.memory_start = address;
                mapping.file_offset = mapping.file_offset.saturating_sub(lower);
            }
            mapping.memory_limit = mapping.memory_limit.max(address + 1);
            // A frame without a name: a backend may symbolize this
            // mapping's addresses itself (pprof skips mappings that say
            // they have functions).
            mapping.has_functions &= frame.function.is_some();
            return id;
        }
        let id = self.profile.mapping.len() as u64 + 1;
        let filename = self.string(module);
        // The report's build id (read while the process ran), else the
        // file's as it is now.
        let build_id = frame
            .build_id
            .clone()
            .or_else(|| {
                module
                    .starts_with('/')
                    .then(|| crate::host::elf::build_id_hex(std::path::Path::new(module)))
                    .flatten()
            })
            .map(|id| self.string(&id))
            .unwrap_or(0);
        self.profile.mapping.push(Mapping {
            id,
            memory_start: address,
            memory_limit: address + 1,
            file_offset: offset.unwrap_or(0),
            filename,
            build_id,
            has_functions: frame.function.is_some(),
            has_filenames: true,
            has_line_numbers: true,
            has_inline_frames: true,
        });
        self.mappings.insert(key, id);
        id
    }

    /// One location per return address: its frames (inlined ones first)
    /// become its lines.
    fn location(&mut self, frames: &[Arc<FrameReport>]) -> u64 {
        let shared = (Arc::as_ptr(&frames[0]) as usize, frames.len());
        if let Some(&id) = self.shared_locations.get(&shared) {
            return id;
        }
        let id = self.new_location(frames);
        self.shared_locations.insert(shared, id);
        id
    }

    fn new_location(&mut self, frames: &[Arc<FrameReport>]) -> u64 {
        let first = &frames[0];
        let address = u64::from_str_radix(first.address.trim_start_matches("0x"), 16).unwrap_or(0);
        let lines: Vec<(u64, i64)> = frames
            .iter()
            .map(|frame| {
                let function = self.function(&frame.label(), frame.file.as_deref().unwrap_or(""));
                (function, frame.line.unwrap_or(0) as i64)
            })
            .collect();
        // Every location has a mapping (pprof consumers fail on one
        // without): code in no file gets the synthetic `[unknown]`.
        let module = first.module.as_deref().unwrap_or(UNKNOWN_MAPPING);
        let mapping_id = self.mapping(first, module, address);
        if let Some(&id) = self.locations.get(&(address, lines.clone())) {
            return id;
        }
        let id = self.profile.location.len() as u64 + 1;
        self.profile.location.push(Location {
            id,
            mapping_id,
            address,
            line: lines
                .iter()
                .map(|&(function_id, line)| Line { function_id, line })
                .collect(),
        });
        self.locations.insert((address, lines), id);
        id
    }
}

/// The mapping of addresses in no file memprof knows (anonymous code: a
/// JIT's, or a module not read).
const UNKNOWN_MAPPING: &str = "[unknown]";

/// Which sample type a viewer shows first.
#[derive(Clone, Copy, PartialEq, Eq)]
pub enum DefaultSample {
    AllocSpace,
    /// Live mode only (else alloc_space).
    InuseSpace,
}

/// The profile, showing in-use space first in live mode (as Go's heap
/// profile), else allocated space.
pub fn render(report: &Report) -> Result<Vec<u8>> {
    let default = match report.is_live() {
        true => DefaultSample::InuseSpace,
        false => DefaultSample::AllocSpace,
    };
    render_with(report, default)
}

/// What was allocated between two reports of one profile, stack by stack
/// (`?seconds=N`): counts and bytes are `now`'s less `before`'s; a live
/// stack's in-use figures are `now`'s (the heap at the end; Go subtracts
/// those too, which can make them negative).
pub fn delta(before: &Report, mut now: Report) -> Report {
    let key = |pid: u32, stack: &StackReport| {
        let addresses: Vec<&str> = stack.frames.iter().map(|f| f.address.as_str()).collect();
        format!("{pid} {} {}", stack.allocated(), addresses.join(" "))
    };
    let earlier: std::collections::HashMap<String, (u64, u64)> = before
        .processes
        .iter()
        .flat_map(|p| {
            p.stacks
                .iter()
                .map(move |s| (key(p.pid, s), (s.bytes, s.count)))
        })
        .collect();
    for process in &mut now.processes {
        for stack in &mut process.stacks {
            let (bytes, count) = earlier
                .get(&key(process.pid, stack))
                .copied()
                .unwrap_or((0, 0));
            stack.bytes = stack.bytes.saturating_sub(bytes);
            stack.count = stack.count.saturating_sub(count);
        }
    }
    // The delta's span begins where `before`'s ended.
    if let Some(end) = before
        .started()
        .and_then(|at| at.checked_add(std::time::Duration::from_secs_f64(before.duration_secs)))
    {
        now.started_at = Some(humantime::format_rfc3339_millis(end).to_string());
    }
    now.duration_secs -= before.duration_secs;
    now
}

pub fn render_with(report: &Report, default: DefaultSample) -> Result<Vec<u8>> {
    let mut builder = Builder::default();
    builder.string("");
    let objects = ValueType {
        r#type: builder.string("alloc_objects"),
        unit: builder.string("count"),
    };
    let space = ValueType {
        r#type: builder.string("alloc_space"),
        unit: builder.string("bytes"),
    };
    builder.profile.sample_type = vec![objects, space.clone()];
    builder.profile.default_sample_type = space.r#type;
    if report.is_live() {
        // As Go's heap profiles: in use is what a heap view shows first.
        let inuse_objects = ValueType {
            r#type: builder.string("inuse_objects"),
            unit: builder.string("count"),
        };
        let inuse_space = ValueType {
            r#type: builder.string("inuse_space"),
            unit: builder.string("bytes"),
        };
        if default == DefaultSample::InuseSpace {
            builder.profile.default_sample_type = inuse_space.r#type;
        }
        builder
            .profile
            .sample_type
            .extend([inuse_objects, inuse_space]);
    }
    builder.profile.period_type = Some(space);
    // Values are estimates already scaled up; the period says how sparse
    // the samples were, as Go's heap profiles do.
    builder.profile.period = report.sample_bytes.unwrap_or(1) as i64;
    builder.profile.duration_nanos = (report.duration_secs * 1e9) as i64;
    builder.profile.time_nanos = report
        .started()
        .and_then(|at| at.duration_since(std::time::UNIX_EPOCH).ok())
        .map_or(0, |since| since.as_nanos() as i64);
    let (pid_key, process_key) = (builder.string("pid"), builder.string("process"));
    for process in &report.processes {
        let process_name = builder.string(&process.command);
        for stack in &process.stacks {
            let location_id = group_by_address(&stack.frames)
                .into_iter()
                .map(|frames| builder.location(frames))
                .collect();
            let mut label = vec![
                Label {
                    key: pid_key,
                    str: 0,
                    num: process.pid as i64,
                },
                Label {
                    key: process_key,
                    str: process_name,
                    num: 0,
                },
            ];
            // Go: the type allocated, for `-tagfocus type=...`.
            if let Some(go_type) = &stack.go_type {
                label.push(Label {
                    key: builder.string("type"),
                    str: builder.string(go_type),
                    num: 0,
                });
            }
            builder.profile.sample.push(Sample {
                location_id,
                value: sample_values(stack),
                label,
            });
        }
    }
    let mut gzip = GzEncoder::new(Vec::new(), Compression::default());
    gzip.write_all(&builder.profile.encode_to_vec())?;
    Ok(gzip.finish()?)
}

/// alloc_objects, alloc_space, and in live mode inuse_objects, inuse_space.
fn sample_values(stack: &StackReport) -> Vec<i64> {
    let mut values = vec![stack.count as i64, stack.bytes as i64];
    if let Some(live) = stack.live {
        values.extend([live.live_count as i64, live.live_bytes as i64]);
    }
    values
}

/// Consecutive frames at one address: a function and those inlined into it.
fn group_by_address(frames: &[Arc<FrameReport>]) -> Vec<&[Arc<FrameReport>]> {
    frames
        .chunk_by(|a, b| a.address == b.address && a.inlined)
        .collect()
}
