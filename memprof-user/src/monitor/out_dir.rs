//! `memprof monitor --out DIR`: one report per interval, each a file of
//! its own named by its UTC time (names sort as times do), the oldest
//! removed beyond `--out-keep` files or `--out-max-size` bytes in all.
use std::{
    fs,
    io::Write as _,
    path::{Path, PathBuf},
    time::SystemTime,
};

use anyhow::{Context as _, Result};

use crate::{
    human::error::UserError,
    report::{create_new, json, options::Format, pprof, Report},
};

const PREFIX: &str = "memprof-";

pub struct OutDir {
    dir: PathBuf,
    /// pprof profiles (`--format pprof`), else JSON reports.
    pprof: bool,
    keep: usize,
    max_bytes: u64,
}

impl OutDir {
    /// Checks that DIR can take the files before profiling starts.
    pub fn open(dir: &Path, format: Format, keep: usize, max_bytes: u64) -> Result<OutDir> {
        fs::create_dir_all(dir).map_err(|err| {
            UserError::new(format!("cannot write reports to {}: {err}", dir.display()))
                .with_exit_code(2)
        })?;
        let probe = dir.join(format!(".memprof-write-check-{}", std::process::id()));
        create_new(&probe)
            .and_then(|_| fs::remove_file(&probe))
            .map_err(|err| {
                UserError::new(format!("cannot write reports to {}: {err}", dir.display()))
                    .with_exit_code(2)
            })?;
        Ok(OutDir {
            dir: dir.to_path_buf(),
            pprof: format == Format::Pprof,
            keep: keep.max(1),
            max_bytes,
        })
    }

    /// Writes `report` to a new file, then removes the oldest beyond the
    /// limits (never the one just written). Returns its path.
    pub fn write(&self, report: &Report) -> Result<PathBuf> {
        let (bytes, extension) = match self.pprof {
            true => (pprof::render(report)?, "pb.gz"),
            false => (json::render(report)?.into_bytes(), "json"),
        };
        let stamp = humantime::format_rfc3339_millis(SystemTime::now())
            .to_string()
            .replace(':', "");
        // Two reports in one millisecond (SIGHUP at an interval) both stay.
        let path = (1..)
            .map(|n| match n {
                1 => self.dir.join(format!("{PREFIX}{stamp}.{extension}")),
                n => self.dir.join(format!("{PREFIX}{stamp}-{n}.{extension}")),
            })
            .find(|path| !path.exists())
            .unwrap_or_default();
        // Whole or not at all: written aside (a new file, mode 0600, no
        // link followed: memprof runs as root), then renamed into place.
        let partial = self
            .dir
            .join(format!(".{PREFIX}{stamp}.{}.partial", std::process::id()));
        create_new(&partial)
            .and_then(|mut file| file.write_all(&bytes))
            .and_then(|()| fs::rename(&partial, &path))
            .with_context(|| format!("writing {}", path.display()))?;
        self.prune(&path)?;
        Ok(path)
    }

    fn prune(&self, newest: &Path) -> Result<()> {
        let mut files: Vec<(PathBuf, u64)> = fs::read_dir(&self.dir)?
            .flatten()
            .filter(|entry| is_report_name(&entry.file_name().to_string_lossy()))
            .map(|entry| {
                let size = entry.metadata().map_or(0, |m| m.len());
                (entry.path(), size)
            })
            .collect();
        files.sort();
        let mut total: u64 = files.iter().map(|(_, size)| size).sum();
        let mut count = files.len();
        for (path, size) in files {
            if path == newest || (count <= self.keep && total <= self.max_bytes) {
                break;
            }
            fs::remove_file(&path).with_context(|| format!("removing {}", path.display()))?;
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
