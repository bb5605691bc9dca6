//! Starting the traced command held, so that the probes are in place
//! before it runs its first instruction.
//!
//! std's `Command::spawn` waits for the exec, which would deadlock with a
//! child that waits for us; so fork and exec by hand.
use std::{
    ffi::CString,
    os::fd::{AsRawFd as _, OwnedFd},
    path::{Path, PathBuf},
};

use anyhow::{Context as _, Result};
use nix::{
    fcntl::OFlag,
    sys::{
        signal::{kill, signal, SigHandler, Signal},
        wait::waitpid,
    },
    unistd::{fork, pipe2, ForkResult, Pid},
};

use crate::error::UserError;

/// Exit status of a command that could not be found or run, as in shells.
pub const EXIT_NOT_FOUND: i32 = 127;

/// Resolves CMD like a shell would: a path if it has a '/', else $PATH.
pub fn resolve_program(program: &str) -> Result<PathBuf> {
    let not_found =
        || UserError::new(format!("{program}: command not found")).with_exit_code(EXIT_NOT_FOUND);
    if program.contains('/') {
        let path = Path::new(program);
        if !path.is_file() {
            return Err(not_found().into());
        }
        return Ok(path.to_path_buf());
    }
    which::which(program).map_err(|_| not_found().into())
}

/// A forked child blocked before exec until [`HeldChild::release`].
pub struct HeldChild {
    pub pid: Pid,
    release: Option<OwnedFd>,
    exec_error: OwnedFd,
    released: bool,
}

impl HeldChild {
    /// Forks; the child waits, then execs `program` with `args` (args[0] is argv[0]).
    pub fn spawn(program: &Path, args: &[String]) -> Result<HeldChild> {
        // Everything the child needs is allocated before fork.
        let program_c = CString::new(program.as_os_str().as_encoded_bytes())
            .context("program path contains a NUL byte")?;
        let args_c = args
            .iter()
            .map(|a| CString::new(a.as_bytes()))
            .collect::<Result<Vec<_>, _>>()
            .context("an argument contains a NUL byte")?;
        // The argv array too: the child must not call malloc (it would be counted).
        let mut argv: Vec<*const libc::c_char> = args_c.iter().map(|a| a.as_ptr()).collect();
        argv.push(std::ptr::null());
        let (release_read, release_write) = pipe2(OFlag::O_CLOEXEC)?;
        let (error_read, error_write) = pipe2(OFlag::O_CLOEXEC)?;

        // SAFETY: single-threaded at this point (no runtime yet); the child
        // only calls async-signal-safe functions before exec.
        match unsafe { fork() }.context("fork")? {
            ForkResult::Child => {
                drop(release_write);
                drop(error_read);
                let mut byte = [0u8; 1];
                // SAFETY: plain read(2) into a local buffer.
                let n =
                    unsafe { libc::read(release_read.as_raw_fd(), byte.as_mut_ptr().cast(), 1) };
                if n != 1 {
                    // memprof gave up before attaching.
                    // SAFETY: _exit is async-signal-safe.
                    unsafe { libc::_exit(EXIT_NOT_FOUND) };
                }
                // Rust ignores SIGPIPE; the program expects the default.
                // SAFETY: resetting a disposition before exec.
                let _ = unsafe { signal(Signal::SIGPIPE, SigHandler::SigDfl) };
                // SAFETY: NUL-terminated strings and a NULL-terminated argv, built before fork.
                unsafe { libc::execv(program_c.as_ptr(), argv.as_ptr()) };
                let errno = std::io::Error::last_os_error()
                    .raw_os_error()
                    .unwrap_or(0)
                    .to_ne_bytes();
                // SAFETY: write(2) of a local buffer, then _exit.
                unsafe {
                    libc::write(error_write.as_raw_fd(), errno.as_ptr().cast(), errno.len());
                    libc::_exit(EXIT_NOT_FOUND);
                }
            }
            ForkResult::Parent { child } => Ok(HeldChild {
                pid: child,
                release: Some(release_write),
                exec_error: error_read,
                released: false,
            }),
        }
    }

    /// Lets the child exec; fails if the exec failed.
    pub fn release(mut self, program: &Path) -> Result<Pid> {
        let release = self.release.take().expect("released twice");
        nix::unistd::write(&release, &[1u8]).context("releasing the traced command")?;
        drop(release);
        let mut errno = [0u8; 4];
        // Closed on a successful exec (CLOEXEC): read returns 0.
        let n = nix::unistd::read(&self.exec_error, &mut errno).unwrap_or(0);
        if n == errno.len() {
            let _ = waitpid(self.pid, None);
            let err = std::io::Error::from_raw_os_error(i32::from_ne_bytes(errno));
            return Err(UserError::new(format!("{}: {err}", program.display()))
                .with_exit_code(if err.kind() == std::io::ErrorKind::NotFound {
                    EXIT_NOT_FOUND
                } else {
                    126
                })
                .into());
        }
        self.released = true;
        Ok(self.pid)
    }
}

impl Drop for HeldChild {
    /// Not released: memprof failed to attach; the command must not run unprofiled.
    fn drop(&mut self) {
        if self.released {
            return;
        }
        let _ = kill(self.pid, Signal::SIGKILL);
        let _ = waitpid(self.pid, None);
    }
}
