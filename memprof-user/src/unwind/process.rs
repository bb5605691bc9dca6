//! A process's executable mappings with their tables: the user-space
//! form of the BPF side's per-process mapping table.
use std::{
    path::{Path, PathBuf},
    sync::Arc,
};

use anyhow::{Context as _, Result};

use super::{cache::UnwindCache, table::UnwindTable, walk::Mapping};
use crate::procs::parse_maps_line;

/// An executable, file-backed mapping (a line of /proc/PID/maps).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ExecMapping {
    pub start: u64,
    pub end: u64,
    /// File offset of `start`.
    pub offset: u64,
    pub path: PathBuf,
}

/// The executable, file-backed mappings in /proc/PID/maps text
/// (`[vdso]` and deleted files are left out).
pub fn parse_maps(text: &str) -> Vec<ExecMapping> {
    text.lines()
        .filter(|line| !line.ends_with(" (deleted)"))
        .filter_map(parse_maps_line)
        .filter(|mapping| mapping.path.starts_with('/'))
        .map(|mapping| ExecMapping {
            start: mapping.start,
            end: mapping.end,
            offset: mapping.file_offset,
            path: PathBuf::from(mapping.path),
        })
        .collect()
}

/// One mapping and its file's table.
#[derive(Clone, Debug)]
pub struct MappedTable {
    pub start: u64,
    pub end: u64,
    pub bias: u64,
    pub path: PathBuf,
    pub table: Arc<UnwindTable>,
}

/// The tables of a process's executable mappings, sorted by address.
#[derive(Clone, Debug, Default)]
pub struct ProcessTables {
    pub mappings: Vec<MappedTable>,
    /// Mappings left out (file unreadable, not x86-64 ELF, no matching
    /// segment), with why.
    pub skipped: Vec<(PathBuf, String)>,
}

impl ProcessTables {
    /// The tables for the mappings in `/proc/PID/maps`; files are read by
    /// path through `root` (`/` for memprof's own view, `/proc/PID/root`
    /// for a process in another mount namespace).
    pub fn for_pid(pid: u32, root: &Path, cache: &mut UnwindCache) -> Result<ProcessTables> {
        let text = crate::procs::read_maps_text(pid)
            .with_context(|| format!("reading /proc/{pid}/maps"))?;
        Ok(Self::for_mappings(&parse_maps(&text), root, cache))
    }

    pub fn for_mappings(
        mappings: &[ExecMapping],
        root: &Path,
        cache: &mut UnwindCache,
    ) -> ProcessTables {
        let mut tables = ProcessTables::default();
        for mapping in mappings {
            let path = root.join(mapping.path.strip_prefix("/").unwrap_or(&mapping.path));
            let table = match cache.get_or_compile(&path) {
                Ok(table) => table,
                Err(err) => {
                    tables
                        .skipped
                        .push((mapping.path.clone(), format!("{err:#}")));
                    continue;
                }
            };
            let Some(bias) = table.load_bias(mapping.start, mapping.offset) else {
                tables.skipped.push((
                    mapping.path.clone(),
                    "no executable segment at the mapped offset".to_string(),
                ));
                continue;
            };
            tables.mappings.push(MappedTable {
                start: mapping.start,
                end: mapping.end,
                bias,
                path: mapping.path.clone(),
                table,
            });
        }
        tables.mappings.sort_by_key(|m| m.start);
        tables
    }

    /// The mappings as the walk takes them.
    pub fn walk_mappings(&self) -> Vec<Mapping<'_>> {
        self.mappings
            .iter()
            .map(|m| Mapping {
                start: m.start,
                end: m.end,
                bias: m.bias,
                table: &m.table,
            })
            .collect()
    }
}
