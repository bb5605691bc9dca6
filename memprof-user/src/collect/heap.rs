//! `--live` in user space: scans of the kernel's pointer table (ages,
//! --min-age), the leftovers of processes that ended, and peaks.
//!
//! The kernel keeps each call site's live bytes and count up to date; what
//! it cannot keep is how old the blocks are, so ages come from scanning
//! the pointer table when a report is made.
use std::{
    collections::{HashMap, HashSet},
    time::{Duration, Instant},
};

use anyhow::{Context as _, Result};
use aya::{
    maps::{HashMap as BpfHashMap, MapData, PerCpuHashMap},
    Ebpf,
};
use memprof_common::{
    images::{ProcState, ProcessImage},
    live::LiveBlock,
    sites::{AllocKey, AllocStats},
};

use crate::{
    collect::{
        catalog::EndedImage,
        live_table::LiveTable,
        peaks::{read_heaps, ExactHeap, PeakCaptures},
        read_live_sites, units_to_calls,
    },
    host::procfs::status::process_runs,
};

/// The live blocks of one call site, as a scan found them.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct LiveFigures {
    pub bytes: u64,
    pub count: u64,
    /// Age of the oldest block, in nanoseconds.
    pub oldest_age_ns: u64,
}

impl LiveFigures {
    fn absorb(&mut self, other: &LiveFigures) {
        self.bytes += other.bytes;
        self.count += other.count;
        self.oldest_age_ns = self.oldest_age_ns.max(other.oldest_age_ns);
    }

    /// Counts a block; with sampling, in weighed units (see `view`).
    fn add(&mut self, block: &LiveBlock, age_ns: u64) {
        self.bytes += block.weight.bytes;
        self.count += block.weight.unit;
        self.oldest_age_ns = self.oldest_age_ns.max(age_ns);
    }
}

/// A process's largest live heap, and what held it.
#[derive(Clone, Debug, Default)]
pub struct Peak {
    /// The largest live bytes and blocks: exact (kept by the kernel) when
    /// `exact`, else the largest a poll saw.
    pub bytes: u64,
    pub count: u64,
    pub secs: f64,
    pub exact: bool,
    /// The call sites that held memory at the capture closest to the peak.
    pub sites: Vec<(AllocKey, AllocStats)>,
    /// What they held then, and when.
    pub held_bytes: u64,
    pub held_secs: f64,
}

/// What a report shows of the live heap.
#[derive(Debug, Default)]
pub struct LiveView {
    /// Live blocks per call site: for running processes as of the scan,
    /// for ended ones as of their end. Only blocks at least --min-age old.
    pub sites: HashMap<AllocKey, LiveFigures>,
    pub unknown_frees: HashMap<ProcessImage, u64>,
    /// Frees the C library made of its own blocks (never the program's).
    pub internal_frees: HashMap<ProcessImage, u64>,
    pub peaks: HashMap<ProcessImage, Peak>,
    /// The longest time between two peak polls.
    pub peak_poll_secs: f64,
    /// Direct mappings' peaks: bytes, and seconds since the start.
    pub mapped_peaks: HashMap<ProcessImage, (u64, f64)>,
}

/// Polls for peaks at least this often.
const PEAK_POLL: Duration = Duration::from_millis(100);
/// A poll may take at most this share of one core: polls of large tables
/// are spaced out.
const PEAK_POLL_SHARE: u32 = 20;

/// A scan of the table for what ended processes left reads all of it
/// (88 MiB by default): spaced out as peak polls are, so that a host where
/// processes end every few milliseconds does not have it read ten times a
/// second, but never more than this far apart...
const SWEEP_MAX_WAIT: Duration = Duration::from_secs(1);
/// ...nor with more than this many ended images waiting (their slots in
/// the kernel's tables are taken meanwhile), nor while the table holds
/// half the blocks it may (what they left could fill it).
const SWEEP_BATCH: usize = 256;

