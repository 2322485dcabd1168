//! kubelet's qosContainerManager and podContainerManager, with either cgroup driver:
//! cgroupfs (podlapse makes the directories) or systemd (systemd makes transient slices,
//! as kubelet's systemd cgroup manager has it do). Limits are written to the cgroup files
//! in both cases, after systemd has the same values as unit properties, as runc does.
//!
//! Calls block on the filesystem or on systemd's jobs; `destroy_pod_cgroup` may also sleep
//! up to about 1.3 s waiting for killed processes to leave, so async callers run it on a
//! blocking thread.

use std::collections::BTreeSet;
use std::io::ErrorKind;
use std::path::Path;

use k8s_openapi::api::core::v1::Pod;

use super::cgroup_name::{CgroupDriver, CgroupName};
use super::layout::{CgroupLayout, cgroup_dir};
use super::systemd::{self, Systemd};
use super::{CmError, cgroupfs};
use crate::kubelet::qos::{
    self, MAX_SHARES, MIN_SHARES, PodResourceConfig, QosClass, pod_qos, pod_resource_config,
};

/// The Burstable tier's cgroup, below the root.
pub const BURSTABLE_CGROUP: &str = "burstable";
/// The BestEffort tier's cgroup, below the root.
pub const BEST_EFFORT_CGROUP: &str = "besteffort";
/// A pod cgroup is `pod<uid>`.
pub const POD_CGROUP_PREFIX: &str = "pod";

/// Creates, limits, lists and removes pod cgroups under one cgroup root.
#[derive(Debug, Clone)]
pub struct PodContainerManager {
    root: CgroupName,
    driver: CgroupDriver,
    layout: CgroupLayout,
    /// The system bus connection, with the systemd driver only.
    systemd: Option<Systemd>,
}

impl PodContainerManager {
    /// A manager for pods under `cgroup_root` (for example `/podlapse`, which the systemd
    /// driver names `/podlapse.slice`). Nothing is created until
    /// [`PodContainerManager::ensure_qos_cgroups`]; with the systemd driver this connects
    /// to systemd, and fails if it cannot.
    pub fn new(
        cgroup_root: &str,
        layout: CgroupLayout,
        driver: CgroupDriver,
    ) -> Result<PodContainerManager, CmError> {
        let invalid = || CmError::InvalidCgroupRoot {
            root: cgroup_root.to_string(),
        };
        let trimmed = cgroup_root.trim_end_matches('/');
        if !cgroup_root.starts_with('/') {
            return Err(invalid());
        }
        if !trimmed.is_empty()
            && trimmed[1..]
                .split('/')
                .any(|p| p.is_empty() || p == "." || p == "..")
        {
            return Err(invalid());
        }
        let systemd = match driver {
            CgroupDriver::Systemd => Some(Systemd::connect()?),
            CgroupDriver::Cgroupfs => None,
        };
        Ok(PodContainerManager {
            root: CgroupName::from_cgroupfs(trimmed),
            driver,
            layout,
            systemd,
        })
    }

    /// The root in the driver's naming.
    pub fn cgroup_root(&self) -> String {
        self.root.to_driver(self.driver)
    }

    pub fn driver(&self) -> CgroupDriver {
        self.driver
    }

    pub fn layout(&self) -> &CgroupLayout {
        &self.layout
    }

    /// The cgroup a QoS class's pods sit under (the root itself for Guaranteed), in the
    /// driver's naming.
    pub fn qos_cgroup(&self, class: QosClass) -> String {
        self.qos_name(class).to_driver(self.driver)
    }

    fn qos_name(&self, class: QosClass) -> CgroupName {
        match class {
            QosClass::Guaranteed => self.root.clone(),
            QosClass::Burstable => self.root.child(BURSTABLE_CGROUP),
            QosClass::BestEffort => self.root.child(BEST_EFFORT_CGROUP),
        }
    }

    /// kubelet's GetPodContainerName: the pod's cgroup in the driver's naming, to pass as
    /// the sandbox's `cgroup_parent` (containerd's systemd mode takes the slice from its
    /// last part). Pure; nothing is created.
    pub fn pod_cgroup_name(&self, pod: &Pod) -> Result<String, CmError> {
        self.pod_cgroup_in(pod_qos(pod), self.pod_uid(pod)?)
    }

