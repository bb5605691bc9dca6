//! Cleaning the debuginfod cache as elfutils' client does: at most once
//! per `cache_clean_interval_s` (a file in the cache, a day unless it
//! says), every file not used for `max_unused_age_s` (a week) goes, and
//! the directories left empty. memprof also keeps the cache under
//! [`MAX_CACHE_BYTES`], the least recently used files going first.
//! Nothing is followed: only regular files in directories of the cache's
//! own shape (DIR/BUILD-ID/FILE) are removed.
use std::{
    fs,
    io::Read as _,
    os::unix::fs::OpenOptionsExt as _,
    path::{Path, PathBuf},
    time::{Duration, SystemTime},
};

/// elfutils' defaults.
const DEFAULT_INTERVAL_SECS: u64 = 86_400;
const DEFAULT_MAX_UNUSED_SECS: u64 = 604_800;

/// The most the cache keeps: a few debug files of the largest programs.
const MAX_CACHE_BYTES: u64 = 16 << 30;

/// A file of the cache, when it was last used.
struct Cached {
    used: SystemTime,
    bytes: u64,
    path: PathBuf,
}

/// Cleans the cache at `dir` if its interval has passed by `now`.
pub fn clean(dir: &Path, now: SystemTime) {
    let interval_file = dir.join("cache_clean_interval_s");
    let interval = setting(&interval_file, DEFAULT_INTERVAL_SECS);
    let max_unused = setting(&dir.join("max_unused_age_s"), DEFAULT_MAX_UNUSED_SECS);
    // The interval file's modification: the last cleaning.
    let last = fs::symlink_metadata(&interval_file).and_then(|m| m.modified());
    if let Ok(last) = last {
        if now.duration_since(last).unwrap_or_default() < Duration::from_secs(interval) {
            return;
        }
    }
    let mut files = cached_files(dir);
    files.sort_by_key(|file| file.used);
    let mut total: u64 = files.iter().map(|file| file.bytes).sum();
    for file in &files {
        let unused = now.duration_since(file.used).unwrap_or_default();
        if (unused > Duration::from_secs(max_unused) || total > MAX_CACHE_BYTES)
            && fs::remove_file(&file.path).is_ok()
        {
            total -= file.bytes;
        }
    }
    for file in &files {
        // Fails, as it should, while the directory holds anything.
        if let Some(build_id_dir) = file.path.parent() {
            let _ = fs::remove_dir(build_id_dir);
        }
    }
    for (path, value) in [
        (&interval_file, interval),
        (&dir.join("max_unused_age_s"), max_unused),
    ] {
        let _ = write_setting(path, value);
    }
}

/// The regular files in DIR/BUILD-ID/ (a build id: hex digits), with the
/// debuginfod crate's stale downloads (DIR/.tmpXXXXXX).
fn cached_files(dir: &Path) -> Vec<Cached> {
    let mut files = Vec::new();
    let Ok(entries) = fs::read_dir(dir) else {
        return files;
    };
    for entry in entries.flatten() {
        let name = entry.file_name();
        let name = name.to_string_lossy();
        let Ok(meta) = entry.metadata() else {
            continue;
        };
        if meta.is_file() && name.starts_with(".tmp") {
            files.extend(cached(entry.path(), &meta));
            continue;
        }
        let build_id = name.len() >= 4 && name.bytes().all(|b| b.is_ascii_hexdigit());
        if !meta.is_dir() || !build_id {
            continue;
        }
        let Ok(inner) = fs::read_dir(entry.path()) else {
            continue;
        };
        for file in inner.flatten() {
            // `metadata` of a DirEntry does not follow a symbolic link.
            if let Some(meta) = file.metadata().ok().filter(|m| m.is_file()) {
                files.extend(cached(file.path(), &meta));
            }
        }
    }
    files
}

fn cached(path: PathBuf, meta: &fs::Metadata) -> Option<Cached> {
    let used = meta.accessed().ok()?.max(meta.modified().ok()?);
    Some(Cached {
        used,
        bytes: meta.len(),
        path,
    })
}

/// A number of seconds the cache keeps in a file of its own, or `default`.
fn setting(path: &Path, default: u64) -> u64 {
    let mut text = String::new();
    let read = fs::OpenOptions::new()
        .read(true)
        .custom_flags(libc::O_NOFOLLOW | libc::O_NONBLOCK)
        .open(path)
        .and_then(|file| file.take(64).read_to_string(&mut text));
    read.ok()
        .and_then(|_| text.trim().parse().ok())
        .unwrap_or(default)
}

fn write_setting(path: &Path, value: u64) -> std::io::Result<()> {
    use std::io::Write as _;
    let mut file = fs::OpenOptions::new()
        .write(true)
        .create(true)
        .truncate(true)
        .mode(0o644)
        .custom_flags(libc::O_NOFOLLOW | libc::O_NONBLOCK)
        .open(path)?;
    writeln!(file, "{value}")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn files_unused_for_a_week_go_and_the_rest_stay_until_the_next_interval() {
        let dir = std::env::temp_dir().join(format!("memprof-debug-cache-{}", std::process::id()));
        let _ = fs::remove_dir_all(&dir);
        let old = dir.join("0123456789abcdef");
        let fresh = dir.join("fedcba9876543210");
        let other = dir.join("not-a-build-id");
        for d in [&old, &fresh, &other] {
            fs::create_dir_all(d).unwrap();
            fs::write(d.join("debuginfo"), b"x").unwrap();
        }
        let week_later = SystemTime::now() + Duration::from_secs(DEFAULT_MAX_UNUSED_SECS + 60);
        // The fresh file used just before "now", a week on.
        let file = fs::File::options()
            .write(true)
            .open(fresh.join("debuginfo"))
            .unwrap();
        file.set_times(
            fs::FileTimes::new()
                .set_accessed(week_later)
                .set_modified(week_later),
        )
        .unwrap();
        clean(&dir, week_later);
        assert!(
            !old.exists(),
            "unused for a week: removed, its directory too"
        );
        assert!(fresh.join("debuginfo").exists());
        assert!(
            other.join("debuginfo").exists(),
            "not the cache's own shape"
        );
        assert_eq!(setting(&dir.join("cache_clean_interval_s"), 0), 86_400);
        // Cleaned just now (the interval file's time): not again within
        // the day, even a file unused for longer than a week.
        fs::create_dir_all(&old).unwrap();
        fs::write(old.join("debuginfo"), b"x").unwrap();
        let long_ago = SystemTime::now() - Duration::from_secs(DEFAULT_MAX_UNUSED_SECS * 2);
        fs::File::options()
            .write(true)
            .open(old.join("debuginfo"))
            .unwrap()
            .set_times(
                fs::FileTimes::new()
                    .set_accessed(long_ago)
                    .set_modified(long_ago),
            )
            .unwrap();
        clean(&dir, SystemTime::now() + Duration::from_secs(3600));
        assert!(old.exists());
        let _ = fs::remove_dir_all(&dir);
    }
}
