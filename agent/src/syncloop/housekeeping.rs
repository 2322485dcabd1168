//! HandlePodCleanups: remove what belongs to no desired pod. Runtime sandboxes and
//! containers that carry podlapse's labels for this node, pod directories under the root
//! dir, and (with pod cgroups) orphaned cgroups. Never touches objects without podlapse's
//! labels or another node's.

use std::collections::{BTreeSet, HashMap};

use crate::cri::{RuntimeService, api};
use crate::kubelet::sandbox_gc::{SandboxGcInfo, evictable_sandboxes};
use crate::kuberuntime::labels;
use crate::kuberuntime::volumes;

use super::shared::Shared;

/// What one housekeeping pass removed.
#[derive(Debug, Default, PartialEq, Eq)]
pub struct Cleaned {
    pub sandboxes: Vec<String>,
    /// Dead sandboxes of pods that still exist (kubelet's sandbox GC).
    pub dead_sandboxes: Vec<String>,
    pub containers: Vec<String>,
    pub pod_dirs: Vec<String>,
    pub pod_cgroups: Vec<String>,
}

fn ours(node: &str) -> HashMap<String, String> {
    HashMap::from([
        (
            labels::MANAGED_BY.to_string(),
            labels::MANAGED_BY_VALUE.to_string(),
        ),
        (labels::NODE.to_string(), node.to_string()),
    ])
}

/// Removes runtime objects and directories of pods whose UID is not in `keep`.
pub async fn cleanup_orphans<R: RuntimeService>(
    cri: &R,
    shared: &Shared,
    keep: &BTreeSet<String>,
) -> Cleaned {
    let node = &shared.cfg.node_name;
    let mut cleaned = Cleaned::default();
    let orphan =
        |l: &HashMap<String, String>| l.get(labels::POD_UID).is_some_and(|u| !keep.contains(u));

    let listed = cri
        .list_containers(Some(api::ContainerFilter {
            label_selector: ours(node),
            ..Default::default()
        }))
        .await;
    // Sandboxes some container still names, the orphans' about to go excepted.
    let mut in_use: BTreeSet<String> = BTreeSet::new();
    if let Ok(containers) = listed {
        let (orphans, kept): (Vec<_>, Vec<_>) =
            containers.into_iter().partition(|c| orphan(&c.labels));
        in_use.extend(kept.into_iter().map(|c| c.pod_sandbox_id));
        for c in orphans {
            let stopped = c.state != api::ContainerState::ContainerRunning as i32
                || cri.stop_container(&c.id, 0).await.is_ok();
            if stopped && cri.remove_container(&c.id).await.is_ok() {
                cleaned.containers.push(c.id);
            }
        }
    }
    if let Ok(sandboxes) = cri
        .list_pod_sandbox(Some(api::PodSandboxFilter {
            label_selector: ours(node),
            ..Default::default()
        }))
        .await
    {
        let (orphans, kept): (Vec<_>, Vec<_>) =
            sandboxes.into_iter().partition(|s| orphan(&s.labels));
        for sb in orphans {
            if cri.stop_pod_sandbox(&sb.id).await.is_ok()
                && cri.remove_pod_sandbox(&sb.id).await.is_ok()
            {
                cleaned.sandboxes.push(sb.id);
            }
        }
        // kubelet's sandbox GC for the pods that stay: a dead sandbox (one a crashed
        // runtime left, or an older attempt) goes once it holds no container and a newer
        // one exists.
        let mut by_pod: std::collections::BTreeMap<String, Vec<SandboxGcInfo>> =
            std::collections::BTreeMap::new();
        for sb in kept {
            let Some(uid) = sb.labels.get(labels::POD_UID) else {
                continue;
            };
            by_pod.entry(uid.clone()).or_default().push(SandboxGcInfo {
                has_containers: in_use.contains(&sb.id),
                ready: sb.state == api::PodSandboxState::SandboxReady as i32,
                created_at: sb.created_at,
                id: sb.id,
            });
        }
        for sandboxes in by_pod.values() {
            for id in evictable_sandboxes(sandboxes, true) {
                // kubelet stops a sandbox before removing it, in case nothing did.
                if cri.stop_pod_sandbox(&id).await.is_ok()
                    && cri.remove_pod_sandbox(&id).await.is_ok()
                {
                    cleaned.dead_sandboxes.push(id);
                }
            }
        }
    }
    let pods_dir = shared.cfg.root_dir.join("pods");
    if let Ok(entries) = std::fs::read_dir(&pods_dir) {
        let mut uids: Vec<String> = entries
            .filter_map(|e| e.ok()?.file_name().into_string().ok())
            .filter(|uid| !keep.contains(uid))
            .collect();
        uids.sort();
        for uid in uids {
            if volumes::remove_pod_dir(&uid, &shared.cfg).is_ok() {
                cleaned.pod_dirs.push(uid);
            }
        }
    }
    if let Some(pcm) = &shared.pcm
        && let Ok(uids) = pcm.list_pod_cgroups()
    {
        for uid in uids.into_iter().filter(|u| !keep.contains(u)) {
            if pcm.destroy_pod_cgroup_blocking(&uid).await.is_ok() {
                cleaned.pod_cgroups.push(uid);
            }
        }
    }
    cleaned
}