/// What an ended process image left allocated.
#[derive(Default)]
struct Ended {
    end: End,
    sites: HashMap<AllocKey, LiveFigures>,
}

/// When a process image ended, as far as its blocks are concerned.
#[derive(Clone, Copy, Debug, Default)]
struct End {
    /// Blocks allocated up to this time were the image's; later ones
    /// belong to a new process that reuses the pid.
    cutoff_ns: u64,
    /// Ages of what it left are measured at this time.
    age_at_ns: u64,
}

impl End {
    fn owns(&self, block: &LiveBlock) -> bool {
        block.time_ns <= self.cutoff_ns
    }
}

pub struct HeapTracker {
    min_age_ns: u64,
    sampling: bool,
    started: Instant,
    /// Live blocks that processes left when they exited (or exec'd),
    /// taken out of the kernel's table, with the end time.
    ended: HashMap<ProcessImage, Ended>,
    /// Images whose main thread ended while other threads ran on.
    waiting: Vec<EndedImage>,
    /// Images that ended, whose blocks the next scan takes out, and
    /// whether their process is gone (not exec'd over).
    ending: HashMap<ProcessImage, (End, bool)>,
    next_sweep: Instant,
    /// --max-live: the blocks the table may hold.
    max_live: u32,
    /// The kernel's exact heap figures, as last read (kept for images
    /// whose slot went to another image since).
    exact: HashMap<ProcessImage, ExactHeap>,
    /// Which sites held each heap closest to its peak.
    pub captures: PeakCaptures,
    /// CLOCK_MONOTONIC when profiling started (the clock of peak times).
    pub started_ns: u64,
    last_poll: Option<Instant>,
    next_poll: Instant,
    longest_gap: Duration,
}

impl HeapTracker {
    pub fn new(min_age_ns: u64, sampling: bool, max_live: u32) -> HeapTracker {
        let now = Instant::now();
        HeapTracker {
            min_age_ns,
            sampling,
            started: now,
            ended: HashMap::new(),
            waiting: Vec::new(),
            ending: HashMap::new(),
            next_sweep: now,
            max_live,
            exact: HashMap::new(),
            captures: PeakCaptures::default(),
            started_ns: monotonic_ns(),
            last_poll: None,
            next_poll: now,
            longest_gap: Duration::ZERO,
        }
    }

