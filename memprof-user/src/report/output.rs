//! Writing a report where `-o` names. memprof runs as root, and the name
//! may be in a directory others can write to (/tmp): what is there may be
//! a file or a FIFO another user planted to receive root's report, or a
//! symbolic link to a file of root's. So an existing name is written only
//! when it belongs to the user who ran memprof (or to root), and a file
//! is never written in place: the report goes to a new file beside it,
//! synced, then renamed over it. A full disk leaves the previous report
//! whole.
use std::{
    fs,
    io::{self, Write as _},
    os::unix::fs::{MetadataExt as _, OpenOptionsExt as _, PermissionsExt as _},
    path::{Path, PathBuf},
};

use anyhow::Result;

use crate::human::error::UserError;

/// Writes `rendered` to `output` (see the module's doc) or stdout.
pub fn write_out(rendered: &[u8], output: Option<&Path>) -> Result<()> {
    write_with(output, |out| out.write_all(rendered))
}

/// As [`write_out`], the report written by `render` as it is made (a
/// large one is never held whole in memory).
pub fn write_with(
    output: Option<&Path>,
    render: impl FnOnce(&mut dyn io::Write) -> io::Result<()>,
) -> Result<()> {
    let Some(path) = output else {
        let mut stdout = io::BufWriter::with_capacity(WRITE_BUFFER, io::stdout().lock());
        render(&mut stdout)?;
        stdout.flush()?;
        return Ok(());
    };
    match existing(path)? {
        // A FIFO or a terminal of the user's own: written as it is.
        Some(metadata) if !metadata.is_file() => fs::OpenOptions::new()
            .write(true)
            .custom_flags(libc::O_NOFOLLOW | libc::O_NOCTTY)
            .open(path)
            .and_then(|stream| {
                let mut buffered = io::BufWriter::with_capacity(WRITE_BUFFER, stream);
                render(&mut buffered)?;
                buffered.flush()
            })
            .map_err(|err| output_error(path, err)),
        existing => replace(path, render, existing.as_ref()).map_err(|err| output_error(path, err)),
    }
}

/// Reports are written in pieces of this size.
const WRITE_BUFFER: usize = 1 << 20;

/// Checks that the report can be written to `output`, before profiling
/// starts: the name is refused as [`write_out`] would refuse it, and a
/// file can be made in its directory (made and removed again: nothing is
/// left behind if profiling fails).
pub fn check_output(output: Option<&Path>) -> Result<()> {
    let Some(path) = output else {
        return Ok(());
    };
    if existing(path)?.is_some_and(|metadata| !metadata.is_file()) {
        return Ok(());
    }
    let probe = temporary_beside(path);
    create_new(&probe).map_err(|err| output_error(path, err))?;
    fs::remove_file(&probe).map_err(|err| output_error(path, err))
}

/// Creates `path` as a new report file, mode 0600 (reports hold command
/// lines and paths). O_EXCL: fails on any existing name, a dangling
/// symbolic link too.
pub fn create_new(path: &Path) -> io::Result<fs::File> {
    fs::OpenOptions::new()
        .write(true)
        .create_new(true)
        .mode(0o600)
        .custom_flags(libc::O_NOFOLLOW | libc::O_CLOEXEC)
        .open(path)
}

/// What is at `path` now, if anything; Err when memprof must not write
/// there: a symbolic link, a directory, or a name that belongs to
/// another user.
fn existing(path: &Path) -> Result<Option<fs::Metadata>> {
    let metadata = match fs::symlink_metadata(path) {
        Ok(metadata) => metadata,
        Err(err) if err.kind() == io::ErrorKind::NotFound => return Ok(None),
        Err(err) => return Err(output_error(path, err)),
    };
    if metadata.is_symlink() {
        return Err(output_error(
            path,
            io::Error::from_raw_os_error(libc::ELOOP),
        ));
    }
    if metadata.is_dir() {
        return Err(output_error(
            path,
            io::Error::from_raw_os_error(libc::EISDIR),
        ));
    }
    let owner = metadata.uid();
    if owner != 0 && owner != invoking_uid() {
        let message = format!(
            "{} belongs to another user (uid {owner}): memprof does not write its report there",
            path.display()
        );
        return Err(UserError::new(message).with_exit_code(2).into());
    }
    Ok(Some(metadata))
}

