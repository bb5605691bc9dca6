//! Direct mappings in user space: each profiled process image's anonymous
//! mappings and program-break growth, kept from the kernel's `MappingNotice`s
//! (see memprof-ebpf's `mappings`), and what each call site mapped (in
//! all) and still holds. Kept here, not in the kernel: an unmap may cut
//! any part of any number of mappings, which takes an ordered index.
//!
//! Each call is counted exactly (never sampled). An `mremap` is counted
//! as realloc is: an allocation of the new size at its own call site; the
//! old range leaves. An `sbrk` that raises the break allocates the bytes
//! between the old and new break; one that lowers it releases them.
use std::collections::{BTreeMap, HashMap};

use aya::maps::{HashMap as BpfHashMap, Map, MapData};
use memprof_common::{
    images::ProcessImage,
    mappings::{MappingCall, MappingNotice},
    sites::{AllocKey, AllocStats},
    stacks::StackFrames,
};

use crate::{
    collect::{
        catalog::{Catalog, ProcessInfo},
        heap::LiveFigures,
        stacks_of,
    },
    probes::ProbedFunction,
};

/// Call sites whose decision `Origins` keeps at once.
const DECIDED_MAX: usize = 1 << 16;

#[derive(Default)]
pub struct MappingTracker {
    /// `--temp-threshold` (live mode): a mapping ended sooner was temporary.
    temp_threshold_ns: u64,
    images: HashMap<ProcessImage, ImageMappings>,
}

#[derive(Default)]
struct ImageMappings {
    /// Mapped ranges by start address; each is [start, `end`).
    regions: BTreeMap<u64, Region>,
    /// Pieces left of each call's range (an unmap in its middle makes two),
    /// by call number: the pieces of one still count as one live allocation.
    pieces: HashMap<u64, u32>,
    next_call: u64,
    sites: HashMap<AllocKey, SiteFigures>,
    /// When the image ended (kernel clock): ages of what it left stop there.
    ended_ns: Option<u64>,
    /// Bytes mapped now, and the most at once (with its time).
    live_bytes: u64,
    peak_bytes: u64,
    peak_ns: u64,
}

/// How a mapped range ends.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Ending {
    /// Unmapped at `now_ns`: a temporary if it lived less than
    /// `temp_threshold_ns`.
    Unmapped { now_ns: u64, temp_threshold_ns: u64 },
    /// Moved by `mremap`: it lives on under the new call.
    Moved,
}

#[derive(Clone, Copy, Debug)]
struct Region {
    end: u64,
    site: AllocKey,
    time_ns: u64,
    call: u64,
}

#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
struct SiteFigures {
    bytes: u64,
    count: u64,
    live_bytes: u64,
    live_count: u64,
    temporary_count: u64,
}

impl MappingTracker {
    pub fn new(temp_threshold_ns: u64) -> MappingTracker {
        MappingTracker {
            temp_threshold_ns,
            ..MappingTracker::default()
        }
    }

    /// Applies one call. `own`: made by the program itself, not inside
    /// an allocator (see [`Origins`]): only those are counted; the others
    /// still end what they unmap.
    pub fn on_notice(&mut self, notice: &MappingNotice, own: bool) {
        let site = notice.site;
        let unmapped = Ending::Unmapped {
            now_ns: notice.time_ns,
            temp_threshold_ns: self.temp_threshold_ns,
        };
        let image = self.images.entry(site.image()).or_default();
        match notice.call {
            c if c == MappingCall::Map as u32 => {
                // MAP_FIXED replaces what was there.
                image.end(notice.address, notice.length, unmapped);
                if !own {
                    return;
                }
                image.map(site, notice.address, notice.length, notice.time_ns);
            }
            c if c == MappingCall::Unmap as u32 => {
                image.end(notice.address, notice.length, unmapped);
            }
            c if c == MappingCall::Remap as u32 => {
                // Only a mapping memprof saw made is memory it counts (an
                // unknown one may be a file's, or older than the profile).
                let moved = image.end(notice.old_address, notice.old_length, Ending::Moved);
                if own && moved > 0 {
                    image.map(site, notice.address, notice.length, notice.time_ns);
                }
            }
            c if c == MappingCall::Sbrk as u32 => {
                // The old break, and the increment.
                let (before, increment) = (notice.address, notice.length as i64);
                if increment > 0 && own {
                    image.map(site, before, increment as u64, notice.time_ns);
                } else if increment < 0 {
                    let released = increment.unsigned_abs();
                    image.end(before.wrapping_sub(released), released, unmapped);
                }
            }
            _ => {}
        }
    }

