//! `cargo xtask dist`: what installs memprof without building it, in
//! target/dist/: the binary stripped (its BPF programs are inside it),
//! its man pages and shell completions, the systemd unit pointing at
//! /usr/bin, and a .deb of them all (cargo-deb; the metadata is in
//! memprof-user/Cargo.toml).
use std::{path::Path, process::Command};

use anyhow::{Context as _, Result};

use crate::{process::run, workspace::root};

/// The pages `memprof man [COMMAND]` writes, by the name each goes by.
const PAGES: [(&str, Option<&str>); 9] = [
    ("memprof", None),
    ("memprof-trace", Some("trace")),
    ("memprof-attach", Some("attach")),
    ("memprof-monitor", Some("monitor")),
    ("memprof-report", Some("report")),
    ("memprof-diff", Some("diff")),
    ("memprof-doctor", Some("doctor")),
    ("memprof-completions", Some("completions")),
    ("memprof-man", Some("man")),
];

/// The completion scripts, by shell and the name the .deb installs.
const COMPLETIONS: [(&str, &str); 3] = [
    ("bash", "memprof.bash"),
    ("zsh", "_memprof"),
    ("fish", "memprof.fish"),
];

pub fn dist(build: bool) -> Result<()> {
    let root = root();
    let dist = root.join("target/dist");
    for dir in ["man", "completions"] {
        std::fs::create_dir_all(dist.join(dir))?;
    }
    if build {
        run(Command::new("cargo").current_dir(&root).args([
            "build",
            "--release",
            "-p",
            "memprof-user",
        ]))?;
    }
    let binary = dist.join("memprof");
    run(Command::new("strip")
        .arg("-o")
        .arg(&binary)
        .arg(root.join("target/release/memprof")))?;
    for (name, command) in PAGES {
        let page = run(Command::new(&binary).arg("man").args(command))?;
        std::fs::write(dist.join(format!("man/{name}.1")), page.stdout)?;
    }
    for (shell, name) in COMPLETIONS {
        let script = run(Command::new(&binary).args(["completions", shell]))?;
        std::fs::write(dist.join("completions").join(name), script.stdout)?;
    }
    let unit = std::fs::read_to_string(root.join("packaging/memprof.service"))?;
    std::fs::write(
        dist.join("memprof.service"),
        unit.replace("/usr/local/bin/memprof", "/usr/bin/memprof"),
    )?;
    let deb = run(Command::new("cargo")
        .current_dir(&root)
        .args([
            "deb",
            "-p",
            "memprof-user",
            "--no-build",
            "--no-strip",
            "-o",
        ])
        .arg(&dist))
    .context("cargo deb (cargo install cargo-deb)")?;
    let deb = String::from_utf8_lossy(&deb.stdout).trim().to_string();
    println!("{}: {}", binary.display(), size(&binary)?);
    println!("{deb}: {}", size(Path::new(&deb))?);
    Ok(())
}

fn size(path: &Path) -> Result<String> {
    let bytes = std::fs::metadata(path)
        .with_context(|| path.display().to_string())?
        .len();
    Ok(format!("{:.1} MiB", bytes as f64 / (1024.0 * 1024.0)))
}
