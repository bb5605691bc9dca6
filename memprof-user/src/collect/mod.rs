//! Reading the kernel's maps: per-call-site totals, stacks, lost events.
use crate::probes::own_handle;
mod batch;
pub mod catalog;
pub mod heap;
pub mod live_table;
pub mod mappings;
pub mod notices;
pub mod peaks;
pub mod timeline;

use std::collections::HashMap;

use anyhow::{Context as _, Result};
use aya::{
    maps::{HashMap as BpfHashMap, IterableMap, Map, MapData, PerCpuArray},
    Ebpf,
};
use memprof_common::{
    images::REFUSED_GENERATION,
    lost::LostCause,
    sampling::UNIT,
    sites::{AllocKey, AllocStats, SiteSlot, NO_STACK, SITE_SLOTS},
    stacks::StackFrames,
};

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
    /// Counts are estimates from samples (--sample-bytes).
    pub sampling: bool,
}

/// Every call site's stats, summed over CPUs and over the site's
/// `COUNTS` entry, slots (totals mode) and `SITE_STATS` (live mode); with
/// `sampling`, counts turned from weighed units into (estimated) calls.
pub fn read_sites(ebpf: &Ebpf, sampling: bool) -> Result<Vec<(AllocKey, AllocStats)>> {
    let mut sums = read_counts(ebpf)?;
    for (key, stats) in read_slots(ebpf)? {
        add_to(&mut sums, key, [stats].iter());
    }
    Ok(finish(sums, sampling))
}

/// `read_sites` for live mode, whose sites are never in the slots: the
/// peak poll skips the slots' thousand reads.
pub fn read_live_sites(ebpf: &Ebpf, sampling: bool) -> Result<Vec<(AllocKey, AllocStats)>> {
    Ok(finish(read_counts(ebpf)?, sampling))
}

/// `COUNTS`, and in live mode the sites' stats kept by id.
fn read_counts(ebpf: &Ebpf) -> Result<HashMap<AllocKey, AllocStats>> {
    let map = |name: &str| ebpf.map(name).with_context(|| format!("map {name}"));
    read_counts_of(map("COUNTS")?, map("SITE_IDS")?, map("SITE_STATS")?)
}

/// The maps live mode keeps its sites' figures in, with handles of their
/// own: the notice thread reads them the moment a heap reaches a peak.
pub struct LiveSiteMaps {
    counts: Map,
    ids: Map,
    stats: Map,
}

impl LiveSiteMaps {
    pub fn open(ebpf: &Ebpf) -> Result<LiveSiteMaps> {
        Ok(LiveSiteMaps {
            counts: own_handle(ebpf, "COUNTS")?,
            ids: own_handle(ebpf, "SITE_IDS")?,
            stats: own_handle(ebpf, "SITE_STATS")?,
        })
    }

    /// As [`read_live_sites`].
    pub fn read(&self, sampling: bool) -> Result<Vec<(AllocKey, AllocStats)>> {
        Ok(finish(
            read_counts_of(&self.counts, &self.ids, &self.stats)?,
            sampling,
        ))
    }
}

fn read_counts_of(counts: &Map, ids: &Map, stats: &Map) -> Result<HashMap<AllocKey, AllocStats>> {
    let mut sums: HashMap<AllocKey, AllocStats> = HashMap::new();
    batch::for_each(map_data(counts)?, |key: AllocKey, stats: AllocStats| {
        add_to(&mut sums, key, std::iter::once(&stats));
    })
    .context("reading COUNTS")?;
    let mut site_ids: Vec<(AllocKey, u32)> = Vec::new();
    batch::for_each(map_data(ids)?, |key: AllocKey, id: u32| {
        site_ids.push((key, id))
    })
    .context("reading SITE_IDS")?;
    if site_ids.is_empty() {
        return Ok(sums);
    }
    let mut by_id: HashMap<u32, AllocStats> = HashMap::new();
    let cpus = aya::util::nr_cpus().map_err(|(_, err)| err)?;
    batch::for_each_per_cpu(map_data(stats)?, cpus, |id: u32, per_cpu: &[AllocStats]| {
        let sum = per_cpu
            .iter()
            .fold(AllocStats::default(), |sum, v| sum.merged(*v));
        by_id.insert(id, sum);
    })
    .context("reading SITE_STATS")?;
    for (key, id) in site_ids {
        if let Some(stats) = by_id.get(&id) {
            add_to(&mut sums, key, std::iter::once(stats));
        }
    }
    Ok(sums)
}

