//! One malformed file among a process's libraries stops neither the
//! others' symbols nor the report.
use std::{
    collections::BTreeMap,
    fs,
    path::{Path, PathBuf},
};

use memprof::{
    collect::catalog::{Catalog, ProcessInfo},
    host::procfs::maps::Mapping,
    report::{diff, saved},
    symbolize::Symbolizer,
};
use memprof_common::notices::{LibraryNotice, NoticeKind};

use crate::{elf::*, reports::*};

/// Symbolizing a malformed library leaves its frames unknown, and the
/// frames of the process's other files (and of other processes) as they
/// are.
#[test]
pub(crate) fn a_malformed_library_does_not_stop_the_others() {
    let seeds = elf_seeds(false);
    let small = seeds
        .seeds
        .iter()
        .position(|s| s.name.ends_with("/small"))
        .expect("gcc builds the small program");
    let good = PathBuf::from(&seeds.seeds[small].name);
    let offset = seeds.functions[small][0];
    let mut broken_bytes = seeds.seeds[small].bytes.clone();
    // Section headers past the end of the file, a truncated symbol table.
    broken_bytes[0x28..0x30].copy_from_slice(&u64::MAX.to_le_bytes());
    broken_bytes.truncate(broken_bytes.len() * 2 / 3);
    let broken = seeds.dir.join("broken.so");
    fs::write(&broken, &broken_bytes).unwrap();
    let process = |pid: u32, path: &Path| ProcessInfo {
        pid,
        mappings: vec![Mapping {
            start: 0x10_0000,
            end: 0x20_0000,
            file_offset: 0,
            path: path.display().to_string(),
            deleted: false,
        }],
        ..Default::default()
    };
    let mut symbolizer = Symbolizer::new();
    let address = 0x10_0000 + offset + 1;
    let frames = symbolizer.symbolize(Some(&process(1, &broken)), &[address]);
    assert_eq!(frames[0].len(), 1);
    assert_eq!(frames[0][0].function, None, "{:?}", frames[0]);
    assert_eq!(frames[0][0].module.as_deref(), broken.to_str());
    let frames = symbolizer.symbolize(Some(&process(2, &good)), &[address]);
    assert!(
        frames[0].iter().any(|f| f.function.is_some()),
        "{:?}",
        frames[0]
    );

    // The notice path: no code segments from the broken file, and the
    // good one's as ever.
    let mut catalog = Catalog::default();
    for (index, path) in [(1, &broken), (2, &good)] {
        catalog.on_library(&LibraryNotice {
            kind: NoticeKind::Library as u32,
            tgid: 3,
            generation: 0,
            index,
            held: 0,
            _reserved: 0,
            base: 0x5000_0000,
            path: c_path(path),
        });
    }
    let mapped: BTreeMap<&str, usize> =
        catalog
            .get(3, 0)
            .unwrap()
            .mappings
            .iter()
            .fold(BTreeMap::new(), |mut counts, m| {
                *counts.entry(m.path.as_str()).or_default() += 1;
                counts
            });
    assert_eq!(mapped.get(good.to_str().unwrap()), Some(&1), "{mapped:?}");
    assert_eq!(mapped.get(broken.to_str().unwrap()), None, "{mapped:?}");
}

#[test]
pub(crate) fn diff_deltas_hold_any_saved_numbers() {
    let seeds = report_seeds();
    let mut big = saved::parse(std::str::from_utf8(&seeds[0].bytes).unwrap(), "a").unwrap();
    let small = big.clone();
    big.bytes = u64::MAX;
    for stack in &mut big.processes[0].stacks {
        stack.bytes = u64::MAX;
    }
    let grew = diff::diff(&small, &big, 10);
    assert_eq!(grew.change.bytes_delta, i64::MAX);
    let shrank = diff::diff(&big, &small, 10);
    assert_eq!(shrank.change.bytes_delta, i64::MIN);
}
