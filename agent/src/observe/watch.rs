//! What changed since the runtime was last looked at. The observer feeds every sandbox and
//! container status it gets (from the event stream or a list) to a [`Watcher`], which
//! answers with the records of what changed: a sandbox that became ready, a container
//! that was created, started or exited, and what went away. It does no IO and reads no
//! clock: the times are the caller's and the runtime's.

use std::collections::{BTreeMap, BTreeSet};

use super::runtime_spans::is_uid;
use crate::cri::api;
use crate::trace::{Observation, ObservedRecord, ObservedVia};

/// kubelet's labels on the sandboxes and containers it creates.
pub const POD_NAME_LABEL: &str = "io.kubernetes.pod.name";
pub const POD_NAMESPACE_LABEL: &str = "io.kubernetes.pod.namespace";
pub const POD_UID_LABEL: &str = "io.kubernetes.pod.uid";
pub const CONTAINER_NAME_LABEL: &str = "io.kubernetes.container.name";

/// The pod a sandbox belongs to, as its labels say.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
struct PodRef {
    uid: String,
    namespace: String,
    name: String,
    /// Set when the labels do not name a pod: it is then known by its sandbox ID.
    note: String,
}

impl PodRef {
    fn of(
        labels: &std::collections::HashMap<String, String>,
        meta: Option<&api::PodSandboxMetadata>,
    ) -> PodRef {
        let label = |k: &str| labels.get(k).cloned().unwrap_or_default();
        let uid = label(POD_UID_LABEL);
        let name = Some(label(POD_NAME_LABEL))
            .filter(|n| !n.is_empty())
            .or_else(|| meta.map(|m| m.name.clone()))
            .unwrap_or_default();
        let namespace = Some(label(POD_NAMESPACE_LABEL))
            .filter(|n| !n.is_empty())
            .or_else(|| meta.map(|m| m.namespace.clone()))
            .unwrap_or_default();
        if is_uid(&uid) {
            return PodRef {
                uid,
                namespace,
                name,
                note: String::new(),
            };
        }
        let note = if uid.is_empty() {
            format!("no {POD_UID_LABEL} label: shown by its sandbox ID")
        } else {
            format!("{POD_UID_LABEL}={uid:?} is not a pod UID: shown by its sandbox ID")
        };
        PodRef {
            uid: String::new(),
            namespace,
            name,
            note,
        }
    }
}

#[derive(Debug, Clone)]
struct SandboxSeen {
    pod: PodRef,
    ready: bool,
}

#[derive(Debug, Clone, Default)]
struct ContainerSeen {
    sandbox_id: String,
    name: String,
    started: bool,
    exited: bool,
}

/// The sandboxes and containers seen so far, and the clock anchor that places the
/// runtime's wall-clock times on the trace's clock.
#[derive(Debug, Clone)]
pub struct Watcher {
    started_wall_ns: i64,
    started_ns: u64,
    sandboxes: BTreeMap<String, SandboxSeen>,
    containers: BTreeMap<String, ContainerSeen>,
}

impl Watcher {
    /// `started_wall_ns` and `started_ns`: one moment on the wall clock and on the
    /// trace's monotonic clock (the trace header's anchor).
    pub fn new(started_wall_ns: i64, started_ns: u64) -> Watcher {
        Watcher {
            started_wall_ns,
            started_ns,
            sandboxes: BTreeMap::new(),
            containers: BTreeMap::new(),
        }
    }

    /// The trace's clock for the runtime's wall-clock time; None for no time (0).
    fn mono(&self, wall_ns: i64) -> Option<u64> {
        if wall_ns <= 0 {
            return None;
        }
        let mono = self.started_ns as i128 + (wall_ns as i128 - self.started_wall_ns as i128);
        u64::try_from(mono).ok()
    }

    /// The wall-clock time the observer started at.
    pub fn started_wall_ns(&self) -> i64 {
        self.started_wall_ns
    }

    pub fn knows_sandbox(&self, id: &str) -> bool {
        self.sandboxes.contains_key(id)
    }

    pub fn knows_container(&self, id: &str) -> bool {
        self.containers.contains_key(id)
    }

    /// Whether a listed sandbox in `state` says something new, so its status is worth a
    /// call.
    pub fn sandbox_changed(&self, id: &str, state: i32) -> bool {
        let ready = state == api::PodSandboxState::SandboxReady as i32;
        self.sandboxes.get(id).is_none_or(|s| s.ready != ready)
    }

    /// Whether a listed container in `state` says something new.
    pub fn container_changed(&self, id: &str, state: i32) -> bool {
        let Some(c) = self.containers.get(id) else {
            return true;
        };
        match api::ContainerState::try_from(state) {
            Ok(api::ContainerState::ContainerRunning) => !c.started,
            Ok(api::ContainerState::ContainerExited) => !c.exited,
            _ => false,
        }
    }

    fn record(
        &self,
        at_ns: u64,
        via: ObservedVia,
        what: Observation,
        pod: &PodRef,
        sandbox_id: &str,
    ) -> ObservedRecord {
        ObservedRecord {
            at_ns,
            runtime_ns: None,
            what,
            via,
            pod_uid: pod.uid.clone(),
            namespace: pod.namespace.clone(),
            name: pod.name.clone(),
            sandbox_id: sandbox_id.to_string(),
            attempt: 0,
            container_id: String::new(),
            container: String::new(),
            ip: String::new(),
            host_network: false,
            exit_code: None,
            before_start: false,
            stream_missed: false,
            note: String::new(),
        }
    }

