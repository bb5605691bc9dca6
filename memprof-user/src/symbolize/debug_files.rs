//! Separate debug files for stripped modules, by GNU build id: under the
//! debug directories (`DIR/.build-id/xx/rest.debug`, as gdb and perf look),
//! else from the debuginfod servers named in `DEBUGINFOD_URLS`, cached on
//! disk where elfutils' client caches them (`DEBUGINFOD_CACHE_PATH`, else
//! `~/.cache/debuginfod_client`), so gdb, perf and memprof share one cache;
//! under sudo in root's own, /var/cache/memprof/debuginfod. A download is
//! cut off past the size memprof reads; the cache is cleaned of files
//! unused for a week, at most once a day, as elfutils' client cleans it.
//! (A `.gnu_debuglink` is followed by blazesym itself, through the same
//! directories.)
use std::{
    collections::HashMap,
    path::{Path, PathBuf},
    time::Duration,
};

use debuginfod::{BuildId, CachingClient, Client, HttpClient, HttpClientError, Readable};

use crate::host::untrusted::MAX_FILE_BYTES;

/// The debug directories searched when the user names none (gdb's and
/// blazesym's defaults).
pub const DEFAULT_DEBUG_DIRS: [&str; 2] = ["/usr/lib/debug", "/lib/debug"];

/// The download cache under sudo (root's, not the invoking user's).
const ROOT_CACHE: &str = "/var/cache/memprof/debuginfod";

/// How long one download may take before memprof gives up on it.
const FETCH_TIMEOUT: Duration = Duration::from_secs(30);

pub struct DebugFiles {
    dirs: Vec<PathBuf>,
    /// By build id (hex): the file found, or None.
    found: HashMap<String, Option<PathBuf>>,
    /// The debuginfod client, made on first use: None when
    /// `DEBUGINFOD_URLS` names no server (or could not be used: said once).
    client: Option<Option<CachingClient>>,
}

impl DebugFiles {
    pub fn new(dirs: &[PathBuf]) -> DebugFiles {
        let dirs = if dirs.is_empty() {
            DEFAULT_DEBUG_DIRS.iter().map(PathBuf::from).collect()
        } else {
            dirs.to_vec()
        };
        DebugFiles {
            dirs,
            found: HashMap::new(),
            client: None,
        }
    }

    /// The debug directories, for blazesym's `.gnu_debuglink` search.
    pub fn dirs(&self) -> &[PathBuf] {
        &self.dirs
    }

    /// The separate debug file of the module whose build id is `build_id`
    /// (hex), if one can be found.
    pub fn find(&mut self, build_id: &str) -> Option<PathBuf> {
        // It names files and URLs: hex digits only.
        if build_id.len() < 4 || !build_id.bytes().all(|b| b.is_ascii_hexdigit()) {
            return None;
        }
        if let Some(found) = self.found.get(build_id) {
            return found.clone();
        }
        let found = self
            .in_debug_dirs(build_id)
            .or_else(|| self.download(build_id));
        self.found.insert(build_id.to_string(), found.clone());
        found
    }

    fn in_debug_dirs(&self, build_id: &str) -> Option<PathBuf> {
        self.dirs
            .iter()
            .map(|dir| build_id_path(dir, build_id))
            .find(|path| path.is_file())
    }

    fn download(&mut self, build_id: &str) -> Option<PathBuf> {
        let client = self.client.get_or_insert_with(debuginfod_client).as_ref()?;
        let id = BuildId::formatted(build_id.to_string());
        match off_memprofs_runtime(|| client.fetch_debug_info(&id)) {
            Ok(Some(path)) => the_file_asked_for(path, build_id),
            Ok(None) => None,
            Err(err) => {
                eprintln!("memprof: warning: debuginfod: build id {build_id}: {err:#}");
                None
            }
        }
    }
}

/// `path`, a download for `build_id`, if it is that file: a server (or
/// whoever answers for it) may send anything. Another file, or one
/// larger than memprof reads, is removed from the cache and said once.
fn the_file_asked_for(path: PathBuf, build_id: &str) -> Option<PathBuf> {
    let size = crate::host::untrusted::metadata(&path).map_or(0, |m| m.len());
    let arrived = crate::host::elf::build_id_hex(&path);
    if arrived.as_deref() == Some(build_id) && size <= MAX_FILE_BYTES {
        return Some(path);
    }
    eprintln!(
        "memprof: warning: debuginfod: build id {build_id}: the server sent another file \
         (build id {}, {size} bytes); not used",
        arrived.as_deref().unwrap_or("none")
    );
    let _ = std::fs::remove_file(&path);
    None
}

