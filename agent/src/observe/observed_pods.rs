//! The pods an observer serves on its API (`GET /pods`, `podlapse pods`): each pod as
//! the runtime shows it, in the API's types. Its sandbox's IP, and each container's state
//! (created, running, exited with its code). Readiness, conditions and restart counts are
//! the kubelet's and stay unset; the phase says only what the runtime shows (Pending until
//! a container runs, Running while one does). A pod without kubelet's labels is keyed by
//! its sandbox ID, with the reason in its status message.

use std::collections::BTreeMap;
use std::sync::Arc;

use k8s_openapi::api::core::v1::{
    ContainerState, ContainerStateRunning, ContainerStateTerminated, ContainerStateWaiting,
    ContainerStatus, Pod, PodIP, PodStatus,
};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{ObjectMeta, Time};

use crate::syncloop::StatusStore;
use crate::trace::{Observation, ObservedRecord};

/// What the observer knows of one pod.
#[derive(Debug, Clone, Default)]
struct PodSeen {
    /// The sandbox it runs in now: the newest one seen ready.
    sandbox_id: String,
    ip: String,
    note: String,
    /// Its containers in the current sandbox, by container name; a restart replaces the
    /// older one.
    containers: BTreeMap<String, ContainerSeen>,
}

#[derive(Debug, Clone, Default)]
struct ContainerSeen {
    id: String,
    created_ns: Option<u64>,
    started_ns: Option<u64>,
    exited: Option<(u64, i32)>,
}

/// Folds the observed records into the status store the API serves.
pub struct ObservedPods {
    store: Arc<StatusStore>,
    /// One moment on the wall clock and on the trace's monotonic clock (the header's).
    anchor: (i64, u64),
    pods: BTreeMap<String, PodSeen>,
    /// Container changes of a sandbox not yet seen ready, by sandbox ID: one list can
    /// find a sandbox still being made and, moments later, its container already
    /// running. Applied once the sandbox is seen ready; dropped with the sandbox.
    early: BTreeMap<String, Vec<ObservedRecord>>,
}

impl ObservedPods {
    pub fn new(store: Arc<StatusStore>, started_wall_ns: i64, started_ns: u64) -> ObservedPods {
        ObservedPods {
            store,
            anchor: (started_wall_ns, started_ns),
            pods: BTreeMap::new(),
            early: BTreeMap::new(),
        }
    }

    fn time(&self, mono_ns: u64) -> Option<Time> {
        let wall = i128::from(self.anchor.0) + i128::from(mono_ns) - i128::from(self.anchor.1);
        jiff::Timestamp::from_nanosecond(wall).ok().map(Time)
    }

