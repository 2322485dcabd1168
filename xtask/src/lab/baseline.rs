//! What the host looked like just before `up` started anything. `down` removes what is
//! present now but was not then, so it never touches what was there before the lab.

use std::collections::BTreeMap;
use std::fs;
use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};

use super::error::LabError;
use super::mounts;
use super::network::{self, Family};
use super::paths::{self, LabPaths};

const PART: &str = "baseline";
const FILE: &str = "baseline.json";

/// Host directories outside the lab root that the lab's tools write into although every
/// path they are configured with points inside the root.
pub(crate) struct WatchedDir {
    pub path: &'static str,
    pub select: Select,
}

impl WatchedDir {
    const fn new(path: &'static str, select: Select) -> WatchedDir {
        WatchedDir { path, select }
    }
}

/// Which new entries of a watched directory are the lab's.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Select {
    Any,
    Prefix(&'static str),
    /// libcni's result cache: `<network>-<container id>-<ifname>`. The lab's are the
    /// `podlapse-lab-*` files, plus the loopback results of the same sandboxes.
    CniResults,
}

impl Select {
    /// The entries among `new` that belong to the lab; `all` is the directory's full
    /// listing, from which sandbox ids are learnt.
    pub(crate) fn pick<'a>(self, new: &[&'a String], all: &[String]) -> Vec<&'a String> {
        match self {
            Select::Any => new.to_vec(),
            Select::Prefix(p) => new.iter().copied().filter(|e| e.starts_with(p)).collect(),
            Select::CniResults => {
                let prefix = format!("{}-", super::CNI_NETWORK);
                let ids: Vec<&str> = all
                    .iter()
                    .filter_map(|e| e.strip_prefix(&prefix))
                    .filter_map(|rest| rest.rsplit_once('-').map(|(id, _ifname)| id))
                    .filter(|id| !id.is_empty())
                    .collect();
                new.iter()
                    .copied()
                    .filter(|e| e.starts_with(&prefix) || ids.iter().any(|id| e.contains(id)))
                    .collect()
            }
        }
    }
}

pub(crate) const WATCHED_DIRS: &[WatchedDir] = &[
    // containerd's shims put their sockets under /run/containerd/s whatever `state` says.
    WatchedDir::new("/run/containerd", Select::Any),
    WatchedDir::new("/run/containerd/s", Select::Any),
    // libcni caches each ADD result here; a DEL that never runs leaves the file.
    WatchedDir::new("/var/lib/cni", Select::Any),
    WatchedDir::new("/var/lib/cni/results", Select::CniResults),
    // Default netns mount directory, should the state-dir setting ever be ignored.
    WatchedDir::new(paths::HOST_NETNS_DIR, Select::Prefix("cni-")),
    // skopeo's blob info cache, written on every push.
    WatchedDir::new("/var/lib/containers", Select::Any),
    WatchedDir::new(
        "/var/lib/containers/cache",
        Select::Prefix("blob-info-cache"),
    ),
    // Defaults of containerd's root and opt plugin, in case a setting is not honoured.
    WatchedDir::new("/var/lib/containerd", Select::Any),
    WatchedDir::new("/opt/containerd", Select::Any),
];

/// The cgroup containerd's CRI plugin puts pods under when no parent is given.
pub(crate) const CGROUP_PARENT: &str = "k8s.io";

/// Top-level cgroups pods of the lab live under: containerd's default, and podlapse's pod
/// cgroup roots (`/podlapse` by default; tests use `/podlapse-<something>`).
pub(crate) fn is_pod_cgroup_root(name: &str) -> bool {
    name == CGROUP_PARENT || name == "podlapse" || name.starts_with("podlapse-")
}

#[derive(Debug, Clone, Default, Serialize, Deserialize, PartialEq)]
pub(crate) struct Baseline {
    /// Raw `iptables-save` / `ip6tables-save` output, kept in their own files.
    #[serde(skip)]
    pub iptables: BTreeMap<String, String>,
    /// `nft list tables` entries as `family name`.
    pub nft_tables: Vec<String>,
    pub ip_forward: Option<String>,
    /// For each watched directory: its entries, or `None` when it did not exist.
    pub dirs: BTreeMap<PathBuf, Option<Vec<String>>>,
    /// Cgroup directories at or below the pod cgroup roots that already existed.
    pub cgroups: Vec<PathBuf>,
}

impl Baseline {
    pub(crate) fn capture() -> Result<Baseline, LabError> {
        let mut iptables = BTreeMap::new();
        for family in Family::ALL {
            iptables.insert(family.baseline_file().to_owned(), network::save(family)?);
        }
        Ok(Baseline {
            iptables,
            nft_tables: network::nft_tables(),
            ip_forward: network::read_ip_forward(),
            dirs: WATCHED_DIRS
                .iter()
                .map(|w| (PathBuf::from(w.path), dir_entries(Path::new(w.path))))
                .collect(),
            cgroups: lab_cgroups(),
        })
    }

    pub(crate) fn iptables(&self, family: Family) -> &str {
        self.iptables
            .get(family.baseline_file())
            .map(String::as_str)
            .unwrap_or("")
    }

