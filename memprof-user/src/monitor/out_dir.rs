//! `memprof monitor --out DIR`: one report per interval, each a file of
//! its own named by its UTC time (names sort as times do), the oldest
//! removed beyond `--out-keep` files or `--out-max-size` bytes in all.
//! memprof runs as root: the directory is opened once, not through a
//! symbolic link, and must belong to root or to the user who ran memprof
//! and be writable by no one else; every file is then made, renamed and
//! removed through that handle, never by a path someone could swap.
use std::{
    fs,
    io::Write as _,
    os::{
        fd::{AsRawFd as _, OwnedFd},
        unix::fs::MetadataExt as _,
    },
    path::{Path, PathBuf},
    time::SystemTime,
};

use anyhow::{Context as _, Result};
use nix::{
    fcntl::{openat, renameat, AtFlags, OFlag},
    sys::stat::{fstatat, Mode},
    unistd::{unlinkat, UnlinkatFlags},
};

use crate::{
    human::error::UserError,
    report::{
        json,
        options::{Format, JsonVersion, ReportOptions},
        output::invoking_uid,
        pprof, Report,
    },
};

const PREFIX: &str = "memprof-";

/// What a report being written is named until it is whole.
const PARTIAL: &str = ".partial";

pub struct OutDir {
    /// The directory as named, for messages.
    shown: PathBuf,
    dir: OwnedFd,
    /// pprof profiles (`--format pprof`), else JSON reports.
    pprof: bool,
    json_version: JsonVersion,
    keep: usize,
    max_bytes: u64,
}

impl OutDir {
    /// Opens DIR (made if need be) and checks it can take the files
    /// before profiling starts; removes the partial files an earlier
    /// memprof left there.
    pub fn open(
        dir: &Path,
        options: &ReportOptions,
        keep: usize,
        max_bytes: u64,
    ) -> Result<OutDir> {
        let refused = |reason: String| -> anyhow::Error {
            UserError::new(format!(
                "cannot write reports to {}: {reason}",
                dir.display()
            ))
            .with_exit_code(2)
            .into()
        };
        fs::create_dir_all(dir).map_err(|err| refused(err.to_string()))?;
        let handle = nix::fcntl::open(
            dir,
            OFlag::O_RDONLY | OFlag::O_DIRECTORY | OFlag::O_NOFOLLOW | OFlag::O_CLOEXEC,
            Mode::empty(),
        )
        .map_err(|err| match err {
            nix::errno::Errno::ELOOP => refused("it is a symbolic link".to_string()),
            err => refused(err.desc().to_string()),
        })?;
        let metadata = fs::File::from(handle.try_clone()?).metadata()?;
        let owner = metadata.uid();
        if owner != 0 && owner != invoking_uid() {
            return Err(refused(format!("it belongs to another user (uid {owner})")));
        }
        if metadata.mode() & 0o022 != 0 {
            return Err(refused(format!(
                "others can write to it (mode {:o})",
                metadata.mode() & 0o7777
            )));
        }
        let out = OutDir {
            shown: dir.to_path_buf(),
            dir: handle,
            pprof: options.format == Format::Pprof,
            json_version: options.json_version,
            keep: keep.max(1),
            max_bytes,
        };
        out.remove_partial_files();
        let probe = format!(".memprof-write-check-{}", std::process::id());
        out.create_new(&probe)
            .and_then(|_| unlinkat(&out.dir, probe.as_str(), UnlinkatFlags::NoRemoveDir))
            .map_err(|err| refused(err.desc().to_string()))?;
        Ok(out)
    }

    /// Writes `report` to a new file, then removes the oldest beyond the
    /// limits (never the one just written). Returns its path.
    pub fn write(&self, report: &Report) -> Result<PathBuf> {
        let pprof_bytes = match self.pprof {
            true => Some(pprof::render(report)?),
            false => None,
        };
        let extension = if self.pprof { "pb.gz" } else { "json" };
        let stamp = humantime::format_rfc3339_millis(SystemTime::now())
            .to_string()
            .replace(':', "");
        // Two reports in one millisecond (SIGHUP at an interval) both stay.
        let name = (1..)
            .map(|n| match n {
                1 => format!("{PREFIX}{stamp}.{extension}"),
                n => format!("{PREFIX}{stamp}-{n}.{extension}"),
            })
            .find(|name| self.stat(name).is_err())
            .unwrap_or_default();
        let path = self.shown.join(&name);
        // Whole or not at all: written aside (a new file, mode 0600, no
        // link followed: memprof runs as root), then renamed into place.
        let partial = format!(".{PREFIX}{stamp}.{}{PARTIAL}", std::process::id());
        let written = self
            .create_new(&partial)
            .map_err(std::io::Error::from)
            .and_then(|file| {
                let mut out = std::io::BufWriter::with_capacity(1 << 20, file);
                match &pprof_bytes {
                    Some(bytes) => out.write_all(bytes)?,
                    None => json::write(report, self.json_version, &mut out)?,
                }
                out.flush()
            })
            .and_then(|()| {
                renameat(&self.dir, partial.as_str(), &self.dir, name.as_str())
                    .map_err(std::io::Error::from)
            });
        if written.is_err() {
            let _ = unlinkat(&self.dir, partial.as_str(), UnlinkatFlags::NoRemoveDir);
        }
        written.with_context(|| format!("writing {}", path.display()))?;
        self.prune(&name)?;
        Ok(path)
    }

