//! What memprof knows about each profiled process image: name, command
//! line, executable mappings and the files it holds open, captured while
//! the process is alive so that its stacks are symbolized after it exits.
//! The loader's notices say where each object's code lies; /proc is read
//! for the rest (`capture`).
mod capture;

use std::{
    collections::{HashMap, VecDeque},
    fs,
    path::Path,
    sync::Arc,
};

use memprof_common::{
    images::{generation_order, ProcessImage},
    notices::{LibraryNotice, NoticeKind, ProcessNotice},
};

use crate::host::{
    elf::{code_segments, CodeSegment},
    files, guard,
    procfs::{
        maps::{map_files_path, Mapping},
        paths::{file_of, program_link},
        status::live_dir,
    },
};

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
    /// The container's full id (64 hex digits).
    pub container_id: Option<String>,
    /// The Kubernetes pod it runs in, when its cgroup names one (its UID).
    pub pod_uid: Option<String>,
    /// The files it maps, open (by path in its maps): read as they were
    /// mapped, after it exits too, whatever their paths name by then.
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
    /// The kernel's name for it at its first call seen (the calling
    /// thread's): its name when /proc never showed this image.
    pub first_seen_comm: String,
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
            .unwrap_or_else(|| self.first_seen_comm.clone());
    }

    /// The file it maps at `path`, held open.
    pub fn held_file(&self, path: &str) -> Option<&fs::File> {
        self.held_files
            .iter()
            .find(|(held, _)| held == path)
            .map(|(_, file)| file.as_ref())
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
    /// The files processes map, held open for them (see
    /// [`ProcessInfo::held_files`]).
    open_files: capture::OpenFiles,
}

/// Forgotten images kept for a child's `inherit_from`.
const FORGOTTEN_KEPT: usize = 256;

const PAGE_MASK: u64 = !0xfff;

/// The end of the page that holds the byte before `end`: where the
/// kernel's mapping of a segment ending at `end` ends.
fn page_end(end: u64) -> u64 {
    end.wrapping_add(0xfff) & PAGE_MASK
}

impl Catalog {
    pub fn on_notice(&mut self, notice: &ProcessNotice) {
        let key = (notice.tgid, notice.generation);
        if notice.kind == NoticeKind::FirstSeen as u32 {
            self.current.insert(notice.tgid, notice.generation);
            let comm = c_string(&notice.comm);
            if !comm.is_empty() {
                self.processes
                    .entry(key)
                    .or_insert_with(|| ProcessInfo {
                        pid: notice.tgid,
                        ..Default::default()
                    })
                    .first_seen_comm = comm;
            }
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
            // The very files, as the parent held them.
            child.held_files = parent.held_files;
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
        let segments = match files::inode(&file) {
            Some(identity) => self
                .segments
                .entry(identity)
                .or_insert_with(|| file_code_segments(&file))
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
        let mut held = process.held_file(&path).is_some();
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
            // Held now, while it is surely mapped: a library unloaded
            // before /proc is read again is named, after the process
            // ends, from this file, not from what its path names then.
            if !held {
                let mapped = map_files_path(pid, mapping.start, page_end(mapping.end));
                if let Some(file) = self.open_files.hold(&mapped) {
                    process.held_files.push((path.clone(), file));
                    held = true;
                }
            }
            process.announced.push(mapping.start);
            if !process.mappings.iter().any(|m| m.start == mapping.start) {
                process.mappings.push(mapping);
            }
        }
        // The mapping ended, or is not one range: the file memprof just
        // read its segments from, through the process's root.
        if !held {
            if let Some(file) = self.open_files.hold(&file) {
                process.held_files.push((path, file));
            }
        }
        process.mappings.sort_by_key(|m| m.start);
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
        self.open_files.prune();
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
fn file_code_segments(path: &std::path::Path) -> Vec<CodeSegment> {
    let Ok(data) = crate::host::untrusted::read(path) else {
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

#[cfg(test)]
mod tests {
    use super::*;
    use crate::host::procfs::maps::parse_maps_line;

    /// A page of `path` mapped at `start`.
    pub(super) fn at(start: u64, path: &str) -> Mapping {
        Mapping {
            start,
            end: start + 0x1000,
            file_offset: 0,
            path: path.to_string(),
            deleted: false,
        }
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
            comm: [0; 16],
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

    /// An image the loader never announced (under the budget, its first
    /// sampled call came after its start), read from /proc only after its
    /// exec: the kernel's name at its first call stands.
    #[test]
    fn an_unannounced_image_named_after_its_exec_takes_the_kernels_name() {
        const PID: u32 = 4_000_002;
        let mut catalog = Catalog::default();
        let mut comm = [0u8; 16];
        comm[..10].copy_from_slice(b"exec_after");
        let notice = |kind: NoticeKind, time_ns: u64| ProcessNotice {
            kind: kind as u32,
            tgid: PID,
            generation: 3,
            parent: 0,
            time_ns,
            comm,
        };
        catalog.on_notice(&notice(NoticeKind::FirstSeen, 500_000));
        let image = catalog.processes.get_mut(&(PID, 3)).unwrap();
        assert_eq!(image.first_seen_comm, "exec_after");
        image.command = "allocs".into();
        image.exe = Some("/usr/bin/allocs".into());
        image.named_at_ns = 3_000_000;
        catalog.on_notice(&notice(NoticeKind::Replaced, 1_000_000));
        let image = catalog.get(PID, 3).unwrap();
        assert_eq!(image.command, "exec_after");
        assert_eq!(image.exe, None);
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
            comm: [0; 16],
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
}
