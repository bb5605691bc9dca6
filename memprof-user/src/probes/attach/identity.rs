//! Which files: those a process maps, each file once by identity (device
//! and inode), and whether one is memprof's own program.
use std::path::{Path, PathBuf};

use crate::host::files;

/// The files process `pid` maps executable (`procfs::maps::executable_files`).
pub(super) fn mapped_files(pid: u32) -> Vec<(String, PathBuf)> {
    let maps = crate::host::procfs::maps::read_maps_text(pid).unwrap_or_default();
    crate::host::procfs::maps::executable_files(pid, &maps)
}

/// Each file once (by device and inode: the same library may be reached
/// by several paths), in first-seen order.
pub(super) fn distinct_files<'a>(paths: impl Iterator<Item = &'a PathBuf>) -> Vec<PathBuf> {
    let mut seen = std::collections::HashSet::new();
    paths
        .filter(|path| seen.insert(files::inode(path).unwrap_or_default()))
        .cloned()
        .collect()
}

/// Whether the file is memprof's own program, which `monitor` never
/// probes: memprof never watches itself, and on the whole host its
/// allocator (mimalloc, its own) would be probed in every process that
/// maps it (its watchdog, another memprof), memprof too, and each of
/// memprof's allocations would take a trap. By name, memprof's own
/// process stands in for those to come at the start, and its budget's
/// calibration child is adopted: their program's probes would be
/// listed, and take room, for nothing. (`trace -- memprof ...` does
/// profile memprof.)
pub(super) fn is_own_executable(identity: (u64, u64)) -> bool {
    static OWN: std::sync::OnceLock<(u64, u64)> = std::sync::OnceLock::new();
    identity == *OWN.get_or_init(|| files::inode(Path::new("/proc/self/exe")).unwrap_or_default())
}
