//! packaging/memprof.service: systemd accepts it as it is, pointing at the
//! memprof just built (`systemd-analyze verify` fails on a missing binary,
//! and only warns on values it cannot parse: any word from it fails).
use std::process::Command;

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