/// A map's own data, for the batch reads.
fn map_data(map: &Map) -> Result<&MapData> {
    match map {
        Map::HashMap(data)
        | Map::PerCpuHashMap(data)
        | Map::PerCpuArray(data)
        | Map::Array(data) => Ok(data),
        _ => anyhow::bail!("not a hash map or an array"),
    }
}

/// Adds a site's stats (from CPUs, slots or maps) to its sum.
fn add_to<'a>(
    sums: &mut HashMap<AllocKey, AllocStats>,
    key: AllocKey,
    stats: impl Iterator<Item = &'a AllocStats>,
) {
    let sum = sums.entry(key).or_default();
    *sum = stats.fold(*sum, |sum, v| sum.merged(*v));
}

fn finish(sums: HashMap<AllocKey, AllocStats>, sampling: bool) -> Vec<(AllocKey, AllocStats)> {
    sums.into_iter()
        .map(|(key, total)| {
            let total = without_torn_reads(total);
            (key, if sampling { in_calls(total) } else { total })
        })
        .collect()
}

/// The taken slots of the per-CPU site table. Each slot is read twice:
/// a slot whose key differs between the reads was being taken (its key
/// possibly half written), and its few calls are left for the next read.
fn read_slots(ebpf: &Ebpf) -> Result<Vec<(AllocKey, AllocStats)>> {
    let slots: PerCpuArray<&MapData, SiteSlot> =
        PerCpuArray::try_from(ebpf.map("SITE_SLOTS").context("map SITE_SLOTS")?)?;
    let first = (0..SITE_SLOTS)
        .map(|index| slots.get(&index, 0))
        .collect::<Result<Vec<_>, _>>()
        .context("reading SITE_SLOTS")?;
    let mut taken = Vec::new();
    for (index, before) in (0..SITE_SLOTS).zip(first) {
        let now = slots.get(&index, 0).context("reading SITE_SLOTS")?;
        for (before, now) in before.iter().zip(now.iter()) {
            if now.key.tgid != 0 && now.key == before.key {
                taken.push((now.key, now.stats));
            }
        }
    }
    Ok(taken)
}

/// The CPUs' slots of an entry are copied one after another while the
/// programs run: a block allocated on a CPU already copied and freed on
/// one not yet copied leaves a "negative" live sum. Read as zero.
fn without_torn_reads(mut stats: AllocStats) -> AllocStats {
    if (stats.live_bytes as i64) < 0 || (stats.live_count as i64) < 0 {
        stats.live_bytes = 0;
        stats.live_count = 0;
    }
    stats
}

/// Weighed units to calls, rounded to the nearest.
pub fn units_to_calls(units: u64) -> u64 {
    (units + UNIT / 2) / UNIT
}

fn in_calls(stats: AllocStats) -> AllocStats {
    AllocStats {
        count: units_to_calls(stats.count),
        live_count: units_to_calls(stats.live_count),
        temporary_count: units_to_calls(stats.temporary_count),
        untracked_count: units_to_calls(stats.untracked_count),
        ..stats
    }
}

pub fn snapshot(ebpf: &Ebpf, sampling: bool) -> Result<Snapshot> {
    let stack_map: BpfHashMap<&MapData, u64, StackFrames> =
        BpfHashMap::try_from(ebpf.map("STACKS").context("map STACKS")?)?;
    let lost_map: PerCpuArray<&MapData, u64> =
        PerCpuArray::try_from(ebpf.map("LOST").context("map LOST")?)?;

    let mut snapshot = Snapshot {
        sites: read_sites(ebpf, sampling)?,
        sampling,
        ..Snapshot::default()
    };
    snapshot.stacks = stacks_of(&stack_map, snapshot.sites.iter().map(|(key, _)| key.stack));
    for cause in LostCause::ALL {
        let per_cpu = lost_map.get(&(cause as u32), 0).context("reading LOST")?;
        snapshot.lost[cause as usize] = per_cpu.iter().sum();
    }
    // Calls of processes the process table had no room for are lost, not
    // a process's (`--max-processes`).
    snapshot.sites.retain(|(key, stats)| {
        let refused = key.generation == REFUSED_GENERATION;
        if refused {
            snapshot.lost[LostCause::ProcessTableFull as usize] += stats.samples;
        }
        !refused
    });
    // A site whose stack `monitor` evicted as it was being counted (see
    // `evict`) shows its caller alone.
    for (key, stats) in &snapshot.sites {
        if key.stack != NO_STACK && !snapshot.stacks.contains_key(&key.stack) {
            snapshot.lost[LostCause::StackEvicted as usize] += stats.samples;
        }
    }
    Ok(snapshot)
}