    fn pod_uid<'p>(&self, pod: &'p Pod) -> Result<&'p str, CmError> {
        pod.metadata
            .uid
            .as_deref()
            .filter(|u| !u.is_empty())
            .ok_or_else(|| CmError::MissingPodUid {
                pod: format!(
                    "{}/{}",
                    pod.metadata.namespace.as_deref().unwrap_or_default(),
                    pod.metadata.name.as_deref().unwrap_or_default()
                ),
            })
    }

    /// kubelet's qosContainerManager.Start: the root and the two tier cgroups in every
    /// hierarchy, BestEffort at the minimum CPU weight. Idempotent.
    pub fn ensure_qos_cgroups(&self) -> Result<(), CmError> {
        for class in [
            QosClass::Guaranteed,
            QosClass::Burstable,
            QosClass::BestEffort,
        ] {
            self.create(&self.qos_name(class), &PodResourceConfig::default())?;
        }
        self.set_cpu_shares(&self.qos_name(QosClass::BestEffort), MIN_SHARES)
    }

    /// kubelet's qosContainerManager.UpdateCgroups for CPU: the Burstable tier's weight
    /// follows the CPU its pods request (`pods` are all the pods on the node).
    pub fn update_qos_cgroups<'a>(
        &self,
        pods: impl IntoIterator<Item = &'a Pod>,
    ) -> Result<(), CmError> {
        let shares = qos::burstable_cpu_shares(pods);
        self.set_cpu_shares(&self.qos_name(QosClass::Burstable), shares)?;
        self.set_cpu_shares(&self.qos_name(QosClass::BestEffort), MIN_SHARES)
    }

    /// kubelet's EnsureExists: the pod's cgroup in every hierarchy, with its limits.
    /// Returns the cgroup path to pass to the runtime as the sandbox's `cgroup_parent`.
    ///
    /// kubelet writes the limits only when it creates the cgroup; podlapse writes them
    /// every time, which is the same for a pod whose resources never change and repairs a
    /// cgroup left half-made by an earlier failure.
    pub fn ensure_pod_cgroup(&self, pod: &Pod) -> Result<String, CmError> {
        let cgroup = self.pod_name_in(pod_qos(pod), self.pod_uid(pod)?)?;
        let name = cgroup.to_driver(self.driver);
        let config = pod_resource_config(pod);
        self.create(&cgroup, &config)?;
        match &self.layout {
            CgroupLayout::V1 { .. } => {
                for (controller, file, value) in v1_settings(&config) {
                    if let Some(mountpoint) = self.layout.controller_mountpoint(controller) {
                        cgroupfs::write(&cgroup_dir(mountpoint, &name), file, &value)?;
                    }
                }
            }
            CgroupLayout::V2 { mountpoint } => {
                let dir = cgroup_dir(mountpoint, &name);
                for (file, value) in v2_settings(&config) {
                    cgroupfs::write(&dir, file, &value)?;
                }
            }
        }
        Ok(name)
    }

    /// kubelet's Exists: the pod's cgroup is present in every hierarchy, under whichever
    /// QoS tier holds it.
    pub fn pod_cgroup_exists(&self, uid: &str) -> bool {
        let Ok(names) = self.pod_cgroup_candidates(uid) else {
            return false;
        };
        let mountpoints = self.layout.mountpoints();
        names.iter().any(|name| {
            let name = name.to_driver(self.driver);
            mountpoints.iter().all(|m| cgroup_dir(m, &name).is_dir())
        })
    }

    /// kubelet's podContainerManager.Destroy: SIGKILL whatever still runs in the pod's
    /// cgroups (kubelet does this too, for processes the runtime lost track of), then
    /// remove them deepest first in every hierarchy and under every QoS tier. A cgroup
    /// already gone is fine; one whose processes survive is [`CmError::CgroupBusy`].
    pub fn destroy_pod_cgroup(&self, uid: &str) -> Result<(), CmError> {
        let mut trees = Vec::new();
        let mut units = Vec::new();
        for cgroup in self.pod_cgroup_candidates(uid)? {
            let name = cgroup.to_driver(self.driver);
            for mountpoint in self.layout.mountpoints() {
                let dir = cgroup_dir(mountpoint, &name);
                if dir.is_dir() {
                    trees.push(cgroupfs::subtree_deepest_first(&dir)?);
                    units.extend(cgroup.systemd_unit());
                }
            }
        }
        let mut stragglers = Vec::new();
        for dir in trees.iter().flatten() {
            for pid in cgroupfs::procs(dir)? {
                // v1 lists a process once per hierarchy; kill it once.
                if pid > 0 && !stragglers.iter().any(|(p, _)| *p == pid) {
                    stragglers.push((pid, dir.clone()));
                }
            }
        }
        if !stragglers.is_empty() {
            tracing::info!(
                pod_uid = uid,
                pids = ?stragglers.iter().map(|(p, _)| *p).collect::<Vec<_>>(),
                "killing processes left in the pod's cgroup"
            );
            cgroupfs::kill_all(&stragglers)?;
        }
        if let Some(systemd) = &self.systemd {
            // Stopping the slice stops what systemd still holds in it (the runtime's
            // container scopes) and removes its cgroups; whatever is left goes below.
            units.dedup();
            for unit in &units {
                systemd.stop_unit(unit)?;
            }
        }
        for dir in trees.iter().flatten() {
            cgroupfs::remove(dir)?;
        }
        Ok(())
    }

    /// [`PodContainerManager::destroy_pod_cgroup`] on the runtime's blocking pool: it waits
    /// on the kernel and on systemd, and a worker thread must not. (`block_in_place` would
    /// also do, but it hands the worker's queue to a new thread each time, and every such
    /// thread keeps the stack pages the pod workers touched.)
    pub async fn destroy_pod_cgroup_blocking(&self, uid: &str) -> Result<(), CmError> {
        let (pcm, owned) = (self.clone(), uid.to_string());
        tokio::task::spawn_blocking(move || pcm.destroy_pod_cgroup(&owned))
            .await
            .unwrap_or_else(|e| {
                Err(CmError::Interrupted {
                    uid: uid.to_string(),
                    reason: e.to_string(),
                })
            })
    }

    /// kubelet's GetAllPodsFromCgroups: UIDs of the pod cgroups under any QoS tier in any
    /// hierarchy, for housekeeping to remove those of pods that no longer exist.
    pub fn list_pod_cgroups(&self) -> Result<BTreeSet<String>, CmError> {
        let mut uids = BTreeSet::new();
        for mountpoint in self.layout.mountpoints() {
            for class in [
                QosClass::Guaranteed,
                QosClass::Burstable,
                QosClass::BestEffort,
            ] {
                let tier = self.qos_name(class);
                let dir = cgroup_dir(mountpoint, &tier.to_driver(self.driver));
                let entries = match std::fs::read_dir(&dir) {
                    Ok(e) => e,
                    Err(e) if e.kind() == ErrorKind::NotFound => continue,
                    Err(source) => return Err(CmError::Read { path: dir, source }),
                };
                for entry in entries {
                    let entry = entry.map_err(|source| CmError::Read {
                        path: dir.clone(),
                        source,
                    })?;
                    if !entry.file_type().is_ok_and(|t| t.is_dir()) {
                        continue;
                    }
                    let name = entry.file_name();
                    let component = name
                        .to_str()
                        .and_then(|n| tier.child_component(self.driver, n));
                    let uid = component
                        .as_deref()
                        .and_then(|n| n.strip_prefix(POD_CGROUP_PREFIX))
                        .filter(|u| valid_uid(u));
                    if let Some(uid) = uid {
                        uids.insert(uid.to_string());
                    }
                }
            }
        }
        Ok(uids)
    }

    fn pod_cgroup_in(&self, class: QosClass, uid: &str) -> Result<String, CmError> {
        Ok(self.pod_name_in(class, uid)?.to_driver(self.driver))
    }

    fn pod_name_in(&self, class: QosClass, uid: &str) -> Result<CgroupName, CmError> {
        if !valid_uid(uid) {
            return Err(CmError::InvalidPodUid {
                uid: uid.to_string(),
            });
        }
        Ok(self
            .qos_name(class)
            .child(&format!("{POD_CGROUP_PREFIX}{uid}")))
    }

    /// Where a pod with this UID could be: its class is not known from the UID alone.
    fn pod_cgroup_candidates(&self, uid: &str) -> Result<Vec<CgroupName>, CmError> {
        [
            QosClass::Guaranteed,
            QosClass::Burstable,
            QosClass::BestEffort,
        ]
        .into_iter()
        .map(|class| self.pod_name_in(class, uid))
        .collect()
    }

    /// Creates `cgroup` in every hierarchy: the directories with cgroupfs, a transient
    /// slice with `config`'s limits as its properties with systemd.
    fn create(&self, cgroup: &CgroupName, config: &PodResourceConfig) -> Result<(), CmError> {
        if let Some(systemd) = &self.systemd {
            let Some(unit) = cgroup.systemd_unit() else {
                return Ok(());
            };
            let parent = cgroup
                .components()
                .split_last()
                .and_then(|(_, parents)| {
                    parents
                        .iter()
                        .fold(CgroupName::root(), |n, p| n.child(p))
                        .systemd_unit()
                })
                .unwrap_or_else(|| "-.slice".into());
            return systemd.start_slice(&unit, &parent, &systemd::resource_properties(config));
        }
        let name = cgroup.to_cgroupfs();
        let name = name.as_str();
        match &self.layout {
            CgroupLayout::V1 { .. } => {
                let cpuset = self.layout.controller_mountpoint("cpuset");
                for mountpoint in self.layout.mountpoints() {
                    let dir = cgroup_dir(mountpoint, name);
                    if Some(mountpoint) == cpuset {
                        cgroupfs::create_below(mountpoint, &dir, inherit_cpuset)?;
                    } else {
                        cgroupfs::create_below(mountpoint, &dir, |_| Ok(()))?;
                    }
                }
            }
            CgroupLayout::V2 { mountpoint } => {
                cgroupfs::create_below(mountpoint, &cgroup_dir(mountpoint, name), delegate)?;
            }
        }
        Ok(())
    }

    fn set_cpu_shares(&self, cgroup: &CgroupName, shares: u64) -> Result<(), CmError> {
        if let (Some(systemd), Some(unit)) = (&self.systemd, cgroup.systemd_unit()) {
            let weight = PodResourceConfig {
                cpu_shares: Some(shares),
                ..PodResourceConfig::default()
            };
            systemd.set_properties(&unit, &systemd::resource_properties(&weight))?;
        }
        let name = cgroup.to_driver(self.driver);
        let name = name.as_str();
        match &self.layout {
            CgroupLayout::V1 { .. } => match self.layout.controller_mountpoint("cpu") {
                Some(m) => cgroupfs::write(&cgroup_dir(m, name), "cpu.shares", &shares.to_string()),
                None => Ok(()),
            },
            CgroupLayout::V2 { mountpoint } => cgroupfs::write(
                &cgroup_dir(mountpoint, name),
                "cpu.weight",
                &cpu_shares_to_weight(shares).to_string(),
            ),
        }
    }
}

