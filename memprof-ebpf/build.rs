use which::which;

/// Rebuild the BPF object when bpf-linker changes (it is the linker of the
/// BPF target, so cargo does not track it on its own).
fn main() {
    if let Ok(bpf_linker) = which("bpf-linker") {
        println!("cargo:rerun-if-changed={}", bpf_linker.display());
    }
}
