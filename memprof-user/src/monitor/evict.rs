//! `monitor` runs for days on hosts whose processes come and go. What an
//! ended process left — its call sites in the kernel's tables, its stacks,
//! its mappings, what the catalog knows of it — stays one interval (for
//! the reports and scrapes after its end), then goes. The symbol caches
//! are emptied when they grow past a cap. Everything evicted is counted,
//! and shown in reports (`limits`).
use std::{
    collections::{HashSet, VecDeque},
    sync::Mutex,
    time::{Duration, Instant},
};

use anyhow::{Context as _, Result};
use aya::{
    maps::{Array, HashMap as BpfHashMap, MapData, PerCpuHashMap},
    Ebpf,
};
use memprof_common::{
    images::{ProcState, ProcessImage, REFUSED_GENERATION},
    sites::{AllocKey, AllocStats, NO_STACK},
    stacks::StackFrames,
};

use crate::{
    collect::{
        catalog::{Catalog, EndedImage},
        heap::{forget_processes, HeapTracker},
        mappings::MappingTracker,
    },
    host::procfs::status::process_runs,
    probes::Probes,
    report::model::LimitsReport,
    symbolize::Symbolizer,
};

/// Frames the symbolizer caches before it starts afresh.
const MAX_SYMBOL_FRAMES: usize = 1 << 20;
/// Files whose code segments the catalog keeps before it starts afresh.
const MAX_SEGMENT_FILES: usize = 4096;

pub struct Evictor {
    /// How long an ended process stays: one report interval.
    retention: Duration,
    /// Ended images by when memprof heard of their end, oldest first.
    pending: VecDeque<(EndedImage, Instant)>,
    /// Stacks no call site referenced at the last stack sweep: evicted if
    /// still unreferenced at the next (a stack is stored a moment before
    /// its first call site).
    unreferenced: HashSet<u64>,
    next_stack_sweep: Instant,
    /// What `STACK_EPOCH` holds.
    epoch: u64,
    counts: LimitsReport,
    /// Calls of refused processes (`--max-processes`) whose sites went.
    refused_calls: u64,
}

impl Evictor {
    /// `limits`: the retention and the tables' caps.
    pub fn new(limits: LimitsReport, catalog: &Mutex<Catalog>) -> Evictor {
        let retention = Duration::from_secs_f64(limits.retention_secs);
        catalog
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .keep_exits();
        Evictor {
            retention,
            pending: VecDeque::new(),
            unreferenced: HashSet::new(),
            next_stack_sweep: Instant::now() + retention,
            epoch: 0,
            counts: limits,
            refused_calls: 0,
        }
    }

    /// How often `sweep` should run.
    pub fn period(&self) -> Duration {
        (self.retention / 4).clamp(Duration::from_millis(250), Duration::from_secs(5))
    }

    /// Evicts the images that ended one retention ago, and (every
    /// retention) the stacks no call site uses any more.
    pub fn sweep(&mut self, ebpf: &mut Ebpf, held: Held<'_>) -> Result<()> {
        let now = Instant::now();
        held.probes
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .prune();
        {
            let mut catalog = held.catalog.lock().unwrap_or_else(|e| e.into_inner());
            // An image `reconcile` queued already stays queued once.
            for ended in catalog.take_exits() {
                if !self
                    .pending
                    .iter()
                    .any(|(queued, _)| queued.image == ended.image)
                {
                    self.pending.push_back((ended, now));
                }
            }
        }
        let mut due = HashSet::new();
        let mut later = Vec::new();
        while let Some(&(ended, at)) = self.pending.front() {
            if now.duration_since(at) < self.retention {
                break;
            }
            self.pending.pop_front();
            if ended.replaced || image_gone(ebpf, ended.image) {
                due.insert(ended.image);
            } else {
                // Its main thread ended, others run on: later.
                later.push((ended, now));
            }
        }
        self.pending.extend(later);
        let stacks_due = now >= self.next_stack_sweep;
        if due.is_empty() && !stacks_due {
            return Ok(());
        }
        self.evict_images(ebpf, &due)?;
        {
            let mut catalog = held.catalog.lock().unwrap_or_else(|e| e.into_inner());
            catalog.forget(&due, MAX_SEGMENT_FILES);
        }
        held.mappings
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .forget(&due);
        if let Some(heap) = held.heap {
            // What they left leaves the kernel's table first (a scan may
            // be waiting): it would come back after being forgotten.
            heap.sweep(ebpf, &[], true)?;
            heap.forget(&due);
        }
        self.counts.evicted_processes += due.len() as u64;
        if held.symbolizer.trim(MAX_SYMBOL_FRAMES) {
            self.counts.symbol_cache_resets += 1;
        }
        if stacks_due {
            self.next_stack_sweep = now + self.retention;
            let sites = self.sweep_stacks(ebpf, held.mappings)?;
            self.reconcile(ebpf, &sites, now);
        }
        Ok(())
    }

