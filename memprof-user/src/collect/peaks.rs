//! `--live`: each process image's heap peak. The kernel keeps the peak
//! itself exact (`HEAPS`, see `memprof_common::live::ProcHeap`); which call
//! sites held the heap then is captured by user space: at once when the
//! kernel says the peak grew enough (`NoticeKind::PeakGrown`, read on the
//! notice thread), and at every poll. The capture closest to the peak is
//! kept, with what it held, so a report says how close its attribution is.
use std::{
    collections::{HashMap, HashSet},
    sync::{atomic::Ordering, Arc, Mutex},
};

use anyhow::Result;
use aya::{
    maps::{Map, MapData},
    Ebpf,
};
use memprof_common::{
    images::ProcessImage,
    live::ProcHeap,
    sites::{AllocKey, AllocStats},
};

use crate::collect::{
    heap::monotonic_ns,
    live_table::{array, page_size, Mapping},
    LiveSiteMaps,
};

/// A process image's heap as the kernel counted it (weighed units for
/// counts when sampling).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct ExactHeap {
    pub live_bytes: u64,
    pub live_count: u64,
    pub peak_bytes: u64,
    pub peak_count: u64,
    /// CLOCK_MONOTONIC when `peak_bytes` was reached.
    pub peak_time_ns: u64,
}

/// Every image's figures in `HEAPS`, read through a mapping of the array
/// (one read of its memory rather than a system call per slot).
pub fn read_heaps(ebpf: &Ebpf) -> Result<HashMap<ProcessImage, ExactHeap>> {
    const WORDS: usize = size_of::<ProcHeap>() / 8;
    let (fd, slots) = array(ebpf, "HEAPS", size_of::<ProcHeap>())?;
    let length = (slots * size_of::<ProcHeap>()).next_multiple_of(page_size()?);
    let mapping = Mapping::new(fd, 0, length)?;
    let mut heaps = HashMap::new();
    for slot in 0..slots {
        let mut words = [0u64; WORDS];
        for (index, word) in words.iter_mut().enumerate() {
            *word = mapping
                .word((slot * WORDS + index) * 8)
                .load(Ordering::Relaxed);
        }
        // SAFETY: ProcHeap is plain u64s, WORDS of them.
        let heap: ProcHeap = unsafe { words.as_ptr().cast::<ProcHeap>().read() };
        if heap.owner == 0 {
            continue;
        }
        let image = ProcessImage {
            tgid: (heap.owner >> 32) as u32,
            generation: heap.owner as u32,
        };
        heaps.insert(
            image,
            ExactHeap {
                live_bytes: heap.live_bytes,
                live_count: heap.live_count,
                peak_bytes: heap.peak_bytes,
                peak_count: heap.peak_count,
                peak_time_ns: heap.peak_time_ns,
            },
        );
    }
    Ok(heaps)
}

/// Frees the slots of `HEAPS` held by ended `images` (their exact heaps
/// read), for new images to take before any running one's (the kernel
/// looks for a free slot first). Their figures are zeroed first: a slot
/// read after a new image took it never shows the old one's.
pub fn free_heap_slots(ebpf: &Ebpf, images: &HashSet<ProcessImage>) -> Result<()> {
    const WORDS: usize = size_of::<ProcHeap>() / 8;
    if images.is_empty() {
        return Ok(());
    }
    let owners: HashSet<u64> = images
        .iter()
        .map(|image| ProcHeap::owner_of(image.tgid, image.generation))
        .collect();
    let (fd, slots) = array(ebpf, "HEAPS", size_of::<ProcHeap>())?;
    let length = (slots * size_of::<ProcHeap>()).next_multiple_of(page_size()?);
    let mapping = Mapping::new(fd, 0, length)?;
    for slot in 0..slots {
        let owner = mapping.word(slot * WORDS * 8);
        let held_by = owner.load(Ordering::Acquire);
        if owners.contains(&held_by) {
            // An ended image's: nothing but user space writes it now.
            for word in 1..WORDS {
                mapping
                    .word((slot * WORDS + word) * 8)
                    .store(0, Ordering::Relaxed);
            }
            let _ = owner.compare_exchange(held_by, 0, Ordering::AcqRel, Ordering::Relaxed);
        }
    }
    Ok(())
}

