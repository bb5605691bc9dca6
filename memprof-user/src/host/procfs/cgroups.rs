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

/// The container a cgroup path names, as docker and crictl show it: the
/// first 12 hex digits of [`container_id_of`].
pub fn container_of(cgroup: &str) -> Option<String> {
    container_id_of(cgroup).map(|id| id[..12].to_string())
}

/// The full id of the container a cgroup path names: its last component
/// holding a 64-hex-digit id (docker-ID.scope, cri-containerd-ID.scope,
/// libpod-ID.scope, /docker/ID, /kubepods/.../ID).
pub fn container_id_of(cgroup: &str) -> Option<String> {
    // Bytes, not chars: a cgroup name may hold any UTF-8.
    let lower_hex = |b: &u8| b.is_ascii_digit() || (b'a'..=b'f').contains(b);
    cgroup.rsplit('/').find_map(|component| {
        let bytes = component.as_bytes();
        (0..bytes.len().saturating_sub(63)).find_map(|start| {
            let id = &bytes[start..start + 64];
            let bounded = !bytes.get(start + 64).is_some_and(u8::is_ascii_hexdigit);
            let starts = start == 0 || !bytes[start - 1].is_ascii_hexdigit();
            (id.iter().all(lower_hex) && bounded && starts)
                .then(|| String::from_utf8_lossy(id).into_owned())
        })
    })
}

/// The UID of the Kubernetes pod a cgroup path names, as the API shows it
/// (dashes): `pod<UID>` under the cgroupfs driver
/// (/kubepods/burstable/pod1b2c…/ID), `kubepods-…-pod<UID>.slice` with
/// underscores under systemd's.
pub fn pod_uid_of(cgroup: &str) -> Option<String> {
    if !cgroup.contains("kubepods") {
        return None;
    }
    cgroup.split('/').find_map(|component| {
        let at = component.rfind("pod")?;
        let uid = component[at + 3..]
            .trim_end_matches(".slice")
            .replace('_', "-");
        let shaped = uid.len() == 36
            && uid.char_indices().all(|(i, c)| match i {
                8 | 13 | 18 | 23 => c == '-',
                _ => c.is_ascii_hexdigit(),
            });
        shaped.then_some(uid)
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
        assert_eq!(
            container_id_of(&format!("/docker/{id}")).as_deref(),
            Some(id)
        );
    }

    #[test]
    fn pods_are_named_by_their_uid() {
        let uid = "1b2c3d4e-5f60-4718-9a0b-c1d2e3f40516";
        let id = "4f1e2d3c4b5a69788796a5b4c3d2e1f00112233445566778899aabbccddeeff0";
        let systemd = format!(
            "/kubepods.slice/kubepods-burstable.slice/kubepods-burstable-pod{}.slice/cri-containerd-{id}.scope",
            uid.replace('-', "_")
        );
        let cgroupfs = format!("/kubepods/besteffort/pod{uid}/{id}");
        for path in [systemd, cgroupfs] {
            assert_eq!(pod_uid_of(&path).as_deref(), Some(uid), "{path}");
        }
        assert_eq!(pod_uid_of(&format!("/docker/{id}")), None);
        assert_eq!(pod_uid_of("/kubepods/burstable/podnot-a-uid/x"), None);
    }
}
