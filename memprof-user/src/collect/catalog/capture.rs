//! Reading an image's picture from /proc while it runs: its name,
//! command line, executable, cgroup and mappings, kept only when /proc
//! still shows this image (not the next one exec'd, nor an address space
//! half torn down), and the files it maps held open.
use std::{
    collections::HashMap,
    fs,
    path::{Path, PathBuf},
    sync::{Arc, Weak},
};

use super::{Catalog, ProcessInfo};
use crate::host::{
    procfs::{
        cgroups::{cgroup_paths, container_id_of, container_of, pod_uid_of},
        maps::{map_files_path, parse_maps_line, read_maps_through_a_thread, Mapping},
        paths::program_link,
        status::exec_under_way,
    },
    untrusted,
};

impl Catalog {
    /// Reads what /proc has on the process now; keeps older mappings when
    /// the process is already gone.
    pub(super) fn capture(&mut self, (pid, generation): (u32, u32)) {
        let entry = self
            .processes
            .entry((pid, generation))
            .or_insert_with(|| ProcessInfo {
                pid,
                ..Default::default()
            });
        let read = read_proc(pid);
        if let ProcRead::ExecUnderWay = read {
            // The next image's name and maps, before the exec's notice.
            return;
        }
        if let ProcRead::Image(fresh) = read {
            let fresh = *fresh;
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
            } else if entry.command.is_empty() {
                entry.command = entry.first_seen_comm.clone();
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
                entry.container_id = fresh.container_id;
                entry.pod_uid = fresh.pod_uid;
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
                entry.hold_files(&mut self.open_files);
            }
        } else {
            if entry.command.is_empty() {
                entry.command = entry.first_seen_comm.clone();
            }
            if entry.mappings.is_empty() {
                entry.exited = true;
            }
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
}

impl ProcessInfo {
    /// Opens the files it maps that it does not hold yet, through
    /// /proc/PID/map_files while it runs: the very files mapped, whatever
    /// their paths name now or after it exits (deleted, replaced by a
    /// FIFO, a symbolic link swapped in). `shared` holds each file once
    /// for all the processes that map it (by device and inode).
    pub(super) fn hold_files(&mut self, shared: &mut OpenFiles) {
        let unheld: Vec<(String, PathBuf)> = self
            .mappings
            .iter()
            .filter(|m| m.path.starts_with('/') && self.held_file(&m.path).is_none())
            .map(|m| (m.path.clone(), map_files_path(self.pid, m.start, m.end)))
            .collect();
        for (path, opened) in unheld {
            if self.held_file(&path).is_some() {
                continue;
            }
            if let Some(file) = shared.hold(&opened) {
                self.held_files.push((path, file));
            }
        }
    }
}

/// Files held open for the processes that map them, once each.
#[derive(Default)]
pub struct OpenFiles(HashMap<(u64, u64), Weak<fs::File>>);

impl OpenFiles {
    /// The file at `path` (a /proc/PID/map_files link, or a path through
    /// the process's root), held: the one already held for another
    /// process when it is the same file. A regular file only.
    pub(super) fn hold(&mut self, path: &Path) -> Option<Arc<fs::File>> {
        use std::os::unix::fs::MetadataExt as _;
        let metadata = untrusted::metadata(path).ok()?;
        let key = (metadata.dev(), metadata.ino());
        if let Some(held) = self.0.get(&key).and_then(Weak::upgrade) {
            return Some(held);
        }
        let file = Arc::new(untrusted::open(path).ok()?);
        self.0.insert(key, Arc::downgrade(&file));
        Some(file)
    }

    /// Forgets the files no process holds any more.
    pub(super) fn prune(&mut self) {
        self.0.retain(|_, file| file.strong_count() > 0);
    }
}

/// What a read of /proc showed.
enum ProcRead {
    Image(Box<ProcessInfo>),
    /// An exec half done: the next program's name and maps, which the
    /// image memprof asked about never had.
    ExecUnderWay,
    Gone,
}

fn read_proc(pid: u32) -> ProcRead {
    let Some((maps, dir)) = read_maps_through_a_thread(pid) else {
        return ProcRead::Gone;
    };
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
    // Last: a picture whose exec ended meanwhile is caught by its time
    // (`Catalog::on_notice`).
    if exe.is_some() && exec_under_way(&dir) {
        return ProcRead::ExecUnderWay;
    }
    let cgroups = fs::read_to_string(format!("/proc/{pid}/cgroup")).unwrap_or_default();
    let groups = cgroup_paths(&cgroups);
    // The unified hierarchy's ("0::/path") names the process's cgroup.
    let cgroup = cgroups
        .lines()
        .find_map(|line| line.strip_prefix("0::").map(str::to_string))
        .or_else(|| groups.first().cloned());
    ProcRead::Image(Box::new(ProcessInfo {
        pid,
        command,
        cmdline,
        exe,
        mappings,
        container: groups.iter().find_map(|group| container_of(group)),
        container_id: groups.iter().find_map(|group| container_id_of(group)),
        pod_uid: groups.iter().find_map(|group| pod_uid_of(group)),
        cgroup,
        ..Default::default()
    }))
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

#[cfg(test)]
mod tests {
    use super::{adds_a_mapping, another_address_space};
    use crate::collect::catalog::tests::at;

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
}