    /// Takes the blocks of process images that ended out of the kernel's
    /// table, so that it does not fill with memory nobody holds any more;
    /// what they left is kept for the report. An image whose process
    /// still runs (its main thread ended with pthread_exit) is left alone.
    /// The table is read when the last read's cost allows (see
    /// [`SWEEP_MAX_WAIT`]), or now with `force`; each image's end is
    /// taken as it is found, whenever its blocks leave.
    pub fn sweep(&mut self, ebpf: &mut Ebpf, ended: &[EndedImage], force: bool) -> Result<()> {
        // Images whose process still ran at their end wait here, and end
        // when no thread is left. An exec ends its image at once.
        let checked_ns = monotonic_ns();
        let mut newly_ended = HashSet::new();
        let waiting = std::mem::take(&mut self.waiting);
        for (ended, checked_before) in ended
            .iter()
            .map(|&ended| (ended, false))
            .chain(waiting.into_iter().map(|ended| (ended, true)))
        {
            if ended.replaced || !process_runs(ended.image.tgid) {
                // Every block the image had was allocated before this check;
                // ages are measured at its end: the notice, or about now if
                // other threads ran on after it.
                let end = End {
                    cutoff_ns: checked_ns,
                    age_at_ns: if checked_before {
                        checked_ns
                    } else {
                        ended.end_ns
                    },
                };
                self.ending.insert(ended.image, (end, !ended.replaced));
                newly_ended.insert(ended.image);
            } else {
                self.waiting.push(ended);
            }
        }
        if !newly_ended.is_empty() {
            // Their exact heaps are read: their slots go to new images at
            // once (a few, in a table of its own), whenever their blocks
            // leave.
            self.exact.extend(read_heaps(ebpf)?);
            crate::collect::peaks::free_heap_slots(ebpf, &newly_ended)?;
        }
        if self.ending.is_empty() {
            return Ok(());
        }
        let started = Instant::now();
        let mut table = LiveTable::open(ebpf)?;
        let due = force
            || started >= self.next_sweep
            || self.ending.len() >= SWEEP_BATCH
            || table.used_blocks() >= u64::from(self.max_live) / 2;
        if !due {
            return Ok(());
        }
        let end_of = std::mem::take(&mut self.ending);
        let mut gone = Vec::new();
        for tracked in table.blocks()? {
            let block = tracked.block;
            let image = tracked.key.image();
            let Some((end, _)) = end_of.get(&image).filter(|(end, _)| end.owns(&block)) else {
                continue;
            };
            gone.push(tracked);
            let age_ns = end.age_at_ns.saturating_sub(block.time_ns);
            if age_ns >= self.min_age_ns {
                let left = self.ended.entry(image).or_default();
                left.sites
                    .entry(block.site)
                    .or_default()
                    .add(&block, age_ns);
            }
        }
        let mut dead = Vec::new();
        for (image, (end, process_gone)) in end_of {
            self.ended.entry(image).or_default().end = end;
            if process_gone {
                dead.push(image);
            }
        }
        table.drop_blocks(&gone)?;
        forget_processes(ebpf, &dead)?;
        self.next_sweep = started + (started.elapsed() * PEAK_POLL_SHARE).min(SWEEP_MAX_WAIT);
        Ok(())
    }

    /// Drops what evicted images left (`monitor`).
    pub fn forget(&mut self, images: &HashSet<ProcessImage>) {
        self.ended.retain(|image, _| !images.contains(image));
        self.exact.retain(|image, _| !images.contains(image));
        self.captures.forget(images);
    }

    /// Whether the process image of a call site has ended (its blocks
    /// were taken out of the table).
    pub fn has_ended(&self, key: &AllocKey) -> bool {
        self.ended.contains_key(&key.image())
    }

    /// Reads every call site's live figures and notes new peaks. Cheap
    /// enough for every 100 ms with small tables; large ones are polled
    /// less often. `force` polls now whatever the time.
    pub fn poll_peaks(&mut self, ebpf: &Ebpf, force: bool) -> Result<()> {
        let now = Instant::now();
        if !force && now < self.next_poll {
            return Ok(());
        }
        let sites = read_live_sites(ebpf, self.sampling)?;
        self.captures
            .offer(sites, self.started.elapsed().as_secs_f64(), None);
        let cost = now.elapsed();
        // The final, forced poll comes after the targets ended, whose
        // figures stopped changing then: it does not widen the gap.
        if !force {
            let last = self.last_poll.unwrap_or(self.started);
            self.longest_gap = self.longest_gap.max(now - last);
        }
        self.last_poll = Some(now);
        self.next_poll = now + PEAK_POLL.max(cost * PEAK_POLL_SHARE);
        Ok(())
    }

    /// Each image's peak: the kernel's exact figures where it kept them,
    /// the sites from the capture closest to it.
    fn peaks(&mut self, ebpf: &Ebpf) -> Result<HashMap<ProcessImage, Peak>> {
        self.exact.extend(read_heaps(ebpf)?);
        let captures = self.captures.get();
        let mut peaks = HashMap::new();
        for (image, capture) in &captures {
            peaks.insert(
                *image,
                Peak {
                    bytes: capture.bytes,
                    count: capture.count,
                    secs: capture.secs,
                    exact: false,
                    sites: capture.sites.clone(),
                    held_bytes: capture.bytes,
                    held_secs: capture.secs,
                },
            );
        }
        for (image, heap) in &self.exact {
            let peak = peaks.entry(*image).or_default();
            peak.bytes = heap.peak_bytes;
            peak.count = if self.sampling {
                units_to_calls(heap.peak_count)
            } else {
                heap.peak_count
            };
            peak.secs = heap.peak_time_ns.saturating_sub(self.started_ns) as f64 / 1e9;
            peak.exact = true;
        }
        Ok(peaks)
    }