    /// A process image ended (exit or exec) at `time_ns`: what it left
    /// mapped stops ageing.
    pub fn on_end(&mut self, image: ProcessImage, time_ns: u64) {
        if let Some(mappings) = self.images.get_mut(&image) {
            mappings.ended_ns.get_or_insert(time_ns);
        }
    }

    /// Every call site's figures: totals, and what is mapped now.
    /// Drops evicted images (`monitor`).
    pub fn forget(&mut self, images: &std::collections::HashSet<ProcessImage>) {
        self.images.retain(|image, _| !images.contains(image));
    }

    pub fn sites(&self) -> Vec<(AllocKey, AllocStats)> {
        self.images
            .values()
            .flat_map(|image| image.sites.iter())
            .map(|(key, figures)| {
                let stats = AllocStats {
                    bytes: figures.bytes,
                    count: figures.count,
                    samples: figures.count,
                    live_bytes: figures.live_bytes,
                    live_count: figures.live_count,
                    temporary_count: figures.temporary_count,
                    ..AllocStats::default()
                };
                (*key, stats)
            })
            .collect()
    }

    /// Each image's peak of mapped bytes, exact, and its time (kernel clock).
    pub fn peaks(&self) -> HashMap<ProcessImage, (u64, u64)> {
        self.images
            .iter()
            .filter(|(_, image)| image.peak_bytes > 0)
            .map(|(&key, image)| (key, (image.peak_bytes, image.peak_ns)))
            .collect()
    }

    /// What each call site holds mapped now (as of its image's end for an
    /// ended one), counting only ranges at least `min_age_ns` old.
    pub fn live(&self, min_age_ns: u64, now_ns: u64) -> HashMap<AllocKey, LiveFigures> {
        let mut sites: HashMap<AllocKey, LiveFigures> = HashMap::new();
        for image in self.images.values() {
            let at = image.ended_ns.unwrap_or(now_ns);
            // A call's pieces count as one allocation.
            let mut calls_seen = std::collections::HashSet::new();
            for (start, region) in &image.regions {
                let age_ns = at.saturating_sub(region.time_ns);
                if age_ns < min_age_ns {
                    continue;
                }
                let figures = sites.entry(region.site).or_default();
                figures.bytes += region.end - start;
                if calls_seen.insert(region.call) {
                    figures.count += 1;
                }
                figures.oldest_age_ns = figures.oldest_age_ns.max(age_ns);
            }
        }
        sites
    }
}

impl ImageMappings {
    fn map(&mut self, site: AllocKey, start: u64, length: u64, time_ns: u64) {
        if length == 0 {
            return;
        }
        let call = self.next_call;
        self.next_call += 1;
        let region = Region {
            end: start.saturating_add(length),
            site,
            time_ns,
            call,
        };
        self.regions.insert(start, region);
        self.pieces.insert(call, 1);
        let figures = self.sites.entry(site).or_default();
        figures.bytes += length;
        figures.count += 1;
        figures.live_bytes += length;
        figures.live_count += 1;
        self.live_bytes += length;
        if self.live_bytes > self.peak_bytes {
            self.peak_bytes = self.live_bytes;
            self.peak_ns = time_ns;
        }
    }

    /// Ends whatever part of the mappings lies in [start, start + length);
    /// returns the bytes ended.
    fn end(&mut self, start: u64, length: u64, how: Ending) -> u64 {
        let end = start.saturating_add(length);
        // Ranges that start before `end` and end after `start`: the one
        // starting at or before `start`, and those starting inside.
        let first = self
            .regions
            .range(..=start)
            .next_back()
            .map_or(start, |(&s, _)| s);
        let hit: Vec<(u64, Region)> = self
            .regions
            .range(first..end)
            .filter(|(_, region)| region.end > start)
            .map(|(&s, &r)| (s, r))
            .collect();
        let mut ended = 0;
        for (region_start, region) in hit {
            self.regions.remove(&region_start);
            let mut pieces_left = 0;
            if region_start < start {
                self.regions.insert(
                    region_start,
                    Region {
                        end: start,
                        ..region
                    },
                );
                pieces_left += 1;
            }
            if region.end > end {
                self.regions.insert(end, region);
                pieces_left += 1;
            }
            let cut = region.end.min(end) - region_start.max(start);
            ended += cut;
            let pieces = self.pieces.entry(region.call).or_insert(1);
            *pieces = (*pieces - 1) + pieces_left;
            let gone = *pieces == 0;
            if gone {
                self.pieces.remove(&region.call);
            }
            if let Some(figures) = self.sites.get_mut(&region.site) {
                figures.live_bytes -= cut;
                figures.live_count -= u64::from(gone);
                if let Ending::Unmapped {
                    now_ns,
                    temp_threshold_ns,
                } = how
                {
                    let young = now_ns.saturating_sub(region.time_ns) < temp_threshold_ns;
                    figures.temporary_count += u64::from(gone && young);
                }
            }
        }
        self.live_bytes -= ended;
        ended
    }
}

