//! What memprof knows about each profiled process: name, executable and
//! executable memory mappings, captured while the process is alive so its
//! stacks can be symbolized after it exits.
use std::{
    collections::{HashMap, VecDeque},
    fs,
    path::{Path, PathBuf},
    sync::Arc,
};

use memprof_common::{
    images::{generation_order, ProcessImage},
    notices::{LibraryNotice, NoticeKind, ProcessNotice},
};

use crate::{
    discover::pid::stat_fields_after_name,
    host::{
        elf::{code_segments, CodeSegment},
        guard,
    },
};

/// One executable mapping of a file (or the vDSO).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Mapping {
    pub start: u64,
    pub end: u64,
    pub file_offset: u64,
    /// Path as the process sees it ("/usr/lib/.../libc.so.6", "[vdso]").
    pub path: String,
    /// The kernel marks the file deleted: `path` names another file now,
    /// or none (see [`mapped_file`]).
    pub deleted: bool,
}

#[derive(Clone, Debug, Default)]
pub struct ProcessInfo {
    pub pid: u32,
    /// Short name (comm).
    pub command: String,
    /// Full command line, if it could be read.
    pub cmdline: Vec<String>,
    pub exe: Option<String>,
    /// Sorted by start address.
    pub mappings: Vec<Mapping>,
    pub exited: bool,
    /// Its cgroup (the unified hierarchy's, else the first listed).
    pub cgroup: Option<String>,
    /// The container it runs in, when its cgroup names one (the first 12
    /// hex digits of the id, as docker and crictl show it).
    pub container: Option<String>,
    /// The deleted files it maps, open (by path in its maps): they can be
    /// read after it exits, when nothing else names them.
    pub held_files: Vec<(String, Arc<fs::File>)>,
    /// When /proc first named it (CLOCK_MONOTONIC ns, the kernel's clock
    /// for notices; 0: not yet). A read after the image was exec'd over
    /// named the next one (`Catalog::on_notice`).
    pub named_at_ns: u64,
    /// The program its loader announced (the path it was exec'd with):
    /// this image's, whenever /proc was read.
    pub loaded_program: Option<String>,
    /// Where the mappings its loader announced start (`on_library`).
    pub announced: Vec<u64>,
}

impl ProcessInfo {
    /// /proc was read after this image was exec'd over: its name, command
    /// line and executable were the next image's (a shell's subshell
    /// named `tr`, dash named after the sqlite3 it exec'd). Its loader's
    /// word for the program stands, else it goes unnamed; of its mappings,
    /// those the loader announced (the rest were the next image's).
    fn named_by_a_later_image(&mut self) {
        let announced = &self.announced;
        self.mappings.retain(|m| announced.contains(&m.start));
        self.cmdline.clear();
        self.exe = self.loaded_program.clone();
        self.command = self
            .loaded_program
            .as_deref()
            .map(file_name)
            .unwrap_or_default();
    }

    /// The deleted file it maps at `path`, held open.
    pub fn held_file(&self, path: &str) -> Option<&fs::File> {
        self.held_files
            .iter()
            .find(|(held, _)| held == path)
            .map(|(_, file)| file.as_ref())
    }

    /// Opens the deleted files it maps that it does not hold yet (through
    /// /proc/PID/map_files, while it runs).
    fn hold_deleted_files(&mut self) {
        let deleted: Vec<(String, PathBuf)> = self
            .mappings
            .iter()
            .filter(|m| m.deleted)
            .map(|m| (m.path.clone(), map_files_path(self.pid, m.start, m.end)))
            .collect();
        for (path, opened) in deleted {
            if self.held_file(&path).is_some() {
                continue;
            }
            if let Ok(file) = fs::File::open(opened) {
                self.held_files.push((path, Arc::new(file)));
            }
        }
    }

    /// The mapping that holds `address`.
    pub fn mapping_of(&self, address: u64) -> Option<&Mapping> {
        let index = self.mappings.partition_point(|m| m.start <= address);
        let mapping = self.mappings.get(index.checked_sub(1)?)?;
        (address < mapping.end).then_some(mapping)
    }
}

/// A process image that ended.
#[derive(Clone, Copy, Debug)]
pub struct EndedImage {
    pub image: ProcessImage,
    /// Kernel time (`bpf_ktime_get_ns`) of the end.
    pub end_ns: u64,
    /// Ended by an exec: the address space is gone for sure, while the
    /// process runs on. Otherwise its main thread exited, which ends the
    /// process only if no other thread runs on.
    pub replaced: bool,
}

/// Processes by (pid, image generation).
#[derive(Default)]
pub struct Catalog {
    processes: HashMap<(u32, u32), ProcessInfo>,
    /// The generation each pid is at now, as far as memprof heard.
    current: HashMap<u32, u32>,
    /// Code segments of each loaded file (by device and inode: a
    /// container's file may have the host's path), read once.
    segments: HashMap<(u64, u64), Vec<CodeSegment>>,
    /// Images that ended (exit or exec) since the last `take_ended`, when
    /// kept (`keep_ended`: live mode).
    ended: Option<Vec<EndedImage>>,
    /// The same for `take_exits` (`monitor`'s eviction), when kept.
    exits: Option<Vec<EndedImage>>,
    /// Images `forget` dropped, newest last (at most `FORGOTTEN_KEPT`):
    /// a child they forked may make its first call later, and end before
    /// /proc is read (a daemon's start, its parent long gone).
    forgotten: VecDeque<((u32, u32), ProcessInfo)>,
}

/// Forgotten images kept for a child's `inherit_from`.
const FORGOTTEN_KEPT: usize = 256;

const PAGE_MASK: u64 = !0xfff;

impl Catalog {
    pub fn on_notice(&mut self, notice: &ProcessNotice) {
        let key = (notice.tgid, notice.generation);
        if notice.kind == NoticeKind::FirstSeen as u32 {
            self.current.insert(notice.tgid, notice.generation);
            if notice.parent != 0 {
                // A forked child starts in a copy of its parent's address
                // space; by now it may have exec'd, and /proc would show
                // the new image: the parent's first, /proc only if it
                // still runs the same program (`capture`).
                self.processes.entry(key).or_insert_with(|| ProcessInfo {
                    pid: notice.tgid,
                    ..Default::default()
                });
                self.inherit_from(key, notice.parent);
            }
            self.capture(key);
        } else if notice.kind == NoticeKind::Exited as u32
            || notice.kind == NoticeKind::Replaced as u32
        {
            if notice.kind == NoticeKind::Exited as u32 {
                self.current.remove(&notice.tgid);
            }
            if let Some(process) = self.processes.get_mut(&key) {
                process.exited = true;
                if notice.kind == NoticeKind::Replaced as u32
                    && process.named_at_ns > notice.time_ns
                {
                    process.named_by_a_later_image();
                }
            }
            let image = ProcessImage {
                tgid: notice.tgid,
                generation: notice.generation,
            };
            let ended = EndedImage {
                image,
                end_ns: notice.time_ns,
                replaced: notice.kind == NoticeKind::Replaced as u32,
            };
            if let Some(kept) = self.ended.as_mut() {
                kept.push(ended);
            }
            if let Some(exits) = self.exits.as_mut() {
                exits.push(ended);
            }
        }
    }

