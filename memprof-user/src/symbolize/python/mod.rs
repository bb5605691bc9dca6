//! Naming Python frames: a code object read from the process that ran it
//! ([`code_object`]) and the source line of an instruction in it
//! ([`line_table`]), at the layout and in the encoding of each CPython
//! version.
pub mod code_object;
pub mod line_table;

#[cfg(test)]
mod walk_tests;

/// The CPythons on this machine memprof knows, with their minor version:
/// pyenv's builds and Debian's python3.11 (for the tests).
#[cfg(test)]
fn interpreters_here() -> Vec<(u32, String)> {
    let mut found: Vec<(u32, String)> = std::fs::read_dir("/root/.pyenv/versions")
        .map(|dirs| {
            dirs.flatten()
                .filter_map(|entry| {
                    let dir = entry.file_name().to_string_lossy().into_owned();
                    let minor: u32 = dir.strip_prefix("3.")?.split('.').next()?.parse().ok()?;
                    code_object::CodeLayout::of(minor)?;
                    Some((
                        minor,
                        format!("/root/.pyenv/versions/{dir}/bin/python3.{minor}"),
                    ))
                })
                .collect()
        })
        .unwrap_or_default();
    found.push((11, "/usr/bin/python3.11".to_string()));
    found
}
