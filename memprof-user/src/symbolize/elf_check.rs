//! What memprof checks in a file before blazesym reads it. blazesym
//! allocates a compressed section's stated size before it inflates it: a
//! malformed file that states more than can be had makes that allocation
//! fail, and a failed allocation aborts the process. No panic to catch:
//! the whole session, every process's profile, would be lost. So memprof
//! first reads the section headers of the file, and of the debug files
//! blazesym would follow from it (build id, `.gnu_debuglink`,
//! `.gnu_debugaltlink`, `.debug_sup`), and leaves a file that fails
//! unsymbolized. The headers are read on demand, not the whole file.
use std::{
    collections::BTreeSet,
    ffi::OsStr,
    fs,
    os::unix::ffi::OsStrExt as _,
    path::{Path, PathBuf},
};

use anyhow::{bail, Context as _, Result};
use object::{
    elf,
    read::elf::{CompressionHeader as _, FileHeader, SectionHeader as _},
    Endianness, FileKind, ReadCache, ReadRef,
};

use crate::host::{
    elf::build_id,
    untrusted::{self, Refused},
};

/// The most zlib inflates one byte to (deflate's limit is 1032:1).
const ZLIB_MAX_RATIO: u64 = 1032;

/// The debug files one file points to.
#[derive(Debug, Default, PartialEq, Eq)]
pub struct DebugLinks {
    /// `.gnu_debuglink`: a file name, looked for in several places.
    pub debuglink: Option<Vec<u8>>,
    /// `.gnu_debugaltlink` and `.debug_sup`: a path and a build id.
    pub supplementary: Vec<(Vec<u8>, Vec<u8>)>,
    pub build_id: Option<Vec<u8>>,
}

/// Checks that every zlib-compressed section of an ELF file states a size
/// zlib can give, and returns what the file links to for its debug
/// information. Not an ELF file: nothing to check (blazesym refuses it
/// before it allocates). An error is one line.
pub fn check<'data, R: ReadRef<'data>>(data: R) -> Result<DebugLinks> {
    match FileKind::parse(data) {
        Ok(FileKind::Elf32) => check_elf::<elf::FileHeader32<Endianness>, R>(data),
        Ok(FileKind::Elf64) => check_elf::<elf::FileHeader64<Endianness>, R>(data),
        _ => Ok(DebugLinks::default()),
    }
}

fn check_elf<'data, Elf, R>(data: R) -> Result<DebugLinks>
where
    Elf: FileHeader<Endian = Endianness>,
    R: ReadRef<'data>,
{
    let header = Elf::parse(data)?;
    let endian = header.endian()?;
    let sections = header
        .sections(endian, data)
        .context("its section headers")?;
    for (index, section) in sections.iter().enumerate() {
        let compression = section
            .compression(endian, data)
            .with_context(|| format!("section {index}"))?;
        let Some((compression, _, compressed)) = compression else {
            continue;
        };
        let stated: u64 = compression.ch_size(endian).into();
        if compression.ch_type(endian) == elf::ELFCOMPRESS_ZLIB
            && stated
                > compressed
                    .saturating_mul(ZLIB_MAX_RATIO)
                    .saturating_add(1024)
        {
            bail!(
                "section {index} states {stated} bytes once inflated, from {compressed} \
                 compressed: more than zlib gives"
            );
        }
    }
    let section_data = |name: &[u8]| -> Option<&'data [u8]> {
        let (_, section) = sections.section_by_name(endian, name)?;
        section.data(endian, data).ok()
    };
    let until_nul =
        |bytes: &[u8]| -> Vec<u8> { bytes.split(|&b| b == 0).next().unwrap_or_default().to_vec() };
    let mut links = DebugLinks {
        debuglink: section_data(b".gnu_debuglink")
            .map(until_nul)
            .filter(|name| !name.is_empty()),
        supplementary: Vec::new(),
        build_id: build_id(data),
    };
    // A path, NUL, the supplementary file's build id.
    if let Some(altlink) = section_data(b".gnu_debugaltlink") {
        let name = until_nul(altlink);
        let id = altlink.get(name.len() + 1..).unwrap_or_default();
        links.supplementary.push((name, id.to_vec()));
    }
    // Version (2 bytes), is-supplementary (1), path, NUL, ULEB128 length,
    // checksum.
    if let Some(sup) = section_data(b".debug_sup").and_then(|sup| sup.get(3..)) {
        let name = until_nul(sup);
        let rest = sup.get(name.len() + 1..).unwrap_or_default();
        let (length, used) = uleb128(rest);
        let id = usize::try_from(length)
            .ok()
            .and_then(|length| rest.get(used..used.checked_add(length)?))
            .unwrap_or_default();
        links.supplementary.push((name, id.to_vec()));
    }
    links.supplementary.retain(|(name, _)| !name.is_empty());
    Ok(links)
}

