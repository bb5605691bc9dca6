//! The processes that spent their allowance, as the kernel says them on
//! `OVER_BUDGET`: read in the event loop the moment the kernel wakes it,
//! so that their probes go out within a millisecond or so, not at the
//! period's end (a process that allocates hard runs 3-20x slower with
//! them in).
use anyhow::{Context as _, Result};
use aya::{
    maps::{MapData, RingBuf},
    Ebpf,
};
use memprof_common::notices::OverBudgetNotice;
use tokio::io::unix::AsyncFd;

use crate::collect::notices::read_record;

pub struct OverBudget {
    ring: AsyncFd<RingBuf<MapData>>,
}

impl OverBudget {
    pub fn open(ebpf: &mut Ebpf) -> Result<OverBudget> {
        let ring = RingBuf::try_from(ebpf.take_map("OVER_BUDGET").context("map OVER_BUDGET")?)?;
        // SAFETY: the ring owns its map's descriptor, which stays open and
        // the same for as long as the AsyncFd holds the ring.
        let ring = unsafe { AsyncFd::register(ring) }
            .map_err(|err| anyhow::anyhow!("watching the OVER_BUDGET ring buffer: {err}"))?;
        Ok(OverBudget { ring })
    }

    /// The next processes over their allowance (waits for one).
    pub async fn next(&mut self) -> Vec<u32> {
        loop {
            let Ok(mut guard) = self.ring.readable_mut().await else {
                return std::future::pending().await;
            };
            let mut tgids = Vec::new();
            while let Some(item) = guard.get_inner_mut().next() {
                tgids.extend(read_record::<OverBudgetNotice>(&item).map(|notice| notice.tgid));
            }
            guard.clear_ready();
            if !tgids.is_empty() {
                return tgids;
            }
        }
    }
}

/// The next processes over their allowance, if the budget keeps any.
pub async fn next(over: &mut Option<OverBudget>) -> Vec<u32> {
    match over {
        Some(over) => over.next().await,
        None => std::future::pending().await,
    }
}
