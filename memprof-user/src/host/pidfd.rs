//! pidfds: a process handle that no reused pid can fool.
use std::os::fd::{FromRawFd as _, OwnedFd};

/// A pidfd: readable once the process has exited.
pub fn pidfd_open(pid: i32) -> std::io::Result<OwnedFd> {
    // SAFETY: plain syscall; returns a new fd or -1.
    let fd = unsafe { libc::syscall(libc::SYS_pidfd_open, pid, 0) };
    if fd < 0 {
        return Err(std::io::Error::last_os_error());
    }
    // SAFETY: a new fd owned by nobody else.
    Ok(unsafe { OwnedFd::from_raw_fd(fd as i32) })
}
