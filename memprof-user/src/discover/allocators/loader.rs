//! The loader's probe site: where glibc's ld.so announces each change to
//! its list of loaded libraries.
use std::path::Path;

use anyhow::{Context as _, Result};
use object::SymbolKind;

use crate::host::elf::{symbol_addresses, vaddr_to_file_offset};

/// Where the loader announces loaded libraries: `_dl_debug_state`, which
/// glibc's ld.so calls after each change to its list of loaded objects
/// (the debugger interface), and how far `_r_debug`, the head of that
/// list, lies from it.
#[derive(Clone, Copy, Debug)]
pub struct LoaderSite {
    pub file_offset: u64,
    /// `_r_debug` minus `_dl_debug_state`, in virtual addresses.
    pub r_debug_delta: i64,
}

pub fn loader_site(loader: &Path) -> Result<Option<LoaderSite>> {
    let data = crate::host::untrusted::read(loader)
        .with_context(|| format!("reading {}", loader.display()))?;
    loader_site_in(&data, &loader.display().to_string())
}

/// [`loader_site`] of a loader's bytes; `shown` names it in errors.
pub fn loader_site_in(data: &[u8], shown: &str) -> Result<Option<LoaderSite>> {
    let file = object::File::parse(data).with_context(|| format!("{shown} is not an ELF file"))?;
    let functions = symbol_addresses(&file, SymbolKind::Text);
    let data_symbols = symbol_addresses(&file, SymbolKind::Data);
    let (Some(&state), Some(&r_debug)) = (
        functions.get("_dl_debug_state"),
        data_symbols.get("_r_debug"),
    ) else {
        return Ok(None);
    };
    Ok(
        vaddr_to_file_offset(&file, state).map(|file_offset| LoaderSite {
            file_offset,
            r_debug_delta: (r_debug as i64).wrapping_sub(state as i64),
        }),
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn finds_the_loaders_debugger_interface() {
        let loader = std::fs::canonicalize("/lib64/ld-linux-x86-64.so.2").unwrap();
        let site = loader_site(&loader)
            .unwrap()
            .expect("glibc's ld.so has _dl_debug_state");
        assert!(site.r_debug_delta > 0, "_r_debug is data, after the code");
    }
}