    /// A process memprof attaches to: read /proc now, while it surely
    /// runs (it may exit right after its first allocation). Its first
    /// image memprof sees is generation 0.
    pub fn attach_to(&mut self, pid: u32) {
        self.current.insert(pid, 0);
        self.capture((pid, 0));
    }

    /// The images that ended since the last call.
    pub fn take_ended(&mut self) -> Vec<EndedImage> {
        self.ended.as_mut().map(std::mem::take).unwrap_or_default()
    }

    /// From now on ended images are kept for `take_ended` (live mode, whose
    /// housekeeping takes them).
    pub fn keep_ended(&mut self) {
        self.ended.get_or_insert_with(Vec::new);
    }

    /// A forked child that exited before /proc could be read: it ran in a
    /// copy of its parent's address space.
    fn inherit_from(&mut self, key: (u32, u32), parent: u32) {
        // The parent's latest image: the one that forked (it may have
        // exited since, and been forgotten).
        let Some(parent) = self
            .processes
            .iter()
            .chain(self.forgotten.iter().map(|(key, info)| (key, info)))
            .filter(|((pid, _), _)| *pid == parent)
            .max_by(|((_, a), _), ((_, b), _)| generation_order(*a, *b))
            .map(|(_, info)| info.clone())
        else {
            return;
        };
        let Some(child) = self.processes.get_mut(&key) else {
            return;
        };
        if child.mappings.is_empty() {
            child.mappings = parent.mappings;
            // The program it runs, until it execs (see `named_by_a_later_image`).
            child.loaded_program = parent.loaded_program.or_else(|| parent.exe.clone());
            child.announced = child.mappings.iter().map(|m| m.start).collect();
            child.exe = child.exe.take().or(parent.exe);
            if child.command.is_empty() {
                child.command = parent.command;
            }
        }
    }

    /// The loader reported an object loaded at `base`: where its code lies
    /// follows from its ELF headers, whether or not the process is still
    /// there to read /proc from.
    pub fn on_library(&mut self, notice: &LibraryNotice) {
        let (pid, generation) = (notice.tgid, notice.generation);
        let named = c_string(&notice.path);
        let path = if notice.index == 0 {
            program_path(pid, &named)
        } else {
            // The loader's name may go through symlinks (/lib -> usr/lib);
            // /proc shows the resolved path: use one spelling.
            Some(
                fs::canonicalize(&named)
                    .map(|p| p.display().to_string())
                    .unwrap_or(named),
            )
        };
        // Skips the vDSO ("linux-vdso.so.1"): no file behind it.
        let Some(path) = path.filter(|p| p.starts_with('/')) else {
            return;
        };
        // The file as the process sees it (through its root).
        let file = file_of(pid, &path);
        let segments = match file_identity(&file) {
            Some(identity) => self
                .segments
                .entry(identity)
                .or_insert_with(|| file_code_segments(&file.display().to_string()))
                .clone(),
            None => Vec::new(),
        };
        let process = self
            .processes
            .entry((pid, generation))
            .or_insert_with(|| ProcessInfo {
                pid,
                ..Default::default()
            });
        if notice.index == 0 {
            if process.command.is_empty() {
                process.command = file_name(&path);
            }
            process.exe.get_or_insert_with(|| path.clone());
            process.loaded_program = Some(path.clone());
        }
        for segment in segments {
            // Page-aligned, as the kernel maps it (and /proc shows it).
            let start = notice.base.wrapping_add(segment.vaddr);
            let mapping = Mapping {
                start: start & PAGE_MASK,
                end: start.wrapping_add(segment.memsz),
                file_offset: segment.offset & PAGE_MASK,
                path: path.clone(),
                // Just loaded, from that path.
                deleted: false,
            };
            process.announced.push(mapping.start);
            if !process.mappings.iter().any(|m| m.start == mapping.start) {
                process.mappings.push(mapping);
            }
        }
        process.mappings.sort_by_key(|m| m.start);
    }

    /// Reads what /proc has on the process now; keeps older mappings when
    /// the process is already gone.
    fn capture(&mut self, (pid, generation): (u32, u32)) {
        let entry = self
            .processes
            .entry((pid, generation))
            .or_insert_with(|| ProcessInfo {
                pid,
                ..Default::default()
            });
        if let Some(fresh) = read_proc(pid) {
            if entry.exe.is_some() && fresh.exe.is_some() && fresh.exe != entry.exe
                || another_address_space(&entry.mappings, &fresh.mappings)
            {
                // The pid runs another program now, or the same one again
                // (it exec'd since this image was seen: a forked shell that
                // ran `sh`): what /proc shows is not this image's.
                return;
            }
            // A process whose address space is being torn down (it exits)
            // shows part of its maps and no exe: what was read before, or
            // inherited from its parent, is the better picture then.
            let torn_down = fresh.exe.is_none();
            if entry.named_at_ns == 0 {
                entry.named_at_ns = crate::collect::heap::monotonic_ns();
            }
            if !fresh.command.is_empty() {
                entry.command = fresh.command;
            }
            if !fresh.cmdline.is_empty() {
                entry.cmdline = fresh.cmdline;
            }
            if !torn_down {
                entry.exe = fresh.exe;
            }
            if fresh.cgroup.is_some() {
                entry.cgroup = fresh.cgroup;
                entry.container = fresh.container;
            }
            // A read that shows no mapping memprof does not know already
            // is a partial picture (seen on 6.18: an old address space
            // half torn down while the pid runs its next image), or shows
            // a library since unloaded gone (its frames are still to be
            // named).
            if adds_a_mapping(&entry.mappings, &fresh.mappings)
                && (!torn_down || entry.mappings.is_empty())
            {
                entry.mappings = fresh.mappings;
                entry.hold_deleted_files();
            }
        } else if entry.mappings.is_empty() {
            entry.exited = true;
        }
    }