    /// Images in the kernel's tables whose process is gone with no notice
    /// read (the ring buffer was full: lost "notice_dropped") are queued
    /// as if their end had been announced now.
    /// `sites`: the call sites in `COUNTS` (as the stack sweep read them).
    fn reconcile(&mut self, ebpf: &Ebpf, sites: &[AllocKey], now: Instant) {
        let queued: HashSet<ProcessImage> =
            self.pending.iter().map(|(ended, _)| ended.image).collect();
        let images: HashSet<ProcessImage> = sites
            .iter()
            .filter(|key| key.generation != REFUSED_GENERATION)
            .map(|key| key.image())
            .filter(|image| !queued.contains(image))
            .collect();
        for image in images {
            if image_gone(ebpf, image) {
                let ended = EndedImage {
                    image,
                    end_ns: crate::collect::heap::monotonic_ns(),
                    replaced: false,
                };
                self.pending.push_back((ended, now));
            }
        }
    }

    /// What was evicted so far, and how full the tables were at the last
    /// sweep.
    pub fn report(&self) -> LimitsReport {
        self.counts.clone()
    }

    /// Calls of refused processes no longer in the kernel's tables: still
    /// lost ("process_table_full").
    pub fn refused_calls(&self) -> u64 {
        self.refused_calls
    }

    /// The kernel's entries of `due`'s images; and those of refused
    /// processes that are gone (their calls stay counted as lost).
    fn evict_images(&mut self, ebpf: &mut Ebpf, due: &HashSet<ProcessImage>) -> Result<()> {
        let removed = remove_sites(ebpf, |key| {
            due.contains(&key.image())
                || (key.generation == REFUSED_GENERATION && !process_runs(key.tgid))
        })?;
        self.counts.sites = removed.kept;
        self.refused_calls += removed.refused_samples;
        for name in ["UNKNOWN_FREES", "INTERNAL_FREES"] {
            let mut map: PerCpuHashMap<&mut MapData, ProcessImage, u64> = PerCpuHashMap::try_from(
                ebpf.map_mut(name).with_context(|| format!("map {name}"))?,
            )?;
            let keys: Vec<ProcessImage> = map.keys().filter_map(|key| key.ok()).collect();
            for key in keys.iter().filter(|image| due.contains(image)) {
                let _ = map.remove(key);
            }
        }
        // (Their heap slots went when the live heap's sweep read their
        // exact heaps, at their end.)
        forget_processes(ebpf, &due.iter().copied().collect::<Vec<_>>())?;
        let procs: BpfHashMap<&MapData, u32, ProcState> =
            BpfHashMap::try_from(ebpf.map("PROCS").context("map PROCS")?)?;
        self.counts.processes = procs.keys().count() as u64;
        Ok(())
    }

