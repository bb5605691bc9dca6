//! Starting the traced command held, so that the probes are in place
//! before it runs its first instruction.
//!
//! std's `Command::spawn` waits for the exec, which would deadlock with a
//! child that waits for us; so fork and exec by hand.
use std::{
    ffi::{CString, OsStr, OsString},
    os::fd::{AsRawFd as _, OwnedFd, RawFd},
    path::{Path, PathBuf},
};

use anyhow::{Context as _, Result};
use nix::{
    fcntl::OFlag,
    sys::{
        signal::{kill, signal, SigHandler, Signal},
        wait::waitpid,
    },
    unistd::{fork, geteuid, getgrouplist, pipe2, ForkResult, Gid, Pid, Uid, User},
};

use crate::human::error::UserError;

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

/// The user the traced command runs as, when not as memprof itself.
#[derive(Debug)]
pub struct RunAs {
    /// Its name, or its uid when the user database has no entry for it.
    pub name: String,
    pub uid: Uid,
    pub gid: Gid,
    /// Supplementary groups.
    pub groups: Vec<Gid>,
    /// Its home directory, for HOME (with USER and LOGNAME); None: the
    /// user database has no entry, the environment is left as it is.
    pub home: Option<PathBuf>,
}

/// Who runs the traced command: `--user USER` (a name or a uid) if given,
/// else under sudo the user who ran sudo (SUDO_UID, SUDO_GID), else memprof's
/// own user. None: as memprof itself (root keeps root). Errors before
/// anything starts.
pub fn run_as(user: Option<&str>) -> Result<Option<RunAs>> {
    let bad = |message: String| UserError::new(message).with_exit_code(2);
    if let Some(user) = user {
        let entry = match user.parse::<u32>() {
            Ok(uid) => User::from_uid(Uid::from_raw(uid)),
            Err(_) => User::from_name(user),
        }
        .context("reading the user database")?
        .ok_or_else(|| bad(format!("--user {user}: no such user")))?;
        if entry.uid.is_root() {
            return Ok(None);
        }
        let gid = entry.gid;
        return Ok(Some(RunAs::of(entry, gid)?));
    }
    // Only root can switch; and under `sudo -u someone` memprof is not root.
    if !geteuid().is_root() {
        return Ok(None);
    }
    let Some(uid) = std::env::var_os("SUDO_UID") else {
        return Ok(None);
    };
    let id = |name: &str, value: &OsStr| {
        value.to_str().and_then(|v| v.parse::<u32>().ok()).ok_or_else(|| {
            bad(format!(
                "{name}={} is not a numeric id (give --user USER, or --user root to run the command as root)",
                value.to_string_lossy()
            ))
        })
    };
    let uid = Uid::from_raw(id("SUDO_UID", &uid)?);
    if uid.is_root() {
        return Ok(None);
    }
    let gid = std::env::var_os("SUDO_GID")
        .map(|gid| id("SUDO_GID", &gid).map(Gid::from_raw))
        .transpose()?;
    match User::from_uid(uid).context("reading the user database")? {
        Some(entry) => {
            let gid = gid.unwrap_or(entry.gid);
            Ok(Some(RunAs::of(entry, gid)?))
        }
        // No entry: its ids alone, the environment as sudo left it.
        None => {
            let gid = gid.ok_or_else(|| {
                bad(format!(
                    "SUDO_UID={uid}: no such user and no SUDO_GID (give --user USER, or --user root to run the command as root)"
                ))
            })?;
            Ok(Some(RunAs {
                name: uid.to_string(),
                uid,
                gid,
                groups: vec![gid],
                home: None,
            }))
        }
    }
}

impl RunAs {
    /// A user of the user database, with primary group `gid` and its
    /// supplementary groups.
    fn of(entry: User, gid: Gid) -> Result<RunAs> {
        let name = CString::new(entry.name.as_bytes()).context("user name with a NUL byte")?;
        let groups = getgrouplist(&name, gid)
            .with_context(|| format!("reading the groups of user {}", entry.name))?;
        Ok(RunAs {
            name: entry.name,
            uid: entry.uid,
            gid,
            groups,
            home: Some(entry.dir),
        })
    }

    /// The environment of the command: memprof's, with HOME, USER and
    /// LOGNAME of this user.
    fn environment(&self) -> Result<Vec<CString>> {
        let mut env: Vec<(OsString, OsString)> = std::env::vars_os().collect();
        if let Some(home) = &self.home {
            env.retain(|(key, _)| !matches!(key.to_str(), Some("HOME" | "USER" | "LOGNAME")));
            env.push(("HOME".into(), home.clone().into_os_string()));
            env.push(("USER".into(), self.name.clone().into()));
            env.push(("LOGNAME".into(), self.name.clone().into()));
        }
        env.into_iter()
            .map(|(key, value)| {
                let mut entry = key.into_encoded_bytes();
                entry.push(b'=');
                entry.extend_from_slice(value.as_encoded_bytes());
                CString::new(entry)
            })
            .collect::<Result<_, _>>()
            .context("an environment variable contains a NUL byte")
    }
}

