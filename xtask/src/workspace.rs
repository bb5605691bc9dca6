//! The workspace's paths, and building what the tasks run: memprof, and
//! the C programs measured under it.
use std::{
    path::{Path, PathBuf},
    process::Command,
};

use anyhow::Result;

use crate::process::run;

pub fn root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .unwrap()
        .to_path_buf()
}

/// Builds the workspace (release): the path of its memprof.
pub fn build_memprof() -> Result<PathBuf> {
    let root = root();
    run(Command::new("cargo")
        .args(["build", "--release", "--quiet"])
        .current_dir(&root))?;
    Ok(root.join("target/release/memprof"))
}

/// target/bench, created if need be: where the programs measured go.
pub fn bench_dir() -> Result<PathBuf> {
    let dir = root().join("target/bench");
    std::fs::create_dir_all(&dir)?;
    Ok(dir)
}

/// Compiles the workspace's C file `source` to `out`, with frame pointers.
pub fn compile(source: &str, out: &Path) -> Result<()> {
    compile_with(source, out, "-fno-omit-frame-pointer")
}

/// Compiles the workspace's C file `source` to `out`; `frame_pointers` is
/// gcc's flag for keeping or omitting them.
pub fn compile_with(source: &str, out: &Path, frame_pointers: &str) -> Result<()> {
    run(Command::new("gcc")
        .args(["-O2", "-g", frame_pointers, "-o"])
        .arg(out)
        .arg(root().join(source)))?;
    Ok(())
}