/// A UID names one directory level: no separators, nothing relative, nothing odd.
fn valid_uid(uid: &str) -> bool {
    !uid.is_empty()
        && uid.len() <= 128
        && uid
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || c == '-' || c == '_' || c == '.')
        && uid != "."
        && uid != ".."
}

/// A new v1 cpuset cgroup starts with no CPUs and no memory nodes, and a process cannot
/// join it like that; like runc, copy the parent's values down into an empty level.
fn inherit_cpuset(dir: &Path) -> Result<(), CmError> {
    let Some(parent) = dir.parent() else {
        return Ok(());
    };
    for file in ["cpuset.cpus", "cpuset.mems"] {
        if !dir.join(file).exists() || !cgroupfs::read(dir, file)?.trim().is_empty() {
            continue;
        }
        let value = cgroupfs::read(parent, file)?;
        cgroupfs::write(dir, file, value.trim())?;
    }
    Ok(())
}

/// v2 gives a child only the controllers its parent enables in `cgroup.subtree_control`:
/// enable everything available at each level, so the pod cgroup has cpu and memory and
/// the container cgroups runc creates below it do too. One at a time, as runc does,
/// because a controller that cannot be enabled must not stop the others; a missing one
/// shows up as a failed limit write naming the file.
fn delegate(dir: &Path) -> Result<(), CmError> {
    let available = cgroupfs::read(dir, "cgroup.controllers")?;
    let enabled = cgroupfs::read(dir, "cgroup.subtree_control")?;
    let enabled: BTreeSet<&str> = enabled.split_whitespace().collect();
    for controller in available.split_whitespace() {
        if !enabled.contains(controller) {
            let _ = cgroupfs::write(dir, "cgroup.subtree_control", &format!("+{controller}"));
        }
    }
    Ok(())
}

