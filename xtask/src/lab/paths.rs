//! Where every file of the lab lives. Everything the lab writes sits under one root so that
//! `down` can finish by removing a single directory.

use std::path::{Path, PathBuf};

/// Overrides the lab root; used by tests that want a lab of their own.
pub const LAB_DIR_ENV: &str = "PODLAPSE_LAB_DIR";
/// The lab root when [`LAB_DIR_ENV`] is not set.
pub const DEFAULT_LAB_DIR: &str = "/var/lib/podlapse-lab";
/// Under the root: the state file, present exactly while the lab is up.
pub(crate) const STATE_FILE: &str = "lab.json";
/// Under the root: what the host looked like before `up`.
pub(crate) const BASELINE_DIR: &str = "baseline";
/// The host's default directory of named network namespaces, outside the lab root: the
/// lab's pods get theirs under its state dir, and this is watched for any that land here.
pub(crate) const HOST_NETNS_DIR: &str = "/run/netns";
/// The same directory by its older name (a link to [`HOST_NETNS_DIR`] on most hosts).
pub(crate) const VAR_RUN_NETNS_DIR: &str = "/var/run/netns";

/// The lab's directory layout, derived from its root.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LabPaths {
    /// Absolute path of the lab root.
    pub root: PathBuf,
}

impl LabPaths {
    /// A lab rooted at `root`; a relative root is taken relative to the current directory,
    /// because the daemons run with a different working directory.
    pub fn new(root: impl Into<PathBuf>) -> LabPaths {
        let root = root.into();
        let root = std::path::absolute(&root).unwrap_or(root);
        LabPaths { root }
    }

    /// `$PODLAPSE_LAB_DIR`, else `/var/lib/podlapse-lab`.
    pub fn from_env() -> LabPaths {
        match std::env::var_os(LAB_DIR_ENV) {
            Some(dir) if !dir.is_empty() => LabPaths::new(dir),
            _ => LabPaths::new(DEFAULT_LAB_DIR),
        }
    }

    /// Whether the root holds a lab, up or left behind by a crash: its baseline (written
    /// first by `up`) or its state file is there.
    pub fn holds_a_lab(&self) -> bool {
        self.baseline_dir().is_dir() || self.state_file().is_file()
    }

    /// The CRI (and containerd API) socket the agent connects to.
    pub fn cri_socket(&self) -> PathBuf {
        self.containerd_dir().join("containerd.sock")
    }

    /// `lab.json`: written last by `up`, removed by `down`, so it exists exactly while the lab
    /// is up.
    pub fn state_file(&self) -> PathBuf {
        self.root.join(STATE_FILE)
    }

    /// What the host looked like before `up`, so `down` can tell lab residue from the rest.
    pub fn baseline_dir(&self) -> PathBuf {
        self.root.join(BASELINE_DIR)
    }

    pub fn registry_dir(&self) -> PathBuf {
        self.root.join("registry")
    }

    pub fn registry_config(&self) -> PathBuf {
        self.registry_dir().join("config.yml")
    }

    pub fn registry_log(&self) -> PathBuf {
        self.registry_dir().join("registry.log")
    }

    pub fn registry_storage(&self) -> PathBuf {
        self.registry_dir().join("data")
    }

    /// Where the pinned containerd 2.x package is unpacked (`usr/bin/containerd`, its
    /// shim and `ctr`).
    pub fn runtime_dir(&self) -> PathBuf {
        self.root.join("runtime")
    }

    pub fn runtime_bin_dir(&self) -> PathBuf {
        self.runtime_dir().join("usr").join("bin")
    }

    pub fn containerd_dir(&self) -> PathBuf {
        self.root.join("containerd")
    }

    pub fn containerd_config(&self) -> PathBuf {
        self.containerd_dir().join("config.toml")
    }

    pub fn containerd_log(&self) -> PathBuf {
        self.containerd_dir().join("containerd.log")
    }

    /// containerd's persistent `root` (content store, snapshots, metadata).
    pub fn containerd_root(&self) -> PathBuf {
        self.containerd_dir().join("root")
    }

    /// containerd's `state` (task bundles, CRI sandboxes and, with
    /// `netns_mounts_under_state_dir`, the pods' network namespaces).
    pub fn containerd_state(&self) -> PathBuf {
        self.containerd_dir().join("state")
    }

    pub fn containerd_ttrpc_socket(&self) -> PathBuf {
        self.containerd_dir().join("containerd.sock.ttrpc")
    }