    pub(crate) fn save(&self, paths: &LabPaths) -> Result<(), LabError> {
        let dir = paths.baseline_dir();
        fs::create_dir_all(&dir).map_err(|e| LabError::io(PART, "create", &dir, e))?;
        for (name, text) in &self.iptables {
            let f = dir.join(name);
            fs::write(&f, text).map_err(|e| LabError::io(PART, "write", &f, e))?;
        }
        let f = dir.join(FILE);
        let json = serde_json::to_string_pretty(self).map_err(|source| LabError::State {
            path: f.clone(),
            source,
        })?;
        fs::write(&f, json).map_err(|e| LabError::io(PART, "write", &f, e))
    }

    /// The baseline of the last `up`, if it got far enough to record one.
    pub(crate) fn load(paths: &LabPaths) -> Option<Baseline> {
        let dir = paths.baseline_dir();
        let text = fs::read_to_string(dir.join(FILE)).ok()?;
        let mut b: Baseline = serde_json::from_str(&text).ok()?;
        for family in Family::ALL {
            let text = fs::read_to_string(dir.join(family.baseline_file())).ok()?;
            b.iptables.insert(family.baseline_file().to_owned(), text);
        }
        Some(b)
    }
}

pub(crate) fn dir_entries(path: &Path) -> Option<Vec<String>> {
    let rd = fs::read_dir(path).ok()?;
    let mut names: Vec<String> = rd
        .flatten()
        .map(|e| e.file_name().to_string_lossy().into_owned())
        .collect();
    names.sort();
    Some(names)
}

/// Mount points of the cgroup hierarchies (v1 controllers and the v2 one).
pub(crate) fn cgroup_hierarchies() -> Vec<PathBuf> {
    let mut out: Vec<PathBuf> = mounts::current_mounts()
        .into_iter()
        .filter(|m| m.fs_type == "cgroup" || m.fs_type == "cgroup2")
        .map(|m| m.mount_point)
        .collect();
    out.sort();
    out.dedup();
    out
}

/// Every directory at or below a pod cgroup root in every hierarchy.
pub(crate) fn lab_cgroups() -> Vec<PathBuf> {
    let mut out = Vec::new();
    for h in cgroup_hierarchies() {
        let Ok(rd) = fs::read_dir(&h) else { continue };
        for e in rd.flatten() {
            let is_root = e.file_name().to_str().is_some_and(is_pod_cgroup_root);
            if is_root && e.file_type().is_ok_and(|t| t.is_dir()) {
                collect_dirs(&e.path(), &mut out);
            }
        }
    }
    out.sort();
    out
}

fn collect_dirs(dir: &Path, out: &mut Vec<PathBuf>) {
    out.push(dir.to_owned());
    if let Ok(rd) = fs::read_dir(dir) {
        for e in rd.flatten() {
            if e.file_type().is_ok_and(|t| t.is_dir()) {
                collect_dirs(&e.path(), out);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn watched_dirs_are_outside_any_lab_root_and_parents_come_first() {
        for (i, w) in WATCHED_DIRS.iter().enumerate() {
            assert!(w.path.starts_with('/'));
            // A parent listed after its child would be removed before the child's entries
            // are looked at.
            for later in &WATCHED_DIRS[i + 1..] {
                assert!(
                    !w.path.starts_with(&format!("{}/", later.path)),
                    "{}",
                    w.path
                );
            }
        }
    }

    #[test]
    fn cni_results_of_lab_sandboxes_only() {
        let all: Vec<String> = [
            "cni-loopback-aaa111-lo",
            "cni-loopback-bbb222-lo",
            "other-net-bbb222-eth0",
            "podlapse-lab-aaa111-eth0",
        ]
        .iter()
        .map(|s| s.to_string())
        .collect();
        let new: Vec<&String> = all.iter().collect();
        let picked = Select::CniResults.pick(&new, &all);
        assert_eq!(
            picked,
            vec!["cni-loopback-aaa111-lo", "podlapse-lab-aaa111-eth0"]
        );
        assert_eq!(Select::Prefix("cni-").pick(&new, &all).len(), 2);
        assert_eq!(Select::Any.pick(&new, &all).len(), 4);
    }

    #[test]
    fn roundtrip_through_files() {
        let dir = std::env::temp_dir().join(format!("ptlab-baseline-{}", std::process::id()));
        let paths = LabPaths::new(&dir);
        let mut b = Baseline {
            nft_tables: vec!["ip filter".into()],
            ip_forward: Some("0".into()),
            ..Baseline::default()
        };
        b.dirs.insert("/run/netns".into(), None);
        b.dirs
            .insert("/var/lib/cni".into(), Some(vec!["networks".into()]));
        b.iptables
            .insert("iptables-save.txt".into(), "*filter\nCOMMIT\n".into());
        b.iptables
            .insert("ip6tables-save.txt".into(), String::new());
        b.save(&paths).unwrap();
        let back = Baseline::load(&paths).unwrap();
        fs::remove_dir_all(&dir).unwrap();
        assert_eq!(back, b);
        assert_eq!(back.iptables(Family::V4), "*filter\nCOMMIT\n");
    }
}