/// A client for the servers in `DEBUGINFOD_URLS`, or None.
fn debuginfod_client() -> Option<CachingClient> {
    let made = || -> anyhow::Result<Option<CachingClient>> {
        let http = reqwest::blocking::Client::builder()
            .timeout(FETCH_TIMEOUT)
            .build()?;
        let Some(client) = Client::builder()
            .http_client(Capped(http))
            .build_from_env()?
        else {
            return Ok(None);
        };
        // Under sudo, root must not write into (or trust) a cache the
        // invoking user controls (`sudo -E` keeps their HOME and
        // DEBUGINFOD_CACHE_PATH): root's own cache then.
        let dir = match std::env::var_os("SUDO_UID") {
            Some(_) => PathBuf::from(ROOT_CACHE),
            None => std::env::var_os("DEBUGINFOD_CACHE_PATH")
                .map(PathBuf::from)
                .or_else(|| {
                    let home = std::env::var_os("XDG_CACHE_HOME")
                        .map(PathBuf::from)
                        .or_else(|| {
                            Some(PathBuf::from(std::env::var_os("HOME")?).join(".cache"))
                        })?;
                    Some(home.join("debuginfod_client"))
                })
                .ok_or_else(|| {
                    anyhow::anyhow!("no cache directory (DEBUGINFOD_CACHE_PATH, HOME)")
                })?,
        };
        let client = CachingClient::new(client, &dir)?;
        super::debug_cache::clean(&dir, std::time::SystemTime::now());
        Ok(Some(client))
    };
    off_memprofs_runtime(made).unwrap_or_else(|err| {
        eprintln!("memprof: warning: debuginfod (DEBUGINFOD_URLS) not used: {err:#}");
        None
    })
}

/// reqwest's client, what a server sends cut off past [`MAX_FILE_BYTES`]
/// (a server, or whoever answers for it, may send without end).
#[derive(Debug)]
struct Capped(reqwest::blocking::Client);

impl HttpClient for Capped {
    fn get(&self, url: &str) -> Result<Box<dyn Readable>, HttpClientError> {
        let response = self
            .0
            .get(url)
            .send()
            .map_err(|err| HttpClientError::Other(Box::new(err)))?;
        if !response.status().is_success() {
            return Err(HttpClientError::StatusCode(response.status()));
        }
        if let Some(length) = response.content_length().filter(|&n| n > MAX_FILE_BYTES) {
            return Err(HttpClientError::Other(
                format!("the server offers {length} bytes, more than the {MAX_FILE_BYTES} memprof reads").into(),
            ));
        }
        Ok(Box::new(CappedRead {
            inner: response,
            left: MAX_FILE_BYTES,
        }))
    }
}

/// A body read up to `left` more bytes; one more is an error (the
/// download, half written, is then removed).
#[derive(Debug)]
struct CappedRead<R> {
    inner: R,
    left: u64,
}

impl<R: std::io::Read> std::io::Read for CappedRead<R> {
    fn read(&mut self, buf: &mut [u8]) -> std::io::Result<usize> {
        if self.left == 0 {
            return match self.inner.read(&mut [0u8; 1])? {
                0 => Ok(0),
                _ => Err(std::io::Error::other(format!(
                    "the server sent more than the {MAX_FILE_BYTES} bytes memprof reads"
                ))),
            };
        }
        let room = buf
            .len()
            .min(usize::try_from(self.left).unwrap_or(usize::MAX));
        let read = self.inner.read(&mut buf[..room])?;
        self.left -= read as u64;
        Ok(read)
    }
}

/// Runs `work` on a thread of its own and waits for it: reqwest's
/// blocking client (building it, and each download) runs a runtime of its
/// own, which must not be started from within memprof's.
fn off_memprofs_runtime<T: Send>(
    work: impl FnOnce() -> anyhow::Result<T> + Send,
) -> anyhow::Result<T> {
    std::thread::scope(|scope| {
        scope
            .spawn(work)
            .join()
            .unwrap_or_else(|_| Err(anyhow::anyhow!("its thread panicked")))
    })
}

/// Where a debug directory keeps the debug file of `build_id` (hex, at
/// least 4 digits).
fn build_id_path(dir: &Path, build_id: &str) -> PathBuf {
    dir.join(".build-id")
        .join(&build_id[..2])
        .join(format!("{}.debug", &build_id[2..]))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_body_past_the_cap_is_an_error_and_one_at_it_is_not() {
        use std::io::Read as _;
        let read = |body: &[u8], cap: u64| {
            let mut capped = CappedRead {
                inner: body,
                left: cap,
            };
            let mut out = Vec::new();
            capped.read_to_end(&mut out).map(|_| out.len())
        };
        assert_eq!(read(&[7; 100], 100).unwrap(), 100);
        assert_eq!(read(&[7; 99], 100).unwrap(), 99);
        assert!(read(&[7; 101], 100).is_err());
    }

    #[test]
    fn finds_a_debug_file_by_build_id_in_a_named_directory() {
        let dir = std::env::temp_dir().join(format!("memprof-debug-dirs-{}", std::process::id()));
        let id = "0123456789abcdef0123456789abcdef01234567";
        let path = build_id_path(&dir, id);
        std::fs::create_dir_all(path.parent().unwrap()).unwrap();
        std::fs::write(&path, b"x").unwrap();
        let mut files = DebugFiles::new(std::slice::from_ref(&dir));
        assert_eq!(files.find(id), Some(path.clone()));
        // Not a hex id: never a path outside the directory.
        assert_eq!(files.find("../../etc/passwd"), None);
        let _ = std::fs::remove_dir_all(&dir);
    }
}
