//! A snapshot of everything on the host that the lab could leave behind, so a test can
//! check that `down` really restored the host: snapshot, up, work, down, snapshot, diff.

use std::collections::BTreeSet;
use std::path::Path;

use serde::Serialize;

use super::baseline::{self, WATCHED_DIRS};
use super::mounts;
use super::network::{self, Dump, Family};
use super::paths::{self, LabPaths};
use super::process;

#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize)]
pub struct ResidueSnapshot {
    /// Live lab processes: daemons, shims, runc and container processes, as
    /// `pid N (cmdline)`. Zombies are left out (see `is_alive`).
    pub processes: BTreeSet<String>,
    /// Mounts under the lab root or in a netns directory, as `mount point (fstype)`.
    pub mounts: BTreeSet<String>,
    /// Entries of `/var/run/netns`.
    pub netns: BTreeSet<String>,
    /// Network link names (`ip -o link`).
    pub links: BTreeSet<String>,
    /// iptables and ip6tables tables, chains and rules, without counters and comments.
    pub iptables: BTreeSet<String>,
    /// host-local reservations under the lab's IPAM directory.
    pub ipam_reservations: BTreeSet<String>,
    /// Host directories outside the root that the lab's tools write into, and their entries.
    pub host_paths: BTreeSet<String>,
    /// Cgroup directories at or below `k8s.io` in every hierarchy.
    pub cgroups: BTreeSet<String>,
    /// Kernel settings the CNI plugins change.
    pub sysctls: BTreeSet<String>,
}

/// Captures the residue-relevant host state. Never fails: what cannot be read is left out.
pub fn snapshot_residue(paths: &LabPaths) -> ResidueSnapshot {
    let mut s = ResidueSnapshot::default();
    let me = std::process::id();
    for pid in process::all_pids() {
        if pid == me || !process::is_alive(pid) {
            continue;
        }
        if is_lab_process(paths, pid) {
            s.processes.insert(process::describe_pid(pid));
        }
    }
    let netns_dirs = [
        paths.root.clone(),
        paths::HOST_NETNS_DIR.into(),
        paths::VAR_RUN_NETNS_DIR.into(),
    ];
    for m in mounts::mounts_under(&mounts::current_mounts(), &netns_dirs) {
        s.mounts
            .insert(format!("{} ({})", m.mount_point.display(), m.fs_type));
    }
    s.netns = baseline::dir_entries(Path::new(paths::VAR_RUN_NETNS_DIR))
        .unwrap_or_default()
        .into_iter()
        .collect();
    s.links = network::link_names(&[]).into_iter().collect();
    for family in Family::ALL {
        if let Ok(text) = network::save(family) {
            for line in Dump::parse(&text).normalized() {
                s.iptables.insert(format!("{} {line}", family.label()));
            }
        }
    }
    s.ipam_reservations = network::ipam_reservations(paths).into_iter().collect();
    for w in WATCHED_DIRS {
        if let Some(entries) = baseline::dir_entries(Path::new(w.path)) {
            s.host_paths.insert(w.path.to_owned());
            for e in entries {
                s.host_paths.insert(format!("{}/{e}", w.path));
            }
        }
    }
    s.cgroups = baseline::lab_cgroups()
        .into_iter()
        .map(|p| p.display().to_string())
        .collect();
    if let Some(v) = network::read_ip_forward() {
        s.sysctls.insert(format!("net.ipv4.ip_forward={v}"));
    }
    s
}

/// A process belongs to the lab if its command line or working directory names the lab
/// root (daemons, shims, runc), or it runs in a cgroup of the CRI plugin (pod processes).
pub(crate) fn is_lab_process(paths: &LabPaths, pid: u32) -> bool {
    if paths.mentions_root(&process::cmdline(pid)) {
        return true;
    }
    if process::cwd(pid)
        .is_some_and(|c| paths.contains(&c) || paths.mentions_root(&c.to_string_lossy()))
    {
        return true;
    }
    process::cgroups(pid).iter().any(|c| {
        c.trim_start_matches('/')
            .split('/')
            .next()
            .is_some_and(baseline::is_pod_cgroup_root)
            && c.matches('/').count() >= 2
    })
}

impl ResidueSnapshot {
    /// What is in `later` but not in `self`, one human-readable line each.
    pub fn diff(&self, later: &ResidueSnapshot) -> Vec<String> {
        let mut out = Vec::new();
        let fields: [(&str, &BTreeSet<String>, &BTreeSet<String>); 9] = [
            ("process", &self.processes, &later.processes),
            ("mount", &self.mounts, &later.mounts),
            ("netns", &self.netns, &later.netns),
            ("link", &self.links, &later.links),
            ("iptables", &self.iptables, &later.iptables),
            (
                "ipam reservation",
                &self.ipam_reservations,
                &later.ipam_reservations,
            ),
            ("host path", &self.host_paths, &later.host_paths),
            ("cgroup", &self.cgroups, &later.cgroups),
            ("sysctl", &self.sysctls, &later.sysctls),
        ];
        for (kind, before, after) in fields {
            for item in after.difference(before) {
                out.push(format!("{kind}: {item}"));
            }
        }
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn diff_lists_only_new_items() {
        let mut before = ResidueSnapshot::default();
        before.links.insert("eth0".into());
        before.sysctls.insert("net.ipv4.ip_forward=0".into());
        let mut after = before.clone();
        assert!(before.diff(&after).is_empty());
        after.links.insert("ptlab0".into());
        after.sysctls.remove("net.ipv4.ip_forward=0");
        after.sysctls.insert("net.ipv4.ip_forward=1".into());
        after.links.remove("eth0");
        assert_eq!(
            before.diff(&after),
            vec![
                "link: ptlab0".to_owned(),
                "sysctl: net.ipv4.ip_forward=1".to_owned()
            ]
        );
    }

    #[test]
    fn snapshot_of_an_absent_lab_mentions_nothing_of_it() {
        let paths = LabPaths::new("/nonexistent/podlapse-lab-residue-test");
        let s = snapshot_residue(&paths);
        assert!(s.ipam_reservations.is_empty());
        assert!(
            s.mounts
                .iter()
                .all(|m| !m.contains("podlapse-lab-residue-test"))
        );
        assert_eq!(s, s.clone());
    }
}