/// Whose a mapping call is, by its stack: the program's own, unless a
/// frame lies in a probed allocator function's code (glibc's malloc maps
/// big blocks and grows its heap with sbrk; an `--alloc-fn` maps its
/// chunks: that memory is counted as the allocator's blocks). Decided
/// once per call site.
pub struct Origins {
    stacks: Map,
    decided: HashMap<AllocKey, bool>,
}

impl Origins {
    /// `stacks`: a handle on the kernel's `STACKS` map.
    pub fn new(stacks: Map) -> Origins {
        Origins {
            stacks,
            decided: HashMap::new(),
        }
    }

    pub fn is_programs(
        &mut self,
        site: &AllocKey,
        catalog: &Catalog,
        probed: &[ProbedFunction],
    ) -> bool {
        if let Some(&own) = self.decided.get(site) {
            return own;
        }
        let Some(info) = catalog.get(site.tgid, site.generation) else {
            // Not known yet: nothing says it is not the program's.
            return true;
        };
        let deeper = BpfHashMap::<&MapData, u64, StackFrames>::try_from(&self.stacks)
            .map(|stacks| stacks_of(&stacks, [site.stack]))
            .unwrap_or_default()
            .remove(&site.stack)
            .unwrap_or_default();
        // Return addresses, looked up one byte back (in the call).
        let inside_an_allocator = site.caller > 1
            && in_a_malloc_library(info, site.caller - 1, probed)
            || std::iter::once(site.caller)
                .chain(deeper)
                .filter(|&address| address > 1)
                .any(|address| in_probed_code(info, address - 1, probed));
        let own = !inside_an_allocator;
        if self.decided.len() >= DECIDED_MAX {
            // `monitor` runs for days, its processes come and go.
            self.decided.clear();
        }
        self.decided.insert(*site, own);
        own
    }
}

/// Whether the call at `address` (the mapping function's direct caller)
/// lies in a shared library that replaces malloc (jemalloc, tcmalloc,
/// mimalloc as libraries): what it maps is its heap, also from functions
/// no probe is on (jemalloc's `pages_map`), which a stack cut short (a new
/// process's tables not loaded yet) leaves as the only frame. A wrapper
/// that defines malloc and mmap too (glibc's libmemusage, a sanitizer's
/// runtime) passes the program's mmap on to the C library's from there:
/// that call was counted at the wrapper's own probe. Not the C library
/// (the kernel tells its own calls from a program's thread stacks), nor
/// the loader, nor a program with malloc linked in (all its code would
/// count).
fn in_a_malloc_library(info: &ProcessInfo, address: u64, probed: &[ProbedFunction]) -> bool {
    use crate::discover::allocators::{is_libc_name, is_loader_name};
    let Some(mapping) = info.mapping_of(address) else {
        return false;
    };
    let name = file_name(&mapping.path);
    let program = info.exe.as_deref().map(file_name);
    if is_libc_name(name) || is_loader_name(name) || program == Some(name) {
        return false;
    }
    probed.iter().any(|function| {
        function.role == "alloc" && function.function == "malloc" && function.file_name == name
    })
}

fn file_name(path: &str) -> &str {
    path.rsplit('/').next().unwrap_or("")
}