    /// Re-reads the maps of live processes (they may have loaded libraries)
    /// and learns about processes whose notice was lost.
    pub fn refresh(&mut self, seen: impl IntoIterator<Item = (u32, u32)>) {
        for key in seen {
            let is_current = self.current.get(&key.0).is_none_or(|&g| g == key.1);
            match self.processes.get(&key) {
                Some(process) if process.exited || !is_current => {}
                // An older image of a pid that exec'd since: /proc shows the new one.
                None if !is_current => {}
                _ => self.capture(key),
            }
        }
    }

    /// Drops evicted images (`monitor`), and the code segments of files
    /// once there are more than `max_files` (read again when needed).
    pub fn forget(&mut self, images: &std::collections::HashSet<ProcessImage>, max_files: usize) {
        for image in images {
            let key = (image.tgid, image.generation);
            let Some(mut info) = self.processes.remove(&key) else {
                continue;
            };
            if info.mappings.is_empty() {
                continue;
            }
            // What a child needs (its frames are named from the files).
            info.held_files.clear();
            if self.forgotten.len() == FORGOTTEN_KEPT {
                self.forgotten.pop_front();
            }
            self.forgotten.push_back((key, info));
        }
        if self.segments.len() > max_files {
            self.segments.clear();
        }
    }

    /// Ended images kept for `monitor`'s eviction (none unless
    /// `keep_exits` was called).
    pub fn take_exits(&mut self) -> Vec<EndedImage> {
        std::mem::take(self.exits.get_or_insert_with(Vec::new))
    }

    /// From now on ended images are also kept for `take_exits`.
    pub fn keep_exits(&mut self) {
        self.exits.get_or_insert_with(Vec::new);
    }

    pub fn get(&self, pid: u32, generation: u32) -> Option<&ProcessInfo> {
        self.processes.get(&(pid, generation))
    }

    /// The image generation each running pid is at, as far as memprof
    /// heard (an exec or a new process reusing a pid moves it on).
    pub fn current_generations(&self) -> &HashMap<u32, u32> {
        &self.current
    }

    /// Of the pids `wanted` takes, each one's newest image that ended
    /// (exit or exec), as far as memprof heard and still keeps it (its pid
    /// may run a new process already).
    pub fn ended_generations(&self, wanted: impl Fn(u32) -> bool) -> HashMap<u32, u32> {
        let mut last: HashMap<u32, u32> = HashMap::new();
        for (&(tgid, generation), info) in &self.processes {
            if !info.exited || !wanted(tgid) {
                continue;
            }
            let kept = last.entry(tgid).or_insert(generation);
            if memprof_common::images::generation_order(generation, *kept).is_gt() {
                *kept = generation;
            }
        }
        last
    }
}

/// Where the code of the ELF file at `path` lies; none when the file
/// cannot be read or is malformed (only this object's frames are then
/// unknown: the notice thread, and every other process, go on).
fn file_code_segments(path: &str) -> Vec<CodeSegment> {
    let Ok(data) = fs::read(path) else {
        return Vec::new();
    };
    guard::contained(|| code_segments(&data))
        .ok()
        .and_then(Result::ok)
        .unwrap_or_default()
}

/// The text of a NUL-terminated path buffer.
pub fn c_string(bytes: &[u8]) -> String {
    let end = bytes.iter().position(|&b| b == 0).unwrap_or(bytes.len());
    String::from_utf8_lossy(&bytes[..end]).into_owned()
}

fn file_name(path: &str) -> String {
    path.rsplit('/').next().unwrap_or(path).to_string()
}

/// The program a process runs, from the path it was exec'd with: relative
/// paths are taken from its working directory, or memprof's when the
/// process is gone (the same for `trace`'s command and most children).
fn program_path(pid: u32, execd: &str) -> Option<String> {
    if execd.is_empty() {
        return program_link(&live_dir(pid).join("exe"));
    }
    let path = Path::new(execd);
    let absolute = if path.is_absolute() {
        path.to_path_buf()
    } else {
        let cwd = fs::read_link(format!("/proc/{pid}/cwd"))
            .or_else(|_| std::env::current_dir())
            .ok()?;
        cwd.join(path)
    };
    let canonical = fs::canonicalize(&absolute).unwrap_or(absolute);
    Some(canonical.display().to_string())
}

/// The CPU time process `pid` has taken, all its threads, in ns (its
/// process CPU clock), while it runs.
pub fn cpu_time_ns(pid: u32) -> Option<u64> {
    let clock = nix::time::clock_getcpuclockid(nix::unistd::Pid::from_raw(pid as i32)).ok()?;
    let time = nix::time::clock_gettime(clock).ok()?;
    Some(time.tv_sec() as u64 * 1_000_000_000 + time.tv_nsec() as u64)
}

/// The parent of process `pid` (/proc/PID/stat field 4), while it runs.
pub fn parent_of(pid: u32) -> Option<u32> {
    let stat = fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    stat_fields_after_name(&stat).nth(1)?.parse().ok()
}

/// Whether process `pid` is stopped by a stop signal it sent itself:
/// stopped (/proc/PID/stat state T) on its way out of kill, tkill or
/// tgkill with a stop signal (/proc/PID/syscall: x86-64 numbers). Not a
/// process memprof stopped (that one is in no such call).
pub fn stopped_itself(pid: u32) -> bool {
    is_stopped(pid)
        && fs::read_to_string(format!("/proc/{pid}/syscall"))
            .is_ok_and(|call| sends_itself_a_stop(&call))
}

/// Whether process `pid` is stopped by a signal (state T; not t, a
/// debugger's stop).
pub fn is_stopped(pid: u32) -> bool {
    fs::read_to_string(format!("/proc/{pid}/stat"))
        .is_ok_and(|stat| stat_fields_after_name(&stat).next() == Some("T"))
}

/// A /proc/PID/syscall line of a kill, tkill or tgkill sending a stop
/// signal (SIGSTOP, SIGTSTP, SIGTTIN, SIGTTOU).
fn sends_itself_a_stop(call: &str) -> bool {
    let words: Vec<u64> = call
        .split_whitespace()
        .map_while(|word| match word.strip_prefix("0x") {
            Some(hex) => u64::from_str_radix(hex, 16).ok(),
            None => word.parse().ok(),
        })
        .collect();
    let signal = match words.first() {
        Some(62 | 200) => words.get(2),
        Some(234) => words.get(3),
        _ => None,
    };
    signal.is_some_and(|&signal| (19..=22).contains(&signal))
}

/// Whether a child of process `pid` is stopped by a signal (state T).
pub fn has_stopped_child(pid: u32) -> bool {
    children()
        .get(&pid)
        .is_some_and(|children| children.iter().any(|&child| is_stopped(child)))
}

