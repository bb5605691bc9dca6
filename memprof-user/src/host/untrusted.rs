//! Opening files other processes control: their programs and libraries,
//! their debug links, what their maps name. memprof runs as root and any
//! of these may be a FIFO (an open that never returns), a device (an open
//! with side effects), a symbolic link planted in a container's root to
//! lead root's open onto a host file, or far larger than any binary. So a
//! file is looked up without being opened (O_PATH), inside the process's
//! root when reached through one (RESOLVE_IN_ROOT: its absolute links
//! stay in it), and opened for reading only once `fstat` shows a regular
//! file within [`MAX_FILE_BYTES`]; through the handle looked up, so a
//! name swapped meanwhile does not count.
use std::{
    ffi::CString,
    fmt,
    fs::File,
    io::{self, Read as _},
    os::{
        fd::{AsRawFd as _, FromRawFd as _, OwnedFd},
        unix::{ffi::OsStrExt as _, fs::MetadataExt as _},
    },
    path::Path,
};

/// The largest file memprof reads for a process: well above the largest
/// binaries with debug information (a few GiB are seen only for debug
/// files of browsers, read from the host's debug directories).
pub const MAX_FILE_BYTES: u64 = 4 << 30;

/// Why a file was not opened.
#[derive(Debug)]
pub enum Refused {
    /// It could not be looked up or opened (gone, no permission).
    Unopenable(io::Error),
    /// A FIFO, a device, a socket or a directory.
    NotRegular(&'static str),
    /// Larger than [`MAX_FILE_BYTES`].
    TooLarge(u64),
}

impl fmt::Display for Refused {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Refused::Unopenable(err) => write!(f, "cannot open it: {err}"),
            Refused::NotRegular(kind) => write!(f, "it is a {kind}, not a regular file"),
            Refused::TooLarge(size) => {
                write!(
                    f,
                    "it is {size} bytes, more than the {MAX_FILE_BYTES} memprof reads"
                )
            }
        }
    }
}

impl std::error::Error for Refused {}

impl From<io::Error> for Refused {
    fn from(err: io::Error) -> Refused {
        Refused::Unopenable(err)
    }
}

/// `path` opened for reading, if it is a regular file within the cap. A
/// path under /proc/PID/root (or a thread's root) is resolved inside that
/// root. Never blocks.
pub fn open(path: &Path) -> Result<File, Refused> {
    let handle = look_up(path)?;
    let file = File::from(handle);
    let metadata = file.metadata()?;
    let kind = metadata.mode() & libc::S_IFMT;
    if kind != libc::S_IFREG {
        return Err(Refused::NotRegular(kind_name(kind)));
    }
    if metadata.size() > MAX_FILE_BYTES {
        return Err(Refused::TooLarge(metadata.size()));
    }
    // The O_PATH handle opened for reading: the very file fstat saw.
    let reopened = format!("/proc/self/fd/{}", file.as_raw_fd());
    Ok(raw_open(
        Path::new(&reopened),
        libc::O_RDONLY | libc::O_NONBLOCK | libc::O_NOCTTY | libc::O_CLOEXEC,
    )?)
}

/// What `fstat` says of `path`, looked up as [`open`] looks it up (inside
/// a process's root), whatever kind of file it is, without opening it.
pub fn metadata(path: &Path) -> io::Result<std::fs::Metadata> {
    File::from(look_up(path)?).metadata()
}

/// The whole of `path` (see [`open`]).
pub fn read(path: &Path) -> Result<Vec<u8>, Refused> {
    let file = open(path)?;
    let mut data = Vec::new();
    // A file growing past the cap while read is cut there, not followed.
    file.take(MAX_FILE_BYTES).read_to_end(&mut data)?;
    Ok(data)
}

/// An O_PATH handle of `path`: nothing of the file runs (a FIFO's open
/// would wait for a writer, a device's driver would act).
fn look_up(path: &Path) -> io::Result<OwnedFd> {
    match split_root(path) {
        Some((root, inside)) => {
            let root = raw_open(
                Path::new(root),
                libc::O_PATH | libc::O_DIRECTORY | libc::O_CLOEXEC,
            )?;
            open_in_root(&root, inside)
        }
        None => raw_open(path, libc::O_PATH | libc::O_CLOEXEC).map(OwnedFd::from),
    }
}

