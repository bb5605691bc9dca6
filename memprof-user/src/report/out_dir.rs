//! `memprof monitor --out DIR`: one report per interval, each a file of
//! its own named by its UTC time (names sort as times do), the oldest
//! removed beyond `--out-keep` files or `--out-max-size` bytes in all.
use std::{
    fs,
    path::{Path, PathBuf},
    time::SystemTime,
};

use anyhow::{Context as _, Result};

use super::{json, pprof, Report};
use crate::{cli::Format, error::UserError};

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
        let probe = dir.join(".memprof-write-check");
        fs::write(&probe, b"")
            .and_then(|()| fs::remove_file(&probe))
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
        let path = self.dir.join(format!("{PREFIX}{stamp}.{extension}"));
        // Whole or not at all: written aside, then renamed into place.
        let partial = self.dir.join(format!(".{PREFIX}{stamp}.partial"));
        fs::write(&partial, &bytes)
            .and_then(|()| fs::rename(&partial, &path))
            .with_context(|| format!("writing {}", path.display()))?;
        self.prune(&path)?;
        Ok(path)
    }

    fn prune(&self, newest: &Path) -> Result<()> {
        let mut files: Vec<(PathBuf, u64)> = fs::read_dir(&self.dir)?
            .flatten()
            .filter(|entry| {
                let name = entry.file_name();
                let name = name.to_string_lossy();
                name.starts_with(PREFIX) && (name.ends_with(".json") || name.ends_with(".pb.gz"))
            })
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
