//! Reading the symbols of the files a process maps: each return address
//! becomes its frames (function, file:line, inlined functions) through
//! blazesym, with separate debug files found by build id, and caches by
//! file. Runs on the symbolizer's thread ([`super::worker`]).
use std::{
    collections::{BTreeMap, HashMap, HashSet},
    path::{Path, PathBuf},
};

use blazesym::symbolize::{
    source::{Elf, Source},
    Input, Symbolized, Symbolizer as Blaze,
};

use super::{demangled, Frame};
use crate::{
    collect::catalog::ProcessInfo,
    host::{files::FileIdentity, guard, procfs::maps::Mapping},
    human::escape::escaped,
    symbolize::{copies::Copies, debug_files::DebugFiles, elf_check, elf_check::Links},
};

pub struct Reader {
    blaze: Blaze,
    /// Frames per (file key, file offset), address left 0 (see
    /// [`file_key`]).
    cache: HashMap<(String, u64), Vec<Frame>>,
    /// Go type names per (file key, the descriptor's place as a file
    /// offset would be, were the type data mapped as the code is).
    type_names: HashMap<(String, u64), Option<String>>,
    /// Files not read as others are, by key: left unsymbolized (not a
    /// regular file, malformed: see `elf_check`; blazesym panicked on
    /// them), or read by their own symbols only. Said once, not tried
    /// again.
    verdicts: HashMap<String, Verdict>,
    /// Build ids by file key (read once).
    build_ids: HashMap<String, Option<String>>,
    /// Separate debug files of stripped modules.
    debug_files: DebugFiles,
    /// What blazesym reads of modules others control.
    copies: Copies,
    /// Modules not symbolized, or by their own symbols only, and why (one
    /// line each), by path as their processes map them.
    unreadable: BTreeMap<String, String>,
    /// Files (as memprof opens them) that took longer than the time limit
    /// on an earlier thread: not touched again.
    slow: HashSet<PathBuf>,
}

impl Reader {
    /// Separate debug files are looked for under `debug_dirs` (none:
    /// /usr/lib/debug and /lib/debug).
    pub fn with_debug_dirs(debug_dirs: &[PathBuf]) -> Self {
        let debug_files = DebugFiles::new(debug_dirs);
        Reader {
            blaze: new_blaze(debug_files.dirs()),
            debug_files,
            cache: HashMap::new(),
            type_names: HashMap::new(),
            verdicts: HashMap::new(),
            build_ids: HashMap::new(),
            copies: Copies::default(),
            unreadable: BTreeMap::new(),
            slow: HashSet::new(),
        }
    }

    /// The file at `path` (as memprof opens it) is not to be touched:
    /// reading it took an earlier thread too long. Its frames are shown
    /// as module+offset.
    pub fn refuse_slow(&mut self, path: PathBuf) {
        self.slow.insert(path);
    }

    /// The modules left unsymbolized, or named by their own symbols only
    /// (their debug files were not read), and why.
    pub fn unreadable(&self) -> &BTreeMap<String, String> {
        &self.unreadable
    }

    /// Empties the caches once they hold more than `max_frames` frames
    /// (`monitor`, on a host whose programs come and go): they fill again
    /// as reports need. True when emptied.
    pub fn trim(&mut self, max_frames: usize) -> bool {
        if self.cache.len() <= max_frames {
            return false;
        }
        self.cache.clear();
        self.type_names.clear();
        self.build_ids.clear();
        self.verdicts.clear();
        self.copies.clear();
        self.slow.clear();
        // blazesym keeps every file it opened, parsed.
        self.blaze = new_blaze(self.debug_files.dirs());
        true
    }