/// Whether `address` lies in a probed function's code.
fn in_probed_code(info: &ProcessInfo, address: u64, probed: &[ProbedFunction]) -> bool {
    let Some(mapping) = info.mapping_of(address) else {
        return false;
    };
    let name = file_name(&mapping.path);
    let offset = address - mapping.start + mapping.file_offset;
    // By file name: a process may see a library under another path than
    // memprof opened (/lib and /usr/lib, a container's root).
    // A --while function is no allocator: what it maps is the program's.
    probed
        .iter()
        .filter(|f| f.role != "region")
        .any(|function| {
            function.file_name == name
                && function
                    .code
                    .iter()
                    .any(|&(start, end)| (start..end).contains(&offset))
        })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn site(caller: u64) -> AllocKey {
        AllocKey {
            tgid: 1,
            generation: 1,
            allocator: memprof_common::mappings::MMAP,
            reserved: 0,
            stack: 0,
            caller,
        }
    }

    const UNMAPPED: Ending = Ending::Unmapped {
        now_ns: 0,
        temp_threshold_ns: 0,
    };

    fn figures(image: &ImageMappings, caller: u64) -> (u64, u64, u64, u64) {
        let f = image.sites[&site(caller)];
        (f.bytes, f.count, f.live_bytes, f.live_count)
    }

    #[test]
    fn unmaps_end_whole_mappings_and_parts_of_them() {
        let mut image = ImageMappings::default();
        image.map(site(1), 0x10000, 0x4000, 0);
        image.map(site(2), 0x20000, 0x3000, 0);
        // The head of the first, then a hole in the middle of the second.
        assert_eq!(image.end(0x10000, 0x1000, UNMAPPED), 0x1000);
        assert_eq!(image.end(0x21000, 0x1000, UNMAPPED), 0x1000);
        assert_eq!(figures(&image, 1), (0x4000, 1, 0x3000, 1));
        assert_eq!(figures(&image, 2), (0x3000, 1, 0x2000, 1));
        // One unmap over the rest of both and beyond.
        assert_eq!(image.end(0x0, 0x30000, UNMAPPED), 0x5000);
        assert_eq!(figures(&image, 1), (0x4000, 1, 0, 0));
        assert_eq!(figures(&image, 2), (0x3000, 1, 0, 0));
        assert!(image.regions.is_empty() && image.pieces.is_empty());
        // Nothing there: nothing ended.
        assert_eq!(image.end(0x10000, 0x1000, UNMAPPED), 0);
    }

    #[test]
    fn remap_moves_a_known_mapping_and_sbrk_counts_growth() {
        let mut tracker = MappingTracker::default();
        let notice =
            |call: MappingCall, address, length, old_address, old_length, caller| MappingNotice {
                kind: 7,
                call: call as u32,
                time_ns: 0,
                address,
                length,
                old_address,
                old_length,
                site: site(caller),
            };
        tracker.on_notice(&notice(MappingCall::Map, 0x10000, 0x2000, 0, 0, 1), true);
        tracker.on_notice(
            &notice(MappingCall::Remap, 0x40000, 0x8000, 0x10000, 0x2000, 2),
            true,
        );
        // Not a mapping memprof saw: not counted.
        tracker.on_notice(
            &notice(MappingCall::Remap, 0x90000, 0x8000, 0x70000, 0x2000, 2),
            true,
        );
        // The break raised by 0x21000 from 0x100000, lowered by 0x10000.
        tracker.on_notice(&notice(MappingCall::Sbrk, 0x100000, 0x21000, 0, 0, 3), true);
        tracker.on_notice(
            &notice(MappingCall::Sbrk, 0x121000, (-0x10000i64) as u64, 0, 0, 4),
            true,
        );
        let sites: HashMap<u64, AllocStats> = tracker
            .sites()
            .into_iter()
            .map(|(k, s)| (k.caller, s))
            .collect();
        let got = |caller| {
            let s = sites[&caller];
            (s.bytes, s.count, s.live_bytes, s.live_count)
        };
        assert_eq!(got(1), (0x2000, 1, 0, 0));
        assert_eq!(got(2), (0x8000, 1, 0x8000, 1));
        assert_eq!(got(3), (0x21000, 1, 0x11000, 1));
        assert!(!sites.contains_key(&4));
    }

    #[test]
    fn calls_not_the_programs_are_not_counted_but_end_what_they_unmap() {
        let mut tracker = MappingTracker::default();
        let call = |call: MappingCall, address, length, caller| MappingNotice {
            kind: 7,
            call: call as u32,
            time_ns: 0,
            address,
            length,
            old_address: 0,
            old_length: 0,
            site: site(caller),
        };
        // malloc's sbrk (not counted), then the program's.
        tracker.on_notice(&call(MappingCall::Sbrk, 0x100000, 0x20000, 2), false);
        tracker.on_notice(&call(MappingCall::Sbrk, 0x120000, 0x1000, 1), true);
        // A mapping of the program's, then malloc's MAP_FIXED over half of it.
        tracker.on_notice(&call(MappingCall::Map, 0x40000, 0x4000, 3), true);
        tracker.on_notice(&call(MappingCall::Map, 0x42000, 0x2000, 4), false);
        let sites: HashMap<u64, AllocStats> = tracker
            .sites()
            .into_iter()
            .map(|(k, s)| (k.caller, s))
            .collect();
        assert_eq!((sites[&1].bytes, sites[&1].live_bytes), (0x1000, 0x1000));
        assert_eq!((sites[&3].bytes, sites[&3].live_bytes), (0x4000, 0x2000));
        assert!(!sites.contains_key(&2) && !sites.contains_key(&4));
    }
}
