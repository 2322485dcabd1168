//! kubelet's CgroupName: a cgroup as a list of components, written out the way the node's
//! cgroup driver names it.
//!
//! ```text
//! components                    cgroupfs                   systemd
//! [podlapse]                    /podlapse                  /podlapse.slice
//! [podlapse, burstable]         /podlapse/burstable        /podlapse.slice/podlapse-burstable.slice
//! [podlapse, burstable, pod<u>] /podlapse/burstable/pod<u> /podlapse.slice/podlapse-burstable.slice/podlapse-burstable-pod<u_>.slice
//! ```
//!
//! With systemd every level is a slice whose name repeats its parents' joined by `-`, so a
//! `-` inside a component (a pod UID has four) is written as `_`, as kubelet does.

use std::fmt;

/// How the node's runtime names and creates cgroups (kubelet's `--cgroup-driver`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum CgroupDriver {
    Cgroupfs,
    Systemd,
}

impl CgroupDriver {
    pub fn as_str(self) -> &'static str {
        match self {
            CgroupDriver::Cgroupfs => "cgroupfs",
            CgroupDriver::Systemd => "systemd",
        }
    }
}

impl fmt::Display for CgroupDriver {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

impl std::str::FromStr for CgroupDriver {
    type Err = String;

    fn from_str(s: &str) -> Result<CgroupDriver, String> {
        match s {
            "cgroupfs" => Ok(CgroupDriver::Cgroupfs),
            "systemd" => Ok(CgroupDriver::Systemd),
            other => Err(format!(
                "unknown cgroup driver {other:?}: expected cgroupfs or systemd"
            )),
        }
    }
}

const SLICE_SUFFIX: &str = ".slice";

/// A cgroup below the hierarchy's root, as its components; empty is the root itself.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Hash, Default)]
pub struct CgroupName(Vec<String>);

impl CgroupName {
    /// The hierarchy's root.
    pub fn root() -> CgroupName {
        CgroupName(Vec::new())
    }

    /// A cgroupfs path (`/podlapse/burstable`) as components. Empty parts are skipped,
    /// so `/` and `` are the root.
    pub fn from_cgroupfs(path: &str) -> CgroupName {
        CgroupName(
            path.split('/')
                .filter(|p| !p.is_empty())
                .map(str::to_string)
                .collect(),
        )
    }

    /// This cgroup's child `component`.
    pub fn child(&self, component: &str) -> CgroupName {
        let mut parts = self.0.clone();
        parts.push(component.to_string());
        CgroupName(parts)
    }

    pub fn components(&self) -> &[String] {
        &self.0
    }

    /// The name in the driver's form, which is also the path below a hierarchy's mount.
    pub fn to_driver(&self, driver: CgroupDriver) -> String {
        match driver {
            CgroupDriver::Cgroupfs => self.to_cgroupfs(),
            CgroupDriver::Systemd => self.to_systemd(),
        }
    }

    pub fn to_cgroupfs(&self) -> String {
        format!("/{}", self.0.join("/"))
    }

    /// kubelet's ToSystemd: the slice path, every level spelled out.
    pub fn to_systemd(&self) -> String {
        if self.0.is_empty() {
            return "/".into();
        }
        let escaped: Vec<String> = self.0.iter().map(|p| escape_systemd(p)).collect();
        let mut path = String::new();
        for end in 1..=escaped.len() {
            path.push('/');
            path.push_str(&escaped[..end].join("-"));
            path.push_str(SLICE_SUFFIX);
        }
        path
    }

    /// The systemd unit of this cgroup (`podlapse-burstable.slice`); none for the root.
    pub fn systemd_unit(&self) -> Option<String> {
        if self.0.is_empty() {
            return None;
        }
        let escaped: Vec<String> = self.0.iter().map(|p| escape_systemd(p)).collect();
        Some(format!("{}{SLICE_SUFFIX}", escaped.join("-")))
    }

