//! `trace` stops a process until its new code's unwind tables and probes
//! are in (SIGSTOP, then SIGCONT). The kernel tells the parent, and one
//! waiting for its children's stops takes it for a stop of its own: su
//! and sudo stop themselves, and once continued they continue the child.
//! The BPF side (`parent_watch`) stops a process whose parent takes its
//! stops so only when nothing watches that parent's own stops (su run by
//! `trace`, or by a script). Such a child is let go through its parent:
//! memprof continues the parent, which continues the child. Sent by
//! memprof as well, the parent's SIGCONT would come some time after
//! memprof's, and could cancel the child's next stop (a dlopen right
//! after: python's imports) before its tables are in.
use std::time::{Duration, Instant};

use crate::host::procfs::status::{cpu_time_ns, has_stopped_child, parent_of, stopped_itself};

/// How long a released process's parent is watched: it stops itself as
/// soon as it reads its child's stop, within milliseconds.
const WATCHED_FOR: Duration = Duration::from_secs(2);

/// How long a parent continued in its child's place is given to continue
/// the child (su does it at once) before memprof does. (The notice thread
/// waits meanwhile: a longer wait would hold up other processes' notices.)
const HANDED_OVER_WITHIN: Duration = Duration::from_millis(20);

#[derive(Default)]
pub struct StoppedParents {
    /// Parents of released processes, and until when they are watched.
    watched: Vec<(u32, Instant)>,
}

impl StoppedParents {
    /// Lets process `child`, stopped by memprof, run. If its parent
    /// stopped itself for the stop (not a stop memprof sent: that one is
    /// in no kill call), the parent is entered in `watches_stops` and
    /// continued, and continues the child; else the child is continued.
    /// Either way the parent (or the parent's own parent, which may have
    /// stopped itself for the parent's stop: sudo running su) is watched a
    /// while.
    pub fn release(&mut self, child: u32, watches_stops: impl FnOnce(u32)) {
        let parent = parent_of(child).filter(|&parent| parent > 1);
        if let Some(parent) = parent.filter(|&parent| stopped_itself(parent)) {
            self.watch(parent_of(parent));
            let ran = cpu_time_ns(child);
            watches_stops(parent);
            continue_process(parent);
            let deadline = Instant::now() + HANDED_OVER_WITHIN;
            while Instant::now() < deadline {
                // Continued (it may be stopped again already, for its
                // next library: it ran in between).
                if cpu_time_ns(child) != ran {
                    return;
                }
                std::thread::sleep(Duration::from_micros(100));
            }
            // Not su's way after all, or not scheduled yet.
            continue_process(child);
            return;
        }
        self.watch(parent);
        continue_process(child);
    }

    /// Watches process `pid` (not init) for `WATCHED_FOR` from now.
    fn watch(&mut self, pid: Option<u32>) {
        let Some(pid) = pid.filter(|&pid| pid > 1) else {
            return;
        };
        let until = Instant::now() + WATCHED_FOR;
        match self.watched.iter_mut().find(|(watched, _)| *watched == pid) {
            Some(entry) => entry.1 = until,
            None => self.watched.push((pid, until)),
        }
    }

    /// Continues each watched process that stopped itself (its child was
    /// let go before it read the stop, or it read a stop of its child's
    /// own), once no child of its is stopped (continued, it continues
    /// them: that would cancel a hold, or a stop someone else sent the
    /// child, which it must wait out as it does untraced), after
    /// `watches_stops`; its own parent is watched in turn. Forgets those
    /// watched long enough. (A child stopped again between the look and
    /// the process's own SIGCONT to it runs on: a window as long as the
    /// process takes to be scheduled, which opens only when it was slower
    /// to stop than memprof to load tables.)
    pub fn continue_stopped(&mut self, mut watches_stops: impl FnMut(u32)) {
        let now = Instant::now();
        let mut continued = Vec::new();
        self.watched.retain(|&(pid, until)| {
            if stopped_itself(pid) && !has_stopped_child(pid) {
                watches_stops(pid);
                continue_process(pid);
                continued.push(pid);
                return false;
            }
            now < until
        });
        for pid in continued {
            self.watch(parent_of(pid));
        }
    }
}

fn continue_process(pid: u32) {
    // SAFETY: sends a signal, nothing else.
    unsafe { libc::kill(pid as i32, libc::SIGCONT) };
}
