//! The symbolizer's own thread. blazesym, debuginfod and the reads of the
//! files processes map run there, not on the event loop that serves HTTP,
//! writes reports and takes signals: a file a process controls can make
//! them slow (a FUSE mount that never answers, a huge or crafted DWARF, a
//! debuginfod server that never sends), so each file gets a time limit.
//! One that takes longer is shown as module+offset, said in the report,
//! and not touched again; its thread is left to finish alone and a new one
//! takes over. After SIGTERM or SIGINT no wait goes on past [`STOP_GRACE`]
//! from the signal.
use std::{
    collections::{BTreeMap, HashSet},
    path::{Path, PathBuf},
    sync::mpsc::{self, RecvTimeoutError},
    thread::JoinHandle,
    time::{Duration, Instant},
};

use super::{
    reader::{self, Reader},
    Frame,
};
use crate::{
    collect::catalog::ProcessInfo,
    host::{guard::panic_message, stop},
    human::escape::escaped,
};

/// How long reading one file's symbols may take (each step: its identity,
/// its build id, its symbols with their debug file) unless
/// --symbol-time-limit says.
pub const DEFAULT_TIME_LIMIT: Duration = Duration::from_secs(30);

/// After a stop signal, how long symbolizing may still go on: the report,
/// the detaching and the exit fit in the rest of 2 s.
const STOP_GRACE: Duration = Duration::from_millis(1200);

/// How often a wait looks for a stop signal.
const POLL: Duration = Duration::from_millis(50);

/// Threads left reading at which memprof reads no more files until one
/// ends (each holds a CPU while it reads).
const MAX_LEFT_READING: usize = 4;

/// Names frames, on a thread of its own, each file within the time limit.
pub struct Symbolizer {
    debug_dirs: Vec<PathBuf>,
    limit: Duration,
    /// Started on first use, and again after one is left behind.
    worker: Option<Worker>,
    /// Files (as memprof opens them) that took longer than the limit.
    slow: HashSet<PathBuf>,
    /// What the reader said of the modules it did not read in full.
    read_reasons: BTreeMap<String, String>,
    /// The modules of the slow files, and why.
    slow_reasons: BTreeMap<String, String>,
    /// Modules not read for now (memprof stopping, too many threads left
    /// reading), until the next stack is symbolized.
    passing_reasons: BTreeMap<String, String>,
    /// All three, as the report lists them.
    unreadable: BTreeMap<String, String>,
    /// Threads left reading a slow file: gone once they end.
    left_reading: Vec<JoinHandle<()>>,
    /// What a thread panicked with outside the parsers' guard, if one did.
    panicked: Option<String>,
}

struct Worker {
    jobs: mpsc::Sender<Job>,
    replies: mpsc::Receiver<Reply>,
    thread: JoinHandle<()>,
}

enum Job {
    Symbolize {
        process: Option<Box<ProcessInfo>>,
        addresses: Vec<u64>,
        what: Lookup,
    },
    Trim(usize),
}

/// What a job's addresses are.
#[derive(Clone)]
enum Lookup {
    /// Return addresses in code.
    Code,
    /// Go type descriptors, each with an address of the code that
    /// allocated it: each answered by one frame, its function the type's
    /// name, or by none.
    GoTypes { code: Vec<u64> },
}

enum Reply {
    /// The file (as memprof opens it, as the process maps it) touched now.
    Reading(PathBuf, String),
    Symbolized {
        frames: Vec<Vec<Frame>>,
        unreadable: BTreeMap<String, String>,
    },
    Trimmed(bool),
}

/// How a wait for the thread ended.
enum Waited {
    Symbolized(Vec<Vec<Frame>>, BTreeMap<String, String>),
    /// One step took longer than the limit: on this file, if one was named.
    TooLong(Option<(PathBuf, String)>),
    Stopping,
    /// The thread ended (a panic outside the parsers' guard).
    Ended,
}

impl Default for Symbolizer {
    fn default() -> Self {
        Self::new()
    }
}

impl Symbolizer {
    pub fn new() -> Self {
        Self::with_debug_dirs(&[])
    }

    /// Separate debug files are looked for under `debug_dirs` (none:
    /// /usr/lib/debug and /lib/debug).
    pub fn with_debug_dirs(debug_dirs: &[PathBuf]) -> Self {
        Symbolizer {
            debug_dirs: debug_dirs.to_vec(),
            limit: DEFAULT_TIME_LIMIT,
            worker: None,
            slow: HashSet::new(),
            read_reasons: BTreeMap::new(),
            slow_reasons: BTreeMap::new(),
            passing_reasons: BTreeMap::new(),
            unreadable: BTreeMap::new(),
            left_reading: Vec::new(),
            panicked: None,
        }
    }

    /// Each file's symbols may take `limit` to read.
    pub fn with_time_limit(self, limit: Duration) -> Self {
        Symbolizer { limit, ..self }
    }

