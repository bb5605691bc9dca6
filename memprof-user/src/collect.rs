//! Reading the kernel's maps: per-call-site totals, stacks, lost events.
use std::collections::HashMap;

use anyhow::{Context as _, Result};
use aya::{
    maps::{MapData, PerCpuArray, PerCpuHashMap, StackTraceMap},
    Ebpf,
};
use memprof_common::{AllocKey, AllocStats, LostCause, NO_STACK};

/// Everything the kernel counted so far.
#[derive(Debug, Default)]
pub struct Snapshot {
    /// Totals per key, summed over CPUs.
    pub sites: Vec<(AllocKey, AllocStats)>,
    /// Stack frames (return addresses, innermost first) by stack id.
    pub stacks: HashMap<u32, Vec<u64>>,
    /// Lost events per cause, in [`LostCause::ALL`] order.
    pub lost: [u64; LostCause::COUNT as usize],
}

pub fn snapshot(ebpf: &Ebpf) -> Result<Snapshot> {
    let counts: PerCpuHashMap<&MapData, AllocKey, AllocStats> =
        PerCpuHashMap::try_from(ebpf.map("COUNTS").context("map COUNTS")?)?;
    let stack_map: StackTraceMap<&MapData> =
        StackTraceMap::try_from(ebpf.map("STACKS").context("map STACKS")?)?;
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
        if key.stack_id == NO_STACK || snapshot.stacks.contains_key(&key.stack_id) {
            continue;
        }
        // A missing id would mean the stack map lost it: keep an empty stack.
        let frames = stack_map
            .get(&key.stack_id, 0)
            .map(|trace| trace.frames().iter().map(|f| f.ip).collect())
            .unwrap_or_default();
        snapshot.stacks.insert(key.stack_id, frames);
    }
    for cause in LostCause::ALL {
        let per_cpu = lost_map.get(&(cause as u32), 0).context("reading LOST")?;
        snapshot.lost[cause as usize] = per_cpu.iter().sum();
    }
    Ok(snapshot)
}
