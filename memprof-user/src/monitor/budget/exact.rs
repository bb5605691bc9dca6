//! The kernel's exact counts (`calls`) matched to process images: which
//! image each pid's count is of (the notices say which image a pid is
//! at, behind the kernel), the images the kernel counted that sampling
//! missed, and each image's totals from its count, for the tick and for
//! a report between two ticks.
use std::collections::{HashMap, HashSet};

use memprof_common::{
    images::{generation_order, ProcessCalls, ProcessImage, REFUSED_GENERATION},
    sites::{AllocKey, AllocStats},
};

use super::{Budget, KernelCounts};

impl Budget {
    /// Each image's calls in `calls` (its sites' sum) replaced by its
    /// traps where the kernel counted it: the kernel's counts by tgid and
    /// those of the images exec'd over taken first.
    pub(super) fn take_kernel_counts(
        &mut self,
        calls: &mut HashMap<ProcessImage, u64>,
        exact: &KernelCounts,
        current: &HashMap<u32, u32>,
        first_seen: &HashSet<ProcessImage>,
    ) {
        self.count_by_tgid(calls, exact, current, first_seen);
        self.count_execd_over(exact, first_seen);
        for (image, count) in &self.exact_calls {
            if let Some(calls) = calls.get_mut(image) {
                // What the probes cost: every trap, nested calls' too.
                *calls = count.traps;
            }
        }
    }

    /// The kernel counts by tgid: its calls are the image the pid is at
    /// now (as the notices say; for an ended process, its newest seen).
    /// One with no site yet (it exec'd, or a new process took the pid)
    /// waits for its first: the older images keep their last counts. An
    /// image exec'd over has its whole count (`count_execd_over`).
    fn count_by_tgid(
        &mut self,
        calls: &HashMap<ProcessImage, u64>,
        exact: &KernelCounts,
        current: &HashMap<u32, u32>,
        first_seen: &HashSet<ProcessImage>,
    ) {
        let newest = self.newest_images(calls.keys().copied(), exact);
        for (tgid, image) in newest {
            if !pid_may_be_at(current, &image) {
                if first_seen.contains(&image) {
                    self.awaiting.insert(image);
                }
                continue;
            }
            let counted = first_seen.contains(&image)
                || self.exact_calls.contains_key(&image)
                || self.awaiting.remove(&image);
            let Some(&count) = exact.by_tgid.get(&tgid).filter(|_| counted) else {
                continue;
            };
            // Never backwards (a pid taken by a new process before memprof
            // heard of it: its count starts afresh).
            let last = self.exact_calls.entry(image).or_default();
            if count.calls >= last.calls && count.traps >= last.traps {
                *last = count;
            }
        }
    }

    /// An image exec'd over: its count as summed at the exec, whole (the
    /// calls of its last period were never read by tgid), in place of
    /// what was read by tgid (which may be the new image's, the notices
    /// behind).
    fn count_execd_over(&mut self, exact: &KernelCounts, first_seen: &HashSet<ProcessImage>) {
        for (image, &count) in &exact.before_exec {
            let counted = first_seen.contains(image)
                || self.exact_calls.contains_key(image)
                || self.awaiting.remove(image);
            if counted {
                self.exact_calls.insert(*image, count);
                self.replaced.insert(*image);
            }
        }
    }

    /// The totals of the images the kernel counted, scaled as the sites
    /// are, for the report (in place of their sites' sums): their calls
    /// and bytes, plus what `sites` (as counted) have of the direct
    /// mappings' and programs' own samples, which the kernel does not
    /// count. `kernel`: its counts now (`peek_calls`); `current`: the
    /// image each pid is at (`Catalog::current_generations`).
    pub fn counted_totals(
        &self,
        sites: &[(AllocKey, AllocStats)],
        kernel: &KernelCounts,
        current: &HashMap<u32, u32>,
        ended: &HashMap<u32, u32>,
    ) -> HashMap<ProcessImage, AllocStats> {
        // The image each pid's count is for, as the tick takes it: the one
        // the notices say the pid is at, or an ended process's newest (the
        // calls it made between the tick and its end are in its count).
        let images = self.images(sites, kernel, current, ended);
        let newest = self.newest_images(images.iter().copied(), kernel);
        let counts_for = |image: &ProcessImage| {
            newest.get(&image.tgid) == Some(image) && pid_may_be_at(current, image)
        };
        let mut counted = self.exact_sites();
        for (key, stats) in &mut counted {
            if let Some(&whole) = kernel.before_exec.get(&key.image()) {
                // Exec'd over since the tick.
                *stats = exact_stats(whole);
            } else if let (Some(now), true) =
                (kernel.by_tgid.get(&key.tgid), counts_for(&key.image()))
            {
                // Counted on since the tick.
                stats.count = stats.count.max(now.calls);
                stats.bytes = stats.bytes.max(now.bytes);
            }
        }
        self.add_seen_since_tick(&mut counted, images, kernel, &counts_for);
        self.totals.apply(&mut counted);
        let mut totals: HashMap<ProcessImage, AllocStats> = counted
            .into_iter()
            .map(|(key, stats)| (key.image(), stats))
            .collect();
        for (key, stats) in sites {
            if key.allocator >= memprof_common::mappings::MMAP {
                if let Some(total) = totals.get_mut(&key.image()) {
                    *total = total.merged(*stats);
                }
            }
        }
        totals
    }