/// `inside` (relative) looked up with `root` as its root: `..` and
/// absolute symbolic links stay under it, and /proc's magic links are not
/// followed.
fn open_in_root(root: &File, inside: &str) -> io::Result<OwnedFd> {
    let name = CString::new(inside).map_err(|_| io::Error::from_raw_os_error(libc::EINVAL))?;
    // SAFETY: open_how is plain data; all zero is "no flags".
    let mut how: libc::open_how = unsafe { std::mem::zeroed() };
    how.flags = (libc::O_PATH | libc::O_CLOEXEC) as u64;
    how.resolve = libc::RESOLVE_IN_ROOT | libc::RESOLVE_NO_MAGICLINKS;
    // SAFETY: a path and an open_how of our own, their sizes as given.
    let fd = unsafe {
        libc::syscall(
            libc::SYS_openat2,
            root.as_raw_fd(),
            name.as_ptr(),
            &how as *const libc::open_how,
            std::mem::size_of::<libc::open_how>(),
        )
    };
    if fd < 0 {
        return Err(io::Error::last_os_error());
    }
    // SAFETY: openat2 returned a new descriptor, ours alone.
    Ok(unsafe { OwnedFd::from_raw_fd(fd as i32) })
}

fn raw_open(path: &Path, flags: i32) -> io::Result<File> {
    let name = CString::new(path.as_os_str().as_bytes())
        .map_err(|_| io::Error::from_raw_os_error(libc::EINVAL))?;
    // SAFETY: a NUL-terminated path of our own.
    let fd = unsafe { libc::open(name.as_ptr(), flags) };
    if fd < 0 {
        return Err(io::Error::last_os_error());
    }
    // SAFETY: open returned a new descriptor, ours alone.
    Ok(unsafe { File::from_raw_fd(fd) })
}

/// `/proc/PID/root` (or `/proc/PID/task/TID/root`) and the rest of the
/// path under it, relative, when `path` is reached through a process's
/// root.
fn split_root(path: &Path) -> Option<(&str, &str)> {
    let text = path.to_str()?;
    let after_proc = text.strip_prefix("/proc/")?;
    let (pid, rest) = after_proc.split_once('/')?;
    pid.parse::<u32>().ok()?;
    let rest = match rest.strip_prefix("task/") {
        Some(thread) => {
            let (tid, rest) = thread.split_once('/')?;
            tid.parse::<u32>().ok()?;
            rest
        }
        None => rest,
    };
    let inside = rest.strip_prefix("root/")?;
    let root_len = text.len() - inside.len() - 1;
    Some((&text[..root_len], inside))
}

fn kind_name(kind: u32) -> &'static str {
    match kind {
        libc::S_IFIFO => "FIFO",
        libc::S_IFCHR => "character device",
        libc::S_IFBLK => "block device",
        libc::S_IFSOCK => "socket",
        libc::S_IFDIR => "directory",
        libc::S_IFLNK => "symbolic link",
        _ => "special file",
    }
}

#[cfg(test)]
mod tests {
    use std::{fs, os::unix::fs::symlink, time::Instant};

    use super::*;

    fn scratch(name: &str) -> std::path::PathBuf {
        let dir =
            std::env::temp_dir().join(format!("memprof-untrusted-{name}-{}", std::process::id()));
        let _ = fs::remove_dir_all(&dir);
        fs::create_dir_all(&dir).unwrap();
        dir
    }

    #[test]
    fn a_fifo_or_a_device_is_refused_at_once() {
        let dir = scratch("fifo");
        let fifo = dir.join("fifo");
        nix::unistd::mkfifo(&fifo, nix::sys::stat::Mode::S_IRWXU).unwrap();
        let started = Instant::now();
        assert!(matches!(open(&fifo), Err(Refused::NotRegular("FIFO"))));
        assert!(started.elapsed().as_secs() < 1);
        assert!(matches!(
            open(Path::new("/dev/zero")),
            Err(Refused::NotRegular("character device"))
        ));
        assert!(matches!(open(&dir), Err(Refused::NotRegular("directory"))));
        fs::write(dir.join("file"), b"data").unwrap();
        assert_eq!(read(&dir.join("file")).unwrap(), b"data");
        fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn a_link_in_a_process_root_stays_in_that_root() {
        // A container's root: its absolute links name its own files.
        let root = scratch("root");
        fs::write(root.join("hostname"), b"the container's").unwrap();
        symlink("/hostname", root.join("own")).unwrap();
        symlink("/etc/hostname", root.join("hosts")).unwrap();
        let root_handle = raw_open(&root, libc::O_PATH | libc::O_DIRECTORY).unwrap();
        let read_in_root = |name: &str| -> io::Result<Vec<u8>> {
            let handle = open_in_root(&root_handle, name)?;
            let reopened = format!("/proc/self/fd/{}", handle.as_raw_fd());
            fs::read(reopened)
        };
        assert_eq!(read_in_root("own").unwrap(), b"the container's");
        // The host's /etc/hostname is not reached.
        assert!(read_in_root("hosts").is_err());
        assert!(read_in_root("../../etc/hostname").is_err());
        assert_eq!(
            split_root(Path::new("/proc/12/task/13/root/usr/lib/x.so")),
            Some(("/proc/12/task/13/root", "usr/lib/x.so"))
        );
        assert_eq!(split_root(Path::new("/proc/12/exe")), None);
        assert_eq!(split_root(Path::new("/usr/lib/x.so")), None);
        fs::remove_dir_all(&root).unwrap();
    }
}
