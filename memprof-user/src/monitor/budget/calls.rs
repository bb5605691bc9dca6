//! Each process's calls and their bytes, counted exactly in the kernel
//! (`CALLS`) while the budget is kept: what its traps cost is what the
//! windows' estimates take out of its CPU time, and its totals are
//! estimated from these counts (counts estimated from byte samples were
//! too rough for either: see memprof-ebpf `calls`).
use std::collections::{HashMap, HashSet};

use anyhow::{Context as _, Result};
use aya::{
    maps::{HashMap as BpfHashMap, MapData, PerCpuHashMap, PerCpuValues},
    Ebpf,
};
use memprof_common::images::{ProcessCalls, ProcessImage};

/// What the kernel counted, as read at one moment.
#[derive(Clone, Debug, Default)]
pub struct KernelCounts {
    /// By tgid: the calls of the image each pid is at (for an ended
    /// process, its last).
    pub by_tgid: HashMap<u32, ProcessCalls>,
    /// The whole count of each image exec'd over, summed at its exec
    /// (`EXEC_CALLS`): its last period's calls were never read by tgid.
    pub before_exec: HashMap<ProcessImage, ProcessCalls>,
    /// Of `by_tgid`, the pids whose count is that of a process that
    /// ended (its pid may run a new process already).
    pub ended: HashSet<u32>,
}

/// Reads the counts each period, and keeps the map to processes running.
#[derive(Default)]
pub struct CallCounts {
    /// Processes seen ended at the last read: their entries go at this one
    /// (kept one period, so that a process that ended just after its last
    /// calls is still read with them).
    ended: HashSet<u32>,
    /// Their last counts, still given for `final_reads` reads after their
    /// entries went: a short process's first sample may be read after
    /// that (or before the notices say which image its pid is at), and
    /// without its count it was estimated from its samples; a process
    /// none of whose calls was sampled is listed from it.
    finals: HashMap<u32, (ProcessCalls, u32)>,
    /// The images exec'd over, taken out of `EXEC_CALLS`, given as long.
    before_exec: HashMap<ProcessImage, (ProcessCalls, u32)>,
    /// Reads an ended process's last count is given after its entry went
    /// (at least [`FINAL_READS`]).
    final_reads: u32,
}

/// Reads an ended process's last count is given after its entry went, at
/// least.
const FINAL_READS: u32 = 5;

/// And at most (ten minutes of reads): every read copies the counts kept.
const MAX_FINAL_READS: u32 = 600;

impl CallCounts {
    /// An ended process's last count is given for `reads` reads after its
    /// entry went (as long as an ended process stays in the reports).
    pub fn keep_finals(&mut self, reads: u32) {
        self.final_reads = reads.min(MAX_FINAL_READS);
    }

    fn final_reads(&self) -> u32 {
        self.final_reads.max(FINAL_READS)
    }

    /// Each process's calls so far, by tgid (those that ended since the
    /// last read included), and the images exec'd over; the entries of
    /// processes that had ended by then go (the map holds
    /// `--max-processes`), and those of the images exec'd over.
    pub fn read(&mut self, ebpf: &mut Ebpf) -> Result<KernelCounts> {
        self.finals.retain(|_, kept| aged(kept));
        self.before_exec.retain(|_, kept| aged(kept));
        let mut map: PerCpuHashMap<&mut MapData, u32, ProcessCalls> =
            PerCpuHashMap::try_from(ebpf.map_mut("CALLS").context("map CALLS")?)?;
        // A pid's entry now, if any, is newer.
        let mut calls = kept(&self.finals);
        let mut of_ended: HashSet<u32> = calls.keys().copied().collect();
        let mut ended = HashSet::new();
        let mut gone = Vec::new();
        for entry in map.iter() {
            let (tgid, per_cpu) = entry.context("reading CALLS")?;
            if crate::host::procfs::status::process_runs(tgid) {
                calls.insert(tgid, summed(&per_cpu));
                of_ended.remove(&tgid);
                continue;
            }
            of_ended.insert(tgid);
            if self.ended.contains(&tgid) {
                gone.push(tgid);
                let last = summed(&per_cpu);
                calls.insert(tgid, last);
                self.finals.insert(tgid, (last, self.final_reads()));
            } else {
                calls.insert(tgid, summed(&per_cpu));
                ended.insert(tgid);
            }
        }
        for tgid in gone {
            let _ = map.remove(&tgid);
        }
        self.ended = ended;
        // After `CALLS`: an exec between the two reads leaves the old
        // image's whole count here, not the new image's in its place.
        for (image, count) in take_exec_counts(ebpf)? {
            self.before_exec.insert(image, (count, self.final_reads()));
        }
        Ok(KernelCounts {
            by_tgid: calls,
            before_exec: kept(&self.before_exec),
            ended: of_ended,
        })
    }

