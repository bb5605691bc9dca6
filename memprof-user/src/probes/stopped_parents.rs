//! `trace` stops a process until its new code's unwind tables and probes
//! are in (SIGSTOP, then SIGCONT). The kernel tells the parent, and one
//! waiting for its children's stops takes it for a stop of its own: su
//! and sudo then stop themselves, waiting to be continued, and the trace
//! would hang. The BPF side does not stop a process whose parent waits so
//! when it looks (`parent_watch`); one that only started waiting meanwhile
//! is caught here: the parents of released processes are watched a while,
//! and one found stopped is continued. (It then continues its child,
//! which runs already.)
use std::time::{Duration, Instant};

use crate::procs::{parent_of, stopped_itself};

/// How long a released process's parent is watched: it stops itself as
/// soon as it reads its child's stop, within milliseconds.
const WATCHED_FOR: Duration = Duration::from_secs(2);

#[derive(Default)]
pub struct StoppedParents {
    /// Parents, and until when they are watched.
    watched: Vec<(u32, Instant)>,
}

impl StoppedParents {
    /// Process `child`, stopped by memprof, is let go now (call before
    /// its SIGCONT: it may end at once, its parent unknown then).
    pub fn releasing(&mut self, child: u32) {
        let Some(parent) = parent_of(child).filter(|&parent| parent > 1) else {
            return;
        };
        let until = Instant::now() + WATCHED_FOR;
        match self.watched.iter_mut().find(|(pid, _)| *pid == parent) {
            Some(entry) => entry.1 = until,
            None => self.watched.push((parent, until)),
        }
    }

    /// Continues each watched parent that stopped itself (not one memprof
    /// stopped for its own new code: that one is in no kill call), after
    /// `watches_stops` has told the kernel not to stop its children again
    /// (continued, it continues them, which could cancel such a stop);
    /// forgets those watched long enough.
    pub fn continue_stopped(&mut self, mut watches_stops: impl FnMut(u32)) {
        let now = Instant::now();
        self.watched.retain(|&(parent, until)| {
            if stopped_itself(parent) {
                watches_stops(parent);
                // SAFETY: sends a signal, nothing else.
                unsafe { libc::kill(parent as i32, libc::SIGCONT) };
                return false;
            }
            now < until
        });
    }
}