/// The v1 files for a pod's limits, as (controller, file, value), in the order written:
/// the CFS period before the quota it scales. Zero means "leave unset", as in runc.
fn v1_settings(c: &PodResourceConfig) -> Vec<(&'static str, &'static str, String)> {
    let mut out = Vec::new();
    if let Some(shares) = c.cpu_shares.filter(|s| *s != 0) {
        out.push(("cpu", "cpu.shares", shares.to_string()));
    }
    if let Some(period) = c.cpu_period.filter(|p| *p != 0) {
        out.push(("cpu", "cpu.cfs_period_us", period.to_string()));
    }
    if let Some(quota) = c.cpu_quota.filter(|q| *q != 0) {
        out.push(("cpu", "cpu.cfs_quota_us", quota.to_string()));
    }
    if let Some(memory) = c.memory_limit.filter(|m| *m != 0) {
        out.push(("memory", "memory.limit_in_bytes", memory.to_string()));
    }
    out
}

/// The v2 files for a pod's limits: `cpu.weight`, `cpu.max` ("max" for no quota) and
/// `memory.max`.
fn v2_settings(c: &PodResourceConfig) -> Vec<(&'static str, String)> {
    let mut out = Vec::new();
    if let Some(shares) = c.cpu_shares.filter(|s| *s != 0) {
        out.push(("cpu.weight", cpu_shares_to_weight(shares).to_string()));
    }
    let quota = c.cpu_quota.unwrap_or(0);
    let period = c.cpu_period.unwrap_or(0);
    if quota != 0 || period != 0 {
        let mut max = if quota > 0 {
            quota.to_string()
        } else {
            "max".to_string()
        };
        if period != 0 {
            max.push_str(&format!(" {period}"));
        }
        out.push(("cpu.max", max));
    }
    if let Some(memory) = c.memory_limit.filter(|m| *m != 0) {
        let value = if memory < 0 {
            "max".to_string()
        } else {
            memory.to_string()
        };
        out.push(("memory.max", value));
    }
    out
}

