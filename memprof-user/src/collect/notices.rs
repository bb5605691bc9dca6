//! Process notices from the kernel, read on a thread of their own at
//! real-time priority: a process announced at its first allocation may
//! exit a millisecond later, and its memory map must be read from /proc
//! before that, or its stacks cannot be symbolized. In live mode a heap
//! that reached a new peak is announced too: the call sites holding it
//! are captured here, before it shrinks.
use std::{
    collections::VecDeque,
    os::fd::AsRawFd as _,
    sync::{
        atomic::{AtomicBool, Ordering},
        Arc, Mutex,
    },
    thread::JoinHandle,
};

use anyhow::{Context as _, Result};
use aya::maps::{MapData, RingBuf};
use memprof_common::{
    images::ProcessImage,
    mappings::{MappingCall, MappingNotice},
    notices::{LibraryNotice, NoticeKind, ProcessNotice},
    stacks::NOT_RECORDED,
};

use crate::{
    collect::{
        catalog::{c_string, Catalog},
        mappings::{MappingTracker, Origins},
        peaks::{PeakCapturer, Peaked},
    },
    discover::pid::Selection,
    host::procfs::status::process_runs,
    probes::{stopped_parents::StoppedParents, Probes},
    unwind::kernel::KernelTables,
};

/// How long the reader sleeps in poll(2) before it checks for a stop.
const POLL_MS: i32 = 50;
/// Selected processes remembered for their children's notices (`Handler::on_exec`).
const SELECTED_KEPT: usize = 4096;

pub struct NoticeReader {
    stop: Arc<AtomicBool>,
    /// Taken when the thread is joined.
    thread: Option<JoinHandle<()>>,
}

impl NoticeReader {
    pub fn spawn(
        ring: RingBuf<MapData>,
        catalog: Arc<Mutex<Catalog>>,
        peaks: Option<PeakCapturer>,
        unwind: Option<KernelTables>,
        probes: Arc<Mutex<Probes>>,
        mappings: MappingSink,
        watch: Option<Selection>,
    ) -> Result<NoticeReader> {
        let stop = Arc::new(AtomicBool::new(false));
        let thread = std::thread::Builder::new()
            .name("memprof-notices".into())
            .spawn({
                let stop = stop.clone();
                move || {
                    let kernel = Kernel {
                        unwind,
                        probes: &probes,
                        watch,
                    };
                    read_notices(ring, &catalog, mappings, peaks.as_ref(), kernel, &stop)
                }
            })
            .context("starting the notice thread")?;
        Ok(NoticeReader {
            stop,
            thread: Some(thread),
        })
    }

    /// Reads what is left in the ring buffer, then ends the thread; an
    /// error if it had panicked (processes it was to let go may still be
    /// stopped: `trace`'s watchdog must look).
    pub fn stop(mut self) -> Result<()> {
        anyhow::ensure!(self.join(), "the notice thread panicked");
        Ok(())
    }

    /// Whether the thread ended without a panic.
    fn join(&mut self) -> bool {
        self.stop.store(true, Ordering::Relaxed);
        self.thread
            .take()
            .is_none_or(|thread| thread.join().is_ok())
    }
}

/// Also when a session ends on an error: the thread holds the probes,
/// which detach only once it lets them go.
impl Drop for NoticeReader {
    fn drop(&mut self) {
        let _ = self.join();
    }
}

/// Where the direct-mapping notices go, and whose calls they are.
pub struct MappingSink {
    pub tracker: Arc<Mutex<MappingTracker>>,
    pub origins: Origins,
}

/// What the notices change in the kernel.
struct Kernel<'a> {
    /// `--unwind dwarf`: the unwind tables.
    unwind: Option<KernelTables>,
    /// Libraries loaded later get their allocators probed. (`trace`: the
    /// kernel stops a process that loaded libraries until their tables
    /// and probes are in, and says so in a `Held` notice after them; it
    /// gets SIGCONT at the end of the round that read it.)
    probes: &'a Mutex<Probes>,
    /// `monitor --comm/--exe`: processes that exec a program it names are
    /// watched from then on.
    watch: Option<Selection>,
}

fn read_notices(
    mut ring: RingBuf<MapData>,
    catalog: &Mutex<Catalog>,
    mappings: MappingSink,
    peaks: Option<&PeakCapturer>,
    kernel: Kernel,
    stop: &AtomicBool,
) {
    let Kernel {
        unwind,
        probes,
        watch,
    } = kernel;
    raise_priority();
    let mut handler = Handler {
        catalog,
        mappings,
        peaks,
        unwind,
        probes,
        watch,
        remapped: Vec::new(),
        held: Vec::new(),
        parents: StoppedParents::default(),
        selected: VecDeque::new(),
        exiting: Vec::new(),
        peaked: Vec::new(),
    };
    let mut poll_fd = libc::pollfd {
        fd: ring.as_raw_fd(),
        events: libc::POLLIN,
        revents: 0,
    };
    loop {
        let done = stop.load(Ordering::Relaxed);
        while let Some(item) = ring.next() {
            handler.on_item(&item);
        }
        handler.end_round(done);
        if done {
            return;
        }
        // SAFETY: one valid pollfd.
        unsafe { libc::poll(&mut poll_fd, 1, POLL_MS) };
    }
}

