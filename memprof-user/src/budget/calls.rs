//! Each process's calls and their bytes, counted exactly in the kernel
//! (`CALLS`) while the budget is kept: what its traps cost is what the
//! windows' estimates take out of its CPU time, and its totals are
//! estimated from these counts (counts estimated from byte samples were
//! too rough for either: see memprof-ebpf `calls`).
use std::collections::{HashMap, HashSet};

use anyhow::{Context as _, Result};
use aya::{
    maps::{MapData, PerCpuHashMap, PerCpuValues},
    Ebpf,
};
use memprof_common::ProcessCalls;

/// Reads the counts each period, and keeps the map to processes running.
#[derive(Default)]
pub struct CallCounts {
    /// Processes seen ended at the last read: their entries go at this one
    /// (kept one period, so that a process that ended just after its last
    /// calls is still read with them).
    ended: HashSet<u32>,
    /// Their last counts, still given for a few reads after their entries
    /// went: a short process's first sample may be read after that (or
    /// before the notices say which image its pid is at), and without its
    /// count it was estimated from its samples.
    finals: HashMap<u32, (ProcessCalls, u32)>,
}

/// Reads an ended process's last count is given after its entry went.
const FINAL_READS: u32 = 5;

impl CallCounts {
    /// Each process's calls so far, by tgid (those that ended since the
    /// last read included); the entries of processes that had ended by
    /// then go (the map holds `--max-processes`).
    pub fn read(&mut self, ebpf: &mut Ebpf) -> Result<HashMap<u32, ProcessCalls>> {
        let mut map: PerCpuHashMap<&mut MapData, u32, ProcessCalls> =
            PerCpuHashMap::try_from(ebpf.map_mut("CALLS").context("map CALLS")?)?;
        self.finals.retain(|_, (_, left)| {
            *left -= 1;
            *left > 0
        });
        // A pid's entry now, if any, is newer.
        let mut calls: HashMap<u32, ProcessCalls> = self
            .finals
            .iter()
            .map(|(&tgid, &(count, _))| (tgid, count))
            .collect();
        let mut ended = HashSet::new();
        let mut gone = Vec::new();
        for entry in map.iter() {
            let (tgid, per_cpu) = entry.context("reading CALLS")?;
            if crate::procs::process_runs(tgid) {
                calls.insert(tgid, summed(&per_cpu));
            } else if self.ended.contains(&tgid) {
                gone.push(tgid);
                let last = summed(&per_cpu);
                calls.insert(tgid, last);
                self.finals.insert(tgid, (last, FINAL_READS));
            } else {
                calls.insert(tgid, summed(&per_cpu));
                ended.insert(tgid);
            }
        }
        for tgid in gone {
            let _ = map.remove(&tgid);
        }
        self.ended = ended;
        Ok(calls)
    }
}

/// Each process's calls as counted now, between two reads (a report).
pub fn peek(ebpf: &Ebpf) -> Result<HashMap<u32, ProcessCalls>> {
    let map: PerCpuHashMap<&MapData, u32, ProcessCalls> =
        PerCpuHashMap::try_from(ebpf.map("CALLS").context("map CALLS")?)?;
    map.iter()
        .map(|entry| {
            let (tgid, per_cpu) = entry.context("reading CALLS")?;
            Ok((tgid, summed(&per_cpu)))
        })
        .collect()
}

fn summed(per_cpu: &PerCpuValues<ProcessCalls>) -> ProcessCalls {
    per_cpu
        .iter()
        .fold(ProcessCalls::default(), |sum, cpu| ProcessCalls {
            calls: sum.calls.wrapping_add(cpu.calls),
            bytes: sum.bytes.wrapping_add(cpu.bytes),
            traps: sum.traps.wrapping_add(cpu.traps),
        })
}
