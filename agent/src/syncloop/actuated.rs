//! kubelet's actuated resources: what the runtime was last told to give each running
//! container (at its start, or by an in-place resize). computePodResizeAction compares a
//! pod's allocation against them. Like kubelet's checkpoint, they are kept on disk in
//! the pod's directory, so a restarted agent resizes the containers it adopts correctly.

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::sync::Mutex;

use serde::{Deserialize, Serialize};

use crate::kubelet::RuntimePodStatus;
use crate::kubelet::runtime_pod::ContainerResources;

use super::shared::lock;

const CHECKPOINT: &str = "actuated_resources.json";

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
struct Actuated {
    container_id: String,
    cpu_request_milli: i64,
    cpu_limit_milli: i64,
    memory_request: i64,
    memory_limit: i64,
}

/// Per pod UID, per container name.
type PodRecords = BTreeMap<String, Actuated>;

pub struct ActuatedResources {
    /// `<root>/pods`; `None` keeps records in memory only (replay).
    pods_dir: Option<PathBuf>,
    pods: Mutex<BTreeMap<String, PodRecords>>,
}

impl ActuatedResources {
    pub fn new(pods_dir: Option<PathBuf>) -> ActuatedResources {
        ActuatedResources {
            pods_dir,
            pods: Mutex::new(BTreeMap::new()),
        }
    }

    fn checkpoint(&self, uid: &str) -> Option<PathBuf> {
        Some(self.pods_dir.as_ref()?.join(uid).join(CHECKPOINT))
    }

    /// The pod's records, loaded from its checkpoint the first time. A checkpoint that
    /// cannot be read counts as none: the containers are then left as they run.
    fn load<'a>(
        &self,
        pods: &'a mut BTreeMap<String, PodRecords>,
        uid: &str,
    ) -> &'a mut PodRecords {
        pods.entry(uid.to_string()).or_insert_with(|| {
            let Some(path) = self.checkpoint(uid) else {
                return PodRecords::new();
            };
            match std::fs::read(&path) {
                Ok(bytes) => serde_json::from_slice(&bytes).unwrap_or_else(|e| {
                    tracing::warn!(path = %path.display(), error = %e, "ignoring a corrupt actuated-resources checkpoint");
                    PodRecords::new()
                }),
                Err(_) => PodRecords::new(),
            }
        })
    }

    /// Records what the runtime applied to a container, and saves the pod's checkpoint.
    pub fn record(&self, uid: &str, name: &str, container_id: &str, r: ContainerResources) {
        let mut pods = lock(&self.pods);
        let records = self.load(&mut pods, uid);
        records.insert(
            name.to_string(),
            Actuated {
                container_id: container_id.to_string(),
                cpu_request_milli: r.cpu_request_milli,
                cpu_limit_milli: r.cpu_limit_milli,
                memory_request: r.memory_request,
                memory_limit: r.memory_limit,
            },
        );
        let Some(path) = self.checkpoint(uid) else {
            return;
        };
        let bytes = serde_json::to_vec(&*records).unwrap_or_default();
        // Written whole and renamed, so a crash never leaves half a checkpoint.
        let tmp = path.with_extension("json.tmp");
        let saved = path
            .parent()
            .map_or(Ok(()), std::fs::create_dir_all)
            .and_then(|()| std::fs::write(&tmp, &bytes))
            .and_then(|()| std::fs::rename(&tmp, &path));
        if let Err(e) = saved {
            tracing::warn!(path = %path.display(), error = %e, "saving actuated resources");
        }
    }

    /// Puts each running container's actuated resources into the runtime's view, where
    /// the record belongs to that very container.
    pub fn fill(&self, uid: &str, status: &mut RuntimePodStatus) {
        let mut pods = lock(&self.pods);
        let records = self.load(&mut pods, uid);
        for c in &mut status.containers {
            c.resources = records
                .get(&c.name)
                .filter(|a| a.container_id == c.id)
                .map(|a| ContainerResources {
                    cpu_request_milli: a.cpu_request_milli,
                    cpu_limit_milli: a.cpu_limit_milli,
                    memory_request: a.memory_request,
                    memory_limit: a.memory_limit,
                });
        }
    }

    /// Forgets a pod that is gone (its directory, checkpoint included, goes with it).
    pub fn forget(&self, uid: &str) {
        lock(&self.pods).remove(uid);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::kubelet::runtime_pod::{ContainerState, ContainerStatus};

    fn status() -> RuntimePodStatus {
        RuntimePodStatus {
            containers: vec![ContainerStatus {
                id: "c1".into(),
                name: "app".into(),
                state: ContainerState::Running,
                ..ContainerStatus::default()
            }],
            ..RuntimePodStatus::default()
        }
    }

    #[test]
    fn records_survive_a_restart_and_belong_to_one_container() {
        let dir = tempfile::tempdir().unwrap();
        let r = ContainerResources {
            cpu_request_milli: 100,
            cpu_limit_milli: 500,
            memory_request: 0,
            memory_limit: 64 << 20,
        };
        ActuatedResources::new(Some(dir.path().into())).record("uid1", "app", "c1", r);

        let restarted = ActuatedResources::new(Some(dir.path().into()));
        let mut st = status();
        restarted.fill("uid1", &mut st);
        assert_eq!(st.containers[0].resources, Some(r));

        st.containers[0].id = "c2".into();
        restarted.fill("uid1", &mut st);
        assert_eq!(
            st.containers[0].resources, None,
            "another container's record"
        );
    }

    #[test]
    fn a_corrupt_checkpoint_counts_as_none() {
        let dir = tempfile::tempdir().unwrap();
        std::fs::create_dir_all(dir.path().join("uid1")).unwrap();
        std::fs::write(dir.path().join("uid1").join(CHECKPOINT), b"{not json").unwrap();
        let mut st = status();
        ActuatedResources::new(Some(dir.path().into())).fill("uid1", &mut st);
        assert_eq!(st.containers[0].resources, None);
    }
}
