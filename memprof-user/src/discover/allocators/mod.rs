//! Where a target's allocators are: the files it runs (its program and
//! libraries) and, in each, the allocator functions memprof knows
//! (`ALLOCATORS`, `RELEASERS`) or was told about (`--alloc-fn`,
//! `--free-fn`).
//!
//! `runtime` finds the files, `custom` reads the functions named on the
//! command line, `sites` finds the probe sites of one module (reading its
//! code through `module_code`), and `loader` the loader's own site.
use std::path::Path;

mod custom;
mod loader;
mod module_code;
mod runtime;
mod sites;

pub use custom::{allocator_name, register_custom, CustomFunction, CustomRole};
pub use loader::{loader_site, loader_site_in, LoaderSite};
pub use runtime::{is_libc_name, is_loader_name, runtime_of_pid, runtime_of_program, Runtime};
pub use sites::{module_sites, module_sites_in, ModuleSites, ProbeSite, SiteRole};

/// The last component of `path`, or "" when it has none or is not UTF-8.
fn file_name(path: &Path) -> &str {
    path.file_name().and_then(|n| n.to_str()).unwrap_or("")
}