/// Which call sites held an image's heap at one moment.
#[derive(Clone, Debug, Default)]
pub struct Capture {
    /// What those sites held in all.
    pub bytes: u64,
    pub count: u64,
    /// Seconds since profiling started.
    pub secs: f64,
    pub sites: Vec<(AllocKey, AllocStats)>,
}

/// The capture closest to each image's peak so far; shared by the notice
/// thread and the session.
#[derive(Clone, Default)]
pub struct PeakCaptures(Arc<Mutex<HashMap<ProcessImage, Capture>>>);

impl PeakCaptures {
    /// Keeps each image's sites from `sites` where they hold more than
    /// the capture kept so far. `only`: these images alone.
    pub fn offer(
        &self,
        sites: Vec<(AllocKey, AllocStats)>,
        secs: f64,
        only: Option<&[ProcessImage]>,
    ) {
        let mut by_image: HashMap<ProcessImage, Vec<(AllocKey, AllocStats)>> = HashMap::new();
        for (key, stats) in sites {
            let image = key.image();
            if stats.live_count != 0 && only.is_none_or(|only| only.contains(&image)) {
                by_image.entry(image).or_default().push((key, stats));
            }
        }
        let mut captures = self.0.lock().unwrap_or_else(|e| e.into_inner());
        for (image, sites) in by_image {
            let bytes: u64 = sites.iter().map(|(_, s)| s.live_bytes).sum();
            let kept = captures.entry(image).or_default();
            if bytes > kept.bytes {
                *kept = Capture {
                    bytes,
                    count: sites.iter().map(|(_, s)| s.live_count).sum(),
                    secs,
                    sites,
                };
            }
        }
    }

    /// Drops the captures of evicted images.
    pub fn forget(&self, images: &HashSet<ProcessImage>) {
        let mut captures = self.0.lock().unwrap_or_else(|e| e.into_inner());
        captures.retain(|image, _| !images.contains(image));
    }

    pub fn get(&self) -> HashMap<ProcessImage, Capture> {
        self.0.lock().unwrap_or_else(|e| e.into_inner()).clone()
    }
}

/// An image whose heap reached a new peak, and its slot in `HEAPS`.
#[derive(Clone, Copy, Debug)]
pub struct Peaked {
    pub image: ProcessImage,
    pub heap_slot: u32,
}

/// Captures of one peak at most: a heap still growing past a capture
/// is captured again, this many times in all.
const CAPTURE_ROUNDS: usize = 4;

/// What the notice thread needs to capture a peak's sites on its own.
pub struct PeakCapturer {
    pub maps: LiveSiteMaps,
    /// Its own handle on `HEAPS`.
    pub heaps: Map,
    pub sampling: bool,
    pub captures: PeakCaptures,
    /// CLOCK_MONOTONIC when profiling started.
    pub started_ns: u64,
}

impl PeakCapturer {
    /// Captures the sites of the images whose peaks just grew. The kernel
    /// asks again only once a peak has grown by a step; a heap that grew
    /// on while this read (the last step's tail) is read again, while it
    /// still holds more than the capture.
    pub fn capture(&self, peaked: &[Peaked]) {
        let mut pending: Vec<Peaked> = peaked.to_vec();
        for _ in 0..CAPTURE_ROUNDS {
            let images: Vec<ProcessImage> = pending.iter().map(|p| p.image).collect();
            let Ok(sites) = self.maps.read(self.sampling) else {
                return;
            };
            let secs = monotonic_ns().saturating_sub(self.started_ns) as f64 / 1e9;
            self.captures.offer(sites, secs, Some(&images));
            let captured = self.captures.get();
            pending.retain(|p| {
                let held = captured.get(&p.image).map_or(0, |c| c.bytes);
                self.heap(p)
                    .is_some_and(|heap| heap.peak_bytes > held && heap.live_bytes > held)
            });
            if pending.is_empty() {
                return;
            }
        }
    }

    /// The image's heap now, if its slot is still its own.
    fn heap(&self, peaked: &Peaked) -> Option<ProcHeap> {
        let heaps: aya::maps::Array<&MapData, ProcHeap> =
            aya::maps::Array::try_from(&self.heaps).ok()?;
        let heap = heaps.get(&peaked.heap_slot, 0).ok()?;
        let owner = ProcHeap::owner_of(peaked.image.tgid, peaked.image.generation);
        (heap.owner == owner).then_some(heap)
    }
}