/// A ULEB128 number and how many bytes it took (0 and 0 when there is none).
fn uleb128(bytes: &[u8]) -> (u64, usize) {
    let mut value = 0u64;
    for (index, &byte) in bytes.iter().enumerate().take(10) {
        value |= u64::from(byte & 0x7f) << (7 * index);
        if byte & 0x80 == 0 {
            return (value, index + 1);
        }
    }
    (0, 0)
}

/// Where blazesym looks for the debug file `name` of the file `linker`
/// (canonical path) with build id `id`: by build id, then by name in its
/// debug directories, beside the file, and in the debug directories under
/// each of the file's parent directories. Those that exist.
fn candidates(
    name: &[u8],
    linker: Option<&Path>,
    id: Option<&[u8]>,
    debug_dirs: &[PathBuf],
) -> Vec<PathBuf> {
    let name = Path::new(OsStr::from_bytes(name));
    let mut paths = Vec::new();
    if let Some(id) = id.filter(|id| id.len() >= 8) {
        let hex: String = id.iter().map(|b| format!("{b:02x}")).collect();
        for dir in debug_dirs {
            paths.push(dir.join(format!(".build-id/{}/{}.debug", &hex[..2], &hex[2..])));
        }
    }
    for dir in debug_dirs {
        paths.push(dir.join(name));
    }
    if let Some(linker) = linker {
        paths.push(linker.with_file_name(name));
        let relative = linker
            .parent()
            .and_then(|dir| dir.strip_prefix("/").ok())
            .unwrap_or(Path::new(""));
        for dir in debug_dirs {
            for ancestor in relative.ancestors().filter(|a| !a.as_os_str().is_empty()) {
                paths.push(dir.join(ancestor).join(name));
            }
        }
    }
    paths.retain(|path| Some(path.as_path()) != linker && path.exists());
    paths
}

/// How far a file's own word is taken on where its debug files are.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Links {
    /// A file only root can change, in a directory only root can change:
    /// its debug links are followed as gdb follows them.
    Trusted,
    /// A file another user or a container controls (blazesym reads a copy
    /// of it, see `copies`): a debug link is a file name, looked for in
    /// the debug directories and by build id only; a supplementary file
    /// must be named under a debug directory.
    Untrusted,
}

/// Why blazesym must not read a file as it would.
#[derive(Debug)]
pub struct Unreadable {
    /// One line.
    pub reason: String,
    /// The file itself is sound, only a debug file it links to is not:
    /// its own symbols can be read, without following its links.
    pub symbols_only: bool,
}

/// Err when blazesym must not read the ELF file at `path`, or a debug
/// file it would follow from it: malformed (see the module's doc), a
/// debug file that is not a regular file (a FIFO would hang blazesym's
/// open), or, for an [`Links::Untrusted`] file, a link that names a
/// path. A file that cannot be opened is no danger: blazesym fails to
/// open it too.
/// `debug_dirs`: where blazesym looks for debug files (`--debug-dir`).
pub fn readable_by_blazesym(
    path: &Path,
    debug_dirs: &[PathBuf],
    trust: Links,
) -> std::result::Result<(), Unreadable> {
    links_followed(path, debug_dirs, trust).map_err(|(err, symbols_only)| Unreadable {
        reason: format!("{err:#}"),
        symbols_only,
    })
}

/// As [`readable_by_blazesym`]; the error says whether the file itself
/// can be read.
fn links_followed(
    path: &Path,
    debug_dirs: &[PathBuf],
    trust: Links,
) -> std::result::Result<(), (anyhow::Error, bool)> {
    let mut pending = vec![path.to_path_buf()];
    let mut seen = BTreeSet::new();
    while let Some(file) = pending.pop() {
        // Links can go round; a real chain is two or three files long.
        if seen.len() >= 16 || !seen.insert(file.clone()) {
            continue;
        }
        let opened = match untrusted::open(&file) {
            Ok(opened) => opened,
            Err(Refused::Unopenable(_)) => continue,
            Err(refused) if file == path => return Err((refused.into(), false)),
            Err(refused) => {
                let err = anyhow::anyhow!("its debug file {}: {refused}", file.display());
                return Err((err, true));
            }
        };
        let cache = ReadCache::new(opened);
        let links = match check(&cache) {
            Ok(links) => links,
            Err(err) if file == path => return Err((err, false)),
            Err(err) => {
                return Err((
                    err.context(format!("its debug file {}", file.display())),
                    true,
                ))
            }
        };
        // The module's own links only: the debug files found are in the
        // debug directories, root's.
        if trust == Links::Untrusted && file == path {
            links.refuse_paths(debug_dirs).map_err(|err| (err, true))?;
        }
        let canonical = fs::canonicalize(&file).ok();
        let canonical = canonical.as_deref();
        if let Some(name) = &links.debuglink {
            pending.extend(candidates(
                name,
                canonical,
                links.build_id.as_deref(),
                debug_dirs,
            ));
        }
        for (name, id) in &links.supplementary {
            pending.extend(candidates(name, canonical, Some(id), debug_dirs));
        }
    }
    Ok(())
}