    pub fn containerd_opt(&self) -> PathBuf {
        self.containerd_dir().join("opt")
    }

    pub fn containerd_tmp(&self) -> PathBuf {
        self.containerd_dir().join("tmp")
    }

    /// runc's state directory; the default (`/run/containerd/runc`) would be shared with a
    /// system containerd.
    pub fn runc_root(&self) -> PathBuf {
        self.containerd_dir().join("runc")
    }

    /// Where the CRI plugin bind-mounts pod network namespaces.
    pub fn netns_dir(&self) -> PathBuf {
        self.containerd_state()
            .join(super::containerd::CRI_PLUGIN)
            .join("netns")
    }

    pub fn cni_conf_dir(&self) -> PathBuf {
        self.root.join("cni").join("net.d")
    }

    pub fn cni_conflist(&self) -> PathBuf {
        self.cni_conf_dir().join(super::CNI_CONFLIST)
    }

    /// host-local's `dataDir`: IP reservations, so they vanish with the lab root.
    pub fn ipam_dir(&self) -> PathBuf {
        self.root.join("cni").join("ipam")
    }

    /// containerd's `registry.config_path` tree.
    pub fn certs_dir(&self) -> PathBuf {
        self.root.join("certs.d")
    }

    pub fn registry_hosts_toml(&self) -> PathBuf {
        self.certs_dir()
            .join(super::REGISTRY_ADDR)
            .join("hosts.toml")
    }

    /// Scratch space for building the OCI images; removed once they are pushed.
    pub fn image_build_dir(&self) -> PathBuf {
        self.root.join("images")
    }

    /// Whether `text` names a path inside the lab root (the root itself included). A plain
    /// prefix test would also match a sibling such as `<root>-images`.
    pub fn mentions_root(&self, text: &str) -> bool {
        mentions_path(text, &self.root)
    }

    pub fn contains(&self, path: &Path) -> bool {
        path.starts_with(&self.root)
    }
}

/// Whether `text` contains `path` followed by a path separator, a delimiter or the end.
pub(crate) fn mentions_path(text: &str, path: &Path) -> bool {
    let Some(needle) = path.to_str() else {
        return false;
    };
    let needle = needle.trim_end_matches('/');
    if needle.is_empty() {
        return false;
    }
    let mut rest = text;
    while let Some(at) = rest.find(needle) {
        let after = &rest[at + needle.len()..];
        match after.chars().next() {
            None => return true,
            Some(c) if c == '/' || c == '"' || c == '\'' || c == ' ' || c == '\0' => {
                return true;
            }
            Some(c) if c == '\n' || c == ',' || c == ':' || c == '=' => return true,
            _ => rest = &rest[at + needle.len()..],
        }
    }
    false
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn layout_is_under_root() {
        let p = LabPaths::new("/var/lib/podlapse-lab");
        assert_eq!(
            p.cri_socket(),
            PathBuf::from("/var/lib/podlapse-lab/containerd/containerd.sock")
        );
        assert_eq!(
            p.state_file(),
            PathBuf::from("/var/lib/podlapse-lab/lab.json")
        );
        assert_eq!(
            p.registry_hosts_toml(),
            PathBuf::from("/var/lib/podlapse-lab/certs.d/127.0.0.1:5000/hosts.toml")
        );
        for path in [
            p.ipam_dir(),
            p.netns_dir(),
            p.runc_root(),
            p.containerd_opt(),
        ] {
            assert!(p.contains(&path), "{}", path.display());
        }
    }

    #[test]
    fn relative_root_becomes_absolute() {
        assert!(LabPaths::new("some/lab").root.is_absolute());
    }

    #[test]
    fn mention_needs_a_boundary() {
        let p = LabPaths::new("/var/lib/podlapse-lab");
        assert!(
            p.mentions_root("containerd --config /var/lib/podlapse-lab/containerd/config.toml")
        );
        assert!(p.mentions_root("/var/lib/podlapse-lab"));
        assert!(p.mentions_root("-address\0/var/lib/podlapse-lab/containerd/containerd.sock\0"));
        assert!(!p.mentions_root("/var/lib/podlapse-lab-images/x"));
        assert!(!p.mentions_root("/var/lib/podlapse-labx /var/lib/other"));
        assert!(p.mentions_root("/var/lib/podlapse-labx /var/lib/podlapse-lab/y"));
    }
}