    /// What a symbolizer thread panicked with outside the parsers' guard
    /// (the fuzzers fail on it; a report goes on without that thread).
    pub fn panicked(&self) -> Option<&str> {
        self.panicked.as_deref()
    }

    /// The modules left unsymbolized, or named by their own symbols only
    /// (their debug files were not read), and why.
    pub fn unreadable(&self) -> &BTreeMap<String, String> {
        &self.unreadable
    }

    /// Empties the caches once they hold more than `max_frames` frames
    /// (`monitor`, on a host whose programs come and go): they fill again
    /// as reports need, and slow files are tried again. True when emptied.
    pub fn trim(&mut self, max_frames: usize) -> bool {
        let Some(worker) = &self.worker else {
            return false;
        };
        if worker.jobs.send(Job::Trim(max_frames)).is_err() {
            self.worker = None;
            return false;
        }
        let deadline = Instant::now() + self.limit;
        let trimmed = loop {
            match worker.replies.recv_timeout(POLL) {
                Ok(Reply::Trimmed(trimmed)) => break trimmed,
                Ok(_) | Err(RecvTimeoutError::Timeout) if Instant::now() < deadline => {}
                _ => {
                    self.leave_worker();
                    break false;
                }
            }
        };
        if trimmed {
            self.slow.clear();
            self.slow_reasons.clear();
            self.merge_reasons();
        }
        trimmed
    }

    /// Frames for each return address of `process` (several per address
    /// when functions were inlined there, innermost first); module+offset
    /// for the addresses of files not read in time.
    pub fn symbolize(
        &mut self,
        process: Option<&ProcessInfo>,
        addresses: &[u64],
    ) -> Vec<Vec<Frame>> {
        self.look_up(process, addresses, Lookup::Code)
    }

    /// The name of the Go type whose descriptor is at each of `types` of
    /// `process` (what `runtime.mallocgc` was asked for), each with an
    /// address of the code that allocated it; read within the same limits
    /// as symbols. None where it is not one, or was not read.
    pub fn go_type_names(
        &mut self,
        process: Option<&ProcessInfo>,
        types: &[u64],
        code: &[u64],
    ) -> Vec<Option<String>> {
        let what = Lookup::GoTypes {
            code: code.to_vec(),
        };
        self.look_up(process, types, what)
            .into_iter()
            .map(|frames| match frames.as_slice() {
                [named] if named.address == 0 => named.function.clone(),
                _ => None,
            })
            .collect()
    }

    fn look_up(
        &mut self,
        process: Option<&ProcessInfo>,
        addresses: &[u64],
        what: Lookup,
    ) -> Vec<Vec<Frame>> {
        for _ in 0..2 {
            if let Some(reason) = self.not_reading() {
                return self.unread(process, addresses, &reason);
            }
            let Some(worker) = self.worker() else {
                break;
            };
            let job = Job::Symbolize {
                process: process.cloned().map(Box::new),
                addresses: addresses.to_vec(),
                what: what.clone(),
            };
            if worker.jobs.send(job).is_err() {
                self.worker = None;
                continue;
            }
            match self.wait() {
                Waited::Symbolized(frames, unreadable) => {
                    self.read_reasons = unreadable;
                    self.passing_reasons.clear();
                    self.merge_reasons();
                    return frames;
                }
                Waited::TooLong(Some((path, module))) => {
                    self.leave_worker();
                    let reason = format!(
                        "reading its symbols took over {} s (--symbol-time-limit); its frames \
                         are shown as module+offset",
                        self.limit.as_secs_f64()
                    );
                    eprintln!("memprof: warning: {}: {reason}", escaped(&module));
                    self.slow.insert(path);
                    self.slow_reasons.insert(module, reason);
                    self.merge_reasons();
                    // The rest again, on a new thread, without that file.
                    return self.look_up(process, addresses, what);
                }
                Waited::TooLong(None) => {
                    self.leave_worker();
                    let reason = format!(
                        "the symbolizer took over {} s before reading a file",
                        self.limit.as_secs_f64()
                    );
                    return self.unread(process, addresses, &reason);
                }
                Waited::Stopping => {
                    self.leave_worker();
                    return self.unread(process, addresses, STOPPING);
                }
                Waited::Ended => self.ended(),
            }
        }
        self.unread(process, addresses, "the symbolizer's thread could not run")
    }

    /// The thread, started if need be.
    fn worker(&mut self) -> Option<&Worker> {
        if self.worker.is_none() {
            self.worker = Worker::spawn(&self.debug_dirs, &self.slow);
        }
        self.worker.as_ref()
    }