    /// A new file `name` in the directory, mode 0600.
    fn create_new(&self, name: &str) -> nix::Result<fs::File> {
        let flags =
            OFlag::O_WRONLY | OFlag::O_CREAT | OFlag::O_EXCL | OFlag::O_NOFOLLOW | OFlag::O_CLOEXEC;
        openat(&self.dir, name, flags, Mode::from_bits_truncate(0o600)).map(fs::File::from)
    }

    fn stat(&self, name: &str) -> nix::Result<nix::sys::stat::FileStat> {
        fstatat(&self.dir, name, AtFlags::AT_SYMLINK_NOFOLLOW)
    }

    /// The names in the directory, read through its handle.
    fn names(&self) -> Result<Vec<String>> {
        let listed = fs::read_dir(format!("/proc/self/fd/{}", self.dir.as_raw_fd()))
            .with_context(|| format!("reading {}", self.shown.display()))?;
        Ok(listed
            .flatten()
            .map(|entry| entry.file_name().to_string_lossy().into_owned())
            .collect())
    }

    /// Removes what a memprof that stopped mid-write left
    /// (`.memprof-….partial`).
    fn remove_partial_files(&self) {
        for name in self.names().unwrap_or_default() {
            if name.starts_with(&format!(".{PREFIX}")) && name.ends_with(PARTIAL) {
                let _ = unlinkat(&self.dir, name.as_str(), UnlinkatFlags::NoRemoveDir);
            }
        }
    }

    fn prune(&self, newest: &str) -> Result<()> {
        let mut files: Vec<(String, u64)> = self
            .names()?
            .into_iter()
            .filter(|name| is_report_name(name))
            .map(|name| {
                let size = self.stat(&name).map_or(0, |stat| stat.st_size as u64);
                (name, size)
            })
            .collect();
        files.sort();
        let mut total: u64 = files.iter().map(|(_, size)| size).sum();
        let mut count = files.len();
        for (name, size) in files {
            if name == newest || (count <= self.keep && total <= self.max_bytes) {
                break;
            }
            unlinkat(&self.dir, name.as_str(), UnlinkatFlags::NoRemoveDir)
                .with_context(|| format!("removing {}", self.shown.join(&name).display()))?;
            count -= 1;
            total -= size;
        }
        Ok(())
    }
}

/// A report's own name, `memprof-2026-11-24T104235.240Z[-N].json` (or
/// `.pb.gz`): pruning removes nothing else.
fn is_report_name(name: &str) -> bool {
    let Some(rest) = name.strip_prefix(PREFIX) else {
        return false;
    };
    let Some(stamp) = rest
        .strip_suffix(".json")
        .or_else(|| rest.strip_suffix(".pb.gz"))
    else {
        return false;
    };
    let bytes = stamp.as_bytes();
    // 2026-11-24T104235.240Z: 22 characters.
    bytes.len() >= 22
        && bytes[..4].iter().all(u8::is_ascii_digit)
        && bytes[4] == b'-'
        && bytes[10] == b'T'
        && bytes[21] == b'Z'
}

#[cfg(test)]
mod tests {
    use super::is_report_name;

    #[test]
    fn only_its_own_files_are_pruned() {
        assert!(is_report_name("memprof-2026-11-24T104235.240Z.json"));
        assert!(is_report_name("memprof-2026-11-24T104235.240Z-2.pb.gz"));
        assert!(!is_report_name("memprof-1.json"));
        assert!(!is_report_name("memprof-notes.json"));
        assert!(!is_report_name("other-2026-11-24T104235.240Z.json"));
    }
}