impl DebugLinks {
    /// Err when a link of an untrusted file names more than a file name:
    /// a debug link with a `/` (blazesym would look for it outside the
    /// debug directories), or of digits only (beside a copy named
    /// /proc/self/fd/N, it would name one of memprof's own descriptors);
    /// a supplementary file not under a debug directory.
    fn refuse_paths(&self, debug_dirs: &[PathBuf]) -> Result<()> {
        if let Some(name) = &self.debuglink {
            if name.contains(&b'/') || name.iter().all(u8::is_ascii_digit) {
                bail!(
                    "its debug link names {}, not a file name",
                    String::from_utf8_lossy(name).escape_debug()
                );
            }
        }
        for (name, _) in &self.supplementary {
            let path = Path::new(OsStr::from_bytes(name));
            let in_debug_dir = debug_dirs.iter().any(|dir| path.starts_with(dir))
                && !path
                    .components()
                    .any(|c| c == std::path::Component::ParentDir);
            if !in_debug_dir {
                bail!(
                    "its supplementary debug file {} is not under a debug directory",
                    String::from_utf8_lossy(name).escape_debug()
                );
            }
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The 64-bit section header table of `data`: (offset, entry size, count).
    fn section_headers(data: &[u8]) -> (usize, usize, usize) {
        let word = |at: usize, width: usize| {
            let mut bytes = [0u8; 8];
            bytes[..width].copy_from_slice(&data[at..at + width]);
            u64::from_le_bytes(bytes) as usize
        };
        (word(0x28, 8), word(0x3a, 2), word(0x3c, 2))
    }

    #[test]
    fn a_compressed_section_that_states_too_much_is_refused() {
        let libc = fs::canonicalize("/usr/lib/x86_64-linux-gnu/libc.so.6").unwrap();
        let links = check(&*fs::read(&libc).unwrap()).unwrap();
        assert!(links.debuglink.is_some(), "Debian's libc has a debug link");
        assert!(links.build_id.is_some());

        // A section made zlib-compressed, stating 2^56 bytes.
        let mut data = fs::read("/bin/true").unwrap();
        let (offset, size, count) = section_headers(&data);
        let header = offset + size * (count - 1);
        let flags = header + 8;
        let section_offset = u64::from_le_bytes(data[header + 24..header + 32].try_into().unwrap());
        data[flags..flags + 8].copy_from_slice(&u64::from(elf::SHF_COMPRESSED).to_le_bytes());
        let chdr = section_offset as usize;
        data[chdr..chdr + 4].copy_from_slice(&elf::ELFCOMPRESS_ZLIB.to_le_bytes());
        data[chdr + 8..chdr + 16].copy_from_slice(&(1u64 << 56).to_le_bytes());
        let err = check(&*data).unwrap_err();
        assert!(
            format!("{err:#}").contains("more than zlib gives"),
            "{err:#}"
        );
    }

    fn default_dirs() -> Vec<PathBuf> {
        crate::symbolize::debug_files::DEFAULT_DEBUG_DIRS
            .iter()
            .map(PathBuf::from)
            .collect()
    }

    #[test]
    fn libcs_debug_files_are_found_and_readable() {
        let libc = fs::canonicalize("/usr/lib/x86_64-linux-gnu/libc.so.6").unwrap();
        let links = check(&*fs::read(&libc).unwrap()).unwrap();
        let found = candidates(
            links.debuglink.as_deref().unwrap(),
            Some(&libc),
            links.build_id.as_deref(),
            &default_dirs(),
        );
        // libc6-dbg installs it by build id (scripts/setup.sh).
        if Path::new("/usr/lib/debug/.build-id").exists() {
            assert!(!found.is_empty(), "no debug file for {}", libc.display());
        }
        readable_by_blazesym(&libc, &default_dirs(), Links::Trusted).unwrap();
        readable_by_blazesym(Path::new("/no/such/file"), &default_dirs(), Links::Trusted).unwrap();
    }

    #[test]
    fn reads_uleb128() {
        assert_eq!(uleb128(&[0x14]), (20, 1));
        assert_eq!(uleb128(&[0xe5, 0x8e, 0x26]), (624_485, 3));
        assert_eq!(uleb128(&[0x80]), (0, 0));
    }
}