/// Adds sites kept in user space (direct mappings) to a snapshot, with
/// their stacks.
pub fn add_sites(
    ebpf: &Ebpf,
    snapshot: &mut Snapshot,
    sites: Vec<(AllocKey, AllocStats)>,
) -> Result<()> {
    let stack_map: BpfHashMap<&MapData, u64, StackFrames> =
        BpfHashMap::try_from(ebpf.map("STACKS").context("map STACKS")?)?;
    let missing: Vec<u64> = sites
        .iter()
        .map(|(key, _)| key.stack)
        .filter(|stack| !snapshot.stacks.contains_key(stack))
        .collect();
    snapshot.stacks.extend(stacks_of(&stack_map, missing));
    snapshot.sites.extend(sites);
    Ok(())
}

/// The frames of each stack key (beyond the caller), read once each.
pub fn stacks_of(
    stack_map: &BpfHashMap<&MapData, u64, StackFrames>,
    keys: impl IntoIterator<Item = u64>,
) -> HashMap<u64, Vec<u64>> {
    let keys: Vec<u64> = keys.into_iter().collect();
    if keys.len() > WHOLE_STACK_MAP_FROM {
        if let Some(stacks) = whole_stacks_of(stack_map, &keys) {
            return stacks;
        }
    }
    let mut stacks = HashMap::new();
    for key in keys {
        if key == NO_STACK || stacks.contains_key(&key) {
            continue;
        }
        // Only `monitor` removes stacks, of ended processes: a miss is a
        // stack evicted as a new call site took it (left out: counted as
        // lost "stack_evicted", shown with the caller alone).
        if let Ok(stack) = stack_map.get(&key, 0) {
            stacks.insert(key, frames_of(&stack));
        }
    }
    stacks
}

/// A stack's recorded return addresses.
fn frames_of(stack: &StackFrames) -> Vec<u64> {
    stack.ips[..(stack.len as usize).min(stack.ips.len())].to_vec()
}

/// From this many stacks the whole map is read in batches, the ones
/// wanted kept: a few calls in all rather than one a stack.
const WHOLE_STACK_MAP_FROM: usize = 512;

/// [`stacks_of`] by batches; None if the kernel refuses them.
fn whole_stacks_of(
    stack_map: &BpfHashMap<&MapData, u64, StackFrames>,
    keys: &[u64],
) -> Option<HashMap<u64, Vec<u64>>> {
    let wanted: std::collections::HashSet<u64> = keys.iter().copied().collect();
    let mut stacks = HashMap::with_capacity(wanted.len());
    batch::for_each(
        IterableMap::map(stack_map),
        |key: u64, stack: StackFrames| {
            if key != NO_STACK && wanted.contains(&key) {
                stacks.insert(key, frames_of(&stack));
            }
        },
    )
    .ok()?;
    Some(stacks)
}

/// Calls counted so far and how many processes made them: a lighter read
/// than [`snapshot`], for the status line.
/// `ended` says which process images are gone: their blocks are not live.
pub fn totals(ebpf: &Ebpf, ended: impl Fn(&AllocKey) -> bool) -> Result<StatusTotals> {
    let mut totals = StatusTotals::default();
    let mut processes = std::collections::HashSet::new();
    // Unconverted: only raw samples and live bytes are summed here.
    for (key, site) in read_sites(ebpf, false)? {
        // Recorded calls: every call, or the sampled ones.
        totals.calls += site.samples;
        if !ended(&key) {
            totals.live_bytes += site.live_bytes;
        }
        processes.insert(key.tgid);
    }
    totals.processes = processes.len();
    Ok(totals)
}

/// What the status line shows.
#[derive(Debug, Default)]
pub struct StatusTotals {
    pub calls: u64,
    pub processes: usize,
    /// Live mode: bytes allocated and not freed (an estimate when sampling).
    pub live_bytes: u64,
}
