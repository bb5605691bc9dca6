//! USDT probes of the allocation-sampling contract (`memprof_common::
//! usdt`) in an ELF file: its `.note.stapsdt` notes (owner "stapsdt",
//! type 3: pc, base, semaphore, then provider, name and argument specs),
//! located as file offsets for uprobes.
use std::path::Path;

use anyhow::{Context as _, Result};
use memprof_common::usdt::{
    arg, register_index, UsdtArg, UsdtSpec, DDHEAP, OTEL_MEMORY, PROVIDERS,
};
use object::{Object as _, ObjectSection as _};

use crate::host::elf::vaddr_to_file_offset;

/// One probe of a known provider.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct UsdtSite {
    /// "alloc" or "free".
    pub name: String,
    pub file_offset: u64,
    /// Its semaphore's file offset: the kernel raises it while probed, and
    /// the program fires the probe only then.
    pub semaphore: Option<u64>,
    pub spec: UsdtSpec,
}

impl UsdtSite {
    pub fn is_alloc(&self) -> bool {
        self.name == "alloc"
    }

    pub fn provider(&self) -> &'static str {
        PROVIDERS[(self.spec.allocator - OTEL_MEMORY) as usize]
    }
}

/// The `alloc` and `free` probes of the known providers in `path`.
pub fn usdt_sites(path: &Path) -> Result<Vec<UsdtSite>> {
    let data = crate::host::untrusted::read(path)
        .with_context(|| format!("reading {}", path.display()))?;
    usdt_sites_in(&data, &path.display().to_string())
}

/// The same, in the ELF file `data`; `shown` names it in warnings.
pub fn usdt_sites_in(data: &[u8], shown: &str) -> Result<Vec<UsdtSite>> {
    let Ok(file) = object::File::parse(data) else {
        return Ok(Vec::new());
    };
    let Some(section) = file.section_by_name(".note.stapsdt") else {
        return Ok(Vec::new());
    };
    // Prelinked files moved their code: `.stapsdt.base` says by how much.
    let base_now = file.section_by_name(".stapsdt.base").map(|s| s.address());
    let notes = section.data().unwrap_or_default();
    let mut sites = Vec::new();
    for note in parse_notes(notes, file.is_little_endian()) {
        let (pc, base, semaphore, provider, name, args) = note;
        let allocator = match provider.as_str() {
            "otel_memory" => OTEL_MEMORY,
            "ddheap" => DDHEAP,
            _ => continue,
        };
        if name != "alloc" && name != "free" {
            continue;
        }
        let shift = base_now.map_or(0, |now| now.wrapping_sub(base));
        let Some(file_offset) = vaddr_to_file_offset(&file, pc.wrapping_add(shift)) else {
            continue;
        };
        // A probe whose semaphore cannot be placed would never fire.
        let semaphore = match semaphore {
            0 => None,
            at => match vaddr_to_file_offset(&file, at.wrapping_add(shift)) {
                Some(offset) => Some(offset),
                None => {
                    eprintln!(
                        "memprof: warning: {shown}: USDT {provider}:{name}: its semaphore is outside the file's segments; not probed"
                    );
                    continue;
                }
            },
        };
        let Some(args) = parse_args(&args) else {
            eprintln!(
                "memprof: warning: {shown}: USDT {provider}:{name}: arguments '{args}' not understood; not probed"
            );
            continue;
        };
        sites.push(UsdtSite {
            name,
            file_offset,
            semaphore,
            spec: UsdtSpec {
                allocator,
                reserved: 0,
                args,
            },
        });
    }
    Ok(sites)
}

type Note = (u64, u64, u64, String, String, String);

