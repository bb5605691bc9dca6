//! Go frames named from the program's own function table (`.gopclntab`)
//! where its file has no DWARF (`-ldflags=-s` or `-w`): function,
//! file:line and the functions inlined at the address, as Go's own
//! tracebacks name them; and the types `runtime.mallocgc` allocated.
use std::path::Path;

use super::Frame;
use crate::host::{
    elf::file_offset_to_vaddr, gopclntab::go_functions_with_inlines_of, gotypes::GoTypes,
};

/// The names of the Go types whose descriptors lie at (code file offset,
/// distance from it) of the file at `path` (see `GoTypes::name_at`); none
/// for any other file.
pub(super) fn name_go_types(path: &Path, places: &[(u64, i64)]) -> Vec<Option<String>> {
    let named = || -> Option<Vec<Option<String>>> {
        // A regular file only: a profiled process can map anything.
        let opened = crate::host::untrusted::open(path).ok()?;
        let data = object::read::ReadCache::new(opened);
        let file = object::File::parse(&data).ok()?;
        let types = GoTypes::of(&file)?;
        Some(
            places
                .iter()
                .map(|&(code, offset)| types.name_at(code, offset))
                .collect(),
        )
    };
    named().unwrap_or_else(|| vec![None; places.len()])
}

/// Fills the frames of `offsets` (return addresses as file offsets in the
/// module at `path`) that have no file:line, where the file is a Go
/// program. Nothing for any other file.
pub(super) fn name_go_frames(
    path: &Path,
    module: &str,
    offsets: &[u64],
    symbolized: &mut [Option<Vec<Frame>>],
) {
    // A regular file only: a profiled process can map anything.
    let Ok(opened) = crate::host::untrusted::open(path) else {
        return;
    };
    let data = object::read::ReadCache::new(opened);
    let Ok(file) = object::File::parse(&data) else {
        return;
    };
    let Some(functions) = go_functions_with_inlines_of(&file) else {
        return;
    };
    for (offset, frames) in offsets.iter().zip(symbolized.iter_mut()) {
        if frames
            .as_ref()
            .is_some_and(|frames| frames.iter().any(|f| f.file.is_some()))
        {
            continue;
        }
        // Return addresses point after the call: the call itself.
        let Some(pc) = file_offset_to_vaddr(&file, offset.saturating_sub(1)) else {
            continue;
        };
        let Some(go_frames) = functions.frames(pc) else {
            continue;
        };
        *frames = Some(
            go_frames
                .into_iter()
                .map(|frame| Frame {
                    address: 0,
                    function: Some(frame.function.to_string()),
                    file: frame.file.map(str::to_string),
                    line: frame.line,
                    module: Some(module.to_string()),
                    module_offset: None,
                    build_id: None,
                    inlined: frame.inlined,
                })
                .collect(),
        );
    }
}