    /// Frames for each return address of `process` (several per address
    /// when functions were inlined there, innermost first).
    ///
    /// `on_file` is told of each file (as memprof opens it, and as the
    /// process maps it) before it is touched: the thread's owner times
    /// each.
    pub fn symbolize(
        &mut self,
        process: Option<&ProcessInfo>,
        addresses: &[u64],
        on_file: &mut dyn FnMut(&Path, &str),
    ) -> Vec<Vec<Frame>> {
        // Each module as memprof opens it (a container's own copy, through
        // the process's root): the caches are by file, not by name.
        let mut files: HashMap<String, String> = HashMap::new();
        let located: Vec<Option<(String, u64)>> = addresses
            .iter()
            .map(|&address| {
                let mapping = process?.mapping_of(address)?;
                let file = files.entry(mapping.path.clone()).or_insert_with(|| {
                    let path = openable_path(process, mapping);
                    if self.slow.contains(&path) {
                        // Not even looked at: a key no other file has.
                        let key = format!("{}\0slow", path.display());
                        self.verdicts.insert(key.clone(), Verdict::Refused);
                        self.build_ids.insert(key.clone(), None);
                        return key;
                    }
                    on_file(&path, &mapping.path);
                    file_key(&path)
                });
                Some((file.clone(), mapping.file_offset_of(address)))
            })
            .collect();
        let module_of: HashMap<String, String> = files
            .into_iter()
            .map(|(module, file)| (file, module))
            .collect();
        for (file, _) in located.iter().flatten() {
            if !self.build_ids.contains_key(file) {
                let path = Path::new(path_of(file));
                on_file(path, module_of.get(file).map_or(file, String::as_str));
                let id = crate::host::elf::build_id_hex(path);
                self.build_ids.insert(file.clone(), id);
            }
        }
        self.fill_cache(&located, &module_of, on_file);
        addresses
            .iter()
            .zip(&located)
            .map(|(&address, location)| {
                let Some(key @ (file, offset)) = location else {
                    return vec![unknown_frame(address, None)];
                };
                let build_id = self.build_ids.get(file).cloned().flatten();
                let module = module_of.get(file).unwrap_or(file);
                match self.cache.get(key) {
                    Some(frames) => frames
                        .iter()
                        .map(|f| Frame {
                            address,
                            module_offset: Some(*offset),
                            build_id: build_id.clone(),
                            ..f.clone()
                        })
                        .collect(),
                    None => vec![Frame {
                        build_id,
                        ..unknown_frame(address, Some(&(module.clone(), *offset)))
                    }],
                }
            })
            .collect()
    }

    /// The name of the Go type whose descriptor is at each of `types` of
    /// `process`, each with an address in the code that allocated it (in
    /// the same binary: the type data is not mapped executable, the code
    /// is); none where it is not one.
    pub fn go_type_names(
        &mut self,
        process: Option<&ProcessInfo>,
        types: &[u64],
        code: &[u64],
        on_file: &mut dyn FnMut(&Path, &str),
    ) -> Vec<Option<String>> {
        // Each type by its binary (its key, stat'ed once per file) and its
        // place from the code's file offset: the same in every process
        // mapping that binary.
        let mut keys: HashMap<PathBuf, String> = HashMap::new();
        let located: Vec<Option<TypeLocation>> = types
            .iter()
            .zip(code)
            .map(|(&type_address, &code_address)| {
                let mapping = process?.mapping_of(code_address)?;
                let path = openable_path(process, mapping);
                if self.slow.contains(&path) {
                    return None;
                }
                let distance = type_address.wrapping_sub(code_address) as i64;
                let offset = mapping.file_offset_of(code_address);
                let key = keys
                    .entry(path.clone())
                    .or_insert_with(|| file_key(&path))
                    .clone();
                Some(TypeLocation {
                    key,
                    path,
                    module: mapping.path.clone(),
                    place: (offset, distance),
                })
            })
            .collect();
        let mut by_file: HashMap<&str, Vec<&TypeLocation>> = HashMap::new();
        for location in located.iter().flatten() {
            if !self.type_names.contains_key(&location.cache_key()) {
                by_file.entry(&location.key).or_default().push(location);
            }
        }
        for unnamed in by_file.into_values() {
            let (path, module) = (&unnamed[0].path, &unnamed[0].module);
            on_file(path, module);
            let places: Vec<(u64, i64)> = unnamed.iter().map(|l| l.place).collect();
            let names = guard::contained(|| super::go::name_go_types(path, &places))
                .unwrap_or_else(|_| vec![None; places.len()]);
            for (location, name) in unnamed.into_iter().zip(names) {
                self.type_names.insert(location.cache_key(), name);
            }
        }
        located
            .iter()
            .map(|location| {
                self.type_names
                    .get(&location.as_ref()?.cache_key())?
                    .clone()
            })
            .collect()
    }

