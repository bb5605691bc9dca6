//! Each process's calls, counted exactly in the kernel (`CALLS`) while
//! the budget is kept: what its traps cost is what the windows' estimates
//! take out of its CPU time, and a count estimated from byte samples was
//! too rough for that (see memprof-ebpf `calls`).
use std::collections::HashMap;

use anyhow::{Context as _, Result};
use aya::{
    maps::{MapData, PerCpuHashMap},
    Ebpf,
};

/// Each process's calls so far, by tgid; the entries of processes that
/// have ended go (the map holds `--max-processes`).
pub fn read_calls(ebpf: &mut Ebpf) -> Result<HashMap<u32, u64>> {
    let mut map: PerCpuHashMap<&mut MapData, u32, u64> =
        PerCpuHashMap::try_from(ebpf.map_mut("CALLS").context("map CALLS")?)?;
    let mut calls = HashMap::new();
    let mut ended = Vec::new();
    for entry in map.iter() {
        let (tgid, per_cpu) = entry.context("reading CALLS")?;
        match crate::procs::process_runs(tgid) {
            true => {
                calls.insert(tgid, per_cpu.iter().sum());
            }
            false => ended.push(tgid),
        }
    }
    for tgid in ended {
        let _ = map.remove(&tgid);
    }
    Ok(calls)
}