    /// A sandbox's status. `event_wall_ns`: the time of the runtime's event that carried
    /// it (containerd sends a sandbox's events as its RunPodSandbox ends), if any.
    pub fn sandbox(
        &mut self,
        at_ns: u64,
        via: ObservedVia,
        st: &api::PodSandboxStatus,
        event_wall_ns: Option<i64>,
    ) -> Vec<ObservedRecord> {
        let ready = st.state == api::PodSandboxState::SandboxReady as i32;
        let known = self.sandboxes.get(&st.id);
        if known.is_some_and(|s| s.ready == ready) {
            return Vec::new();
        }
        let pod = match known {
            Some(s) => s.pod.clone(),
            None => PodRef::of(&st.labels, st.metadata.as_ref()),
        };
        let what = if ready {
            Observation::SandboxReady
        } else {
            Observation::SandboxNotReady
        };
        let mut r = self.record(at_ns, via, what, &pod, &st.id);
        r.runtime_ns = event_wall_ns.and_then(|t| self.mono(t));
        r.attempt = st.metadata.as_ref().map_or(0, |m| m.attempt);
        r.ip = st
            .network
            .as_ref()
            .map(|n| n.ip.clone())
            .unwrap_or_default();
        r.host_network = st
            .linux
            .as_ref()
            .and_then(|l| l.namespaces.as_ref())
            .and_then(|n| n.options.as_ref())
            .is_some_and(|o| o.network == api::NamespaceMode::Node as i32);
        if known.is_none() {
            r.note = pod.note.clone();
            r.before_start = st.created_at > 0 && st.created_at < self.started_wall_ns;
        }
        self.sandboxes
            .insert(st.id.clone(), SandboxSeen { pod, ready });
        vec![r]
    }

    /// A container's status; `sandbox_id` is its sandbox (a list names it; an event
    /// carries the sandbox's status beside it).
    pub fn container(
        &mut self,
        at_ns: u64,
        via: ObservedVia,
        st: &api::ContainerStatus,
        sandbox_id: &str,
    ) -> Vec<ObservedRecord> {
        let mut seen = self.containers.get(&st.id).cloned();
        let mut out = Vec::new();
        let pod = match self.sandboxes.get(sandbox_id) {
            Some(s) => s.pod.clone(),
            None => PodRef::of(&st.labels, None),
        };
        let name = st
            .labels
            .get(CONTAINER_NAME_LABEL)
            .cloned()
            .filter(|n| !n.is_empty())
            .or_else(|| st.metadata.as_ref().map(|m| m.name.clone()))
            .unwrap_or_default();
        let base = |what, wall_ns: i64| {
            let mut r = self.record(at_ns, via, what, &pod, sandbox_id);
            r.runtime_ns = self.mono(wall_ns);
            r.container_id = st.id.clone();
            r.container = name.clone();
            r.attempt = st.metadata.as_ref().map_or(0, |m| m.attempt);
            r
        };
        let before_start = st.created_at > 0 && st.created_at < self.started_wall_ns;
        let c = seen.get_or_insert_with(|| {
            let mut r = base(Observation::ContainerCreated, st.created_at);
            r.before_start = before_start;
            out.push(r);
            ContainerSeen {
                sandbox_id: sandbox_id.to_string(),
                name: name.clone(),
                started: false,
                exited: false,
            }
        });
        let state = api::ContainerState::try_from(st.state).ok();
        // The runtime sets the start time as StartContainer's task starts, whatever the
        // state now (a container may have run and exited between two looks).
        if st.started_at > 0 && !c.started {
            c.started = true;
            out.push(base(Observation::ContainerStarted, st.started_at));
        }
        if state == Some(api::ContainerState::ContainerExited) && !c.exited {
            c.exited = true;
            let mut r = base(Observation::ContainerExited, st.finished_at);
            r.exit_code = Some(st.exit_code);
            out.push(r);
        }
        self.containers
            .insert(st.id.clone(), seen.unwrap_or_default());
        out
    }

    /// A sandbox the runtime no longer has.
    pub fn sandbox_gone(&mut self, at_ns: u64, via: ObservedVia, id: &str) -> Vec<ObservedRecord> {
        let Some(s) = self.sandboxes.remove(id) else {
            return Vec::new();
        };
        vec![self.record(at_ns, via, Observation::SandboxRemoved, &s.pod, id)]
    }

    /// A container the runtime no longer has.
    pub fn container_gone(
        &mut self,
        at_ns: u64,
        via: ObservedVia,
        id: &str,
    ) -> Vec<ObservedRecord> {
        let Some(c) = self.containers.remove(id) else {
            return Vec::new();
        };
        let pod = self
            .sandboxes
            .get(&c.sandbox_id)
            .map(|s| s.pod.clone())
            .unwrap_or_default();
        let mut r = self.record(
            at_ns,
            via,
            Observation::ContainerRemoved,
            &pod,
            &c.sandbox_id,
        );
        r.container_id = id.to_string();
        r.container = c.name;
        vec![r]
    }

    /// After a full list: what was known and is no longer listed went away. Containers
    /// first, then their sandboxes, as the runtime removes them.
    pub fn listed(
        &mut self,
        at_ns: u64,
        sandboxes: &BTreeSet<String>,
        containers: &BTreeSet<String>,
    ) -> Vec<ObservedRecord> {
        let gone_containers: Vec<String> = self
            .containers
            .keys()
            .filter(|id| !containers.contains(*id))
            .cloned()
            .collect();
        let gone_sandboxes: Vec<String> = self
            .sandboxes
            .keys()
            .filter(|id| !sandboxes.contains(*id))
            .cloned()
            .collect();
        let mut out = Vec::new();
        for id in gone_containers {
            out.extend(self.container_gone(at_ns, ObservedVia::Polling, &id));
        }
        for id in gone_sandboxes {
            out.extend(self.sandbox_gone(at_ns, ObservedVia::Polling, &id));
        }
        out
    }
}