    /// Symbolizes, in one batch per file, the locations not cached yet
    /// (`located` by file; `module_of` names each file as the process
    /// maps it).
    fn fill_cache(
        &mut self,
        located: &[Option<(String, u64)>],
        module_of: &HashMap<String, String>,
        on_file: &mut dyn FnMut(&Path, &str),
    ) {
        let mut by_file: HashMap<&str, Vec<u64>> = HashMap::new();
        for (file, offset) in located.iter().flatten() {
            if !self.cache.contains_key(&(file.clone(), *offset)) && file.starts_with('/') {
                by_file.entry(file).or_default().push(*offset);
            }
        }
        for (file, mut offsets) in by_file {
            let module = module_of.get(file).map_or(file, String::as_str);
            offsets.sort_unstable();
            offsets.dedup();
            // Return addresses point after the call: look up the call itself.
            let lookups: Vec<u64> = offsets.iter().map(|o| o.saturating_sub(1)).collect();
            let path = PathBuf::from(path_of(file));
            on_file(&path, module);
            // A file blazesym must not read as it would (see `source_of`)
            // leaves its frames unknown, or named by its symbols only;
            // one blazesym panics on too. Either way it is said once on
            // stderr and in the report, and the other modules and
            // processes are symbolized as usual.
            let (source, unread) = self.source_of(file, &path, module);
            let blaze = &self.blaze;
            let outcome = source.map(|source| {
                guard::contained(|| blaze.symbolize(&source, Input::FileOffset(&lookups)))
            });
            let results = match &outcome {
                Some(Ok(Ok(results))) => results.as_slice(),
                _ => &[],
            };
            let mut symbolized: Vec<Option<Vec<Frame>>> = offsets
                .iter()
                .enumerate()
                .map(|(index, _)| match results.get(index) {
                    Some(Symbolized::Sym(sym)) => Some(frames_of(sym, module)),
                    _ => None,
                })
                .collect();
            let read = outcome.is_some();
            let panicked = match outcome {
                Some(Err(panic)) => Some(panic),
                _ => None,
            };
            // No file:line anywhere: no DWARF in the file nor through its
            // debug link. A debug file found by build id may have it.
            let has_lines = symbolized
                .iter()
                .flatten()
                .flatten()
                .any(|f| f.file.is_some());
            let in_full = read && !self.verdicts.contains_key(file);
            if in_full && panicked.is_none() && !has_lines {
                self.symbolize_with_debug_file(file, &path, module, &offsets, &mut symbolized);
                super::go::name_go_frames(&path, module, &offsets, &mut symbolized);
            }
            for (offset, frames) in offsets.iter().zip(symbolized) {
                let frames = frames.unwrap_or_else(|| {
                    vec![unknown_frame(0, Some(&(module.to_string(), *offset)))]
                });
                self.cache.insert((file.to_string(), *offset), frames);
            }
            if let Some(reason) = unread {
                self.unreadable.insert(module.to_string(), reason);
            } else if let Some(panic) = panicked {
                let reason = said(module, format!("blazesym {panic}"), "as module+offset");
                self.unreadable.insert(module.to_string(), reason);
                self.verdicts.insert(file.to_string(), Verdict::Refused);
                // blazesym may have been left mid-update: start afresh.
                self.blaze = new_blaze(self.debug_files.dirs());
            }
        }
    }
}

/// A Go type as its binary holds it.
struct TypeLocation {
    /// The binary's [`file_key`], as memprof opens it, as the process
    /// maps it.
    key: String,
    path: PathBuf,
    module: String,
    /// (file offset of the code that allocated it, the type's distance
    /// from that code).
    place: (u64, i64),
}

impl TypeLocation {
    /// Its key in `Reader::type_names`.
    fn cache_key(&self) -> (String, u64) {
        let (code, distance) = self.place;
        (self.key.clone(), code.wrapping_add_signed(distance))
    }
}