    /// Waits for the thread's answer, each step within the limit, the
    /// whole within the grace after a stop signal.
    fn wait(&self) -> Waited {
        let Some(worker) = &self.worker else {
            return Waited::Ended;
        };
        let mut reading = None;
        let mut since = Instant::now();
        loop {
            if past_stop_grace() {
                return Waited::Stopping;
            }
            if Instant::now() >= since + self.limit {
                return Waited::TooLong(reading);
            }
            match worker.replies.recv_timeout(POLL) {
                Ok(Reply::Reading(path, module)) => {
                    reading = Some((path, module));
                    since = Instant::now();
                }
                Ok(Reply::Symbolized { frames, unreadable }) => {
                    return Waited::Symbolized(frames, unreadable)
                }
                Ok(Reply::Trimmed(_)) | Err(RecvTimeoutError::Timeout) => {}
                Err(RecvTimeoutError::Disconnected) => return Waited::Ended,
            }
        }
    }

    /// Why no file is to be read now, if none is.
    fn not_reading(&mut self) -> Option<String> {
        if past_stop_grace() {
            return Some(STOPPING.to_string());
        }
        self.left_reading.retain(|thread| !thread.is_finished());
        (self.left_reading.len() >= MAX_LEFT_READING).then(|| {
            format!(
                "{MAX_LEFT_READING} files each took over {} s to read and are still being read; \
                 no file is read until one ends",
                self.limit.as_secs_f64()
            )
        })
    }

    /// The thread has ended unasked: what it panicked with is kept and
    /// said.
    fn ended(&mut self) {
        let Some(worker) = self.worker.take() else {
            return;
        };
        if let Err(panic) = worker.thread.join() {
            let message = panic_message(panic.as_ref());
            eprintln!(
                "memprof: warning: the symbolizer's thread ended: {}",
                escaped(&message)
            );
            self.panicked = Some(message);
        }
    }

    /// The thread goes on alone with what it was doing, and ends then.
    fn leave_worker(&mut self) {
        if let Some(worker) = self.worker.take() {
            self.left_reading.push(worker.thread);
        }
    }

    /// `process`'s addresses as module+offset, each module said with
    /// `reason`.
    fn unread(
        &mut self,
        process: Option<&ProcessInfo>,
        addresses: &[u64],
        reason: &str,
    ) -> Vec<Vec<Frame>> {
        let (frames, modules) = reader::unread(process, addresses);
        for module in modules {
            self.passing_reasons
                .entry(module)
                .or_insert_with(|| reason.to_string());
        }
        self.merge_reasons();
        frames
    }

    fn merge_reasons(&mut self) {
        self.unreadable = self.read_reasons.clone();
        for reasons in [&self.slow_reasons, &self.passing_reasons] {
            for (module, reason) in reasons {
                self.unreadable
                    .entry(module.clone())
                    .or_insert_with(|| reason.clone());
            }
        }
    }
}

/// A Go type's name as a job's answer (see [`Lookup::GoTypes`]).
fn type_frame(name: Option<String>) -> Option<Frame> {
    Some(Frame {
        function: Some(name?),
        ..Frame::unknown(0)
    })
}

/// Whether a stop signal came more than [`STOP_GRACE`] ago.
fn past_stop_grace() -> bool {
    stop::asked_at().is_some_and(|at| Instant::now() >= at + STOP_GRACE)
}

/// Why modules were not read after a stop signal.
const STOPPING: &str = "memprof was stopping (SIGTERM or SIGINT) before its symbols were read; \
                        its frames are shown as module+offset";

impl Worker {
    /// A thread with a reader of its own (blazesym's caches stay on it),
    /// told which files not to touch.
    fn spawn(debug_dirs: &[PathBuf], slow: &HashSet<PathBuf>) -> Option<Worker> {
        let (jobs, job_queue) = mpsc::channel::<Job>();
        let (replier, replies) = mpsc::channel();
        let debug_dirs = debug_dirs.to_vec();
        let slow = slow.clone();
        let thread = std::thread::Builder::new()
            .name("memprof-symbols".into())
            .spawn(move || {
                let mut reader = Reader::with_debug_dirs(&debug_dirs);
                for path in slow {
                    reader.refuse_slow(path);
                }
                for job in job_queue {
                    let reply = match job {
                        Job::Symbolize {
                            process,
                            addresses,
                            what,
                        } => {
                            let mut on_file = |path: &Path, module: &str| {
                                let touched = Reply::Reading(path.to_path_buf(), module.into());
                                let _ = replier.send(touched);
                            };
                            let process = process.as_deref();
                            let frames = match what {
                                Lookup::Code => reader.symbolize(process, &addresses, &mut on_file),
                                Lookup::GoTypes { code } => reader
                                    .go_type_names(process, &addresses, &code, &mut on_file)
                                    .into_iter()
                                    .map(|name| type_frame(name).into_iter().collect())
                                    .collect(),
                            };
                            Reply::Symbolized {
                                frames,
                                unreadable: reader.unreadable().clone(),
                            }
                        }
                        Job::Trim(max_frames) => Reply::Trimmed(reader.trim(max_frames)),
                    };
                    // No one waits any more: this thread was left behind.
                    if replier.send(reply).is_err() {
                        break;
                    }
                }
            })
            .ok()?;
        Some(Worker {
            jobs,
            replies,
            thread,
        })
    }
}
