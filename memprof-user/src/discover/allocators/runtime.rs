//! The files a target runs, where memprof looks for allocators: those a
//! running process maps, or those a program will load (through its
//! loader's list mode, past `#!` scripts).
use std::{
    fs,
    path::{Path, PathBuf},
    process::Command,
};

use anyhow::{bail, Context as _, Result};

use super::file_name;
use crate::{host::elf::interpreter, human::error::UserError};

/// The files memprof looks for allocators in, for one target.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Runtime {
    /// The program and the libraries it loads, as paths memprof can open.
    pub modules: Vec<PathBuf>,
    /// The dynamic loader, which tells (through `_dl_debug_state`) where
    /// it loaded each library; None for static programs, or when memprof
    /// could not find it.
    pub loader: Option<PathBuf>,
}

pub fn is_loader_name(file_name: &str) -> bool {
    file_name.starts_with("ld-linux")
}

/// Names of the C library as it appears in memory maps and DT_NEEDED.
pub fn is_libc_name(file_name: &str) -> bool {
    file_name == "libc.so.6"
        || (file_name.starts_with("libc-") && file_name.ends_with(".so"))
        || (file_name.starts_with("ld-musl-") && file_name.ends_with(".so.1"))
}

/// Every file a running process has mapped executable, as paths memprof
/// can open (through /proc/PID/root for a process in another mount
/// namespace), and its loader.
pub fn runtime_of_pid(pid: i32) -> Result<Runtime> {
    let maps = crate::host::procfs::maps::read_maps_text(pid as u32)
        .ok_or_else(|| UserError::new(format!("no process with pid {pid}")))?;
    if maps.trim().is_empty() {
        // A zombie, or a process that exited since it was checked.
        return Err(
            UserError::new(format!("pid {pid} has exited: nothing left to profile")).into(),
        );
    }
    let files = crate::host::procfs::maps::executable_files(pid as u32, &maps);
    let loader = files
        .iter()
        .find(|(path, _)| is_loader_name(file_name(Path::new(path))))
        .map(|(_, file)| file.clone());
    let modules = files.into_iter().map(|(_, file)| file).collect();
    Ok(Runtime { modules, loader })
}

/// The files a program will run: itself and the libraries its loader
/// would load (as `ld.so --list` finds them, so RUNPATH, LD_LIBRARY_PATH
/// and ld.so.cache count), following `#!` scripts to their interpreter.
/// A static program is its only module.
pub fn runtime_of_program(program: &Path) -> Result<Runtime> {
    let mut program = program.to_path_buf();
    for _ in 0..4 {
        let data = crate::host::untrusted::read(&program)
            .with_context(|| format!("reading {}", program.display()))?;
        if let Some(interpreter) = shebang_interpreter(&data) {
            program = which::which(&interpreter).unwrap_or(interpreter);
            continue;
        }
        let loader = interpreter(&data).map_err(|_| {
            UserError::new(format!(
                "{} is neither a 64-bit ELF program nor a #! script",
                program.display()
            ))
        })?;
        let program = fs::canonicalize(&program).unwrap_or(program);
        let Some(loader) = loader else {
            return Ok(Runtime {
                modules: vec![program],
                loader: None,
            });
        };
        let loader = fs::canonicalize(&loader).ok();
        let mut modules = vec![program.clone()];
        let listed = loader
            .as_deref()
            .map(|loader| libraries_listed_by(loader, &program))
            .unwrap_or_default();
        for library in listed {
            if !modules.contains(&library) {
                modules.push(library);
            }
        }
        if !modules.iter().any(|m| is_libc_name(file_name(m))) {
            modules.push(find_system_libc()?);
        }
        return Ok(Runtime { modules, loader });
    }
    bail!(
        "too many nested #! interpreters starting at {}",
        program.display()
    )
}

/// The libraries `loader` would load for `program`, from its list mode
/// (what `ldd` shows): nothing of the program runs.
fn libraries_listed_by(loader: &Path, program: &Path) -> Vec<PathBuf> {
    let Ok(output) = Command::new(loader).arg("--list").arg(program).output() else {
        return Vec::new();
    };
    String::from_utf8_lossy(&output.stdout)
        .lines()
        .filter_map(|line| {
            // "\tlibc.so.6 => /lib/x86_64-linux-gnu/libc.so.6 (0x...)" or
            // "\t/lib64/ld-linux-x86-64.so.2 (0x...)".
            let line = line.trim();
            let path = line.split_once("=> ").map_or(line, |(_, path)| path);
            let path = path.split(" (").next()?;
            path.starts_with('/')
                .then(|| fs::canonicalize(path).unwrap_or_else(|_| PathBuf::from(path)))
        })
        .collect()
}

fn shebang_interpreter(data: &[u8]) -> Option<PathBuf> {
    let rest = data.strip_prefix(b"#!")?;
    let line = rest.split(|&b| b == b'\n').next()?;
    let line = std::str::from_utf8(line).ok()?;
    let interpreter = line.split_whitespace().next()?;
    Some(PathBuf::from(interpreter))
}

/// Directories the dynamic loader searches by default on Debian/x86_64.
const SYSTEM_LIB_DIRS: [&str; 6] = [
    "/lib/x86_64-linux-gnu",
    "/usr/lib/x86_64-linux-gnu",
    "/lib64",
    "/usr/lib64",
    "/lib",
    "/usr/lib",
];

pub(super) fn find_system_libc() -> Result<PathBuf> {
    for dir in SYSTEM_LIB_DIRS {
        let candidate = Path::new(dir).join("libc.so.6");
        if candidate.exists() {
            return Ok(fs::canonicalize(&candidate).unwrap_or(candidate));
        }
    }
    Err(UserError::new(format!(
        "no libc.so.6 found in {}; pass --libc PATH",
        SYSTEM_LIB_DIRS.join(", ")
    ))
    .into())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reads_shebang() {
        assert_eq!(
            shebang_interpreter(b"#!/bin/sh -e\necho"),
            Some(PathBuf::from("/bin/sh"))
        );
        assert_eq!(shebang_interpreter(b"\x7fELF"), None);
    }

    #[test]
    fn lists_a_programs_libraries() {
        let runtime = runtime_of_program(Path::new("/usr/bin/sqlite3")).unwrap();
        let names: Vec<_> = runtime.modules.iter().map(|m| file_name(m)).collect();
        assert!(names[0] == "sqlite3", "{names:?}");
        assert!(
            names.iter().any(|n| n.starts_with("libsqlite3")),
            "{names:?}"
        );
        assert!(names.contains(&"libc.so.6"), "{names:?}");
    }
}
