//! `--unwind dwarf`: puts the tables in the kernel. Each file's rows are
//! appended once to `UNWIND_ROWS` (a bump allocator over a BPF array),
//! and each process's executable mappings, with where their rows are,
//! go to `UNWIND_MAPS` under its tgid, refreshed on every notice that
//! its mappings changed (first seen, exec, libraries loaded).
use std::{
    collections::HashMap,
    os::fd::{AsFd as _, AsRawFd as _, BorrowedFd, OwnedFd},
    sync::Arc,
};

use anyhow::{bail, Context as _, Result};
use aya::{
    maps::{HashMap as BpfHashMap, MapData, PerCpuArray, PerCpuValues},
    Ebpf,
};
use memprof_common::{
    lost::LostCause,
    unwind::{MappingEntry, ProcMappings, Row, MAX_MAPPINGS, PAGE_INDEX},
};

use super::{cache::UnwindCache, process::ProcessTables, table::UnwindTable};
use crate::probes::{
    bpf_call::{bpf, BatchAttr},
    own_handle,
};

/// Bytes of compiled tables kept in user space besides the kernel's copy.
const CACHE_BYTES: usize = 64 << 20;
/// The largest file table loaded (the BPF binary search takes 24 steps).
const MAX_FILE_ROWS: usize = (1 << 24) - 1;

pub struct KernelTables {
    /// `UNWIND_ROWS`, written in batches (aya has no batch write).
    rows_fd: OwnedFd,
    maps: BpfHashMap<MapData, u32, ProcMappings>,
    lost: PerCpuArray<MapData, u64>,
    capacity: u32,
    next_row: u32,
    cache: UnwindCache,
    /// Where each loaded table's rows are (the table is kept alive, so its
    /// address names it).
    loaded: HashMap<*const UnwindTable, (Arc<UnwindTable>, u32, u32)>,
    /// Files whose tables did not fit, and mappings beyond a process's
    /// `MAX_MAPPINGS` (lost "unwind_table_full").
    table_full: u64,
    /// The mappings left out of each process's list, as counted so far.
    left_out: HashMap<u32, u64>,
}

// SAFETY: the raw pointers are only keys, never dereferenced.
unsafe impl Send for KernelTables {}

impl KernelTables {
    pub fn open(ebpf: &Ebpf) -> Result<KernelTables> {
        let (rows_fd, capacity) = match ebpf.map("UNWIND_ROWS") {
            Some(aya::maps::Map::Array(data)) => (
                data.fd().as_fd().try_clone_to_owned()?,
                data.info()?.max_entries(),
            ),
            _ => bail!("map UNWIND_ROWS missing or not an array"),
        };
        let maps = BpfHashMap::try_from(own_handle(ebpf, "UNWIND_MAPS")?)?;
        let lost = PerCpuArray::try_from(own_handle(ebpf, "LOST")?)?;
        Ok(KernelTables {
            rows_fd,
            maps,
            lost,
            capacity,
            next_row: 0,
            cache: UnwindCache::new(CACHE_BYTES),
            loaded: HashMap::new(),
            table_full: 0,
            left_out: HashMap::new(),
        })
    }