    /// The counts as they are now, between two reads (a report).
    /// The ended processes' kept counts are given, as by `read`.
    pub fn peek(&self, ebpf: &Ebpf) -> Result<KernelCounts> {
        let map: PerCpuHashMap<&MapData, u32, ProcessCalls> =
            PerCpuHashMap::try_from(ebpf.map("CALLS").context("map CALLS")?)?;
        let mut by_tgid = kept(&self.finals);
        let mut ended: HashSet<u32> = by_tgid.keys().copied().collect();
        for entry in map.iter() {
            let (tgid, per_cpu) = entry.context("reading CALLS")?;
            by_tgid.insert(tgid, summed(&per_cpu));
            // Seen ended at the last read (one that ended since reads as
            // running: `Budget::unsampled_images` looks).
            match self.ended.contains(&tgid) {
                true => ended.insert(tgid),
                false => ended.remove(&tgid),
            };
        }
        let mut before_exec = kept(&self.before_exec);
        let execs: BpfHashMap<&MapData, ProcessImage, ProcessCalls> =
            BpfHashMap::try_from(ebpf.map("EXEC_CALLS").context("map EXEC_CALLS")?)?;
        for entry in execs.iter() {
            let (image, count) = entry.context("reading EXEC_CALLS")?;
            before_exec.insert(image, count);
        }
        Ok(KernelCounts {
            by_tgid,
            before_exec,
            ended,
        })
    }
}

/// Drops the kernel's count of process `tgid`, which ended (memprof's
/// calibration child: its calls are memprof's, not a profiled process's).
pub fn forget_count(ebpf: &mut Ebpf, tgid: u32) -> Result<()> {
    let mut map: PerCpuHashMap<&mut MapData, u32, ProcessCalls> =
        PerCpuHashMap::try_from(ebpf.map_mut("CALLS").context("map CALLS")?)?;
    let _ = map.remove(&tgid);
    Ok(())
}

/// The counts kept after their entries went, without their reads left.
fn kept<K: Copy + Eq + std::hash::Hash>(
    counts: &HashMap<K, (ProcessCalls, u32)>,
) -> HashMap<K, ProcessCalls> {
    counts
        .iter()
        .map(|(&key, &(count, _))| (key, count))
        .collect()
}

/// One read less left for a count kept after its entry went.
fn aged((_, left): &mut (ProcessCalls, u32)) -> bool {
    *left -= 1;
    *left > 0
}

/// The images exec'd over since the last read, their entries taken out.
fn take_exec_counts(ebpf: &mut Ebpf) -> Result<Vec<(ProcessImage, ProcessCalls)>> {
    let mut execs: BpfHashMap<&mut MapData, ProcessImage, ProcessCalls> =
        BpfHashMap::try_from(ebpf.map_mut("EXEC_CALLS").context("map EXEC_CALLS")?)?;
    let taken = execs
        .iter()
        .collect::<Result<Vec<_>, _>>()
        .context("reading EXEC_CALLS")?;
    for (image, _) in &taken {
        let _ = execs.remove(image);
    }
    Ok(taken)
}

fn summed(per_cpu: &PerCpuValues<ProcessCalls>) -> ProcessCalls {
    per_cpu
        .iter()
        .fold(ProcessCalls::default(), |sum, &cpu| sum.plus(cpu))
}