impl Reader {
    /// What blazesym is to read for the module at `path` (`key` in the
    /// caches; `module` as its process maps it): the file, or a copy of
    /// it ([`Copies`]), with its debug links followed or not; none when it
    /// is not to be read at all. The first time a module is not read in
    /// full, the reason too (one line), said on stderr.
    fn source_of(
        &mut self,
        key: &str,
        path: &Path,
        module: &str,
    ) -> (Option<Source<'static>>, Option<String>) {
        if self.copies.over_cap() {
            // blazesym holds the copies it read: both go.
            self.copies.clear();
            self.blaze = new_blaze(self.debug_files.dirs());
        }
        let verdict = self.verdicts.get(key).copied();
        if verdict == Some(Verdict::Refused) {
            return (None, None);
        }
        let refuse = |verdicts: &mut HashMap<String, Verdict>, reason: String| {
            verdicts.insert(key.to_string(), Verdict::Refused);
            (None, Some(said(module, reason, "as module+offset")))
        };
        let readable = match self.copies.readable(key, path) {
            Ok(readable) => readable,
            Err(refused) => return refuse(&mut self.verdicts, refused.to_string()),
        };
        let symbols_only = |path: PathBuf| {
            let mut elf = Elf::new(path);
            elf.debug_syms = false;
            Source::Elf(elf)
        };
        if verdict == Some(Verdict::SymbolsOnly) {
            return (Some(symbols_only(readable.path)), None);
        }
        let dirs = self.debug_files.dirs();
        match elf_check::readable_by_blazesym(&readable.path, dirs, readable.links) {
            Ok(()) => (Some(Source::Elf(Elf::new(readable.path))), None),
            Err(unreadable) if unreadable.symbols_only => {
                self.verdicts.insert(key.to_string(), Verdict::SymbolsOnly);
                let reason = said(
                    module,
                    unreadable.reason,
                    "by its own symbols, no file:line",
                );
                (Some(symbols_only(readable.path)), Some(reason))
            }
            Err(unreadable) => refuse(&mut self.verdicts, unreadable.reason),
        }
    }

    /// Symbolizes the file offsets of `path` (the module as mapped) with
    /// its separate debug file, found by build id, where one is found:
    /// each offset becomes the virtual address the debug file describes
    /// (a debug file has the sections, not the code, so file offsets do
    /// not apply to it). Frames the debug file names replace the others.
    fn symbolize_with_debug_file(
        &mut self,
        key: &str,
        path: &Path,
        module: &str,
        offsets: &[u64],
        symbolized: &mut [Option<Vec<Frame>>],
    ) {
        let Some(build_id) = self.build_ids.get(key).cloned().flatten() else {
            return;
        };
        let Some(debug) = self.debug_files.find(&build_id) else {
            return;
        };
        if let Err(unreadable) =
            elf_check::readable_by_blazesym(&debug, self.debug_files.dirs(), Links::Trusted)
        {
            eprintln!(
                "memprof: warning: not reading {}: {}",
                debug.display(),
                escaped(&unreadable.reason)
            );
            return;
        }
        // A regular file only: a profiled process can map anything.
        let Ok(opened) = crate::host::untrusted::open(path) else {
            return;
        };
        let data = object::read::ReadCache::new(opened);
        let Ok(file) = object::File::parse(&data) else {
            return;
        };
        let addresses: Vec<(usize, u64)> = offsets
            .iter()
            .enumerate()
            .filter_map(|(index, &offset)| {
                let vaddr =
                    crate::host::elf::file_offset_to_vaddr(&file, offset.saturating_sub(1))?;
                Some((index, vaddr))
            })
            .collect();
        let lookups: Vec<u64> = addresses.iter().map(|&(_, vaddr)| vaddr).collect();
        let source = Source::Elf(Elf::new(debug));
        let blaze = &self.blaze;
        let Ok(Ok(results)) =
            guard::contained(|| blaze.symbolize(&source, Input::VirtOffset(&lookups)))
        else {
            return;
        };
        for ((index, _), result) in addresses.iter().zip(&results) {
            if let Symbolized::Sym(sym) = result {
                symbolized[*index] = Some(frames_of(sym, module));
            }
        }
    }
}

/// How a file not read as others are is read.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Verdict {
    /// Not at all: its frames are shown as module+offset.
    Refused,
    /// By its own symbols, its debug links not followed.
    SymbolsOnly,
}