    /// Removes the stacks no call site used at this sweep nor the last,
    /// then raises `STACK_EPOCH`, so that no CPU reuses one it found
    /// before without looking it up again. Returns the call sites of
    /// `COUNTS` it read.
    fn sweep_stacks(
        &mut self,
        ebpf: &mut Ebpf,
        mappings: &Mutex<MappingTracker>,
    ) -> Result<Vec<AllocKey>> {
        // The stacks first, then who uses them: a stack stored between the
        // two reads is used by then, or at the next sweep.
        let stored: Vec<u64> = {
            let stacks: BpfHashMap<&MapData, u64, StackFrames> =
                BpfHashMap::try_from(ebpf.map("STACKS").context("map STACKS")?)?;
            stacks.keys().filter_map(|key| key.ok()).collect()
        };
        let mut used: HashSet<u64> = HashSet::new();
        let counts: BpfHashMap<&MapData, AllocKey, AllocStats> =
            BpfHashMap::try_from(ebpf.map("COUNTS").context("map COUNTS")?)?;
        let sites: Vec<AllocKey> = counts.keys().filter_map(|key| key.ok()).collect();
        used.extend(sites.iter().map(|key| key.stack));
        let ids: BpfHashMap<&MapData, AllocKey, u32> =
            BpfHashMap::try_from(ebpf.map("SITE_IDS").context("map SITE_IDS")?)?;
        used.extend(ids.keys().filter_map(|key| key.ok()).map(|key| key.stack));
        used.extend(
            mappings
                .lock()
                .unwrap_or_else(|e| e.into_inner())
                .sites()
                .iter()
                .map(|(key, _)| key.stack),
        );
        used.remove(&NO_STACK);
        let unused: HashSet<u64> = stored
            .iter()
            .copied()
            .filter(|stack| !used.contains(stack))
            .collect();
        let mut stacks: BpfHashMap<&mut MapData, u64, StackFrames> =
            BpfHashMap::try_from(ebpf.map_mut("STACKS").context("map STACKS")?)?;
        let mut evicted = 0;
        for stack in unused.intersection(&self.unreferenced) {
            if stacks.remove(stack).is_ok() {
                evicted += 1;
            }
        }
        self.unreferenced = unused.difference(&self.unreferenced).copied().collect();
        self.counts.stacks = stored.len() as u64 - evicted;
        self.counts.evicted_stacks += evicted;
        if evicted > 0 {
            self.epoch += 1;
            let mut epoch: Array<&mut MapData, u64> =
                Array::try_from(ebpf.map_mut("STACK_EPOCH").context("map STACK_EPOCH")?)?;
            epoch.set(0, self.epoch, 0).context("map STACK_EPOCH")?;
        }
        Ok(sites)
    }
}

/// What [`remove_sites`] did.
pub struct RemovedSites {
    /// Call sites left in `COUNTS`.
    pub kept: u64,
    /// Calls (samples) of the refused processes' sites removed.
    pub refused_samples: u64,
}

/// Removes the call sites `doomed` names from `COUNTS` and `SITE_IDS`
/// (an evicted site's id stays unused: ids are never handed out twice).
pub fn remove_sites(ebpf: &mut Ebpf, doomed: impl Fn(&AllocKey) -> bool) -> Result<RemovedSites> {
    let mut counts: BpfHashMap<&mut MapData, AllocKey, AllocStats> =
        BpfHashMap::try_from(ebpf.map_mut("COUNTS").context("map COUNTS")?)?;
    let keys: Vec<AllocKey> = counts.keys().filter_map(|key| key.ok()).collect();
    let mut removed = RemovedSites {
        kept: keys.len() as u64,
        refused_samples: 0,
    };
    for key in keys.iter().filter(|key| doomed(key)) {
        if key.generation == REFUSED_GENERATION {
            removed.refused_samples += counts.get(key, 0).map_or(0, |stats| stats.samples);
        }
        if counts.remove(key).is_ok() {
            removed.kept -= 1;
        }
    }
    let mut ids: BpfHashMap<&mut MapData, AllocKey, u32> =
        BpfHashMap::try_from(ebpf.map_mut("SITE_IDS").context("map SITE_IDS")?)?;
    let keys: Vec<AllocKey> = ids.keys().filter_map(|key| key.ok()).collect();
    for key in keys.iter().filter(|key| doomed(key)) {
        let _ = ids.remove(key);
    }
    Ok(removed)
}

/// What the evictor reaches into besides the kernel's maps.
pub struct Held<'a> {
    pub catalog: &'a Mutex<Catalog>,
    pub mappings: &'a Mutex<MappingTracker>,
    pub heap: Option<&'a mut HeapTracker>,
    pub symbolizer: &'a mut Symbolizer,
    pub probes: &'a Mutex<Probes>,
}

/// The image's process is gone: no thread runs it (a pid running now
/// runs another image, whose process took the pid).
fn image_gone(ebpf: &Ebpf, image: ProcessImage) -> bool {
    if !process_runs(image.tgid) {
        return true;
    }
    let Ok(procs) = ebpf
        .map("PROCS")
        .context("map PROCS")
        .and_then(|map| Ok(BpfHashMap::<&MapData, u32, ProcState>::try_from(map)?))
    else {
        return false;
    };
    procs
        .get(&image.tgid, 0)
        .is_ok_and(|state| state.generation != image.generation)
}
