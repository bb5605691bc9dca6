//! Builds the BPF programs (memprof-ebpf) for the BPF target with the
//! nightly toolchain and bpf-linker; the object is embedded in `memprof`.
//! Also names the commit built (`MEMPROF_COMMIT`, for `--version` and
//! `memprof_build_info`).
use std::process::Command;

use anyhow::{anyhow, Context as _};
use aya_build::{Package, Toolchain};

fn main() -> anyhow::Result<()> {
    name_commit();
    let cargo_metadata::Metadata { packages, .. } = cargo_metadata::MetadataCommand::new()
        .no_deps()
        .exec()
        .context("MetadataCommand::exec")?;
    let ebpf_package = packages
        .into_iter()
        .find(|p| p.name.as_str() == "memprof-ebpf")
        .ok_or_else(|| anyhow!("memprof-ebpf package not found"))?;
    let root_dir = ebpf_package
        .manifest_path
        .parent()
        .ok_or_else(|| anyhow!("no parent for {}", ebpf_package.manifest_path))?
        .as_str()
        .to_owned();
    aya_build::build_ebpf(
        [Package {
            name: "memprof-ebpf",
            root_dir: &root_dir,
            ..Default::default()
        }],
        Toolchain::default(),
    )
}

/// `MEMPROF_COMMIT`: the short hash of the commit built on (uncommitted
/// changes not said), or "unknown" outside a git checkout. Built again
/// when HEAD moves.
fn name_commit() {
    let git = |args: &[&str]| {
        Command::new("git")
            .args(args)
            .output()
            .ok()
            .filter(|out| out.status.success())
            .map(|out| String::from_utf8_lossy(&out.stdout).trim().to_string())
    };
    let commit = git(&["rev-parse", "--short=12", "HEAD"]).unwrap_or_else(|| "unknown".into());
    println!("cargo:rustc-env=MEMPROF_COMMIT={commit}");
    if let Some(dir) = git(&["rev-parse", "--absolute-git-dir"]) {
        // logs/HEAD changes with every commit and checkout.
        for path in ["HEAD", "logs/HEAD"] {
            println!("cargo:rerun-if-changed={dir}/{path}");
        }
    }
}
