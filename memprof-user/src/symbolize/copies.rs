//! What blazesym reads of a module. blazesym maps the file it is given and
//! opens the debug files it links to by path, so a file another user or a
//! container controls could stop memprof: truncated while mapped (SIGBUS),
//! rewritten between memprof's checks and blazesym's read, or with a FIFO
//! planted beside it under its debug link's name. Such a module is read
//! once into a private copy (a memfd), and blazesym reads the copy: no
//! one else can change it, and it has no directory of its own to look in
//! for debug files. A file only root can change, in a directory only root
//! can change, on the host as the process saw it, is read where it is.
use std::{
    collections::HashMap,
    fs::{self, File},
    io,
    os::{fd::AsRawFd as _, unix::fs::MetadataExt as _},
    path::{Path, PathBuf},
};

use nix::sys::memfd::{memfd_create, MFdFlags};

use super::elf_check::Links;
use crate::host::untrusted::{self, Refused, MAX_FILE_BYTES};

/// The most the copies may hold at once; past it they are dropped (and
/// blazesym with them) and made again as reports need them.
pub const MAX_COPIED_BYTES: u64 = 1 << 30;

#[derive(Default)]
pub struct Copies {
    /// By the file's key in the symbolizer's caches.
    files: HashMap<String, File>,
    bytes: u64,
}

/// Where blazesym reads a module, and how far its debug links are taken.
pub struct Readable {
    pub path: PathBuf,
    pub links: Links,
}

impl Copies {
    /// Where blazesym is to read the module at `path` (`key` in the
    /// caches). Err when the file is not to be read at all.
    pub fn readable(&mut self, key: &str, path: &Path) -> Result<Readable, Refused> {
        if let Some(copy) = self.files.get(key) {
            return Ok(Readable {
                path: descriptor_path(copy),
                links: Links::Untrusted,
            });
        }
        let file = untrusted::open(path)?;
        if only_root_changes(&file, path) {
            return Ok(Readable {
                path: path.to_path_buf(),
                links: Links::Trusted,
            });
        }
        let size = file.metadata()?.size();
        let copy = copy_of(file)?;
        self.bytes += size;
        let readable = Readable {
            path: descriptor_path(&copy),
            links: Links::Untrusted,
        };
        self.files.insert(key.to_string(), copy);
        Ok(readable)
    }

    /// True when the copies hold more than [`MAX_COPIED_BYTES`]: the
    /// caller drops them with [`Copies::clear`], and blazesym's view of
    /// them.
    pub fn over_cap(&self) -> bool {
        self.bytes > MAX_COPIED_BYTES
    }

    pub fn clear(&mut self) {
        self.files.clear();
        self.bytes = 0;
    }
}

/// `/proc/self/fd/N`: a path blazesym can open for memprof's descriptor.
fn descriptor_path(file: &File) -> PathBuf {
    PathBuf::from(format!("/proc/self/fd/{}", file.as_raw_fd()))
}

/// The whole of `file` in a memfd of memprof's own.
fn copy_of(mut file: File) -> io::Result<File> {
    let mut copy = File::from(memfd_create("memprof-module", MFdFlags::MFD_CLOEXEC)?);
    io::copy(&mut io::Read::take(&mut file, MAX_FILE_BYTES), &mut copy)?;
    Ok(copy)
}

/// True when only root can change the file, or put a file beside it
/// where blazesym looks for its debug files: owned by root and writable
/// by no one else, in such a directory, and the host's file at the path
/// it resolves to (not a container's own, reached through its root).
fn only_root_changes(file: &File, path: &Path) -> bool {
    let root_only = |metadata: &fs::Metadata| metadata.uid() == 0 && metadata.mode() & 0o022 == 0;
    let Ok(metadata) = file.metadata() else {
        return false;
    };
    if !root_only(&metadata) {
        return false;
    }
    // Where blazesym resolves the path to, as it does for debug links.
    let Ok(resolved) = fs::canonicalize(path) else {
        return false;
    };
    let same_file = fs::metadata(&resolved)
        .is_ok_and(|host| (host.dev(), host.ino()) == (metadata.dev(), metadata.ino()));
    let dir_root_only = resolved
        .parent()
        .and_then(|dir| fs::metadata(dir).ok())
        .is_some_and(|dir| root_only(&dir));
    same_file && dir_root_only
}

#[cfg(test)]
mod tests {
    use std::os::unix::fs::PermissionsExt as _;

    use super::*;

    #[test]
    fn a_system_library_is_read_in_place_and_a_users_file_copied() {
        let mut copies = Copies::default();
        let libc = Path::new("/usr/lib/x86_64-linux-gnu/libc.so.6");
        let readable = copies.readable("libc", libc).unwrap();
        assert_eq!(readable.links, Links::Trusted);
        assert_eq!(readable.path, libc);

        // A file in a directory others can write to (as /tmp).
        let dir = std::env::temp_dir().join(format!("memprof-copies-{}", std::process::id()));
        fs::create_dir_all(&dir).unwrap();
        fs::set_permissions(&dir, fs::Permissions::from_mode(0o777)).unwrap();
        let module = dir.join("module");
        fs::write(&module, b"the module as it was").unwrap();
        let readable = copies.readable("module", &module).unwrap();
        assert_eq!(readable.links, Links::Untrusted);
        // Changed or truncated after: the copy is what was read.
        fs::write(&module, b"").unwrap();
        assert_eq!(fs::read(&readable.path).unwrap(), b"the module as it was");
        let again = copies.readable("module", &module).unwrap();
        assert_eq!(again.path, readable.path);
        fs::remove_dir_all(&dir).unwrap();
    }
}
