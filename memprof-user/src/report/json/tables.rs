//! Version 2's shared tables: each module, source file, function and
//! frame of a report listed once, stacks holding indices into them (a
//! frame of a large profile is written once, not once per stack that
//! holds it: ~380 bytes saved each time).
use std::{collections::HashMap, sync::Arc};

use anyhow::{bail, Result};
use serde::{Deserialize, Serialize};

use crate::report::{
    frame::{FrameIndices, FrameReport},
    Report,
};

#[derive(Debug, Default, Serialize, Deserialize, PartialEq)]
pub struct Tables {
    pub modules: Vec<ModuleEntry>,
    pub files: Vec<String>,
    pub functions: Vec<FunctionEntry>,
    /// One per distinct frame (an inlined call is a frame of its own, at
    /// the address of the frame it was inlined into).
    pub locations: Vec<LocationEntry>,
}

#[derive(Clone, Debug, Default, Serialize, Deserialize, PartialEq, Eq, Hash)]
pub struct ModuleEntry {
    pub path: Option<String>,
    pub build_id: Option<String>,
}

#[derive(Clone, Debug, Default, Serialize, Deserialize, PartialEq, Eq, Hash)]
pub struct FunctionEntry {
    pub name: Option<String>,
    /// Index into `files`.
    pub file: Option<u32>,
}

#[derive(Clone, Debug, Default, Serialize, Deserialize, PartialEq)]
pub struct LocationEntry {
    pub address: String,
    /// Index into `modules`.
    pub module: Option<u32>,
    pub module_offset: Option<String>,
    /// Index into `functions`.
    pub function: Option<u32>,
    pub line: Option<u32>,
    pub inlined: bool,
}

/// Gives each distinct value the next index, once.
struct Interner<T: std::hash::Hash + Eq + Clone> {
    index: HashMap<T, u32>,
    values: Vec<T>,
}

impl<T: std::hash::Hash + Eq + Clone> Interner<T> {
    fn new() -> Self {
        Interner {
            index: HashMap::new(),
            values: Vec::new(),
        }
    }

    fn of(&mut self, value: T) -> u32 {
        if let Some(&at) = self.index.get(&value) {
            return at;
        }
        let at = self.values.len() as u32;
        self.values.push(value.clone());
        self.index.insert(value, at);
        at
    }
}

impl Tables {
    /// The tables of every frame `report`'s stacks hold (peak stacks
    /// too), and each frame's index by where it lies. Frames equal in
    /// value share an entry.
    pub fn of(report: &Report) -> (Tables, FrameIndices) {
        let mut by_place = FrameIndices::new();
        let mut by_value: HashMap<&FrameReport, u32> = HashMap::new();
        let mut modules = Interner::new();
        let mut files = Interner::new();
        let mut functions = Interner::new();
        let mut locations = Vec::new();
        let stacks = report.processes.iter().flat_map(|process| {
            let peak = process.live.iter().flat_map(|live| &live.peak_stacks);
            process.stacks.iter().chain(peak)
        });
        for frame in stacks.flat_map(|stack| &stack.frames) {
            let place = Arc::as_ptr(frame);
            if by_place.contains_key(&place) {
                continue;
            }
            let index = *by_value.entry(&**frame).or_insert_with(|| {
                let module = (frame.module.is_some() || frame.build_id.is_some()).then(|| {
                    modules.of(ModuleEntry {
                        path: frame.module.clone(),
                        build_id: frame.build_id.clone(),
                    })
                });
                let file = frame.file.clone().map(|file| files.of(file));
                let function = (frame.function.is_some() || file.is_some()).then(|| {
                    functions.of(FunctionEntry {
                        name: frame.function.clone(),
                        file,
                    })
                });
                locations.push(LocationEntry {
                    address: frame.address.clone(),
                    module,
                    module_offset: frame.module_offset.clone(),
                    function,
                    line: frame.line,
                    inlined: frame.inlined,
                });
                (locations.len() - 1) as u32
            });
            by_place.insert(place, index);
        }
        let tables = Tables {
            modules: modules.values,
            files: files.values,
            functions: functions.values,
            locations,
        };
        (tables, by_place)
    }

    /// The frames the locations describe, in order; an index that points
    /// nowhere (a file edited or made by another tool) is an error.
    pub fn frames(&self) -> Result<Vec<Arc<FrameReport>>> {
        let at = |table: &str, index: u32, len: usize| -> Result<usize> {
            match (index as usize) < len {
                true => Ok(index as usize),
                false => bail!("{table} index {index} is past the table's {len} entries"),
            }
        };
        let mut frames = Vec::with_capacity(self.locations.len());
        for location in &self.locations {
            let module = match location.module {
                Some(i) => Some(&self.modules[at("module", i, self.modules.len())?]),
                None => None,
            };
            let function = match location.function {
                Some(i) => Some(&self.functions[at("function", i, self.functions.len())?]),
                None => None,
            };
            let file = match function.and_then(|f| f.file) {
                Some(i) => Some(self.files[at("file", i, self.files.len())?].clone()),
                None => None,
            };
            frames.push(Arc::new(FrameReport {
                address: location.address.clone(),
                function: function.and_then(|f| f.name.clone()),
                file,
                line: location.line,
                module: module.and_then(|m| m.path.clone()),
                inlined: location.inlined,
                module_offset: location.module_offset.clone(),
                build_id: module.and_then(|m| m.build_id.clone()),
            }));
        }
        Ok(frames)
    }
}