/// Each running process's children, from every process's parent (the
/// kernel here keeps no list of children: CONFIG_PROC_CHILDREN is off).
pub fn children() -> HashMap<u32, Vec<u32>> {
    let mut children: HashMap<u32, Vec<u32>> = HashMap::new();
    for entry in fs::read_dir("/proc").into_iter().flatten().flatten() {
        let Some(pid) = entry.file_name().to_str().and_then(|n| n.parse().ok()) else {
            continue;
        };
        if let Some(parent) = parent_of(pid) {
            children.entry(parent).or_default().push(pid);
        }
    }
    children
}

/// The processes descended from `root` in `children`, but those under a
/// process `stop` says to leave out (and that process itself).
pub fn descendants(
    children: &HashMap<u32, Vec<u32>>,
    root: u32,
    stop: impl Fn(u32) -> bool,
) -> Vec<u32> {
    let mut found = Vec::new();
    let mut next = vec![root];
    while let Some(pid) = next.pop() {
        for &child in children.get(&pid).into_iter().flatten() {
            if child != root && !stop(child) && !found.contains(&child) {
                found.push(child);
                next.push(child);
            }
        }
    }
    found
}

/// When process `pid` started (clock ticks since boot, /proc/PID/stat
/// field 22): with the pid, who it is. None once it is gone (a zombie
/// included; not one whose main thread alone has ended, pthread_exit,
/// while others run on).
pub fn start_time(pid: u32) -> Option<u64> {
    let stat = fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    if has_ended(pid, &stat) {
        return None;
    }
    // Fields 4 to 21 come between the state (3) and the start time (22).
    stat_fields_after_name(&stat).nth(19)?.parse().ok()
}

/// Whether process `pid`, whose /proc/PID/stat reads `stat`, has ended:
/// its main thread is a zombie and no other thread runs on (after the
/// main thread's pthread_exit the others may).
pub fn has_ended(pid: u32, stat: &str) -> bool {
    thread_ended(stat) && !process_runs(pid)
}

/// Whether the thread whose /proc stat reads `stat` has ended: a zombie,
/// or dead.
fn thread_ended(stat: &str) -> bool {
    matches!(stat_fields_after_name(stat).next(), Some("Z" | "X"))
}

/// Whether process `pid` started after `instant` (to the clock tick).
pub fn started_after(pid: u32, instant: std::time::Instant) -> bool {
    let Some(ticks) = start_time(pid) else {
        return false;
    };
    let Ok(Some(per_sec)) = nix::unistd::sysconf(nix::unistd::SysconfVar::CLK_TCK) else {
        return false;
    };
    let Ok(boot) = nix::time::clock_gettime(nix::time::ClockId::CLOCK_BOOTTIME) else {
        return false;
    };
    let uptime = std::time::Duration::from(boot);
    let age = uptime.saturating_sub(std::time::Duration::from_secs_f64(
        ticks as f64 / per_sec as f64,
    ));
    std::time::Instant::now()
        .checked_sub(age)
        .is_some_and(|started| started > instant)
}

/// True while any thread of process `tgid` still runs: its main thread
/// may have ended (pthread_exit) while others go on.
pub fn process_runs(tgid: u32) -> bool {
    live_thread(tgid).is_some()
}

/// A thread of process `tgid` that has not ended, if any.
pub fn live_thread(tgid: u32) -> Option<u32> {
    let threads = fs::read_dir(format!("/proc/{tgid}/task")).ok()?;
    threads.flatten().find_map(|thread| running_thread(&thread))
}

/// Every thread of process `tgid` that has not ended.
pub fn live_threads(tgid: u32) -> Vec<u32> {
    let Ok(threads) = fs::read_dir(format!("/proc/{tgid}/task")) else {
        return Vec::new();
    };
    threads
        .flatten()
        .filter_map(|thread| running_thread(&thread))
        .collect()
}

/// The thread id of /proc/PID/task entry `thread`, unless it has ended.
fn running_thread(thread: &fs::DirEntry) -> Option<u32> {
    let stat = fs::read_to_string(thread.path().join("stat")).ok()?;
    if thread_ended(&stat) {
        return None;
    }
    thread.file_name().to_str()?.parse().ok()
}

/// Whether process `pid`'s main thread has ended (a zombie, or dead),
/// whether or not other threads run on.
pub fn main_thread_ended(pid: u32) -> bool {
    fs::read_to_string(format!("/proc/{pid}/stat")).is_ok_and(|stat| thread_ended(&stat))
}

/// The /proc directory to read process `pid`'s links and files through
/// (exe, root, cgroup): /proc/PID, or once its main thread has ended
/// (pthread_exit) while others run on, a live thread's
/// /proc/PID/task/TID: /proc/PID answers through the main thread then,
/// its exe and root gone, its cgroup the hierarchies' roots.
pub fn live_dir(pid: u32) -> PathBuf {
    let dir = PathBuf::from(format!("/proc/{pid}"));
    match main_thread_ended(pid).then(|| live_thread(pid)).flatten() {
        Some(tid) => dir.join(format!("task/{tid}")),
        None => dir,
    }
}

/// The text of the process's /proc maps (see
/// [`read_maps_through_a_thread`]).
pub fn read_maps_text(pid: u32) -> Option<String> {
    read_maps_through_a_thread(pid).map(|(maps, _)| maps)
}

/// The text of the process's /proc maps and the /proc directory it was
/// read through. A process whose main thread has ended (pthread_exit)
/// while others run shows an empty /proc/PID/maps (the kernel reads the
/// address space through the main thread): then a live thread's own
/// maps are read, in /proc/PID/task/TID. The files they name are to be
/// opened through that directory's `root` too: /proc/PID/root is gone
/// with the main thread.
pub fn read_maps_through_a_thread(pid: u32) -> Option<(String, PathBuf)> {
    let dir = PathBuf::from(format!("/proc/{pid}"));
    let maps = fs::read_to_string(dir.join("maps")).ok()?;
    if !maps.is_empty() {
        return Some((maps, dir));
    }
    let threads = fs::read_dir(dir.join("task")).ok()?;
    threads
        .flatten()
        .filter_map(|thread| {
            Some((
                fs::read_to_string(thread.path().join("maps")).ok()?,
                thread.path(),
            ))
        })
        .find(|(maps, _)| !maps.is_empty())
        .or(Some((maps, dir)))
}