    /// The component a child directory entry `entry` of this cgroup stands for, in the
    /// driver's naming: `pod<uid>` for `pod<uid>` (cgroupfs) or for
    /// `podlapse-burstable-pod<uid_>.slice` below `podlapse-burstable.slice` (systemd).
    /// None when the entry is not a cgroup this naming could have made.
    pub fn child_component(&self, driver: CgroupDriver, entry: &str) -> Option<String> {
        match driver {
            CgroupDriver::Cgroupfs => Some(entry.to_string()),
            CgroupDriver::Systemd => {
                let stem = entry.strip_suffix(SLICE_SUFFIX)?;
                let own = self
                    .systemd_unit()
                    .map(|u| u.trim_end_matches(SLICE_SUFFIX).to_string() + "-")
                    .unwrap_or_default();
                let last = stem.strip_prefix(&own)?;
                (!last.is_empty() && !last.contains('-')).then(|| unescape_systemd(last))
            }
        }
    }
}

/// kubelet's escapeSystemdCgroupName: `-` separates slice levels, so it becomes `_`.
fn escape_systemd(part: &str) -> String {
    part.replace('-', "_")
}

/// The inverse for UIDs, which never contain `_`.
fn unescape_systemd(part: &str) -> String {
    part.replace('_', "-")
}

#[cfg(test)]
mod tests {
    use super::*;

    fn name(parts: &[&str]) -> CgroupName {
        parts.iter().fold(CgroupName::root(), |n, p| n.child(p))
    }

    // kubelet's TestCgroupNameToSystemdBasename and TestCgroupNameToSystemd.
    #[test]
    fn systemd_names_as_kubelet_writes_them() {
        let cases: &[(&[&str], &str, &str)] = &[
            (&[], "/", ""),
            (&["system"], "/system.slice", "system.slice"),
            (
                &["system", "Burstable"],
                "/system.slice/system-Burstable.slice",
                "system-Burstable.slice",
            ),
            (
                &["Burstable", "pod-123"],
                "/Burstable.slice/Burstable-pod_123.slice",
                "Burstable-pod_123.slice",
            ),
            (
                &["test", "a", "b"],
                "/test.slice/test-a.slice/test-a-b.slice",
                "test-a-b.slice",
            ),
            (
                &["test", "a", "b", "Burstable"],
                "/test.slice/test-a.slice/test-a-b.slice/test-a-b-Burstable.slice",
                "test-a-b-Burstable.slice",
            ),
            (&["Burstable"], "/Burstable.slice", "Burstable.slice"),
            (
                &["BestEffort", "pod6c1a4e95-6bb6-11e6-bc26-28d2444e470d"],
                "/BestEffort.slice/BestEffort-pod6c1a4e95_6bb6_11e6_bc26_28d2444e470d.slice",
                "BestEffort-pod6c1a4e95_6bb6_11e6_bc26_28d2444e470d.slice",
            ),
        ];
        for (parts, path, unit) in cases {
            let n = name(parts);
            assert_eq!(n.to_systemd(), *path, "{parts:?}");
            assert_eq!(n.systemd_unit().unwrap_or_default(), *unit, "{parts:?}");
        }
    }

    #[test]
    fn cgroupfs_names_are_plain_paths() {
        assert_eq!(CgroupName::from_cgroupfs("/").to_cgroupfs(), "/");
        let n = CgroupName::from_cgroupfs("/podlapse/").child("burstable");
        assert_eq!(n.to_cgroupfs(), "/podlapse/burstable");
        assert_eq!(n.components(), ["podlapse", "burstable"]);
    }

    #[test]
    fn child_entries_map_back_to_components() {
        let tier = name(&["podlapse", "burstable"]);
        let uid = "6c1a4e95-6bb6-11e6-bc26-28d2444e470d";
        let pod = tier.child(&format!("pod{uid}"));
        let entry = pod.systemd_unit().unwrap();
        assert_eq!(
            tier.child_component(CgroupDriver::Systemd, &entry),
            Some(format!("pod{uid}"))
        );
        // A grandchild slice, a scope and another tier's slice are not children.
        let root = name(&["podlapse"]);
        assert_eq!(root.child_component(CgroupDriver::Systemd, &entry), None);
        assert_eq!(
            tier.child_component(CgroupDriver::Systemd, "cri-containerd-abc.scope"),
            None
        );
        assert_eq!(
            tier.child_component(CgroupDriver::Systemd, "podlapse-besteffort-pod1.slice"),
            None
        );
        assert_eq!(
            tier.child_component(CgroupDriver::Cgroupfs, "pod1"),
            Some("pod1".into())
        );
    }

    #[test]
    fn drivers_parse_by_kubelets_names() {
        assert_eq!("systemd".parse(), Ok(CgroupDriver::Systemd));
        assert_eq!("cgroupfs".parse(), Ok(CgroupDriver::Cgroupfs));
        assert!(
            "Systemd"
                .parse::<CgroupDriver>()
                .unwrap_err()
                .contains("\"Systemd\"")
        );
    }
}
