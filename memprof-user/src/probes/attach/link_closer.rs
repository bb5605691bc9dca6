//! Closing session links off the notice thread's path (see `LinkCloser`).
use std::{
    os::fd::OwnedFd,
    sync::{mpsc, Arc, Mutex},
    thread::JoinHandle,
};

use anyhow::{Context as _, Result};

/// Closes links on threads of their own. The kernel waits for a grace
/// period as it removes a link's uprobes (20-80 ms here), and in `trace`
/// every process forked has links: closed one after the other, 500
/// children's links took 3.1 s after the command had ended, and held the
/// notice thread. Closed by many threads at once, they share grace
/// periods (1 s with 32 threads).
pub(super) struct LinkCloser {
    sender: Option<mpsc::Sender<Vec<OwnedFd>>>,
    receiver: Arc<Mutex<mpsc::Receiver<Vec<OwnedFd>>>>,
    /// Started as links come to be closed, up to `CLOSING_THREADS`.
    threads: Vec<JoinHandle<()>>,
}

/// Links closed at once, at most.
const CLOSING_THREADS: usize = 32;

impl LinkCloser {
    pub(super) fn new() -> LinkCloser {
        let (sender, receiver) = mpsc::channel::<Vec<OwnedFd>>();
        LinkCloser {
            sender: Some(sender),
            receiver: Arc::new(Mutex::new(receiver)),
            threads: Vec::new(),
        }
    }

    pub(super) fn close(&mut self, links: impl IntoIterator<Item = OwnedFd>) {
        let links: Vec<OwnedFd> = links.into_iter().collect();
        if links.is_empty() {
            return;
        }
        if self.threads.len() < CLOSING_THREADS {
            // Without a thread they are closed here, below.
            if let Ok(thread) = self.spawn_thread() {
                self.threads.push(thread);
            }
        }
        if let (Some(sender), false) = (&self.sender, self.threads.is_empty()) {
            let _ = sender.send(links);
        }
    }

    fn spawn_thread(&self) -> Result<JoinHandle<()>> {
        let receiver = self.receiver.clone();
        std::thread::Builder::new()
            .name("memprof-links".into())
            .spawn(move || loop {
                let next = receiver.lock().unwrap_or_else(|e| e.into_inner()).recv();
                match next {
                    Ok(links) => drop(links),
                    Err(_) => return,
                }
            })
            .context("starting a link-closing thread")
    }
}

/// Every link is closed when memprof's probes are.
impl Drop for LinkCloser {
    fn drop(&mut self) {
        self.sender = None;
        for thread in self.threads.drain(..) {
            let _ = thread.join();
        }
    }
}
