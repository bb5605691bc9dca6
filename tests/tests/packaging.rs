//! The files in packaging/: systemd accepts the unit as it is, pointing
//! at the memprof just built (`systemd-analyze verify` fails on a missing
//! binary, and only warns on values it cannot parse: any word from it
//! fails); the Dockerfile and the DaemonSet say what memprof needs and
//! agree with the unit (the one place its capabilities are chosen).
use std::{path::Path, process::Command};

use serde_yaml_ng::Value;
use tests::*;

#[test]
fn systemd_accepts_the_unit() {
    let _serial = serial();
    let unit = std::fs::read_to_string(workspace_root().join("packaging/memprof.service")).unwrap();
    let memprof = memprof_bin();
    let dir = workspace_root().join("target/fixtures/packaging");
    std::fs::create_dir_all(&dir).unwrap();
    let checked = dir.join("memprof.service");
    std::fs::write(
        &checked,
        unit.replace("/usr/local/bin/memprof", memprof.to_str().unwrap()),
    )
    .unwrap();
    let output = Command::new("systemd-analyze")
        .args(["verify", "--man=false"])
        .arg(&checked)
        .output()
        .expect("running systemd-analyze");
    let said = format!(
        "{}{}",
        String::from_utf8_lossy(&output.stdout),
        String::from_utf8_lossy(&output.stderr)
    );
    // The environment file is the administrator's: not there is fine.
    let said: Vec<&str> = said
        .lines()
        .filter(|line| !line.contains("/etc/default/memprof"))
        .collect();
    assert!(output.status.success() && said.is_empty(), "{said:#?}");
}

fn read(name: &str) -> String {
    std::fs::read_to_string(workspace_root().join("packaging").join(name)).unwrap()
}

/// The capabilities the systemd unit gives memprof, without "CAP_".
fn unit_capabilities() -> Vec<String> {
    let unit = read("memprof.service");
    let line = unit
        .lines()
        .find_map(|l| l.strip_prefix("AmbientCapabilities="))
        .expect("AmbientCapabilities in the unit");
    let mut caps: Vec<String> = line
        .split_whitespace()
        .map(|c| c.trim_start_matches("CAP_").to_string())
        .collect();
    caps.sort();
    caps
}

#[test]
fn the_daemonset_runs_monitor_on_the_hosts_processes_with_the_units_capabilities() {
    let daemonset: Value = serde_yaml_ng::from_str(&read("daemonset.yaml")).unwrap();
    assert_eq!(daemonset["kind"], "DaemonSet");
    let pod = &daemonset["spec"]["template"]["spec"];
    assert_eq!(
        pod["hostPID"], true,
        "memprof must see the node's processes"
    );
    let container = &pod["containers"][0];
    assert_eq!(container["args"][0], "monitor");
    let security = &container["securityContext"];
    assert_eq!(security["privileged"], false);
    assert_eq!(security["capabilities"]["drop"][0], "ALL");
    let mut added: Vec<String> = security["capabilities"]["add"]
        .as_sequence()
        .unwrap()
        .iter()
        .map(|c| c.as_str().unwrap().to_string())
        .collect();
    added.sort();
    assert_eq!(added, unit_capabilities());
    assert_eq!(container["ports"][0]["containerPort"], 9464);
    let mounts: Vec<&str> = container["volumeMounts"]
        .as_sequence()
        .unwrap()
        .iter()
        .map(|m| m["mountPath"].as_str().unwrap())
        .collect();
    for needed in ["/sys/kernel/tracing", "/sys/fs/cgroup"] {
        assert!(mounts.contains(&needed), "{needed} not mounted: {mounts:?}");
    }
    let host_paths: Vec<&str> = pod["volumes"]
        .as_sequence()
        .unwrap()
        .iter()
        .filter_map(|v| v["hostPath"]["path"].as_str())
        .collect();
    assert!(
        host_paths.contains(&"/sys/kernel/tracing"),
        "{host_paths:?}"
    );
}

#[test]
fn the_dockerfile_serves_monitor_on_the_daemonsets_port() {
    let dockerfile = read("Dockerfile");
    assert!(dockerfile.contains("COPY target/release/memprof /usr/bin/memprof"));
    assert!(dockerfile.contains("EXPOSE 9464"));
    assert!(dockerfile.contains(r#"CMD ["monitor", "--listen", "0.0.0.0:9464"]"#));
    // Every capability the unit lists is in the documented `docker run`.
    for cap in unit_capabilities() {
        assert!(dockerfile.contains(&format!("--cap-add {cap}")), "{cap}");
    }
}

/// Removes the package when dropped: a failed check leaves nothing
/// installed.
struct Installed;

impl Drop for Installed {
    fn drop(&mut self) {
        let _ = Command::new("dpkg").args(["-r", "memprof"]).output();
    }
}

/// `cargo xtask dist` (its binary, packaging the memprof just built: a
/// build from inside `cargo test` would wait on cargo's lock) makes a
/// .deb that installs with dpkg, and memprof runs from it with its man
/// pages, completions and unit.
#[test]
fn the_deb_installs_and_memprof_runs_from_it() {
    let _serial = serial();
    let xtask = workspace_root().join("target/release/xtask");
    let output = Command::new(&xtask)
        .args(["dist", "--no-build"])
        .current_dir(workspace_root())
        .output()
        .expect("target/release/xtask");
    assert!(output.status.success(), "{output:?}");
    let said = String::from_utf8_lossy(&output.stdout);
    let deb = said
        .lines()
        .find_map(|line| line.split(": ").next().filter(|p| p.ends_with(".deb")))
        .unwrap_or_else(|| panic!("no .deb in {said}"))
        .to_string();
    let _installed = Installed;
    let status = Command::new("dpkg").args(["-i", &deb]).output().unwrap();
    assert!(status.status.success(), "{status:?}");
    let version = Command::new("/usr/bin/memprof")
        .arg("--version")
        .output()
        .unwrap();
    assert!(version.status.success(), "{version:?}");
    assert!(String::from_utf8_lossy(&version.stdout).starts_with("memprof 0."));
    for file in [
        "/usr/share/man/man1/memprof.1.gz",
        "/usr/share/man/man1/memprof-trace.1.gz",
        "/usr/share/bash-completion/completions/memprof",
        "/lib/systemd/system/memprof.service",
    ] {
        assert!(Path::new(file).exists(), "{file} not installed");
    }
    let unit = std::fs::read_to_string("/lib/systemd/system/memprof.service").unwrap();
    assert!(
        unit.contains("ExecStart=/usr/bin/memprof monitor"),
        "{unit}"
    );
    let completion = Command::new("bash")
        .args([
            "-c",
            "source /usr/share/bash-completion/completions/memprof && complete -p memprof",
        ])
        .output()
        .unwrap();
    assert!(completion.status.success(), "{completion:?}");
}
