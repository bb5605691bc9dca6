//! Process notices from the kernel, read on a thread of their own at
//! real-time priority: a process announced at its first allocation may
//! exit a millisecond later, and its memory map must be read from /proc
//! before that, or its stacks cannot be symbolized.
use std::{
    os::fd::AsRawFd as _,
    sync::{
        atomic::{AtomicBool, Ordering},
        Arc, Mutex,
    },
    thread::JoinHandle,
};

use anyhow::{Context as _, Result};
use aya::maps::{MapData, RingBuf};
use memprof_common::{LibraryNotice, NoticeKind, ProcessNotice};

use crate::procs::Catalog;

/// How long the reader sleeps in poll(2) before it checks for a stop.
const POLL_MS: i32 = 50;

pub struct NoticeReader {
    stop: Arc<AtomicBool>,
    thread: JoinHandle<()>,
}

impl NoticeReader {
    pub fn spawn(ring: RingBuf<MapData>, catalog: Arc<Mutex<Catalog>>) -> Result<NoticeReader> {
        let stop = Arc::new(AtomicBool::new(false));
        let thread = std::thread::Builder::new()
            .name("memprof-notices".into())
            .spawn({
                let stop = stop.clone();
                move || read_notices(ring, &catalog, &stop)
            })
            .context("starting the notice thread")?;
        Ok(NoticeReader { stop, thread })
    }

    /// Reads what is left in the ring buffer, then ends the thread.
    pub fn stop(self) {
        self.stop.store(true, Ordering::Relaxed);
        let _ = self.thread.join();
    }
}

fn read_notices(mut ring: RingBuf<MapData>, catalog: &Mutex<Catalog>, stop: &AtomicBool) {
    raise_priority();
    let mut poll_fd = libc::pollfd {
        fd: ring.as_raw_fd(),
        events: libc::POLLIN,
        revents: 0,
    };
    loop {
        let done = stop.load(Ordering::Relaxed);
        while let Some(item) = ring.next() {
            let mut catalog = catalog.lock().unwrap_or_else(|e| e.into_inner());
            match read_record::<ProcessNotice>(&item) {
                Some(notice) if notice.kind == NoticeKind::Library as u32 => {
                    if let Some(library) = read_record::<LibraryNotice>(&item) {
                        catalog.on_library(&library);
                    }
                }
                Some(notice) => catalog.on_notice(&notice),
                None => {}
            }
        }
        if done {
            return;
        }
        // SAFETY: one valid pollfd.
        unsafe { libc::poll(&mut poll_fd, 1, POLL_MS) };
    }
}

/// A record of type T, if the item is large enough to hold one.
fn read_record<T: Copy>(item: &[u8]) -> Option<T> {
    // SAFETY: T is a repr(C) plain-data notice; the size is checked; the
    // BPF side writes whole records, which start with their kind.
    (item.len() >= std::mem::size_of::<T>())
        .then(|| unsafe { std::ptr::read_unaligned(item.as_ptr().cast()) })
}

/// SCHED_FIFO, so the reader runs as soon as a notice arrives even when
/// the profiled processes keep every core busy. Best effort: without it
/// the reader still works, only later.
fn raise_priority() {
    let param = libc::sched_param { sched_priority: 10 };
    // SAFETY: changes the scheduling policy of the calling thread only.
    unsafe { libc::pthread_setschedparam(libc::pthread_self(), libc::SCHED_FIFO, &param) };
}
