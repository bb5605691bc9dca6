//! Files as a process sees them: through its root (another mount
//! namespace), or through /proc/PID/map_files for a deleted one; and
//! named in reports as its maps show them.
use std::{
    fs,
    path::{Path, PathBuf},
};

use crate::host::{
    files,
    procfs::{
        maps::{map_files_path, Mapping},
        status::live_dir,
    },
};

/// A file of process `pid`, by the path its maps give: through the
/// process's root when that shows it (another mount namespace: a
/// container, a service's PrivateTmp), else as is.
/// The path itself when it names the same file here (as reports should
/// show it).
pub fn file_of(pid: u32, path: &str) -> std::path::PathBuf {
    let mut in_root = under_root(Path::new(&format!("/proc/{pid}")), path);
    let mut own = files::inode(&in_root);
    if own.is_none() {
        // Its main thread may have ended, and its root with it.
        in_root = under_root(&live_dir(pid), path);
        own = files::inode(&in_root);
    }
    if own.is_none() || own == files::inode(Path::new(path)) {
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

#[cfg(test)]
mod tests {
    use super::*;
    use crate::host::procfs::maps::maps_line;

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