    /// Reads the process's executable mappings and gives the kernel their
    /// tables. Best effort: a process that exited is left out.
    pub fn refresh(&mut self, pid: u32) -> Result<()> {
        let started = std::time::Instant::now();
        let rows_before = self.next_row;
        let tables = ProcessTables::for_pid(pid, &mut self.cache)?;
        let mut entries = [MappingEntry::default(); MAX_MAPPINGS];
        let mut len = 0;
        let full_before = self.table_full;
        let mut left_out: u64 = 0;
        for mapping in &tables.mappings {
            if len == MAX_MAPPINGS {
                left_out += 1;
                continue;
            }
            let Some((first_row, rows)) = self.rows_of(&mapping.table)? else {
                continue;
            };
            entries[len] = MappingEntry {
                start: mapping.start,
                end: mapping.end,
                bias_plus_base: mapping.bias.wrapping_add(mapping.table.base),
                first_row,
                rows,
            };
            len += 1;
        }
        if left_out > 0 {
            // Each refresh sees them again: counted once each.
            let counted = self.left_out.entry(pid).or_default();
            self.table_full += left_out.saturating_sub(*counted);
            *counted = (*counted).max(left_out);
        }
        let value = ProcMappings {
            len: len as u32,
            reserved: 0,
            entries,
        };
        self.maps
            .insert(pid, value, 0)
            .context("writing map UNWIND_MAPS")?;
        if self.table_full != full_before {
            self.publish_lost()?;
        }
        if std::env::var_os("MEMPROF_LOAD_TIMES").is_some() {
            eprintln!(
                "memprof: unwind tables of pid {pid}: {len} mappings, new_rows={} unwind_ms={:.3}",
                self.next_row - rows_before,
                started.elapsed().as_secs_f64() * 1e3
            );
        }
        Ok(())
    }

    /// The process exited: its mappings leave the kernel (the rows stay:
    /// other processes map the same files).
    pub fn forget(&mut self, pid: u32) {
        let _ = self.maps.remove(&pid);
        self.left_out.remove(&pid);
    }

    /// Where the table's rows are in `UNWIND_ROWS`, appended with their
    /// page index if new; `None` when they do not fit or there are none.
    fn rows_of(&mut self, table: &Arc<UnwindTable>) -> Result<Option<(u32, u32)>> {
        if let Some((_, first, rows)) = self.loaded.get(&Arc::as_ptr(table)) {
            return Ok(Some((*first, *rows)));
        }
        let count = table.rows.len();
        if count == 0 {
            // No CFI at all (libicudata: data with a few bytes of crt
            // stubs in an executable segment): nothing to load, nothing
            // lost; a frame there would be `unwind_no_info`.
            return Ok(None);
        }
        let room = u64::from(self.capacity - self.next_row);
        if count > MAX_FILE_ROWS || count as u64 > room {
            self.table_full += 1;
            return Ok(None);
        }
        let mut index = page_index(&table.rows);
        if (count + index.len()) as u64 > room {
            // The rows fit, their index not: searched whole (the next
            // row is no index header).
            index.clear();
        }
        let first = self.next_row;
        write_rows(self.rows_fd.as_fd(), first, &table.rows)?;
        write_rows(self.rows_fd.as_fd(), first + count as u32, &index)?;
        self.next_row += (count + index.len()) as u32;
        self.loaded
            .insert(Arc::as_ptr(table), (table.clone(), first, count as u32));
        Ok(Some((first, count as u32)))
    }

    /// The kernel never counts `unwind_table_full`: its slot of `LOST`
    /// holds user space's count (on one CPU).
    fn publish_lost(&mut self) -> Result<()> {
        let cpus = aya::util::nr_cpus().map_err(|(_, e)| e)?;
        let mut values = vec![0u64; cpus];
        values[0] = self.table_full;
        self.lost
            .set(
                LostCause::UnwindTableFull as u32,
                PerCpuValues::try_from(values)?,
                0,
            )
            .context("writing map LOST")?;
        Ok(())
    }
}

/// The page index written after a file's rows (memprof-common's
/// `PAGE_INDEX`): pages of 1 KiB (compiled code has a row every ~50
/// bytes), larger where rows are sparse so that the index never has more
/// entries than the file has rows (or 64).
fn page_index(rows: &[Row]) -> Vec<Row> {
    let last = rows.last().map_or(0, |row| u64::from(row.pc));
    let mut shift = 10;
    while (last >> shift) as usize + 1 > rows.len().max(64) {
        shift += 1;
    }
    let pages = (last >> shift) as usize + 1;
    let mut index = Vec::with_capacity(pages + 1);
    index.push(Row {
        pc: pages as u32,
        aux: shift as i8,
        kind: PAGE_INDEX,
        ..Row::default()
    });
    let mut below = 0;
    for page in 0..pages as u64 {
        let start = page << shift;
        while below < rows.len() && u64::from(rows[below].pc) < start {
            below += 1;
        }
        index.push(Row {
            pc: below as u32,
            ..Row::default()
        });
    }
    index
}

