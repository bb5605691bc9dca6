//! A process's cgroups, and the container a cgroup names.
use std::fs;

use crate::host::procfs::status::live_dir;

/// The cgroup paths of process `pid`, one per hierarchy
/// ("/system.slice/x.service").
pub fn cgroups_of(pid: u32) -> Vec<String> {
    cgroup_paths(&fs::read_to_string(live_dir(pid).join("cgroup")).unwrap_or_default())
}

/// The paths of a /proc/PID/cgroup text ("ID:CONTROLLERS:PATH" lines).
pub fn cgroup_paths(text: &str) -> Vec<String> {
    text.lines()
        .filter_map(|line| Some(line.splitn(3, ':').nth(2)?.to_string()))
        .filter(|path| !path.is_empty())
        .collect()
}

/// The container a cgroup path names: its last component holding a
/// 64-hex-digit id (docker-ID.scope, cri-containerd-ID.scope,
/// libpod-ID.scope, /docker/ID, /kubepods/.../ID), as its first 12.
pub fn container_of(cgroup: &str) -> Option<String> {
    // Bytes, not chars: a cgroup name may hold any UTF-8.
    let lower_hex = |b: &u8| b.is_ascii_digit() || (b'a'..=b'f').contains(b);
    cgroup.rsplit('/').find_map(|component| {
        let bytes = component.as_bytes();
        (0..bytes.len().saturating_sub(63)).find_map(|start| {
            let id = &bytes[start..start + 64];
            let bounded = !bytes.get(start + 64).is_some_and(u8::is_ascii_hexdigit);
            let starts = start == 0 || !bytes[start - 1].is_ascii_hexdigit();
            (id.iter().all(lower_hex) && bounded && starts)
                .then(|| String::from_utf8_lossy(&id[..12]).into_owned())
        })
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn containers_are_named_by_their_cgroups_id() {
        let id = "4f1e2d3c4b5a69788796a5b4c3d2e1f00112233445566778899aabbccddeeff0";
        assert_eq!(id.len(), 64);
        for path in [
            format!("/system.slice/docker-{id}.scope"),
            format!("/docker/{id}"),
            format!("/kubepods.slice/kubepods-burstable.slice/cri-containerd-{id}.scope"),
            format!("/machine.slice/libpod-{id}.scope/container"),
        ] {
            assert_eq!(
                container_of(&path).as_deref(),
                Some("4f1e2d3c4b5a"),
                "{path}"
            );
        }
        assert_eq!(container_of("/system.slice/ssh.service"), None);
        assert_eq!(container_of(&"é".repeat(40)), None);
        assert_eq!(
            container_of(&format!("/é{id}é")).as_deref(),
            Some("4f1e2d3c4b5a")
        );
        assert_eq!(container_of(&format!("/x/{id}0")), None);
    }
}
