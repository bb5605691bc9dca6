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

use crate::procs::{has_stopped_child, is_stopped, parent_of, run_time, stopped_itself};

/// How long a released process's parent is watched: it stops itself as
/// soon as it reads its child's stop, within milliseconds.
const WATCHED_FOR: Duration = Duration::from_secs(2);

/// How long a parent continued in its child's place is given to continue
/// the child (su does it at once) before memprof does.
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
    /// continued, and continues the child; else the child is continued
    /// and its parent watched a while (it may be about to stop itself).
    pub fn release(&mut self, child: u32, watches_stops: impl FnOnce(u32)) {
        let parent = parent_of(child).filter(|&parent| parent > 1);
        if let Some(parent) = parent.filter(|&parent| stopped_itself(parent)) {
            let ran = run_time(child);
            watches_stops(parent);
            continue_process(parent);
            let deadline = Instant::now() + HANDED_OVER_WITHIN;
            while Instant::now() < deadline {
                // Continued (it may be stopped again already, for its
                // next library: then it ran in between).
                if !is_stopped(child) || run_time(child) != ran {
                    return;
                }
                std::thread::sleep(Duration::from_micros(100));
            }
            // Not su's way after all.
            continue_process(child);
            return;
        }
        if let Some(parent) = parent {
            let until = Instant::now() + WATCHED_FOR;
            match self.watched.iter_mut().find(|(pid, _)| *pid == parent) {
                Some(entry) => entry.1 = until,
                None => self.watched.push((parent, until)),
            }
        }
        continue_process(child);
    }

    /// Continues each watched parent that stopped itself after its child
    /// was let go (it read the stop late), once no child of its is stopped
    /// (continued, it continues them: that would cancel a hold, or a stop
    /// someone else sent the child, which it must wait out as it does
    /// untraced), after `watches_stops`; forgets those watched long
    /// enough. (A child stopped again between the look and the parent's
    /// SIGCONT would run on: that window is microseconds, and only opens
    /// when the parent was slower to stop than memprof to load tables.)
    pub fn continue_stopped(&mut self, mut watches_stops: impl FnMut(u32)) {
        let now = Instant::now();
        self.watched.retain(|&(parent, until)| {
            if stopped_itself(parent) && !has_stopped_child(parent) {
                watches_stops(parent);
                continue_process(parent);
                return false;
            }
            now < until
        });
    }
}

fn continue_process(pid: u32) {
    // SAFETY: sends a signal, nothing else.
    unsafe { libc::kill(pid as i32, libc::SIGCONT) };
}