/// cpu.shares [2, 262144] to cpu.weight [1, 10000] with the curve current kubelet and
/// runc use (through the default: 1024 shares is weight 100), not the older straight
/// line that put 1024 shares at weight 39.
pub fn cpu_shares_to_weight(shares: u64) -> u64 {
    if shares == 0 {
        return 0;
    }
    if shares <= MIN_SHARES {
        return 1;
    }
    if shares >= MAX_SHARES {
        return 10_000;
    }
    let l = (shares as f64).log2();
    let exponent = (l * l + 125.0 * l) / 612.0 - 7.0 / 34.0;
    10f64.powf(exponent).ceil() as u64
}

#[cfg(test)]
mod tests {
    use super::*;

    fn v1() -> CgroupLayout {
        CgroupLayout::from_mountinfo(
            "32 31 0:29 / /sys/fs/cgroup/cpu rw - cgroup cgroup rw,cpu\n\
             35 31 0:32 / /sys/fs/cgroup/memory rw - cgroup cgroup rw,memory\n",
        )
        .unwrap()
    }

    fn pod(uid: &str, limits: &str) -> Pod {
        serde_json::from_value(serde_json::json!({
            "metadata": {"name": "p", "namespace": "default", "uid": uid},
            "spec": {"containers": [{
                "name": "c",
                "resources": if limits.is_empty() {
                    serde_json::json!({})
                } else {
                    let (cpu, mem) = limits.split_once(',').unwrap();
                    serde_json::json!({"limits": {"cpu": cpu, "memory": mem}})
                },
            }]},
        }))
        .unwrap()
    }

