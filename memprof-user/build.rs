//! Builds the BPF programs (memprof-ebpf) for the BPF target with the
//! nightly toolchain and bpf-linker; the object is embedded in `memprof`.
use anyhow::{anyhow, Context as _};
use aya_build::{Package, Toolchain};

fn main() -> anyhow::Result<()> {
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