const BPF_MAP_UPDATE_BATCH: libc::c_long = 26;

/// Writes `rows` to the array map `fd` from index `first` on, 64K rows per
/// `BPF_MAP_UPDATE_BATCH` call: a call per row (aya's `Array::set`) took
/// 31 ms for libc's 31,000 rows, while the process waits under `trace`.
fn write_rows(fd: BorrowedFd, first: u32, rows: &[Row]) -> Result<()> {
    const CHUNK: usize = 1 << 16;
    for (index, chunk) in rows.chunks(CHUNK).enumerate() {
        let start = first + (index * CHUNK) as u32;
        let keys: Vec<u32> = (start..start + chunk.len() as u32).collect();
        let mut attr = BatchAttr {
            keys: keys.as_ptr() as u64,
            values: chunk.as_ptr() as u64,
            count: chunk.len() as u32,
            map_fd: fd.as_raw_fd() as u32,
            ..BatchAttr::default()
        };
        // `attr` points at `keys` and `chunk`, both alive and `count`
        // long; the kernel only reads them (and writes `count`).
        bpf(BPF_MAP_UPDATE_BATCH, &mut attr)
            .context("writing map UNWIND_ROWS (BPF_MAP_UPDATE_BATCH)")?;
        if attr.count as usize != chunk.len() {
            bail!(
                "writing map UNWIND_ROWS: {} of {} rows written",
                attr.count,
                chunk.len()
            );
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The BPF walk's search (memprof-ebpf's `page_rows` and the search
    /// within the page) over `rows` followed by their index: how many rows
    /// start at or below `relative`.
    fn rows_at_or_below(table: &[Row], rows: usize, relative: u32) -> usize {
        let header = table[rows];
        assert_eq!(header.kind, PAGE_INDEX);
        let pages = header.pc as usize;
        let page = ((relative >> header.aux) as usize).min(pages - 1);
        let start = table[rows + 1 + page].pc as usize;
        let end = match page + 1 < pages {
            true => table[rows + 2 + page].pc as usize,
            false => rows,
        };
        start + table[start..end].partition_point(|row| row.pc <= relative)
    }

    fn row_at(pc: u32) -> Row {
        Row {
            pc,
            ..Row::default()
        }
    }

    #[test]
    fn the_page_index_finds_the_row_a_search_of_all_rows_finds() {
        // Dense code (a row every 0-200 bytes, gaps of pages with no row),
        // sparse code (a page size larger than 1 KiB), and a lone row.
        let mut dense = Vec::new();
        let mut pc = 16u32;
        for i in 0..20_000u32 {
            dense.push(row_at(pc));
            pc += (i * 7919) % 200 + if i % 997 == 0 { 5000 } else { 0 };
        }
        let sparse: Vec<Row> = (0..100u32).map(|i| row_at(i * 1_000_000)).collect();
        for rows in [dense, sparse, vec![row_at(0x40)]] {
            let index = page_index(&rows);
            let mut table = rows.clone();
            table.extend_from_slice(&index);
            assert!(index.len() <= rows.len().max(64) + 1, "{}", index.len());
            let last = rows.last().unwrap().pc;
            let probes = (0..last + 3000)
                .step_by((last as usize / 200_000).max(7))
                .chain([0, 1, last, last + 1, u32::MAX]);
            for relative in probes {
                assert_eq!(
                    rows_at_or_below(&table, rows.len(), relative),
                    rows.partition_point(|row| row.pc <= relative),
                    "at {relative:#x}"
                );
            }
        }
    }
}
