//! A process's executable mappings with their tables: the user-space
//! form of the BPF side's per-process mapping table.
use std::{
    path::{Path, PathBuf},
    sync::Arc,
};

use anyhow::{Context as _, Result};

use super::{cache::UnwindCache, table::UnwindTable, walk::Mapping};
use crate::host::procfs::maps::parse_maps_line;

/// An executable, file-backed mapping (a line of /proc/PID/maps).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ExecMapping {
    pub start: u64,
    pub end: u64,
    /// File offset of `start`.
    pub offset: u64,
    pub path: PathBuf,
    /// The kernel marks the file deleted: `path` names another file now
    /// (see `procs::mapped_file`).
    pub deleted: bool,
}

impl ExecMapping {
    /// The mapped file, as memprof opens it, in process `pid` seen
    /// through `proc_dir` (/proc/PID, or a live thread's
    /// /proc/PID/task/TID): through its root (a container's own; the cache
    /// tells files apart), or, deleted, as mapped.
    fn file(&self, pid: u32, proc_dir: &Path) -> PathBuf {
        // /proc/TID has the map_files a task directory lacks.
        let task = proc_dir
            .file_name()
            .and_then(|name| name.to_str()?.parse().ok())
            .unwrap_or(pid);
        match self.deleted {
            true => crate::host::procfs::maps::map_files_path(task, self.start, self.end),
            false => proc_dir
                .join("root")
                .join(self.path.strip_prefix("/").unwrap_or(&self.path)),
        }
    }
}

/// The executable, file-backed mappings in /proc/PID/maps text (`[vdso]`
/// left out).
pub fn parse_maps(text: &str) -> Vec<ExecMapping> {
    text.lines()
        .filter_map(parse_maps_line)
        .filter(|mapping| mapping.path.starts_with('/'))
        .map(|mapping| ExecMapping {
            start: mapping.start,
            end: mapping.end,
            offset: mapping.file_offset,
            path: PathBuf::from(mapping.path),
            deleted: mapping.deleted,
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
    /// The tables for the mappings in `/proc/PID/maps`. Once the main
    /// thread has ended (pthread_exit) the maps and the files are read
    /// through a thread that runs on: the process's own root went with
    /// the main thread, and every file would be left out.
    pub fn for_pid(pid: u32, cache: &mut UnwindCache) -> Result<ProcessTables> {
        let (text, proc_dir) = crate::host::procfs::maps::read_maps_through_a_thread(pid)
            .with_context(|| format!("reading /proc/{pid}/maps"))?;
        Ok(Self::for_mappings_in(
            &parse_maps(&text),
            pid,
            &proc_dir,
            cache,
        ))
    }

    /// The tables for `mappings` of process `pid`, their files read as
    /// it sees them (through its root: a container's own; deleted ones
    /// through map_files).
    pub fn for_mappings(
        mappings: &[ExecMapping],
        pid: u32,
        cache: &mut UnwindCache,
    ) -> ProcessTables {
        let proc_dir = PathBuf::from(format!("/proc/{pid}"));
        Self::for_mappings_in(mappings, pid, &proc_dir, cache)
    }

    /// `for_mappings`, the files opened through `proc_dir`.
    fn for_mappings_in(
        mappings: &[ExecMapping],
        pid: u32,
        proc_dir: &Path,
        cache: &mut UnwindCache,
    ) -> ProcessTables {
        let mut tables = ProcessTables::default();
        for mapping in mappings {
            let table = match cache.get_or_compile(&mapping.file(pid, proc_dir)) {
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