/// What the child failed at before running the command (sent to the
/// parent with errno).
const STEP_EXEC: i32 = 0;
const STEP_SETGROUPS: i32 = 1;
const STEP_SETGID: i32 = 2;
const STEP_SETUID: i32 = 3;

/// A forked child blocked before exec until [`HeldChild::release`].
pub struct HeldChild {
    pub pid: Pid,
    release: Option<OwnedFd>,
    exec_error: OwnedFd,
    released: bool,
    /// The user it runs as, when not as memprof.
    user: Option<String>,
}

impl HeldChild {
    /// Forks; the child waits, then (as `run_as`, if given) execs `program`
    /// with `args` (args[0] is argv[0]).
    pub fn spawn(program: &Path, args: &[String], run_as: Option<&RunAs>) -> Result<HeldChild> {
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
        // The user's ids and environment too.
        let groups: Vec<libc::gid_t> = run_as
            .map(|user| user.groups.iter().map(|g| g.as_raw()).collect())
            .unwrap_or_default();
        let env_c = run_as.map(RunAs::environment).transpose()?;
        let envp: Option<Vec<*const libc::c_char>> = env_c.as_ref().map(|env| {
            env.iter()
                .map(|e| e.as_ptr())
                .chain(std::iter::once(std::ptr::null()))
                .collect()
        });
        let ids = run_as.map(|user| (user.uid.as_raw(), user.gid.as_raw()));
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
                let error_fd = error_write.as_raw_fd();
                if let Some((uid, gid)) = ids {
                    // Groups and group first: changing them needs root.
                    // SAFETY: system calls on values built before fork.
                    unsafe {
                        if libc::setgroups(groups.len(), groups.as_ptr()) != 0 {
                            child_failed(error_fd, STEP_SETGROUPS);
                        }
                        if libc::setgid(gid) != 0 {
                            child_failed(error_fd, STEP_SETGID);
                        }
                        if libc::setuid(uid) != 0 {
                            child_failed(error_fd, STEP_SETUID);
                        }
                    }
                }
                // SAFETY: NUL-terminated strings and NULL-terminated argv and
                // envp, built before fork.
                unsafe {
                    match &envp {
                        Some(envp) => {
                            libc::execve(program_c.as_ptr(), argv.as_ptr(), envp.as_ptr())
                        }
                        None => libc::execv(program_c.as_ptr(), argv.as_ptr()),
                    }
                };
                child_failed(error_fd, STEP_EXEC);
            }
            ForkResult::Parent { child } => Ok(HeldChild {
                pid: child,
                release: Some(release_write),
                exec_error: error_read,
                released: false,
                user: run_as.map(|user| user.name.clone()),
            }),
        }
    }

    /// Lets the child exec; fails if the exec failed.
    pub fn release(mut self, program: &Path) -> Result<Pid> {
        let release = self.release.take().expect("released twice");
        nix::unistd::write(&release, &[1u8]).context("releasing the traced command")?;
        drop(release);
        let mut message = [0u8; 8];
        // Closed on a successful exec (CLOEXEC): read returns 0.
        let n = nix::unistd::read(&self.exec_error, &mut message).unwrap_or(0);
        if n == message.len() {
            let _ = waitpid(self.pid, None);
            let step = i32::from_ne_bytes(message[..4].try_into().unwrap());
            let errno = i32::from_ne_bytes(message[4..].try_into().unwrap());
            let err = std::io::Error::from_raw_os_error(errno);
            if step != STEP_EXEC {
                let call = match step {
                    STEP_SETGROUPS => "setgroups",
                    STEP_SETGID => "setgid",
                    _ => "setuid",
                };
                let user = self.user.as_deref().unwrap_or("?");
                return Err(UserError::new(format!(
                    "cannot run the command as user {user}: {call}: {err}"
                ))
                .into());
            }
            // Root could run it, the user cannot: say who tried.
            let hint = match (&self.user, err.kind()) {
                (Some(user), std::io::ErrorKind::PermissionDenied) => {
                    format!(" (as user {user}; --user root runs it as root)")
                }
                _ => String::new(),
            };
            let code = if err.kind() == std::io::ErrorKind::NotFound {
                EXIT_NOT_FOUND
            } else {
                126
            };
            let message = format!("{}: {err}{hint}", program.display());
            return Err(UserError::new(message).with_exit_code(code).into());
        }
        self.released = true;
        Ok(self.pid)
    }
}

/// In the child: sends the parent what failed and errno, and exits.
fn child_failed(error_write: RawFd, step: i32) -> ! {
    let errno = std::io::Error::last_os_error().raw_os_error().unwrap_or(0);
    let mut message = [0u8; 8];
    message[..4].copy_from_slice(&step.to_ne_bytes());
    message[4..].copy_from_slice(&errno.to_ne_bytes());
    // SAFETY: write(2) of a local buffer, then _exit.
    unsafe {
        libc::write(error_write, message.as_ptr().cast(), message.len());
        libc::_exit(EXIT_NOT_FOUND);
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