    /// The live figures for a report: a scan of the kernel's table for
    /// the processes still running, what ended ones left.
    pub fn view(&mut self, ebpf: &Ebpf) -> Result<LiveView> {
        let now_ns = monotonic_ns();
        let mut sites: HashMap<AllocKey, LiveFigures> = HashMap::new();
        for tracked in LiveTable::open(ebpf)?.blocks()? {
            let block = tracked.block;
            let image = tracked.key.image();
            // A block of an ended image still here (written while the
            // sweep read the table) is part of what the image left; a
            // younger one belongs to a new process reusing the pid.
            let age_ns = match self.ended.get(&image) {
                Some(left) if left.end.owns(&block) => {
                    left.end.age_at_ns.saturating_sub(block.time_ns)
                }
                _ => now_ns.saturating_sub(block.time_ns),
            };
            if age_ns >= self.min_age_ns {
                sites.entry(block.site).or_default().add(&block, age_ns);
            }
        }
        for left in self.ended.values() {
            for (key, figures) in &left.sites {
                sites.entry(*key).or_default().absorb(figures);
            }
        }
        if self.sampling {
            for figures in sites.values_mut() {
                figures.count = units_to_calls(figures.count);
            }
        }
        let unknown_frees = counts_per_image(ebpf, "UNKNOWN_FREES")?;
        let internal_frees = counts_per_image(ebpf, "INTERNAL_FREES")?;
        Ok(LiveView {
            sites,
            unknown_frees,
            internal_frees,
            peaks: self.peaks(ebpf)?,
            peak_poll_secs: self.longest_gap.max(PEAK_POLL).as_secs_f64(),
            mapped_peaks: HashMap::new(),
        })
    }
}

/// A per-CPU count per process image (`UNKNOWN_FREES`, `INTERNAL_FREES`),
/// summed over CPUs.
fn counts_per_image(ebpf: &Ebpf, name: &str) -> Result<HashMap<ProcessImage, u64>> {
    let map: PerCpuHashMap<&MapData, ProcessImage, u64> =
        PerCpuHashMap::try_from(ebpf.map(name).with_context(|| format!("map {name}"))?)?;
    let mut counts = HashMap::new();
    for entry in map.iter() {
        let (image, per_cpu) = entry.with_context(|| format!("reading {name}"))?;
        counts.insert(image, per_cpu.iter().sum());
    }
    Ok(counts)
}

/// Processes that are gone leave the kernel's process table (which keeps
/// an entry past the main thread's exit, for the threads that may run on),
/// unless the pid already belongs to a new process.
pub fn forget_processes(ebpf: &mut Ebpf, dead: &[ProcessImage]) -> Result<()> {
    if dead.is_empty() {
        return Ok(());
    }
    let mut procs: BpfHashMap<&mut MapData, u32, ProcState> =
        BpfHashMap::try_from(ebpf.map_mut("PROCS").context("map PROCS")?)?;
    for image in dead {
        let same_image = procs
            .get(&image.tgid, 0)
            .is_ok_and(|state| state.generation == image.generation);
        if same_image && !process_runs(image.tgid) {
            let _ = procs.remove(&image.tgid);
        }
    }
    Ok(())
}

/// CLOCK_MONOTONIC in nanoseconds: the clock of `bpf_ktime_get_ns`.
pub fn monotonic_ns() -> u64 {
    let now = nix::time::clock_gettime(nix::time::ClockId::CLOCK_MONOTONIC)
        .expect("CLOCK_MONOTONIC is always there");
    now.tv_sec() as u64 * 1_000_000_000 + now.tv_nsec() as u64
}