/// `reason` and how the frames of `module` are shown, said on stderr
/// (escaped: both may hold what a process wrote), and returned.
fn said(module: &str, reason: String, shown: &str) -> String {
    let reason = format!("{reason}; its frames are shown {shown}");
    eprintln!(
        "memprof: warning: {}: {}",
        escaped(module),
        escaped(&reason)
    );
    reason
}

fn new_blaze(debug_dirs: &[PathBuf]) -> Blaze {
    Blaze::builder()
        .set_debug_dirs(Some(debug_dirs))
        .enable_code_info(true)
        .enable_inlined_fns(true)
        // `demangled` instead: blazesym tries a C function's name too,
        // and a C++ demangler reads `t` or `f` as a type.
        .enable_demangling(false)
        .build()
}

/// The function, preceded by the functions inlined into it at this
/// address, innermost first; each with its own file:line.
fn frames_of(sym: &blazesym::symbolize::Sym<'_>, module: &str) -> Vec<Frame> {
    let frame =
        |name: &str, code: Option<&blazesym::symbolize::CodeInfo<'_>>, inlined: bool| Frame {
            address: 0,
            function: Some(demangled(name).into_owned()),
            file: code.map(|c| c.to_path().display().to_string()),
            line: code.and_then(|c| c.line),
            module: Some(module.to_string()),
            module_offset: None,
            build_id: None,
            inlined,
        };
    let mut frames: Vec<Frame> = sym
        .inlined
        .iter()
        .rev()
        .map(|f| frame(&f.name, f.code_info.as_ref(), true))
        .collect();
    frames.push(frame(&sym.name, sym.code_info.as_deref(), false));
    frames
}

fn unknown_frame(address: u64, location: Option<&(String, u64)>) -> Frame {
    Frame {
        module: location.map(|(m, _)| m.clone()),
        module_offset: location.map(|(_, o)| *o),
        ..Frame::unknown(address)
    }
}

/// Each return address of `process` as module+offset, no file read (the
/// modules as the process maps them, too).
pub fn unread(process: Option<&ProcessInfo>, addresses: &[u64]) -> (Vec<Vec<Frame>>, Vec<String>) {
    let mut modules = Vec::new();
    let frames = addresses
        .iter()
        .map(|&address| {
            let location = process.and_then(|p| p.mapping_of(address)).map(|mapping| {
                if !modules.contains(&mapping.path) {
                    modules.push(mapping.path.clone());
                }
                (mapping.path.clone(), mapping.file_offset_of(address))
            });
            vec![unknown_frame(address, location.as_ref())]
        })
        .collect();
    (frames, modules)
}

/// The key memprof's caches know the file at `path` by: its path and its
/// identity (device, inode, size, modification time), after a NUL. A file
/// replaced at the same path (a package upgrade while `monitor` runs) is
/// another file: keyed by path alone, its offsets were named from the
/// old file's symbols.
fn file_key(path: &Path) -> String {
    match FileIdentity::of(path) {
        Some(id) => format!(
            "{}\0{}:{}:{}:{}.{}",
            path.display(),
            id.dev,
            id.ino,
            id.size,
            id.mtime,
            id.mtime_nsec
        ),
        None => path.display().to_string(),
    }
}

/// The path in a [`file_key`].
fn path_of(key: &str) -> &str {
    key.split('\0').next().unwrap_or(key)
}

/// A module path as memprof can open it: the file memprof holds open for
/// the process ([`ProcessInfo::held_files`]: the very file mapped,
/// before and after the process exits, whatever its path names by then);
/// else, while the process runs, the file it maps (through its root or
/// /proc/PID/map_files); else, once it has gone, the path it mapped,
/// on the host.
fn openable_path(process: Option<&ProcessInfo>, mapping: &Mapping) -> PathBuf {
    use std::os::fd::AsRawFd as _;
    let held = process.and_then(|p| p.held_file(&mapping.path));
    match (held, process.filter(|p| !p.exited)) {
        (Some(file), _) => PathBuf::from(format!("/proc/self/fd/{}", file.as_raw_fd())),
        (None, Some(process)) => crate::host::procfs::paths::mapped_file(process.pid, mapping),
        (None, None) if mapping.deleted => PathBuf::from(format!("{} (deleted)", mapping.path)),
        (None, None) => PathBuf::from(&mapping.path),
    }
}