fn read_proc(pid: u32) -> Option<ProcessInfo> {
    let (maps, dir) = read_maps_through_a_thread(pid)?;
    let mut mappings: Vec<Mapping> = maps.lines().filter_map(parse_maps_line).collect();
    mappings.sort_by_key(|m| m.start);
    let command = fs::read_to_string(format!("/proc/{pid}/comm"))
        .map(|c| c.trim_end().to_string())
        .unwrap_or_default();
    // Through the same thread: the main thread's is empty once it ended.
    let cmdline = fs::read(dir.join("cmdline"))
        .map(|raw| {
            raw.split(|&b| b == 0)
                .filter(|a| !a.is_empty())
                .map(|a| String::from_utf8_lossy(a).into_owned())
                .collect()
        })
        .unwrap_or_default();
    // Read after the maps, through the same thread: no exe means the
    // address space was going while the maps were read.
    let exe = program_link(&dir.join("exe"));
    let cgroups = fs::read_to_string(format!("/proc/{pid}/cgroup")).unwrap_or_default();
    let groups = cgroup_paths(&cgroups);
    // The unified hierarchy's ("0::/path") names the process's cgroup.
    let cgroup = cgroups
        .lines()
        .find_map(|line| line.strip_prefix("0::").map(str::to_string))
        .or_else(|| groups.first().cloned());
    Some(ProcessInfo {
        pid,
        command,
        cmdline,
        exe,
        mappings,
        container: groups.iter().find_map(|group| container_of(group)),
        cgroup,
        ..Default::default()
    })
}

/// The cgroup paths of process `pid`, one per hierarchy
/// ("/system.slice/x.service").
pub fn cgroups_of(pid: u32) -> Vec<String> {
    cgroup_paths(&fs::read_to_string(live_dir(pid).join("cgroup")).unwrap_or_default())
}

/// The paths of a /proc/PID/cgroup text ("ID:CONTROLLERS:PATH" lines).
fn cgroup_paths(text: &str) -> Vec<String> {
    text.lines()
        .filter_map(|line| Some(line.splitn(3, ':').nth(2)?.to_string()))
        .filter(|path| !path.is_empty())
        .collect()
}

/// The container a cgroup path names: its last component holding a
/// 64-hex-digit id (docker-ID.scope, cri-containerd-ID.scope,
/// libpod-ID.scope, /docker/ID, /kubepods/.../ID), as its first 12.
pub fn container_of(cgroup: &str) -> Option<String> {
    // Bytes, not chars: a cgroup name may hold any UTF-8.
    let lower_hex = |b: &u8| b.is_ascii_digit() || (b'a'..=b'f').contains(b);
    cgroup.rsplit('/').find_map(|component| {
        let bytes = component.as_bytes();
        (0..bytes.len().saturating_sub(63)).find_map(|start| {
            let id = &bytes[start..start + 64];
            let bounded = !bytes.get(start + 64).is_some_and(u8::is_ascii_hexdigit);
            let starts = start == 0 || !bytes[start - 1].is_ascii_hexdigit();
            (id.iter().all(lower_hex) && bounded && starts)
                .then(|| String::from_utf8_lossy(&id[..12]).into_owned())
        })
    })
}

/// Device and inode: which file a path names.
fn file_identity(path: &Path) -> Option<(u64, u64)> {
    use std::os::unix::fs::MetadataExt as _;
    fs::metadata(path).ok().map(|m| (m.dev(), m.ino()))
}

/// A file of process `pid`, by the path its maps give: through the
/// process's root when that shows it (another mount namespace: a
/// container, a service's PrivateTmp), else as is.
/// The path itself when it names the same file here (as reports should
/// show it).
pub fn file_of(pid: u32, path: &str) -> std::path::PathBuf {
    let mut in_root = under_root(Path::new(&format!("/proc/{pid}")), path);
    let mut own = file_identity(&in_root);
    if own.is_none() {
        // Its main thread may have ended, and its root with it.
        in_root = under_root(&live_dir(pid), path);
        own = file_identity(&in_root);
    }
    if own.is_none() || own == file_identity(Path::new(path)) {
        std::path::PathBuf::from(path)
    } else {
        in_root
    }
}

/// `path` (absolute, as a process's maps give it) inside the root of the
/// /proc directory `dir` (/proc/PID, or a thread's: [`live_dir`]).
pub fn under_root(dir: &Path, path: &str) -> PathBuf {
    let mut in_root = dir.join("root").into_os_string();
    in_root.push(path);
    in_root.into()
}

/// The file `mapping` of process `pid` maps, as memprof can open it while
/// the process runs: by its path ([`file_of`]), unless the kernel marks it
/// deleted (a library upgraded under a running process, a program run from
/// a memfd as runc runs itself): that path names another file then, or
/// none, and /proc/PID/map_files/START-END opens the very file mapped
/// (the kernel follows it for probes too).
pub fn mapped_file(pid: u32, mapping: &Mapping) -> PathBuf {
    match mapping.deleted {
        true => map_files_path(pid, mapping.start, mapping.end),
        false => file_of(pid, &mapping.path),
    }
}

/// The files process `pid`'s maps (`maps`, its /proc/PID/maps text) map
/// executable, once each: by their paths in its maps, and as memprof opens
/// them ([`mapped_file`]).
pub fn executable_files(pid: u32, maps: &str) -> Vec<(String, PathBuf)> {
    let mut files: Vec<(String, PathBuf)> = Vec::new();
    for mapping in maps.lines().filter_map(parse_maps_line) {
        if mapping.path.starts_with('/') && !files.iter().any(|(path, _)| *path == mapping.path) {
            let file = mapped_file(pid, &mapping);
            files.push((mapping.path, file));
        }
    }
    files
}

/// The file a /proc/PID link (`exe`, `map_files/START-END`) names, by its
/// path less the kernel's " (deleted)" mark (a program or library replaced
/// since it was mapped, an upgrade, is still that file, in reports and
/// labels, before and after), and whether it was marked.
fn read_proc_link(link: &Path) -> Option<(String, bool)> {
    let target = fs::read_link(link).ok()?.display().to_string();
    Some(match target.strip_suffix(" (deleted)") {
        Some(path) => (path.to_string(), true),
        None => (target, false),
    })
}

/// The program a /proc/PID/exe `link` names (see [`read_proc_link`]).
pub fn program_link(link: &Path) -> Option<String> {
    read_proc_link(link).map(|(path, _)| path)
}

/// The program process `pid` runs: its path as /proc shows it (less the
/// " (deleted)" mark), and its file as memprof opens it (through the
/// process's root; deleted, through /proc/PID/exe: a program run from a
/// memfd, or replaced since it started).
pub fn program_file(pid: u32) -> Option<(String, PathBuf)> {
    let exe = live_dir(pid).join("exe");
    let (path, deleted) = read_proc_link(&exe)?;
    let file = match deleted {
        true => exe,
        false => file_of(pid, &path),
    };
    Some((path, file))
}

/// The file process `pid` maps at [start, end), whatever its path now.
pub fn map_files_path(pid: u32, start: u64, end: u64) -> PathBuf {
    PathBuf::from(format!("/proc/{pid}/map_files/{start:x}-{end:x}"))
}