/// What the notice thread acts on, and what one round of notices leaves
/// to do at its end.
struct Handler<'a> {
    catalog: &'a Mutex<Catalog>,
    mappings: MappingSink,
    peaks: Option<&'a PeakCapturer>,
    unwind: Option<KernelTables>,
    probes: &'a Mutex<Probes>,
    watch: Option<Selection>,
    /// `--unwind dwarf`: processes whose mappings changed in this batch,
    /// and those of them stopped until their tables are loaded.
    remapped: Vec<u32>,
    held: Vec<u32>,
    /// The parents of released processes, watched a while (`trace`).
    parents: StoppedParents,
    /// `monitor --comm/--exe/--cgroup`: the processes selected lately, as
    /// their notices came (one may be gone before its children's are read).
    selected: VecDeque<u32>,
    /// Processes whose main thread exited while others ran: their tables go
    /// once no thread is left (no notice says so: checked each round).
    exiting: Vec<u32>,
    /// Heaps that reached a new peak this round.
    peaked: Vec<Peaked>,
}

impl Handler<'_> {
    /// One record from the ring buffer, by its kind.
    fn on_item(&mut self, item: &[u8]) {
        match read_record::<ProcessNotice>(item) {
            Some(notice) if notice.kind == NoticeKind::PeakGrown as u32 => {
                self.on_peak_grown(&notice)
            }
            Some(notice) if notice.kind == NoticeKind::Library as u32 => {
                self.on_library(&notice, item)
            }
            Some(notice) if notice.kind == NoticeKind::Mapping as u32 => self.on_mapping(item),
            // An exec, or a fork by a process announced and not decided
            // on yet (`parent`: the child runs the same program).
            Some(notice) if notice.kind == NoticeKind::Exec as u32 => self.on_exec(&notice),
            Some(notice) if notice.kind == NoticeKind::Forked as u32 => self.on_forked(&notice),
            Some(notice) if notice.kind == NoticeKind::Relink as u32 => self.on_relink(&notice),
            Some(notice) if notice.kind == NoticeKind::Held as u32 => self.on_held(&notice),
            Some(notice) => self.on_process(&notice),
            None => {}
        }
    }

    fn on_peak_grown(&mut self, notice: &ProcessNotice) {
        let image = ProcessImage {
            tgid: notice.tgid,
            generation: notice.generation,
        };
        if !self.peaked.iter().any(|p| p.image == image) {
            self.peaked.push(Peaked {
                image,
                heap_slot: notice.parent,
            });
        }
    }

    fn on_library(&mut self, notice: &ProcessNotice, item: &[u8]) {
        if let Some(library) = read_record::<LibraryNotice>(item) {
            lock(self.catalog).on_library(&library);
            probe_library(self.probes, &library);
        }
        if self.unwind.is_some() && !self.remapped.contains(&notice.tgid) {
            self.remapped.push(notice.tgid);
        }
        // A held process gets SIGCONT after its `Held`
        // notice, which follows its last library's.
    }

    fn on_mapping(&mut self, item: &[u8]) {
        if let Some(mapping) = read_record::<MappingNotice>(item) {
            // A call made where nothing is recorded only ends
            // what it replaces.
            let recorded = mapping.site.reserved & NOT_RECORDED == 0;
            let own = mapping.call == MappingCall::Unmap as u32
                || recorded && {
                    // In the order the session takes them.
                    let probes = lock(self.probes);
                    let catalog = lock(self.catalog);
                    self.mappings
                        .origins
                        .is_programs(&mapping.site, &catalog, &probes.functions)
                };
            lock(&self.mappings.tracker).on_notice(&mapping, own);
        }
    }

    fn on_exec(&mut self, notice: &ProcessNotice) {
        let pid = notice.tgid;
        // What a watched process forked before its probes were
        // all in is its, whatever it runs now (or if it ended).
        let forked_by_watched = notice.parent != 0
            && (self.selected.contains(&notice.parent)
                || lock(self.probes).scopes().is_scoped(notice.parent));
        let selects = self.watch.as_ref().is_some_and(|w| w.selects(pid as i32));
        if !forked_by_watched && !selects {
            // A process that took the pid of one selected.
            self.selected.retain(|&earlier| earlier != pid);
        }
        if forked_by_watched || selects {
            if self.selected.len() == SELECTED_KEPT {
                self.selected.pop_front();
            }
            self.selected.push_back(pid);
            match lock(self.probes).adopt_execd(pid) {
                Ok(()) if self.unwind.is_some() && !self.remapped.contains(&pid) => {
                    self.remapped.push(pid)
                }
                Ok(()) => {}
                // It may have exited already (a daemon's start:
                // what it forked is announced too).
                Err(_) if crate::host::procfs::status::start_time(pid).is_none() => {}
                Err(err) => eprintln!("memprof: warning: pid {pid}: {err:#}"),
            }
        }
        lock(self.probes).settle(pid);
    }

    fn on_forked(&self, notice: &ProcessNotice) {
        // It may have exited already.
        if let Err(err) = lock(self.probes).on_fork(notice.parent, notice.tgid) {
            if crate::host::procfs::status::start_time(notice.tgid).is_some() {
                eprintln!("memprof: warning: pid {}: {err:#}", notice.tgid);
            }
        }
    }

    fn on_relink(&self, notice: &ProcessNotice) {
        // Before its `Held` notice lets it go.
        let held = notice.parent != 0;
        if let Err(err) = lock(self.probes).relink(notice.tgid, held) {
            if process_runs(notice.tgid) {
                eprintln!("memprof: warning: pid {}: {err:#}", notice.tgid);
            }
        }
    }

    fn on_held(&mut self, notice: &ProcessNotice) {
        if !self.remapped.contains(&notice.tgid) {
            self.remapped.push(notice.tgid);
        }
        if !self.held.contains(&notice.tgid) {
            self.held.push(notice.tgid);
        }
    }

    /// A process or image seen first, or ended (its exit, or an exec).
    fn on_process(&mut self, notice: &ProcessNotice) {
        lock(self.catalog).on_notice(notice);
        if notice.kind == NoticeKind::Exited as u32 && !process_runs(notice.tgid) {
            lock(self.probes).forget(notice.tgid);
        }
        if notice.kind == NoticeKind::Exited as u32 || notice.kind == NoticeKind::Replaced as u32 {
            let image = ProcessImage {
                tgid: notice.tgid,
                generation: notice.generation,
            };
            lock(&self.mappings.tracker).on_end(image, notice.time_ns);
        }
        if let Some(unwind) = self.unwind.as_mut() {
            if notice.kind == NoticeKind::FirstSeen as u32 {
                if !self.remapped.contains(&notice.tgid) {
                    self.remapped.push(notice.tgid);
                }
            } else if notice.kind == NoticeKind::Exited as u32 {
                if process_runs(notice.tgid) {
                    // Other threads run on (pthread_exit), or
                    // are still being torn down: look again.
                    if !self.exiting.contains(&notice.tgid) {
                        self.exiting.push(notice.tgid);
                    }
                } else {
                    self.remapped.retain(|&tgid| tgid != notice.tgid);
                    unwind.forget(notice.tgid);
                }
            }
        }
    }

    /// What a round's notices leave to do: tables to load or drop,
    /// processes to let go, peaks to capture. `done`: the last round.
    fn end_round(&mut self, done: bool) {
        self.refresh_tables();
        self.release_stopped(done);
        // Notices of one growth spurt come together: one capture for all.
        if let (Some(peaks), false) = (self.peaks, self.peaked.is_empty()) {
            peaks.capture(&self.peaked);
            self.peaked.clear();
        }
    }

    /// `--unwind dwarf`: the tables of processes gone dropped, those of
    /// processes remapped loaded anew.
    fn refresh_tables(&mut self) {
        // The process may be gone already: then its tables are not needed.
        if let Some(unwind) = self.unwind.as_mut() {
            self.exiting.retain(|&tgid| {
                let alive = process_runs(tgid);
                if !alive {
                    unwind.forget(tgid);
                }
                alive
            });
            for tgid in self.remapped.drain(..) {
                let _ = unwind.refresh(tgid);
            }
        }
    }

    /// The processes stopped for their tables or probes let go.
    fn release_stopped(&mut self, done: bool) {
        let probes = self.probes;
        // The kernel stopped each process whose libraries it announced
        // (see `on_libraries`), or a static program at its exec: its
        // tables are loaded now.
        for tgid in self.held.drain(..) {
            self.parents
                .release(tgid, |parent| lock(probes).watches_stops(parent));
        }
        // `trace`: what profiled processes forked waits for its own probes.
        lock(probes).release_held_forks(done, &mut self.parents);
        self.parents
            .continue_stopped(|parent| lock(probes).watches_stops(parent));
    }
}

fn lock<T>(shared: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    shared.lock().unwrap_or_else(|e| e.into_inner())
}

/// The allocators of a file the loader announced get probes: a library,
/// or (index 0) the program itself, which a child may have exec'd.
fn probe_library(probes: &Mutex<Probes>, library: &LibraryNotice) {
    let (named, path) = if library.index == 0 {
        // The loader lists the program without a name.
        match crate::host::procfs::paths::program_file(library.tgid) {
            Some(program) => program,
            None => return,
        }
    } else {
        let named = c_string(&library.path);
        let path = crate::host::procfs::paths::file_of(library.tgid, &named);
        (named, path)
    };
    if !named.starts_with('/') {
        return;
    }
    if let Err(err) = lock(probes).on_library(library.tgid, &path, library.held != 0) {
        eprintln!(
            "memprof: warning: the allocators of {named} (pid {}) could not be probed: {err:#}",
            library.tgid
        );
    }
}

/// A record of type T, if the item is large enough to hold one.
pub fn read_record<T: Copy>(item: &[u8]) -> Option<T> {
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