    /// Takes in one change the observer recorded.
    pub fn apply(&mut self, r: &ObservedRecord) {
        let key = r.pod_key().to_string();
        let at = r.happened_ns();
        match r.what {
            Observation::SandboxRemoved => {
                self.early.remove(&r.sandbox_id);
                if self
                    .pods
                    .get(&key)
                    .is_some_and(|p| p.sandbox_id == r.sandbox_id)
                {
                    self.pods.remove(&key);
                    self.store.remove(&key);
                }
                return;
            }
            Observation::SandboxReady => {
                if !self.pods.contains_key(&key) {
                    self.store.add_pod(std::sync::Arc::new(Pod {
                        metadata: ObjectMeta {
                            name: Some(r.name.clone()),
                            namespace: Some(r.namespace.clone()),
                            uid: Some(key.clone()),
                            creation_timestamp: self.time(at),
                            ..ObjectMeta::default()
                        },
                        ..Pod::default()
                    }));
                }
                let pod = self.pods.entry(key.clone()).or_default();
                if pod.sandbox_id != r.sandbox_id {
                    // A new sandbox: the containers of the old one are gone with it.
                    pod.containers.clear();
                    pod.sandbox_id = r.sandbox_id.clone();
                }
                pod.ip = r.ip.clone();
                if !r.note.is_empty() {
                    pod.note = r.note.clone();
                }
                for early in self.early.remove(&r.sandbox_id).unwrap_or_default() {
                    self.apply(&early);
                }
            }
            Observation::SandboxNotReady => {
                if let Some(pod) = self.pods.get_mut(&key)
                    && pod.sandbox_id == r.sandbox_id
                {
                    pod.ip.clear();
                }
            }
            Observation::ContainerCreated
            | Observation::ContainerStarted
            | Observation::ContainerExited
            | Observation::ContainerRemoved => {
                let Some(pod) = self
                    .pods
                    .get_mut(&key)
                    .filter(|p| p.sandbox_id == r.sandbox_id)
                else {
                    self.early
                        .entry(r.sandbox_id.clone())
                        .or_default()
                        .push(r.clone());
                    return;
                };
                let c = pod.containers.entry(r.container.clone()).or_default();
                if c.id != r.container_id {
                    if r.what == Observation::ContainerRemoved {
                        // An older instance of a container already replaced.
                        return;
                    }
                    *c = ContainerSeen {
                        id: r.container_id.clone(),
                        ..ContainerSeen::default()
                    };
                }
                match r.what {
                    Observation::ContainerCreated => c.created_ns = Some(at),
                    Observation::ContainerStarted => c.started_ns = Some(at),
                    Observation::ContainerExited => c.exited = Some((at, r.exit_code.unwrap_or(0))),
                    _ => {
                        pod.containers.remove(&r.container);
                    }
                }
            }
        }
        let status = self.status(&key);
        if let Some(status) = status {
            self.store.set_status(&key, status);
        }
    }

    /// The pod's status as the runtime shows it.
    fn status(&self, key: &str) -> Option<PodStatus> {
        let pod = self.pods.get(key)?;
        let statuses: Vec<ContainerStatus> = pod
            .containers
            .iter()
            .map(|(name, c)| self.container_status(name, c))
            .collect();
        let running = pod
            .containers
            .values()
            .any(|c| c.started_ns.is_some() && c.exited.is_none());
        Some(PodStatus {
            phase: Some(if running { "Running" } else { "Pending" }.into()),
            pod_ip: Some(pod.ip.clone()).filter(|ip| !ip.is_empty()),
            pod_ips: Some(vec![PodIP { ip: pod.ip.clone() }]).filter(|_| !pod.ip.is_empty()),
            message: Some(pod.note.clone()).filter(|n| !n.is_empty()),
            container_statuses: Some(statuses).filter(|s| !s.is_empty()),
            ..PodStatus::default()
        })
    }

