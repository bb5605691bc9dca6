//! Freeing the probes of files no process maps any more. The kernel's site
//! table holds [`SITE_GROUPS`] groups and each file probed after the start
//! takes one to three: a monitor on a host where containers with C
//! libraries of their own come and go would run out in days. When the
//! table is full, the groups of the files probed since the start that no
//! running process maps go back to it, with everything that held them.
use std::{collections::HashSet, path::Path};

use memprof_common::dispatch::{site_index, SiteEntry};

use super::{LateProbes, Probes};
use crate::host::files;

impl Probes {
    /// Frees the groups of the files probed since the start that no
    /// process maps now; whether any was freed.
    pub(super) fn reclaim(&mut self, late: &mut LateProbes) -> bool {
        let full: Vec<String> = late
            .full
            .values()
            .map(|(_, program)| crate::host::procfs::paths::path_in_maps(Path::new(program)))
            .collect();
        let names: HashSet<&str> = late
            .files
            .values()
            .filter(|file| file.scoped.is_some())
            .map(|file| file.name.as_str())
            .chain(full.iter().map(String::as_str))
            .collect();
        let mapped = Mapped::now(&names);
        let unmapped: Vec<(u64, u64)> = late
            .files
            .iter()
            .filter(|(identity, file)| file.scoped.is_some() && !mapped.holds(**identity))
            .map(|(identity, _)| *identity)
            .collect();
        let mut freed = false;
        for identity in unmapped {
            let file = late.files.remove(&identity).expect("listed above");
            if !file.groups.is_empty() {
                freed = true;
                self.sites.freed_files += 1;
            }
            self.free_groups(&file.groups, &file.module);
        }
        // Files that found the table full and are gone: not listed any more.
        let gone: Vec<String> = late
            .full
            .iter()
            .filter(|(identity, _)| !mapped.holds(**identity))
            .map(|(_, (_, program))| program.clone())
            .collect();
        late.full.retain(|identity, _| mapped.holds(*identity));
        self.unprobed.retain(|u| !gone.contains(&u.program));
        if freed {
            self.sites.reclaims += 1;
        }
        freed
    }

    /// Gives `groups` (all `module`'s) back to the site table: first what
    /// makes their probes trap (session links, scope events, the events'
    /// anchors), then the events (each removal waits for an RCU grace
    /// period), their table entries, and `module`'s listed functions.
    pub(super) fn free_groups(&mut self, groups: &[u32], module: &Path) {
        if let Some(sessions) = self.sessions.as_mut() {
            for &group in groups {
                sessions.free_group(group);
            }
        }
        let events: Vec<u64> = groups
            .iter()
            .filter_map(|group| self.attached.groups.get(group))
            .flat_map(|hold| hold.events.iter().map(|event| event.id))
            .collect();
        drop(self.scopes.drop_events(&events));
        for &group in groups {
            if let Some(hold) = self.attached.groups.remove(&group) {
                for &offset in &hold.offsets {
                    let _ = self.sites.map.set(
                        site_index(group.into(), offset),
                        SiteEntry::default(),
                        0,
                    );
                }
                self.sites.free_specs.extend(&hold.usdt_specs);
            }
            self.sites.free.push(group);
        }
        self.functions.retain(|function| function.module != module);
    }
}

/// The files mapped executable by some process now: by inode number (as
/// the maps say: the file itself, even deleted or replaced since), and by
/// device and inode as memprof identified them (through the process's
/// root) for those whose path is among `names`. A file is kept if either
/// says so.
struct Mapped {
    inodes: HashSet<u64>,
    identities: HashSet<(u64, u64)>,
}

impl Mapped {
    fn now(names: &HashSet<&str>) -> Mapped {
        let mut mapped = Mapped {
            inodes: HashSet::new(),
            identities: HashSet::new(),
        };
        let own = std::process::id();
        let Ok(dir) = std::fs::read_dir("/proc") else {
            return mapped;
        };
        for pid in dir.filter_map(|entry| entry.ok()?.file_name().to_str()?.parse::<u32>().ok()) {
            if pid == own {
                continue;
            }
            // Through a live thread when the main thread has ended.
            let Some((maps, dir)) = crate::host::procfs::maps::read_maps_through_a_thread(pid)
            else {
                continue;
            };
            let mut seen = HashSet::new();
            for (inode, path) in maps.lines().filter_map(executable_file) {
                mapped.inodes.insert(inode);
                if names.contains(path) && seen.insert(path) {
                    let identity =
                        files::inode(&crate::host::procfs::paths::under_root(&dir, path))
                            .unwrap_or_default();
                    mapped.identities.insert(identity);
                }
            }
        }
        mapped
    }

    fn holds(&self, identity: (u64, u64)) -> bool {
        self.identities.contains(&identity) || self.inodes.contains(&identity.1)
    }
}

/// The inode and path of an executable mapping of a file (the path as the
/// process sees it).
fn executable_file(line: &str) -> Option<(u64, &str)> {
    let line = crate::host::procfs::maps::maps_line(line)?;
    (line.perms.contains('x') && line.inode != 0 && line.path.starts_with('/'))
        .then_some((line.inode, line.path))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_maps_line_gives_the_inode_and_path_of_executable_files_only() {
        let line = "7f3c1a228000-7f3c1a37d000 r-xp 00028000 fe:01 1835165                    /usr/lib/x86_64-linux-gnu/libc.so.6";
        assert_eq!(
            executable_file(line),
            Some((1835165, "/usr/lib/x86_64-linux-gnu/libc.so.6"))
        );
        let deleted = "7f3c1a228000-7f3c1a37d000 r-xp 00028000 fe:01 42 /tmp/a b.so (deleted)";
        assert_eq!(executable_file(deleted), Some((42, "/tmp/a b.so")));
        let data = "7f3c1a228000-7f3c1a37d000 rw-p 00028000 fe:01 42 /tmp/lib.so";
        assert_eq!(executable_file(data), None);
        let anonymous = "7ffd0c1b6000-7ffd0c1b8000 r-xp 00000000 00:00 0 [vdso]";
        assert_eq!(executable_file(anonymous), None);
    }
}
