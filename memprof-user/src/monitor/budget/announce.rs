//! Under the budget the kernel counts every call, but only a sampled call
//! (or an exec, or being named at the start) enters a process in `PROCS`
//! and announces it: a child forked without an exec, none of whose calls
//! was sampled (a worker of a pre-forking server that allocates little),
//! was a count with no process, in no report. At each read user space
//! enters such a process itself, as the kernel would have, and tells the
//! catalog. The entry is marked unannounced: the kernel still sends its
//! `FirstSeen` notice at the first sampled call (the unwinder loads the
//! process's tables on it).
use anyhow::{Context as _, Result};
use aya::{
    maps::{HashMap as BpfHashMap, MapData},
    Ebpf,
};
use memprof_common::{
    images::{first_generation, ProcState},
    live::NO_HEAP_SLOT,
    notices::{NoticeKind, ProcessNotice},
};

use super::calls::KernelCounts;
use crate::collect::catalog::Catalog;

/// Enters each running process with calls counted that the catalog does
/// not know in `PROCS`, under the generation the kernel would have given
/// it now, and announces it to `catalog`. One the kernel entered first
/// keeps its entry (its notice is on the way). Not in live mode: the
/// kernel hands out the heap slots. `counts` is a read's: the pids not
/// in its `ended` ran when it was made.
pub fn unannounced(ebpf: &mut Ebpf, catalog: &mut Catalog, counts: &KernelCounts) -> Result<()> {
    let current = catalog.current_generations();
    let unknown: Vec<u32> = counts
        .by_tgid
        .iter()
        .filter(|&(tgid, count)| {
            count.calls > 0 && !counts.ended.contains(tgid) && !current.contains_key(tgid)
        })
        .map(|(&tgid, _)| tgid)
        .collect();
    if unknown.is_empty() {
        return Ok(());
    }
    let mut procs: BpfHashMap<&mut MapData, u32, ProcState> =
        BpfHashMap::try_from(ebpf.map_mut("PROCS").context("map PROCS")?)?;
    for tgid in unknown {
        let time_ns = crate::collect::heap::monotonic_ns();
        let state = ProcState {
            generation: first_generation(time_ns),
            announced: 0,
            heap_slot: NO_HEAP_SLOT,
            ..ProcState::default()
        };
        // Only where no entry is (a full table refuses it as well).
        const BPF_NOEXIST: u64 = 1;
        if procs.insert(tgid, state, BPF_NOEXIST).is_err() {
            continue;
        }
        // Ended since the read: its exit, past, would never announce its
        // end.
        if !crate::host::procfs::status::process_runs(tgid) {
            let _ = procs.remove(&tgid);
            continue;
        }
        catalog.on_notice(&ProcessNotice {
            kind: NoticeKind::FirstSeen as u32,
            tgid,
            generation: state.generation,
            parent: 0,
            time_ns,
            // The kernel's `FirstSeen` (at its first sampled call) names it.
            comm: [0; 16],
        });
    }
    Ok(())
}