    #[test]
    fn cgroup_names_follow_kubelet() {
        let m = PodContainerManager::new("/podlapse/", v1(), CgroupDriver::Cgroupfs).unwrap();
        assert_eq!(m.cgroup_root(), "/podlapse");
        assert_eq!(m.qos_cgroup(QosClass::Guaranteed), "/podlapse");
        assert_eq!(m.qos_cgroup(QosClass::Burstable), "/podlapse/burstable");
        assert_eq!(m.qos_cgroup(QosClass::BestEffort), "/podlapse/besteffort");
        assert_eq!(
            m.pod_cgroup_name(&pod("u-1", "100m,64Mi")).unwrap(),
            "/podlapse/podu-1"
        );
        assert_eq!(
            m.pod_cgroup_name(&pod("u-2", "")).unwrap(),
            "/podlapse/besteffort/podu-2"
        );
        let top = PodContainerManager::new("/", v1(), CgroupDriver::Cgroupfs).unwrap();
        assert_eq!(top.qos_cgroup(QosClass::Burstable), "/burstable");
        assert_eq!(top.pod_cgroup_name(&pod("u", "1,1Gi")).unwrap(), "/podu");
    }

    #[test]
    fn bad_roots_and_uids_are_refused() {
        for root in ["podlapse", "/a//b", "/a/../b", "/./a", ""] {
            assert!(
                matches!(
                    PodContainerManager::new(root, v1(), CgroupDriver::Cgroupfs),
                    Err(CmError::InvalidCgroupRoot { .. })
                ),
                "{root:?}"
            );
        }
        let m = PodContainerManager::new("/podlapse", v1(), CgroupDriver::Cgroupfs).unwrap();
        for uid in ["../../etc", "a/b", "..", "with space"] {
            assert!(
                matches!(
                    m.pod_cgroup_name(&pod(uid, "")),
                    Err(CmError::InvalidPodUid { .. })
                ),
                "{uid:?}"
            );
        }
        let mut no_uid = pod("x", "");
        no_uid.metadata.uid = None;
        let err = m.pod_cgroup_name(&no_uid).unwrap_err();
        assert_eq!(err.to_string(), "pod default/p has no UID");
    }

    #[test]
    fn v1_files_in_write_order() {
        let c = PodResourceConfig {
            cpu_shares: Some(512),
            cpu_quota: Some(50_000),
            cpu_period: Some(100_000),
            memory_limit: Some(1 << 20),
        };
        assert_eq!(
            v1_settings(&c),
            [
                ("cpu", "cpu.shares", "512".to_string()),
                ("cpu", "cpu.cfs_period_us", "100000".to_string()),
                ("cpu", "cpu.cfs_quota_us", "50000".to_string()),
                ("memory", "memory.limit_in_bytes", "1048576".to_string()),
            ]
        );
        let best_effort = PodResourceConfig {
            cpu_shares: Some(2),
            ..Default::default()
        };
        assert_eq!(
            v1_settings(&best_effort),
            [("cpu", "cpu.shares", "2".to_string())]
        );
    }

    #[test]
    fn v2_files() {
        let c = PodResourceConfig {
            cpu_shares: Some(1024),
            cpu_quota: Some(50_000),
            cpu_period: Some(100_000),
            memory_limit: Some(1 << 20),
        };
        assert_eq!(
            v2_settings(&c),
            [
                ("cpu.weight", "100".to_string()),
                ("cpu.max", "50000 100000".to_string()),
                ("memory.max", "1048576".to_string()),
            ]
        );
        let unlimited = PodResourceConfig {
            cpu_shares: Some(2),
            cpu_quota: Some(-1),
            cpu_period: Some(100_000),
            memory_limit: Some(-1),
        };
        assert_eq!(
            v2_settings(&unlimited),
            [
                ("cpu.weight", "1".to_string()),
                ("cpu.max", "max 100000".to_string()),
                ("memory.max", "max".to_string()),
            ]
        );
    }

    #[test]
    fn weight_curve() {
        assert_eq!(cpu_shares_to_weight(0), 0);
        assert_eq!(cpu_shares_to_weight(2), 1);
        assert_eq!(cpu_shares_to_weight(1024), 100);
        assert_eq!(cpu_shares_to_weight(MAX_SHARES), 10_000);
        let mut last = 0;
        for shares in [3, 10, 102, 512, 2048, 100_000] {
            let w = cpu_shares_to_weight(shares);
            assert!(w > last && w < 10_000, "{shares} -> {w}");
            last = w;
        }
    }
}
