//! Compiled tables, kept by file (GNU build id, else device, inode, size
//! and mtime) up to a bound on their rows' bytes, least recently used
//! evicted first.
use std::{collections::HashMap, fs::File, io::Read as _, path::Path, sync::Arc};

use anyhow::{Context as _, Result};

use super::table::{compile, UnwindTable};
use crate::host::files::FileIdentity;

/// What identifies a file's content.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
enum Key {
    BuildId(Vec<u8>),
    File(FileIdentity),
}

#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct CacheStats {
    /// Files compiled (cache misses).
    pub files_compiled: u64,
    /// Lookups answered from the cache.
    pub hits: u64,
    /// Bytes of rows held, and in how many tables.
    pub bytes_held: usize,
    pub tables_held: usize,
    /// Tables dropped to stay within the bound.
    pub evictions: u64,
}

struct Entry {
    table: Arc<UnwindTable>,
    last_used: u64,
}

/// Compiled unwind tables by file content, within `max_bytes` of rows.
/// A table larger than the bound by itself is returned but not kept.
pub struct UnwindCache {
    max_bytes: usize,
    entries: HashMap<Key, Entry>,
    /// Files already seen, so that a file read again is not reopened for
    /// its build id.
    keys: HashMap<FileIdentity, Key>,
    clock: u64,
    stats: CacheStats,
}

impl UnwindCache {
    pub fn new(max_bytes: usize) -> UnwindCache {
        UnwindCache {
            max_bytes,
            entries: HashMap::new(),
            keys: HashMap::new(),
            clock: 0,
            stats: CacheStats::default(),
        }
    }

    pub fn stats(&self) -> CacheStats {
        self.stats
    }

    /// The table of the ELF file at `path`, compiled on first use. A file
    /// known by its identity is not opened again.
    pub fn get_or_compile(&mut self, path: &Path) -> Result<Arc<UnwindTable>> {
        let opened = || {
            crate::host::untrusted::open(path)
                .with_context(|| format!("opening {}", path.display()))
        };
        let metadata = crate::host::untrusted::metadata(path)
            .with_context(|| format!("reading {}", path.display()))?;
        let identity = FileIdentity::of_metadata(&metadata);
        let key = match self.keys.get(&identity) {
            Some(key) => key.clone(),
            None => {
                let key = key_of(&opened()?, identity);
                self.keys.insert(identity, key.clone());
                key
            }
        };
        self.clock += 1;
        if let Some(entry) = self.entries.get_mut(&key) {
            entry.last_used = self.clock;
            self.stats.hits += 1;
            return Ok(entry.table.clone());
        }
        let mut data = Vec::new();
        opened()?
            .take(crate::host::untrusted::MAX_FILE_BYTES)
            .read_to_end(&mut data)
            .with_context(|| format!("reading {}", path.display()))?;
        let table =
            Arc::new(compile(&data).with_context(|| format!("compiling {}", path.display()))?);
        self.stats.files_compiled += 1;
        self.stats.bytes_held += table.stats.bytes;
        self.entries.insert(
            key.clone(),
            Entry {
                table: table.clone(),
                last_used: self.clock,
            },
        );
        self.evict(&key);
        self.stats.tables_held = self.entries.len();
        Ok(table)
    }

    /// Drops least recently used tables until the rows held fit the
    /// bound, `newest` last.
    fn evict(&mut self, newest: &Key) {
        while self.stats.bytes_held > self.max_bytes {
            let oldest = self
                .entries
                .iter()
                .filter(|(key, _)| *key != newest)
                .min_by_key(|(_, entry)| entry.last_used)
                .map(|(key, _)| key.clone())
                .unwrap_or_else(|| newest.clone());
            let Some(entry) = self.entries.remove(&oldest) else {
                break;
            };
            self.stats.bytes_held -= entry.table.stats.bytes;
            self.stats.evictions += 1;
            self.keys.retain(|_, key| *key != oldest);
        }
    }
}

/// The file's build id, or its identity when it has none.
fn key_of(file: &File, identity: FileIdentity) -> Key {
    let cache = object::ReadCache::new(file);
    match crate::host::elf::build_id(&cache) {
        Some(id) if !id.is_empty() => Key::BuildId(id),
        _ => Key::File(identity),
    }
}