    /// Seen since the tick: the kernel's count, as the tick will take it
    /// (its samples' sum, shown now, would fall then), added to `counted`.
    fn add_seen_since_tick(
        &self,
        counted: &mut Vec<(AllocKey, AllocStats)>,
        images: HashSet<ProcessImage>,
        kernel: &KernelCounts,
        counts_for: &dyn Fn(&ProcessImage) -> bool,
    ) {
        let new: HashSet<ProcessImage> = images
            .into_iter()
            .filter(|image| !self.roots.contains_key(image))
            .collect();
        for image in new {
            let now = match kernel.before_exec.get(&image) {
                Some(whole) => Some(whole),
                None => kernel
                    .by_tgid
                    .get(&image.tgid)
                    .filter(|_| counts_for(&image)),
            };
            if let Some(&now) = now {
                let key = AllocKey {
                    tgid: image.tgid,
                    generation: image.generation,
                    ..AllocKey::default()
                };
                counted.push((key, exact_stats(now)));
            }
        }
    }

    /// Every image to account for: those with sites, and those the
    /// kernel counted with none (`unsampled_images`).
    pub(super) fn images(
        &self,
        sites: &[(AllocKey, AllocStats)],
        kernel: &KernelCounts,
        current: &HashMap<u32, u32>,
        ended: &HashMap<u32, u32>,
    ) -> HashSet<ProcessImage> {
        let mut images = self.unsampled_images(sites, kernel, current, ended);
        images.extend(sites.iter().map(|(key, _)| key.image()));
        images
    }

    /// The images with calls the kernel counted and no site: sampling
    /// picked none of their calls (a process that allocates B bytes goes
    /// unsampled with a chance of about e^(-B/sample)). They are counted
    /// all the same, and listed with their totals and no stacks: the
    /// image the notices say each counted pid is at, or, for a process
    /// that ended, its last (`ended`), and the images exec'd over, while
    /// the kernel's counts are given (an ended process's as long as it
    /// stays in the reports, `keeping_ended`). A process the catalog
    /// never heard of (a child forked without an exec, none of whose
    /// calls was sampled, that ended before a read found it running:
    /// `announce`) is not.
    pub(super) fn unsampled_images(
        &self,
        sites: &[(AllocKey, AllocStats)],
        kernel: &KernelCounts,
        current: &HashMap<u32, u32>,
        ended: &HashMap<u32, u32>,
    ) -> HashSet<ProcessImage> {
        let sampled: HashSet<ProcessImage> = sites.iter().map(|(key, _)| key.image()).collect();
        let at = kernel
            .by_tgid
            .iter()
            .filter(|(_, count)| count.calls > 0)
            .filter_map(|(&tgid, _)| {
                let of_ended = kernel.ended.contains(&tgid);
                let generation = match current.get(&tgid) {
                    Some(&generation) if !of_ended => generation,
                    // The pid may run a new process already: the count is
                    // the ended one's.
                    _ if of_ended || !crate::host::procfs::status::process_runs(tgid) => {
                        *ended.get(&tgid)?
                    }
                    // Running, never announced (`announce` enters it
                    // at the next read; not with --live): its image is
                    // unknown.
                    _ => return None,
                };
                Some(ProcessImage { tgid, generation })
            });
        let execd_over = kernel
            .before_exec
            .iter()
            .filter(|(_, count)| count.calls > 0)
            .map(|(&image, _)| image);
        at.chain(execd_over)
            .filter(|image| image.generation != REFUSED_GENERATION && !sampled.contains(image))
            .collect()
    }

    /// Of `images`, each pid's newest, leaving out those exec'd over
    /// (their counts are whole, from the exec) and the calls of refused
    /// processes (no image: the tick's sites have them, a report's not):
    /// the image the pid's count is for, unless the notices say it is at
    /// a newer one.
    fn newest_images(
        &self,
        images: impl Iterator<Item = ProcessImage>,
        kernel: &KernelCounts,
    ) -> HashMap<u32, ProcessImage> {
        let mut newest: HashMap<u32, ProcessImage> = HashMap::new();
        for image in images {
            if image.generation == REFUSED_GENERATION
                || kernel.before_exec.contains_key(&image)
                || self.replaced.contains(&image)
            {
                continue;
            }
            let kept = newest.entry(image.tgid).or_insert(image);
            if generation_order(image.generation, kept.generation).is_gt() {
                *kept = image;
            }
        }
        newest
    }

    /// The images the kernel counted, each as one site: its calls and
    /// their bytes since it began.
    pub(super) fn exact_sites(&self) -> Vec<(AllocKey, AllocStats)> {
        self.exact_calls
            .iter()
            .map(|(image, &counted)| {
                let key = AllocKey {
                    tgid: image.tgid,
                    generation: image.generation,
                    ..AllocKey::default()
                };
                (key, exact_stats(counted))
            })
            .collect()
    }
}

/// Whether `image`'s pid may be at it, as the notices say (`current`):
/// it is, or its process ended (the notices forget its pid).
fn pid_may_be_at(current: &HashMap<u32, u32>, image: &ProcessImage) -> bool {
    current
        .get(&image.tgid)
        .is_none_or(|&now| now == image.generation)
}

fn exact_stats(counted: ProcessCalls) -> AllocStats {
    AllocStats {
        bytes: counted.bytes,
        count: counted.calls,
        ..AllocStats::default()
    }
}
