//! Memory maps as /proc shows them: each executable mapping of a file,
//! read through a live thread when the main thread has ended.
use std::{fs, path::PathBuf};

use crate::host::procfs::paths::mapped_file;

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

impl Mapping {
    /// Where `address`, inside the mapping, lies in the file mapped.
    pub fn file_offset_of(&self, address: u64) -> u64 {
        (address - self.start).wrapping_add(self.file_offset)
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

/// The file process `pid` maps at [start, end), whatever its path now.
pub fn map_files_path(pid: u32, start: u64, end: u64) -> PathBuf {
    PathBuf::from(format!("/proc/{pid}/map_files/{start:x}-{end:x}"))
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

    #[test]
    fn a_path_with_spaces_is_read_whole() {
        let line =
            "7f0000001000-7f0000002000 r-xp 00001000 fe:00 77   /opt/my app/lib x.so (deleted)";
        let mapping = parse_maps_line(line).unwrap();
        assert_eq!(mapping.path, "/opt/my app/lib x.so");
        assert!(mapping.deleted);
        assert_eq!(maps_line(line).unwrap().inode, 77);
    }
}