/// Writes `rendered` to a new file beside `path`, syncs it and renames it
/// over `path`. The file keeps the mode and owner of the one it replaces;
/// a new one is 0600 and, under sudo, the user's who ran sudo.
fn replace(
    path: &Path,
    render: impl FnOnce(&mut dyn io::Write) -> io::Result<()>,
    replaced: Option<&fs::Metadata>,
) -> io::Result<()> {
    let temporary = temporary_beside(path);
    let written = (|| {
        let file = create_new(&temporary)?;
        match replaced {
            Some(old) => {
                file.set_permissions(fs::Permissions::from_mode(old.mode() & 0o777))?;
                nix::unistd::fchown(
                    &file,
                    Some(nix::unistd::Uid::from_raw(old.uid())),
                    Some(nix::unistd::Gid::from_raw(old.gid())),
                )?;
            }
            None => give_to_sudo_caller(&file),
        }
        let mut buffered = io::BufWriter::with_capacity(WRITE_BUFFER, file);
        render(&mut buffered)?;
        let file = buffered.into_inner().map_err(|err| err.into_error())?;
        file.sync_all()?;
        fs::rename(&temporary, path)
    })();
    if written.is_err() {
        let _ = fs::remove_file(&temporary);
    }
    written
}

/// A name for a new file in `path`'s directory, memprof's alone.
fn temporary_beside(path: &Path) -> PathBuf {
    let name = path.file_name().unwrap_or_default().to_string_lossy();
    path.with_file_name(format!(".{name}.memprof-{}.tmp", std::process::id()))
}

/// The user who ran memprof: under sudo the one who ran sudo.
pub fn invoking_uid() -> u32 {
    sudo_id("SUDO_UID")
        .filter(|_| nix::unistd::geteuid().is_root())
        .unwrap_or_else(|| nix::unistd::geteuid().as_raw())
}

fn sudo_id(name: &str) -> Option<u32> {
    std::env::var(name).ok()?.parse::<u32>().ok()
}

/// One line naming the report file; exit code 2, as for a bad option.
fn output_error(path: &Path, err: io::Error) -> anyhow::Error {
    let shown = path.display();
    let message = match err.raw_os_error() {
        Some(libc::ELOOP) => format!(
            "{shown} is a symbolic link: memprof does not follow it for its report (name the file it points to)"
        ),
        Some(libc::EISDIR) => format!("{shown} is a directory"),
        _ => format!("cannot write the report to {shown}: {err}"),
    };
    UserError::new(message).with_exit_code(2).into()
}

/// Under sudo, a report memprof created belongs to the user who ran sudo
/// (it still has mode 0600), who can then read it without root
/// (`memprof report`, `memprof diff`). Best effort.
fn give_to_sudo_caller(file: &fs::File) {
    if !nix::unistd::geteuid().is_root() {
        return;
    }
    let Some(uid) = sudo_id("SUDO_UID") else {
        return;
    };
    let _ = nix::unistd::fchown(
        file,
        Some(nix::unistd::Uid::from_raw(uid)),
        sudo_id("SUDO_GID").map(nix::unistd::Gid::from_raw),
    );
}

#[cfg(test)]
mod tests {
    use super::*;

    fn scratch(name: &str) -> PathBuf {
        let dir =
            std::env::temp_dir().join(format!("memprof-output-{name}-{}", std::process::id()));
        let _ = fs::remove_dir_all(&dir);
        fs::create_dir_all(&dir).unwrap();
        dir
    }

    #[test]
    fn a_report_replaces_the_file_whole_and_keeps_its_mode() {
        let dir = scratch("replace");
        let path = dir.join("report.txt");
        write_out(b"first", Some(&path)).unwrap();
        assert_eq!(fs::metadata(&path).unwrap().mode() & 0o777, 0o600);
        fs::set_permissions(&path, fs::Permissions::from_mode(0o640)).unwrap();
        write_out(b"second", Some(&path)).unwrap();
        assert_eq!(fs::read(&path).unwrap(), b"second");
        assert_eq!(fs::metadata(&path).unwrap().mode() & 0o777, 0o640);
        // Nothing left beside it.
        assert_eq!(fs::read_dir(&dir).unwrap().count(), 1);
        fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn a_name_of_another_users_is_refused() {
        let dir = scratch("planted");
        let planted = dir.join("planted");
        fs::write(&planted, b"theirs").unwrap();
        nix::unistd::chown(&planted, Some(nix::unistd::Uid::from_raw(65534)), None).unwrap();
        let err = write_out(b"root's report", Some(&planted)).unwrap_err();
        assert!(err.to_string().contains("belongs to another user"), "{err}");
        assert_eq!(fs::read(&planted).unwrap(), b"theirs");
        assert!(check_output(Some(&planted)).is_err());
        let fifo = dir.join("fifo");
        nix::unistd::mkfifo(&fifo, nix::sys::stat::Mode::from_bits_truncate(0o666)).unwrap();
        nix::unistd::chown(&fifo, Some(nix::unistd::Uid::from_raw(65534)), None).unwrap();
        assert!(write_out(b"root's report", Some(&fifo)).is_err());
        fs::remove_dir_all(&dir).unwrap();
    }
}
