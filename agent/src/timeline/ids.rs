//! The identities a cgroup path carries: kubelet names a pod's cgroup `pod<uid>` (cgroupfs
//! driver) or `kubepods-<qos>-pod<uid_with_underscores>.slice` (systemd driver), and the
//! runtime names a sandbox's or container's cgroup by its 64-hex ID (`/k8s.io/<id>`,
//! `<parent>/<id>`, or `cri-containerd-<id>.scope`).

/// What one cgroup path names.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct CgroupIds<'a> {
    /// The pod UID from a `pod<uid>` component.
    pub pod_uid: Option<&'a str>,
    /// The sandbox or container ID in the last component.
    pub runtime_id: Option<&'a str>,
}

impl CgroupIds<'_> {
    /// True for the pod-level cgroup itself (`.../pod<uid>`), not one below it.
    pub fn is_pod_cgroup(&self) -> bool {
        self.pod_uid.is_some() && self.runtime_id.is_none()
    }
}

/// Parses a cgroup path as the cgroup tracepoints report it.
pub fn cgroup_ids(path: &str) -> CgroupIds<'_> {
    let mut ids = CgroupIds::default();
    let components: Vec<&str> = path.split('/').filter(|c| !c.is_empty()).collect();
    for c in &components {
        if let Some(uid) = pod_component(c) {
            ids.pod_uid = Some(uid);
        }
    }
    if let Some(last) = components.last() {
        let last = last
            .strip_suffix(".scope")
            .and_then(|s| s.rsplit_once('-').map(|(_, id)| id))
            .unwrap_or(last);
        if is_runtime_id(last) {
            ids.runtime_id = Some(last);
        }
    }
    ids
}

/// The UID in a `pod<uid>` component. The systemd driver's form carries the UID with `_`
/// for `-`; it is returned as written.
fn pod_component(c: &str) -> Option<&str> {
    let c = c.strip_suffix(".slice").unwrap_or(c);
    let uid = match c.rsplit_once("-pod") {
        Some((_, uid)) => uid,
        None => c.strip_prefix("pod")?,
    };
    (uid.len() == 36
        && uid
            .bytes()
            .all(|b| b.is_ascii_hexdigit() || b == b'-' || b == b'_'))
    .then_some(uid)
}

/// A runtime's sandbox or container ID: 64 lowercase hex digits.
pub fn is_runtime_id(s: &str) -> bool {
    s.len() == 64 && s.bytes().all(|b| matches!(b, b'0'..=b'9' | b'a'..=b'f'))
}

/// Files runc executes for itself while it sets a container up (its re-exec and the
/// sealed copy of its binary): they are not the container's own program.
pub fn is_runtime_helper_exec(filename: &str) -> bool {
    filename == "/proc/self/exe"
        || filename.starts_with("/proc/self/fd/")
        || filename.starts_with("/dev/fd/")
        || filename.rsplit('/').next() == Some("runc")
}

#[cfg(test)]
mod tests {
    use super::*;

    const ID: &str = "c98b9ab4e0440ee4d8a639d8ac2c51b6cb8dfb36a688fc6ea54250c17daaee1a";
    const UID: &str = "cfbe6c52-3f90-2c4c-3f61-9d87dd3fa8e4";

    #[test]
    fn paths_name_pods_sandboxes_and_containers() {
        let p = format!("/podlapse/besteffort/pod{UID}/{ID}");
        assert_eq!(
            cgroup_ids(&p),
            CgroupIds {
                pod_uid: Some(UID),
                runtime_id: Some(ID)
            }
        );
        let pod = format!("/podlapse/besteffort/pod{UID}");
        assert!(cgroup_ids(&pod).is_pod_cgroup());
        let k8s = format!("/k8s.io/{ID}");
        assert_eq!(
            cgroup_ids(&k8s),
            CgroupIds {
                pod_uid: None,
                runtime_id: Some(ID)
            }
        );
        let systemd = format!(
            "/kubepods.slice/kubepods-besteffort.slice/kubepods-besteffort-pod{}.slice/cri-containerd-{ID}.scope",
            UID.replace('-', "_")
        );
        let ids = cgroup_ids(&systemd);
        assert_eq!(ids.pod_uid.unwrap().replace('_', "-"), UID);
        assert_eq!(ids.runtime_id, Some(ID));
    }

    #[test]
    fn other_paths_name_nothing() {
        assert_eq!(cgroup_ids("/podlapse/besteffort"), CgroupIds::default());
        assert_eq!(cgroup_ids("/k8s.io"), CgroupIds::default());
        assert_eq!(cgroup_ids("/k8s.io/abc"), CgroupIds::default());
        assert_eq!(
            cgroup_ids("/system.slice/podcast.service"),
            CgroupIds::default()
        );
        assert_eq!(cgroup_ids(&format!("/x/{UID}")), CgroupIds::default());
        assert!(!is_runtime_id(&ID.to_uppercase()));
    }

    #[test]
    fn runc_helpers_are_not_the_containers_program() {
        assert!(is_runtime_helper_exec("/proc/self/exe"));
        assert!(is_runtime_helper_exec("/dev/fd/6"));
        assert!(is_runtime_helper_exec("/usr/sbin/runc"));
        assert!(!is_runtime_helper_exec("/bin/sh"));
    }
}