/// The stapsdt notes of a 64-bit file: (pc, base, semaphore, provider,
/// name, arguments).
fn parse_notes(data: &[u8], little: bool) -> Vec<Note> {
    let word = |bytes: &[u8]| -> u64 {
        let bytes: [u8; 8] = bytes.try_into().unwrap_or_default();
        if little {
            u64::from_le_bytes(bytes)
        } else {
            u64::from_be_bytes(bytes)
        }
    };
    let half = |bytes: &[u8]| -> usize {
        let bytes: [u8; 4] = bytes.try_into().unwrap_or_default();
        (if little {
            u32::from_le_bytes(bytes)
        } else {
            u32::from_be_bytes(bytes)
        }) as usize
    };
    let align = |n: usize| (n + 3) & !3;
    let mut notes = Vec::new();
    let mut at = 0;
    while at + 12 <= data.len() {
        let (name_size, desc_size, kind) = (
            half(&data[at..at + 4]),
            half(&data[at + 4..at + 8]),
            half(&data[at + 8..at + 12]),
        );
        let name_at = at + 12;
        let desc_at = name_at + align(name_size);
        let next = desc_at + align(desc_size);
        if next > data.len() {
            break;
        }
        let owner = &data[name_at..name_at + name_size];
        let desc = &data[desc_at..desc_at + desc_size];
        at = next;
        if owner != b"stapsdt\0" || kind != 3 || desc.len() < 24 {
            continue;
        }
        let mut strings = desc[24..]
            .split(|&b| b == 0)
            .map(|s| String::from_utf8_lossy(s).into_owned());
        let (Some(provider), Some(name), args) = (
            strings.next(),
            strings.next(),
            strings.next().unwrap_or_default(),
        ) else {
            continue;
        };
        notes.push((
            word(&desc[0..8]),
            word(&desc[8..16]),
            word(&desc[16..24]),
            provider,
            name,
            args,
        ));
    }
    notes
}

/// The first three arguments of a spec ("8@%rdi -8@-16(%rbp) 4@$5");
/// None when one is in a form memprof does not read.
pub fn parse_args(specs: &str) -> Option<[UsdtArg; 3]> {
    let mut args = [UsdtArg::default(); 3];
    for (slot, spec) in args.iter_mut().zip(specs.split_whitespace()) {
        *slot = parse_arg(spec)?;
    }
    Some(args)
}

fn parse_arg(spec: &str) -> Option<UsdtArg> {
    let (size, location) = spec.split_once('@')?;
    let size: i8 = size.parse().ok()?;
    let mut arg = UsdtArg {
        size,
        ..UsdtArg::default()
    };
    if let Some(constant) = location.strip_prefix('$') {
        arg.kind = arg::CONSTANT;
        arg.value = constant.parse().ok()?;
    } else if let Some(register) = location.strip_prefix('%') {
        arg.kind = arg::REGISTER;
        arg.register = register_index(register)?;
    } else {
        // OFFSET(%REG) or OFFSET(%REG,%INDEX,SCALE), the offset possibly
        // empty.
        let (offset, rest) = location.split_once("(%")?;
        let inside = rest.strip_suffix(')')?;
        let mut parts = inside.split(',');
        arg.register = register_index(parts.next()?)?;
        arg.kind = arg::MEMORY;
        if let Some(index) = parts.next() {
            arg.kind = arg::MEMORY_INDEXED;
            arg.index = register_index(index.strip_prefix('%')?)?;
            arg.scale = match parts.next() {
                Some(scale) => scale.parse().ok().filter(|s| [1, 2, 4, 8].contains(s))?,
                None => 1,
            };
        }
        arg.value = if offset.is_empty() {
            0
        } else {
            offset.parse().ok()?
        };
    }
    Some(arg)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn argument_specs_are_read_as_gcc_writes_them() {
        let [a, b, c] = parse_args("8@%rdi -4@-20(%rbp) 8@$65536").unwrap();
        assert_eq!((a.kind, a.register, a.size), (arg::REGISTER, 14, 8));
        assert_eq!(
            (b.kind, b.register, b.size, b.value),
            (arg::MEMORY, 4, -4, -20)
        );
        assert_eq!((c.kind, c.value), (arg::CONSTANT, 65536));
        let [d, _, _] = parse_args("8@(%rsp)").unwrap();
        assert_eq!((d.kind, d.register, d.value), (arg::MEMORY, 19, 0));
        let [e, f, _] = parse_args("8@%r12 4@%r9d").unwrap();
        assert_eq!((e.register, f.register), (3, 8));
        let [g, _, _] = parse_args("8@-8(%rax,%rdi,8)").unwrap();
        assert_eq!(
            (g.kind, g.register, g.index, g.scale, g.value),
            (arg::MEMORY_INDEXED, 10, 14, 8, -8)
        );
        assert!(parse_args("8@%xmm0").is_none());
        assert!(parse_args("8@(%rax,%rbx,3)").is_none());
    }
}