/// The file name processes' maps show for `file` as memprof opens it:
/// maps name the file itself, where a loader may have named a symlink
/// (`libtcmalloc.so.4` for `libtcmalloc.so.4.5.10`).
pub fn mapped_file_name(file: &Path) -> String {
    // Not canonicalize: an absolute link inside a container's root
    // (reached through /proc/PID/root) would be followed on the host.
    let root = root_prefix(file);
    let mut path = file.to_path_buf();
    if root.is_some() || !path.starts_with("/proc/") {
        for _ in 0..8 {
            let Ok(target) = fs::read_link(&path) else {
                break;
            };
            path = match (&root, target.is_absolute()) {
                (Some(root), true) => {
                    Path::new(root).join(target.strip_prefix("/").unwrap_or(&target))
                }
                (None, true) => target,
                (_, false) => path.parent().unwrap_or(Path::new("/")).join(target),
            };
        }
    }
    let shown = path_in_maps(&path);
    shown.rsplit('/').next().unwrap_or("").to_string()
}

/// `/proc/PID/root` (or a thread's `/proc/PID/task/TID/root`) when
/// `file` is reached through it.
fn root_prefix(file: &Path) -> Option<String> {
    let (dir, rest) = split_proc_dir(file.to_str()?)?;
    rest.starts_with("root/").then(|| format!("{dir}/root"))
}

/// `path` split after the /proc directory it starts with, /proc/PID or a
/// thread's /proc/PID/task/TID ([`live_dir`]): (that directory, the
/// rest).
fn split_proc_dir(path: &str) -> Option<(&str, &str)> {
    let (pid, mut rest) = path.strip_prefix("/proc/")?.split_once('/')?;
    pid.parse::<u32>().ok()?;
    if let Some((tid, after)) = rest.strip_prefix("task/").and_then(|r| r.split_once('/')) {
        if tid.parse::<u32>().is_ok() {
            rest = after;
        }
    }
    Some((&path[..path.len() - rest.len() - 1], rest))
}

/// A file's path as its processes' maps show it, for `file` as memprof
/// opens it: less the /proc/PID/root it was reached through; for
/// /proc/PID/map_files/START-END and /proc/PID/exe (a deleted file,
/// [`mapped_file`], [`program_file`]) the path the kernel gives, less its
/// " (deleted)" mark.
pub fn path_in_maps(file: &Path) -> String {
    let path = file.to_string_lossy();
    let Some((_, rest)) = split_proc_dir(&path) else {
        return path.into_owned();
    };
    if let Some(in_root) = rest.strip_prefix("root").filter(|r| r.starts_with('/')) {
        return in_root.to_string();
    }
    match rest.starts_with("map_files/") || rest == "exe" {
        true => read_proc_link(file).map_or_else(|| path.into_owned(), |(target, _)| target),
        false => path.into_owned(),
    }
}

/// Whether `fresh` holds a mapping `known` lacks.
fn adds_a_mapping(known: &[Mapping], fresh: &[Mapping]) -> bool {
    fresh.iter().any(|mapping| {
        !known
            .iter()
            .any(|k| k.start == mapping.start && k.path == mapping.path)
    })
}

/// Whether two lists of mappings are of different address spaces: a file
/// both map lies at different addresses (each exec places its files
/// anew). Unknown (nothing in common): false.
fn another_address_space(known: &[Mapping], fresh: &[Mapping]) -> bool {
    let fresh = lowest_addresses(fresh);
    lowest_addresses(known)
        .into_iter()
        .any(|(path, start)| fresh.get(path).is_some_and(|&other| other != start))
}

/// Each mapped file's lowest address (a refresh compares every live
/// process's mappings: no search per file).
fn lowest_addresses(mappings: &[Mapping]) -> HashMap<&str, u64> {
    let mut lowest: HashMap<&str, u64> = HashMap::new();
    for mapping in mappings {
        let start = lowest.entry(mapping.path.as_str()).or_insert(mapping.start);
        *start = (*start).min(mapping.start);
    }
    lowest
}

/// One line of /proc/PID/maps: "start-end perms offset dev inode path".
pub struct MapsLine<'a> {
    pub start: u64,
    pub end: u64,
    pub perms: &'a str,
    pub offset: u64,
    pub inode: u64,
    /// The rest of the line (a path may hold spaces), less the kernel's
    /// " (deleted)" mark; empty for an anonymous mapping.
    pub path: &'a str,
    /// The kernel's " (deleted)" mark.
    pub deleted: bool,
}

pub fn maps_line(line: &str) -> Option<MapsLine<'_>> {
    let mut rest = line;
    let mut fields = [""; 5];
    for field in &mut fields {
        rest = rest.trim_start();
        let end = rest.find(' ').unwrap_or(rest.len());
        *field = &rest[..end];
        rest = &rest[end..];
    }
    let path = rest.trim();
    let deleted = path.strip_suffix(" (deleted)");
    let (start, end) = fields[0].split_once('-')?;
    Some(MapsLine {
        start: u64::from_str_radix(start, 16).ok()?,
        end: u64::from_str_radix(end, 16).ok()?,
        perms: fields[1],
        offset: u64::from_str_radix(fields[2], 16).ok()?,
        inode: fields[4].parse().ok()?,
        path: deleted.unwrap_or(path),
        deleted: deleted.is_some(),
    })
}

