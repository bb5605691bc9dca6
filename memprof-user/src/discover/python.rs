//! CPython in a process: the module that holds the interpreter (a program
//! built with libpython in it, as Debian's python3.11, or
//! `libpython3.X.so`), its version, and where its runtime state
//! (`_PyRuntime`) lies in the process.
use object::{Object as _, ObjectSection as _, SymbolKind};

use crate::host::{
    elf::{file_offset_to_vaddr, symbol_addresses},
    procfs::{
        maps::{parse_maps_line, read_maps_text},
        paths::mapped_file,
    },
    untrusted,
};

/// A CPython interpreter in a module's file.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Interpreter {
    /// 3.`minor`.
    pub minor: u32,
    /// `_PyRuntime`'s address in the file (virtual, as the file gives it).
    pub runtime_vaddr: u64,
}

/// The interpreter a module's bytes hold, if any: its `_PyRuntime`, and
/// its version from `Py_Version` (`PY_VERSION_HEX`, 3.11 and later) or
/// else from the file's name (`libpython3.9.so.1.0`, `python3.9`).
pub fn interpreter_in(data: &[u8], name: &str) -> Option<Interpreter> {
    interpreter_of(&object::File::parse(data).ok()?, name)
}

/// [`interpreter_in`] of a parsed file.
fn interpreter_of(file: &object::File<'_>, name: &str) -> Option<Interpreter> {
    let symbols = symbol_addresses(file, SymbolKind::Data);
    let runtime_vaddr = *symbols.get("_PyRuntime")?;
    let minor = match symbols.get("Py_Version") {
        Some(&address) => minor_of_hex(u32_at(file, address)?)?,
        None => minor_in_name(name)?,
    };
    Some(Interpreter {
        minor,
        runtime_vaddr,
    })
}

/// A CPython interpreter running in a process.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct RunningInterpreter {
    pub interpreter: Interpreter,
    /// `_PyRuntime`'s address in the process.
    pub runtime: u64,
    /// The module, as the process's maps name it.
    pub module: String,
}

/// The interpreter process `pid` runs, if it runs one: in the first of
/// its mapped files that holds one.
pub fn interpreter_of_pid(pid: u32) -> Option<RunningInterpreter> {
    let maps = read_maps_text(pid)?;
    let mut looked_at: Vec<String> = Vec::new();
    for mapping in maps.lines().filter_map(parse_maps_line) {
        if !mapping.path.starts_with('/') || looked_at.contains(&mapping.path) {
            continue;
        }
        looked_at.push(mapping.path.clone());
        let name = mapping.path.rsplit('/').next().unwrap_or_default();
        if !name.contains("python") {
            continue;
        }
        let Ok(data) = untrusted::read(&mapped_file(pid, &mapping)) else {
            continue;
        };
        let Ok(file) = object::File::parse(&*data) else {
            continue;
        };
        let Some(interpreter) = interpreter_of(&file, name) else {
            continue;
        };
        // Where the file's addresses lie in the process: the mapping's
        // start less the address its file offset has in the file.
        let mapped_vaddr = file_offset_to_vaddr(&file, mapping.file_offset)?;
        let bias = mapping.start.wrapping_sub(mapped_vaddr);
        return Some(RunningInterpreter {
            interpreter,
            runtime: interpreter.runtime_vaddr.wrapping_add(bias),
            module: mapping.path,
        });
    }
    None
}

/// The minor version of a `PY_VERSION_HEX` of Python 3.
fn minor_of_hex(hex: u32) -> Option<u32> {
    (hex >> 24 == 3).then_some((hex >> 16) & 0xff)
}

/// The minor version in a file name holding `python3.N`.
fn minor_in_name(name: &str) -> Option<u32> {
    let (_, rest) = name.split_once("python3.")?;
    let digits: String = rest.chars().take_while(char::is_ascii_digit).collect();
    digits.parse().ok()
}

/// The 4 bytes at `address` of the file's initialised data.
fn u32_at(file: &object::File<'_>, address: u64) -> Option<u32> {
    let bytes = file
        .sections()
        .find_map(|section| section.data_range(address, 4).ok().flatten())?;
    Some(u32::from_le_bytes(bytes.try_into().ok()?))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn versions_from_names() {
        assert_eq!(minor_in_name("libpython3.9.so.1.0"), Some(9));
        assert_eq!(minor_in_name("python3.10"), Some(10));
        assert_eq!(minor_in_name("libpython3.13d.so"), Some(13));
        assert_eq!(minor_in_name("python3"), None);
        assert_eq!(minor_of_hex(0x030b07f0), Some(11));
        assert_eq!(minor_of_hex(0x020712f0), None);
    }

    #[test]
    fn debians_python_holds_its_interpreter() {
        let data = std::fs::read("/usr/bin/python3.11").unwrap();
        let interpreter = interpreter_in(&data, "python3.11").unwrap();
        assert_eq!(interpreter.minor, 11);
        // Its version comes from Py_Version, not the name.
        assert_eq!(interpreter_in(&data, "python").map(|i| i.minor), Some(11));
    }
}
