//! What tells one file from another: device and inode, and size and
//! modification time for a file rewritten in place at the same path (a
//! package upgrade while `monitor` runs). Looked up as untrusted files
//! are (see [`crate::host::untrusted`]).
use std::{fs::Metadata, os::unix::fs::MetadataExt as _, path::Path};

#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct FileIdentity {
    pub dev: u64,
    pub ino: u64,
    pub size: u64,
    pub mtime: i64,
    pub mtime_nsec: i64,
}

impl FileIdentity {
    pub fn of(path: &Path) -> Option<FileIdentity> {
        crate::host::untrusted::metadata(path)
            .ok()
            .map(|m| FileIdentity::of_metadata(&m))
    }

    pub fn of_metadata(m: &Metadata) -> FileIdentity {
        FileIdentity {
            dev: m.dev(),
            ino: m.ino(),
            size: m.size(),
            mtime: m.mtime(),
            mtime_nsec: m.mtime_nsec(),
        }
    }
}

/// The file at `path` (device, inode), whatever its content.
pub fn inode(path: &Path) -> Option<(u64, u64)> {
    crate::host::untrusted::metadata(path)
        .ok()
        .map(|m| (m.dev(), m.ino()))
}