/// Executable mappings of files (and the vDSO) only.
pub fn parse_maps_line(line: &str) -> Option<Mapping> {
    let line = maps_line(line)?;
    if !line.perms.contains('x') || !(line.path.starts_with('/') || line.path == "[vdso]") {
        return None;
    }
    Some(Mapping {
        start: line.start,
        end: line.end,
        file_offset: line.offset,
        path: line.path.to_string(),
        deleted: line.deleted,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A page of `path` mapped at `start`.
    fn at(start: u64, path: &str) -> Mapping {
        Mapping {
            start,
            end: start + 0x1000,
            file_offset: 0,
            path: path.to_string(),
            deleted: false,
        }
    }

    #[test]
    fn the_same_program_placed_elsewhere_is_another_address_space() {
        let forked = [
            at(0x5610_0000, "/usr/bin/dash"),
            at(0x7f00_0000, "/usr/lib/libc.so.6"),
        ];
        let execd = [
            at(0x5564_0000, "/usr/bin/dash"),
            at(0x7f81_0000, "/usr/lib/libc.so.6"),
        ];
        assert!(another_address_space(&forked, &execd));
        assert!(!another_address_space(&forked, &forked));
        // Nothing in common, or nothing known: no telling.
        assert!(!another_address_space(&forked, &[at(0x1000, "/bin/cat")]));
        assert!(!another_address_space(&[], &execd));
    }

    /// /proc read after the image was exec'd over named the next image
    /// (dash taking the name of the sqlite3 it exec'd): at the exec's
    /// notice the loader's word for the program stands.
    #[test]
    fn an_image_named_from_proc_after_its_exec_takes_its_loaders_name() {
        const PID: u32 = 4_000_001;
        let mut catalog = Catalog::default();
        catalog.on_library(&LibraryNotice {
            generation: 7,
            ..dash_loaded(PID)
        });
        let notice = |kind: NoticeKind, generation: u32, time_ns: u64| ProcessNotice {
            kind: kind as u32,
            tgid: PID,
            generation,
            parent: 0,
            time_ns,
        };
        // What a read of /proc 2 ms after the exec (at 1 ms) shows.
        let named_later = |catalog: &mut Catalog, generation: u32| {
            let image = catalog.processes.get_mut(&(PID, generation)).unwrap();
            image.command = "sqlite3".into();
            image.exe = Some("/usr/bin/sqlite3".into());
            image.cmdline = vec!["sqlite3".into(), ":memory:".into()];
            image.mappings.push(at(0x7000_0000, "/usr/bin/sqlite3"));
            image.named_at_ns = 3_000_000;
        };
        named_later(&mut catalog, 7);
        catalog.on_notice(&notice(NoticeKind::Replaced, 7, 1_000_000));
        let image = catalog.get(PID, 7).unwrap();
        assert_eq!(image.command, "dash");
        assert_eq!(image.exe.as_deref(), Some("/usr/bin/dash"));
        assert!(image.cmdline.is_empty());
        assert!(!image.mappings.is_empty());
        assert!(image.mappings.iter().all(|m| m.path == "/usr/bin/dash"));
        // Read before the exec: what /proc said stands.
        catalog.on_library(&LibraryNotice {
            generation: 8,
            ..dash_loaded(PID)
        });
        named_later(&mut catalog, 8);
        catalog.on_notice(&notice(NoticeKind::Replaced, 8, 5_000_000));
        assert_eq!(catalog.get(PID, 8).unwrap().command, "sqlite3");
    }

    /// A daemon's start (`monitor`): the parent forks and exits, and is
    /// forgotten; the child's first call comes later and it ends before
    /// /proc is read. It still ran in a copy of its parent's space.
    #[test]
    fn a_child_of_a_forgotten_image_inherits_its_mappings() {
        const PARENT: u32 = 4_000_003;
        const CHILD: u32 = 4_000_004;
        let mut catalog = Catalog::default();
        catalog.on_library(&LibraryNotice {
            generation: 5,
            ..dash_loaded(PARENT)
        });
        let parents = catalog.get(PARENT, 5).unwrap().mappings.clone();
        assert!(!parents.is_empty());
        let image = ProcessImage {
            tgid: PARENT,
            generation: 5,
        };
        catalog.forget(&[image].into_iter().collect(), usize::MAX);
        assert!(catalog.get(PARENT, 5).is_none());
        catalog.on_notice(&ProcessNotice {
            kind: NoticeKind::FirstSeen as u32,
            tgid: CHILD,
            generation: 9,
            parent: PARENT,
            time_ns: 0,
        });
        let child = catalog.get(CHILD, 9).unwrap();
        assert_eq!(child.mappings, parents);
        assert_eq!(child.exe.as_deref(), Some("/usr/bin/dash"));
    }

    /// The loader's notice of the program `/usr/bin/dash`.
    fn dash_loaded(pid: u32) -> LibraryNotice {
        let mut path = [0u8; memprof_common::notices::PATH_MAX];
        path[..13].copy_from_slice(b"/usr/bin/dash");
        LibraryNotice {
            kind: NoticeKind::Library as u32,
            tgid: pid,
            generation: 0,
            index: 0,
            held: 0,
            _reserved: 0,
            base: 0x5000_0000,
            path,
        }
    }

    #[test]
    fn a_stopped_child_is_found_and_its_cpu_time_moves_only_when_it_runs() {
        let mut child = std::process::Command::new("sh")
            .args(["-c", "while :; do :; done"])
            .spawn()
            .unwrap();
        let (pid, me) = (child.id(), std::process::id());
        // SAFETY: sends a signal to the test's own child, nothing else.
        let signal = |signal| unsafe { libc::kill(pid as i32, signal) };
        let settle = || std::thread::sleep(std::time::Duration::from_millis(50));
        settle();
        assert!(!has_stopped_child(me));
        signal(libc::SIGSTOP);
        settle();
        assert!(has_stopped_child(me));
        let stopped_at = cpu_time_ns(pid).unwrap();
        settle();
        assert_eq!(cpu_time_ns(pid), Some(stopped_at));
        signal(libc::SIGCONT);
        settle();
        assert!(!has_stopped_child(me));
        assert!(cpu_time_ns(pid).unwrap() > stopped_at);
        child.kill().unwrap();
        child.wait().unwrap();
    }

    #[test]
    fn a_stop_a_process_sent_itself_is_told_from_other_calls() {
        // su: kill(getpid(), SIGSTOP); raise(SIGTSTP) is a tgkill.
        assert!(sends_itself_a_stop(
            "62 0x40ce 0x13 0x7fff0405ec18 0x0 0x0 0x0 0x7ff 0x7fe"
        ));
        assert!(sends_itself_a_stop(
            "234 0x40ce 0x40ce 0x14 0x0 0x0 0x0 0x7ff 0x7fe"
        ));
        // A SIGTERM, a sleep, memprof's stop at a uprobe (no call).
        assert!(!sends_itself_a_stop(
            "62 0x40ce 0xf 0x7fff0405ec18 0x0 0x0 0x0 0x7ff 0x7fe"
        ));
        assert!(!sends_itself_a_stop(
            "230 0x0 0x0 0x7ffdb9e2f3d0 0x7ffd 0x0 0x0 0x7ff 0x7f9"
        ));
        assert!(!sends_itself_a_stop("-1 0x7ffdb9e2f3b8 0x7f9d424ff503"));
        assert!(!sends_itself_a_stop("running"));
    }

    #[test]
    fn parses_executable_file_mappings_only() {
        let text = "7f0000001000-7f0000002000 r-xp 00001000 fe:00 123 /usr/lib/libc.so.6\n\
                    7f0000002000-7f0000003000 rw-p 00002000 fe:00 123 /usr/lib/libc.so.6\n\
                    7ffc00000000-7ffc00001000 r-xp 00000000 00:00 0 [vdso]\n\
                    7ffd00000000-7ffd00001000 rwxp 00000000 00:00 0\n";
        let maps: Vec<_> = text.lines().filter_map(parse_maps_line).collect();
        assert_eq!(maps.len(), 2);
        assert_eq!(maps[0].file_offset, 0x1000);
        let process = ProcessInfo {
            mappings: maps,
            ..Default::default()
        };
        assert_eq!(
            process.mapping_of(0x7f0000001800).unwrap().path,
            "/usr/lib/libc.so.6"
        );
        assert!(process.mapping_of(0x7f0000002800).is_none());
    }

    #[test]
    fn a_partial_read_of_known_mappings_adds_nothing() {
        let known = [
            at(0x5610_0000, "/usr/bin/dash"),
            at(0x7f00_0000, "/usr/lib/libc.so.6"),
        ];
        assert!(!adds_a_mapping(&known, &known[..1]));
        assert!(!adds_a_mapping(&known, &[]));
        assert!(adds_a_mapping(
            &known,
            &[at(0x7f10_0000, "/usr/lib/libm.so.6")]
        ));
        assert!(adds_a_mapping(&[], &known));
    }

    #[test]
    fn a_path_with_spaces_is_read_whole() {
        let line =
            "7f0000001000-7f0000002000 r-xp 00001000 fe:00 77   /opt/my app/lib x.so (deleted)";
        let mapping = parse_maps_line(line).unwrap();
        assert_eq!(mapping.path, "/opt/my app/lib x.so");
        assert!(mapping.deleted);
        assert_eq!(maps_line(line).unwrap().inode, 77);
    }

    #[test]
    fn a_file_reached_through_a_process_root_is_named_as_in_its_maps() {
        let name = |path: &str| path_in_maps(Path::new(path));
        assert_eq!(
            name("/proc/123/root/usr/lib/libc.so.6"),
            "/usr/lib/libc.so.6"
        );
        assert_eq!(name("/usr/lib/libc.so.6"), "/usr/lib/libc.so.6");
        assert_eq!(name("/proc/self/root/x"), "/proc/self/root/x");
        // Through a thread's root (its main thread ended: `live_dir`).
        assert_eq!(
            name("/proc/123/task/124/root/usr/lib/libc.so.6"),
            "/usr/lib/libc.so.6"
        );
        assert_eq!(
            root_prefix(Path::new("/proc/123/task/124/root/usr/lib/x.so")).as_deref(),
            Some("/proc/123/task/124/root")
        );
        assert_eq!(root_prefix(Path::new("/proc/123/task/124/maps")), None);
        // A program as probed when deleted (`program_file`): its path.
        let own = fs::read_link("/proc/self/exe").unwrap();
        let exe = format!("/proc/{}/exe", std::process::id());
        assert_eq!(name(&exe), own.display().to_string());
    }

    /// A library replaced under a running process (an upgrade): its path
    /// names the new file, map_files the one mapped.
    #[test]
    fn a_deleted_file_is_opened_as_mapped_and_named_as_it_was() {
        use std::os::fd::AsRawFd as _;
        let path = std::env::temp_dir().join(format!("memprof-deleted-{}", std::process::id()));
        fs::write(&path, b"the old file").unwrap();
        let file = fs::File::open(&path).unwrap();
        // SAFETY: a private read-only mapping of a file of our own.
        let at = unsafe {
            libc::mmap(
                std::ptr::null_mut(),
                4096,
                libc::PROT_READ,
                libc::MAP_PRIVATE,
                file.as_raw_fd(),
                0,
            )
        };
        assert_ne!(at, libc::MAP_FAILED);
        fs::remove_file(&path).unwrap();
        fs::write(&path, b"the new one").unwrap();
        let maps = fs::read_to_string("/proc/self/maps").unwrap();
        let mapping = maps
            .lines()
            .filter_map(maps_line)
            .find(|line| line.start == at as u64)
            .map(|line| Mapping {
                start: line.start,
                end: line.end,
                file_offset: line.offset,
                path: line.path.to_string(),
                deleted: line.deleted,
            })
            .unwrap();
        let pid = std::process::id();
        let opened = mapped_file(pid, &mapping);
        assert_eq!(fs::read(&opened).unwrap(), b"the old file");
        assert_eq!(path_in_maps(&opened), path.display().to_string());
        fs::remove_file(&path).unwrap();
        // SAFETY: unmapped once, as mapped.
        unsafe { libc::munmap(at, 4096) };
    }

    #[test]
    fn a_librarys_file_name_is_the_one_maps_show_through_its_links() {
        let dir = std::env::temp_dir().join(format!("memprof-names-{}", std::process::id()));
        fs::create_dir_all(&dir).unwrap();
        fs::write(dir.join("libx.so.1.2.3"), b"").unwrap();
        let link = |target: &Path, name: &str| {
            let _ = fs::remove_file(dir.join(name));
            std::os::unix::fs::symlink(target, dir.join(name)).unwrap();
        };
        link(Path::new("libx.so.1.2.3"), "libx.so.1");
        link(&dir.join("libx.so.1"), "libx.so");
        assert_eq!(mapped_file_name(&dir.join("libx.so")), "libx.so.1.2.3");
        assert_eq!(
            mapped_file_name(&dir.join("libx.so.1.2.3")),
            "libx.so.1.2.3"
        );
        // Through a process's root, an absolute link stays under it.
        let rooted = format!(
            "/proc/{}/root{}",
            std::process::id(),
            dir.join("libx.so").display()
        );
        assert_eq!(mapped_file_name(Path::new(&rooted)), "libx.so.1.2.3");
        // No such file: its own name.
        assert_eq!(mapped_file_name(&dir.join("libgone.so.7")), "libgone.so.7");
        fs::remove_dir_all(&dir).unwrap();
    }
}

#[cfg(test)]
mod container_tests {
    use super::container_of;

    #[test]
    fn containers_are_named_by_their_cgroups_id() {
        let id = "4f1e2d3c4b5a69788796a5b4c3d2e1f00112233445566778899aabbccddeeff0";
        assert_eq!(id.len(), 64);
        for path in [
            format!("/system.slice/docker-{id}.scope"),
            format!("/docker/{id}"),
            format!("/kubepods.slice/kubepods-burstable.slice/cri-containerd-{id}.scope"),
            format!("/machine.slice/libpod-{id}.scope/container"),
        ] {
            assert_eq!(
                container_of(&path).as_deref(),
                Some("4f1e2d3c4b5a"),
                "{path}"
            );
        }
        assert_eq!(container_of("/system.slice/ssh.service"), None);
        assert_eq!(container_of(&"é".repeat(40)), None);
        assert_eq!(
            container_of(&format!("/é{id}é")).as_deref(),
            Some("4f1e2d3c4b5a")
        );
        assert_eq!(container_of(&format!("/x/{id}0")), None);
    }
}
