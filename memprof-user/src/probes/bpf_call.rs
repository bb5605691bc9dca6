//! Raw `bpf()` calls for what aya 0.14 has no API for (links with a BPF
//! cookie, session uprobes). Each caller passes its own `#[repr(C)]`
//! prefix of `union bpf_attr`, zero-padded.
use std::{
    io,
    os::fd::{FromRawFd as _, OwnedFd, RawFd},
};

/// Runs `bpf(command, attr)`; its non-negative result. The kernel may
/// write into `attr` (`BPF_PROG_LOAD` writes `log_true_size` back).
pub fn bpf<T>(command: libc::c_long, attr: &mut T) -> io::Result<libc::c_long> {
    // SAFETY: attr is a zero-padded bpf_attr prefix of the size passed.
    let result = unsafe {
        libc::syscall(
            libc::SYS_bpf,
            command,
            attr as *mut T,
            std::mem::size_of::<T>() as u32,
        )
    };
    if result < 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(result)
}

/// Runs a `bpf()` command that returns a new fd.
pub fn bpf_fd<T>(command: libc::c_long, attr: &mut T) -> io::Result<OwnedFd> {
    let fd = bpf(command, attr)?;
    // SAFETY: a new fd owned by nobody else.
    Ok(unsafe { OwnedFd::from_raw_fd(fd as RawFd) })
}

/// `union bpf_attr`'s `batch` member (`BPF_MAP_*_BATCH`).
#[repr(C)]
#[derive(Default)]
pub struct BatchAttr {
    pub in_batch: u64,
    pub out_batch: u64,
    pub keys: u64,
    pub values: u64,
    pub count: u32,
    pub map_fd: u32,
    pub elem_flags: u64,
    pub flags: u64,
}
