//! What memprof knows about each profiled process: name, executable and
//! executable memory mappings, captured while the process is alive so its
//! stacks can be symbolized after it exits.
use std::{collections::HashMap, fs, path::PathBuf};

use memprof_common::{NoticeKind, ProcessNotice};

/// One executable mapping of a file (or the vDSO).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Mapping {
    pub start: u64,
    pub end: u64,
    pub file_offset: u64,
    /// Path as the process sees it ("/usr/lib/.../libc.so.6", "[vdso]").
    pub path: String,
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
}

impl ProcessInfo {
    /// The mapping that holds `address`.
    pub fn mapping_of(&self, address: u64) -> Option<&Mapping> {
        let index = self.mappings.partition_point(|m| m.start <= address);
        let mapping = self.mappings.get(index.checked_sub(1)?)?;
        (address < mapping.end).then_some(mapping)
    }
}

/// Processes by (pid, image generation).
#[derive(Default)]
pub struct Catalog {
    processes: HashMap<(u32, u32), ProcessInfo>,
    /// The generation each pid is at now, as far as memprof heard.
    current: HashMap<u32, u32>,
}

impl Catalog {
    pub fn on_notice(&mut self, notice: &ProcessNotice) {
        let key = (notice.tgid, notice.generation);
        if notice.kind == NoticeKind::FirstSeen as u32 {
            self.current.insert(notice.tgid, notice.generation);
            self.capture(key);
        } else if notice.kind == NoticeKind::Exited as u32 {
            self.current.remove(&notice.tgid);
            if let Some(process) = self.processes.get_mut(&key) {
                process.exited = true;
            }
        }
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
            entry.command = fresh.command;
            entry.cmdline = fresh.cmdline;
            entry.exe = fresh.exe;
            if !fresh.mappings.is_empty() {
                entry.mappings = fresh.mappings;
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

    pub fn get(&self, pid: u32, generation: u32) -> Option<&ProcessInfo> {
        self.processes.get(&(pid, generation))
    }
}

fn read_proc(pid: u32) -> Option<ProcessInfo> {
    let maps = fs::read_to_string(format!("/proc/{pid}/maps")).ok()?;
    let mut mappings: Vec<Mapping> = maps.lines().filter_map(parse_maps_line).collect();
    mappings.sort_by_key(|m| m.start);
    let command = fs::read_to_string(format!("/proc/{pid}/comm"))
        .map(|c| c.trim_end().to_string())
        .unwrap_or_default();
    let cmdline = fs::read(format!("/proc/{pid}/cmdline"))
        .map(|raw| {
            raw.split(|&b| b == 0)
                .filter(|a| !a.is_empty())
                .map(|a| String::from_utf8_lossy(a).into_owned())
                .collect()
        })
        .unwrap_or_default();
    let exe = fs::read_link(format!("/proc/{pid}/exe"))
        .ok()
        .map(|p: PathBuf| p.display().to_string());
    Some(ProcessInfo {
        pid,
        command,
        cmdline,
        exe,
        mappings,
        ..Default::default()
    })
}

/// "start-end perms offset dev inode path": executable mappings only.
fn parse_maps_line(line: &str) -> Option<Mapping> {
    let mut fields = line.split_whitespace();
    let range = fields.next()?;
    let perms = fields.next()?;
    let offset = fields.next()?;
    let path = fields.nth(2)?;
    if !perms.contains('x') || !(path.starts_with('/') || path == "[vdso]") {
        return None;
    }
    let (start, end) = range.split_once('-')?;
    Some(Mapping {
        start: u64::from_str_radix(start, 16).ok()?,
        end: u64::from_str_radix(end, 16).ok()?,
        file_offset: u64::from_str_radix(offset, 16).ok()?,
        path: path.to_string(),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

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