    fn container_status(&self, name: &str, c: &ContainerSeen) -> ContainerStatus {
        let state = match (c.started_ns, c.exited) {
            (_, Some((at, code))) => ContainerState {
                terminated: Some(ContainerStateTerminated {
                    exit_code: code,
                    finished_at: self.time(at),
                    started_at: c.started_ns.and_then(|t| self.time(t)),
                    container_id: Some(c.id.clone()),
                    ..ContainerStateTerminated::default()
                }),
                ..ContainerState::default()
            },
            (Some(at), None) => ContainerState {
                running: Some(ContainerStateRunning {
                    started_at: self.time(at),
                }),
                ..ContainerState::default()
            },
            (None, None) => ContainerState {
                waiting: Some(ContainerStateWaiting {
                    reason: Some("ContainerCreating".into()),
                    message: None,
                }),
                ..ContainerState::default()
            },
        };
        ContainerStatus {
            name: name.to_string(),
            container_id: Some(c.id.clone()),
            state: Some(state),
            started: Some(c.started_ns.is_some() && c.exited.is_none()),
            ..ContainerStatus::default()
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::trace::ObservedVia;

    const UID: &str = "0b6c1f9e-2a4d-4c1e-9f3a-5d6e7f8a9b0c";

    fn record(what: Observation, at_ms: u64, container: &str) -> ObservedRecord {
        ObservedRecord {
            at_ns: at_ms * 1_000_000,
            runtime_ns: None,
            what,
            via: ObservedVia::Events,
            pod_uid: UID.into(),
            namespace: "default".into(),
            name: "web".into(),
            sandbox_id: "sb1".into(),
            attempt: 0,
            container_id: if container.is_empty() {
                String::new()
            } else {
                format!("id-{container}")
            },
            container: container.into(),
            ip: if container.is_empty() {
                "10.0.0.7".into()
            } else {
                String::new()
            },
            host_network: false,
            exit_code: (what == Observation::ContainerExited).then_some(3),
            before_start: false,
            note: String::new(),
            stream_missed: false,
        }
    }

    /// One list found the sandbox still being made and its container already running:
    /// the container shows once the sandbox is seen ready.
    #[test]
    fn a_container_seen_before_its_sandbox_was_ready_shows_once_it_is() {
        let store = Arc::new(StatusStore::default());
        let mut pods = ObservedPods::new(store.clone(), 1_000_000_000_000, 0);
        pods.apply(&record(Observation::SandboxNotReady, 5, ""));
        pods.apply(&record(Observation::ContainerCreated, 8, "app"));
        pods.apply(&record(Observation::ContainerStarted, 9, "app"));
        assert!(store.get(UID).is_none());
        pods.apply(&record(Observation::SandboxReady, 10, ""));
        let st = store.get(UID).unwrap().status;
        assert_eq!(st.phase.as_deref(), Some("Running"));
        let c = &st.container_statuses.unwrap()[0];
        assert_eq!(c.container_id.as_deref(), Some("id-app"));
        assert!(c.state.as_ref().unwrap().running.is_some());
        // A sandbox removed before it was ever ready leaves nothing kept.
        let mut gone = record(Observation::ContainerCreated, 20, "app");
        gone.sandbox_id = "sb2".into();
        pods.apply(&gone);
        let mut removed = record(Observation::SandboxRemoved, 30, "");
        removed.sandbox_id = "sb2".into();
        pods.apply(&removed);
        assert!(pods.early.is_empty());
    }

    #[test]
    fn the_api_shows_each_pod_as_the_runtime_shows_it() {
        let store = Arc::new(StatusStore::default());
        let mut pods = ObservedPods::new(store.clone(), 1_000_000_000_000, 0);
        pods.apply(&record(Observation::SandboxReady, 10, ""));
        let p = store
            .get(UID)
            .expect("the pod is listed once its sandbox is ready");
        assert_eq!((p.namespace.as_str(), p.name.as_str()), ("default", "web"));
        assert_eq!(p.status.phase.as_deref(), Some("Pending"));
        assert_eq!(p.status.pod_ip.as_deref(), Some("10.0.0.7"));
        pods.apply(&record(Observation::ContainerCreated, 20, "app"));
        let c = &store.get(UID).unwrap().status.container_statuses.unwrap()[0];
        let waiting = c.state.as_ref().unwrap().waiting.as_ref().unwrap();
        assert_eq!(waiting.reason.as_deref(), Some("ContainerCreating"));
        pods.apply(&record(Observation::ContainerStarted, 30, "app"));
        let st = store.get(UID).unwrap().status;
        assert_eq!(st.phase.as_deref(), Some("Running"));
        let c = &st.container_statuses.unwrap()[0];
        assert_eq!(c.container_id.as_deref(), Some("id-app"));
        assert!(c.state.as_ref().unwrap().running.is_some());
        // Readiness is the kubelet's: never claimed.
        assert!(!c.ready);
        pods.apply(&record(Observation::ContainerExited, 40, "app"));
        let st = store.get(UID).unwrap().status;
        assert_eq!(st.phase.as_deref(), Some("Pending"));
        let c = &st.container_statuses.unwrap()[0];
        let t = c.state.as_ref().unwrap().terminated.as_ref().unwrap();
        assert_eq!(t.exit_code, 3);
        // Another sandbox's removal leaves the pod; its own removes it.
        let mut old = record(Observation::SandboxRemoved, 50, "");
        old.sandbox_id = "sb0".into();
        pods.apply(&old);
        assert!(store.get(UID).is_some());
        pods.apply(&record(Observation::SandboxRemoved, 60, ""));
        assert!(store.get(UID).is_none());
    }
}
