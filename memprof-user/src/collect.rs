//! Reading the kernel's maps: per-call-site totals, stacks, lost events.
use std::collections::HashMap;

use anyhow::{Context as _, Result};
use aya::{
    maps::{HashMap as BpfHashMap, MapData, PerCpuArray, PerCpuHashMap},
    Ebpf,
};
use memprof_common::{AllocKey, AllocStats, LostCause, StackFrames, NO_STACK};

/// Everything the kernel counted so far.
#[derive(Debug, Default)]
pub struct Snapshot {
    /// Totals per key, summed over CPUs.
    pub sites: Vec<(AllocKey, AllocStats)>,
    /// Stack frames beyond the caller (return addresses, innermost
    /// first) by stack key.
    pub stacks: HashMap<u64, Vec<u64>>,
    /// Lost events per cause, in [`LostCause::ALL`] order.
    pub lost: [u64; LostCause::COUNT as usize],
}

pub fn snapshot(ebpf: &Ebpf) -> Result<Snapshot> {
    let counts: PerCpuHashMap<&MapData, AllocKey, AllocStats> =
        PerCpuHashMap::try_from(ebpf.map("COUNTS").context("map COUNTS")?)?;
    let stack_map: BpfHashMap<&MapData, u64, StackFrames> =
        BpfHashMap::try_from(ebpf.map("STACKS").context("map STACKS")?)?;
    let lost_map: PerCpuArray<&MapData, u64> =
        PerCpuArray::try_from(ebpf.map("LOST").context("map LOST")?)?;

    let mut snapshot = Snapshot::default();
    for entry in counts.iter() {
        let (key, per_cpu) = entry.context("reading COUNTS")?;
        let total = per_cpu
            .iter()
            .fold(AllocStats::default(), |sum, v| AllocStats {
                bytes: sum.bytes + v.bytes,
                count: sum.count + v.count,
            });
        snapshot.sites.push((key, total));
    }
    for (key, _) in &snapshot.sites {
        if key.stack == NO_STACK || snapshot.stacks.contains_key(&key.stack) {
            continue;
        }
        // Stacks are never removed, so a lookup cannot miss; if it did, the
        // stack would show its caller alone.
        let frames = stack_map
            .get(&key.stack, 0)
            .map(|stack| stack.ips[..(stack.len as usize).min(stack.ips.len())].to_vec())
            .unwrap_or_default();
        snapshot.stacks.insert(key.stack, frames);
    }
    for cause in LostCause::ALL {
        let per_cpu = lost_map.get(&(cause as u32), 0).context("reading LOST")?;
        snapshot.lost[cause as usize] = per_cpu.iter().sum();
    }
    Ok(snapshot)
}

/// Calls counted so far and how many processes made them: a lighter read
/// than [`snapshot`], for the status line.
pub fn totals(ebpf: &Ebpf) -> Result<(u64, usize)> {
    let counts: PerCpuHashMap<&MapData, AllocKey, AllocStats> =
        PerCpuHashMap::try_from(ebpf.map("COUNTS").context("map COUNTS")?)?;
    let mut calls = 0;
    let mut processes = std::collections::HashSet::new();
    for entry in counts.iter() {
        let (key, per_cpu) = entry.context("reading COUNTS")?;
        calls += per_cpu.iter().map(|v| v.count).sum::<u64>();
        processes.insert(key.tgid);
    }
    Ok((calls, processes.len()))
}
