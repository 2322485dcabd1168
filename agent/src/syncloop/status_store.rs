//! kubelet's status manager and event recorder in one place: each pod's latest API status
//! and its events, readable by the local API and by `run --until-ready`.

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};

use k8s_openapi::api::core::v1::{Pod, PodSpec, PodStatus};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use serde::Serialize;

use crate::kubelet::pod_startup_latency::has_pod_started;
use crate::kubelet::runtime_pod::Nanos;
use crate::kuberuntime::event::{EventRecorder, PodEvent, PodWait};
use crate::kuberuntime::labels;

use crate::clock::wall_now;

/// Events kept per pod; older ones are dropped first.
const MAX_EVENTS_PER_POD: usize = 500;

#[derive(Debug, Clone, Serialize)]
pub struct StampedEvent {
    /// Wall-clock ns.
    pub at: Nanos,
    /// CLOCK_MONOTONIC ns, the clock of CRI spans and kernel events.
    pub at_ns: u64,
    #[serde(flatten)]
    pub event: PodEvent,
}

/// A pod as the API shows it beside its status: its `metadata` and `spec`.
#[derive(Debug, Clone, Default)]
pub struct ManifestPod(pub Arc<Pod>);

impl ManifestPod {
    pub fn metadata(&self) -> &ObjectMeta {
        &self.0.metadata
    }

    pub fn spec(&self) -> Option<&PodSpec> {
        self.0.spec.as_ref()
    }
}

impl Serialize for ManifestPod {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        use serde::ser::SerializeStruct;
        let mut st = s.serialize_struct("ManifestPod", 2)?;
        st.serialize_field("metadata", &self.0.metadata)?;
        st.serialize_field("spec", &self.0.spec)?;
        st.end()
    }
}

#[derive(Debug, Clone, Serialize)]
pub struct PodRecord {
    pub uid: String,
    pub namespace: String,
    pub name: String,
    /// The manifest's pod as last seen, shared with the reconciler: the API shows its
    /// metadata and spec.
    #[serde(flatten)]
    pub pod: ManifestPod,
    pub status: PodStatus,
    pub first_seen: Nanos,
    /// When the pod first reached Running.
    pub running_at: Option<Nanos>,
    /// When every container of its status was first running (kubelet's "pod started"
    /// for its pod-start metrics).
    #[serde(skip)]
    pub all_started_at: Option<Nanos>,
    /// Its run-to-completion init containers' runs: container ID to the runtime's start
    /// and finish (ns).
    #[serde(skip)]
    pub init_runs: BTreeMap<String, (i64, i64)>,
    pub events: Vec<StampedEvent>,
}

/// Sees every event as it is recorded: (pod UID, namespace, name, event).
pub type EventTap = Arc<dyn Fn(&str, &str, &str, &StampedEvent) + Send + Sync>;

/// Sees every wait a pod's work spent queued: (pod UID, namespace, name, start and end in
/// CLOCK_MONOTONIC ns, the wait).
pub type WaitTap = Arc<dyn Fn(&str, &str, &str, u64, u64, &PodWait) + Send + Sync>;

/// Sees every status change as it is published: (pod UID, namespace, name, CLOCK_MONOTONIC
/// ns, the new status).
pub type StatusTap = Arc<dyn Fn(&str, &str, &str, u64, &PodStatus) + Send + Sync>;

pub struct StatusStore {
    pods: Mutex<BTreeMap<String, PodRecord>>,
    changed: tokio::sync::watch::Sender<u64>,
    tap: Mutex<Option<EventTap>>,
    status_tap: Mutex<Option<StatusTap>>,
    wait_tap: Mutex<Option<WaitTap>>,
}

impl std::fmt::Debug for StatusStore {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("StatusStore").finish_non_exhaustive()
    }
}

impl Default for StatusStore {
    fn default() -> Self {
        StatusStore {
            pods: Mutex::new(BTreeMap::new()),
            changed: tokio::sync::watch::channel(0).0,
            tap: Mutex::new(None),
            status_tap: Mutex::new(None),
            wait_tap: Mutex::new(None),
        }
    }
}

impl StatusStore {
    fn lock(&self) -> std::sync::MutexGuard<'_, BTreeMap<String, PodRecord>> {
        self.pods.lock().unwrap_or_else(|e| e.into_inner())
    }

    fn bump(&self) {
        self.changed.send_modify(|g| *g += 1);
    }

    /// A receiver that sees a new value after every change.
    pub fn subscribe(&self) -> tokio::sync::watch::Receiver<u64> {
        self.changed.subscribe()
    }

    /// Sends every event recorded from now on to `tap` too (the trace writer).
    pub fn set_event_tap(&self, tap: EventTap) {
        *self.tap.lock().unwrap_or_else(|e| e.into_inner()) = Some(tap);
    }

    /// Sends every status change from now on to `tap` too (the trace writer).
    pub fn set_status_tap(&self, tap: StatusTap) {
        *self.status_tap.lock().unwrap_or_else(|e| e.into_inner()) = Some(tap);
    }

    /// Sends every wait recorded from now on to `tap` (the trace writer and timeline).
    pub fn set_wait_tap(&self, tap: WaitTap) {
        *self.wait_tap.lock().unwrap_or_else(|e| e.into_inner()) = Some(tap);
    }

    /// A wait of a known pod that ended now, after `waited_ns`.
    pub fn record_wait(&self, uid: &str, wait: PodWait, waited_ns: u64) {
        let Some((ns, name)) = self
            .lock()
            .get(uid)
            .map(|r| (r.namespace.clone(), r.name.clone()))
        else {
            return;
        };
        let end_ns = crate::clock::mono_now();
        let tap = self
            .wait_tap
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .clone();
        if let Some(tap) = tap {
            tap(
                uid,
                &ns,
                &name,
                end_ns.saturating_sub(waited_ns),
                end_ns,
                &wait,
            );
        }
    }

    /// Registers a pod when it is first seen.
    pub fn add_pod(&self, pod: Arc<Pod>) {
        let uid = labels::pod_uid(&pod).to_string();
        self.lock().entry(uid.clone()).or_insert_with(|| PodRecord {
            uid,
            namespace: labels::pod_namespace(&pod).to_string(),
            name: labels::pod_name(&pod).to_string(),
            pod: ManifestPod(pod),
            status: PodStatus {
                phase: Some("Pending".into()),
                ..PodStatus::default()
            },
            first_seen: wall_now(),
            running_at: None,
            all_started_at: None,
            init_runs: BTreeMap::new(),
            events: Vec::new(),
        });
        self.bump();
    }

    /// Replaces a known pod's metadata and spec after its manifest changed in place
    /// (an image or resources edit); its status and events stay.
    pub fn update_pod(&self, pod: Arc<Pod>) {
        if let Some(rec) = self.lock().get_mut(labels::pod_uid(&pod)) {
            rec.pod = ManifestPod(pod);
        }
        self.bump();
    }

    /// Keeps the runs of a pod's run-to-completion init containers the runtime reports
    /// (ID, started, finished), for the pod-start SLI to leave out.
    pub fn record_init_runs(&self, uid: &str, runs: impl IntoIterator<Item = (String, i64, i64)>) {
        if let Some(rec) = self.lock().get_mut(uid) {
            for (id, started, finished) in runs {
                rec.init_runs.insert(id, (started, finished));
            }
        }
    }

    /// Sets a pod's API status.
    pub fn set_status(&self, uid: &str, status: PodStatus) {
        self.update_status(uid, |_| Some(status));
    }

    /// Sets a pod's API status to what `change` makes of the current one, under one lock,
    /// so no status published in between is overwritten; `None` leaves it as it is.
    pub fn update_status(&self, uid: &str, change: impl FnOnce(&PodStatus) -> Option<PodStatus>) {
        let mut pods = self.lock();
        let Some(rec) = pods.get_mut(uid) else {
            return;
        };
        let Some(status) = change(&rec.status) else {
            return;
        };
        if rec.running_at.is_none() && status.phase.as_deref() == Some("Running") {
            rec.running_at = Some(wall_now());
        }
        if rec.all_started_at.is_none() && has_pod_started(&status) {
            rec.all_started_at = Some(wall_now());
        }
        if rec.status != status {
            let at_ns = crate::clock::mono_now();
            let tap = self
                .status_tap
                .lock()
                .unwrap_or_else(|e| e.into_inner())
                .clone();
            let named = tap.map(|t| (t, rec.namespace.clone(), rec.name.clone()));
            rec.status = status;
            let published = named.as_ref().map(|_| rec.status.clone());
            drop(pods);
            if let (Some((tap, ns, name)), Some(status)) = (named, published) {
                tap(uid, &ns, &name, at_ns, &status);
            }
            self.bump();
        }
    }

    /// Forgets a pod that is gone.
    pub fn remove(&self, uid: &str) {
        self.lock().remove(uid);
        self.bump();
    }

    pub fn record(&self, uid: &str, event: PodEvent) {
        let tap = self.tap.lock().unwrap_or_else(|e| e.into_inner()).clone();
        let mut pods = self.lock();
        let Some(rec) = pods.get_mut(uid) else {
            return;
        };
        if rec.events.len() >= MAX_EVENTS_PER_POD {
            rec.events.remove(0);
        }
        let stamped = StampedEvent {
            at: wall_now(),
            at_ns: crate::clock::mono_now(),
            event,
        };
        // Copied only for a tap, which is called outside the store's lock.
        match tap {
            None => {
                rec.events.push(stamped);
                drop(pods);
            }
            Some(tap) => {
                let (ns, name) = (rec.namespace.clone(), rec.name.clone());
                rec.events.push(stamped.clone());
                drop(pods);
                tap(uid, &ns, &name, &stamped);
            }
        }
        self.bump();
    }

    pub fn get(&self, uid: &str) -> Option<PodRecord> {
        self.lock().get(uid).cloned()
    }

    /// Reads one pod in place, under the store's lock, where [`StatusStore::get`] would
    /// copy its spec, status and events. `f` must not call into the store.
    pub fn with_pod<T>(&self, uid: &str, f: impl FnOnce(&PodRecord) -> T) -> Option<T> {
        self.lock().get(uid).map(f)
    }

    /// Shows `f` every pod, in UID order, under the store's lock and without copying
    /// any: for a caller that reads a few fields of many pods after every change, where
    /// [`StatusStore::list`] would copy each pod's spec, status and events each time.
    /// `f` must not call into the store.
    pub fn for_each(&self, mut f: impl FnMut(&PodRecord)) {
        for rec in self.lock().values() {
            f(rec);
        }
    }

    /// Every pod, ordered by namespace and name, handed to `f` where it lies: no copy of
    /// every record for a reader that only serializes them. Status updates wait while `f`
    /// runs, so it must be quick.
    pub fn with_sorted<R>(&self, f: impl FnOnce(&[&PodRecord]) -> R) -> R {
        let pods = self.lock();
        let mut all: Vec<&PodRecord> = pods.values().collect();
        all.sort_by(|a, b| (&a.namespace, &a.name, &a.uid).cmp(&(&b.namespace, &b.name, &b.uid)));
        f(&all)
    }

    /// Every pod, ordered by namespace and name.
    pub fn list(&self) -> Vec<PodRecord> {
        let mut all: Vec<PodRecord> = self.lock().values().cloned().collect();
        all.sort_by(|a, b| (&a.namespace, &a.name, &a.uid).cmp(&(&b.namespace, &b.name, &b.uid)));
        all
    }

    /// An event recorder bound to one pod.
    pub fn recorder(self: &Arc<Self>, uid: &str) -> PodRecorder {
        PodRecorder {
            store: self.clone(),
            uid: uid.to_string(),
        }
    }
}

/// Records events for one pod into the store.
pub struct PodRecorder {
    store: Arc<StatusStore>,
    uid: String,
}

impl EventRecorder for PodRecorder {
    fn record(&self, event: PodEvent) {
        tracing::debug!(pod = %self.uid, reason = %event.reason, "{}", event.message);
        self.store.record(&self.uid, event);
    }

    fn waited(&self, wait: PodWait, waited_ns: u64) {
        self.store.record_wait(&self.uid, wait, waited_ns);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn pod(namespace: &str, name: &str, uid: &str) -> Pod {
        let mut p = Pod::default();
        p.metadata.namespace = Some(namespace.into());
        p.metadata.name = Some(name.into());
        p.metadata.uid = Some(uid.into());
        p
    }

    #[test]
    fn pods_are_read_in_place_as_list_and_get_show_them() {
        let store = StatusStore::default();
        store.add_pod(Arc::new(pod("b", "web", "u2")));
        store.add_pod(Arc::new(pod("a", "db", "u1")));
        store.set_status(
            "u2",
            PodStatus {
                phase: Some("Running".into()),
                ..PodStatus::default()
            },
        );
        let mut seen = Vec::new();
        store.for_each(|r| seen.push((r.uid.clone(), r.status.phase.clone())));
        assert_eq!(
            seen,
            [
                ("u1".to_string(), Some("Pending".to_string())),
                ("u2".to_string(), Some("Running".to_string())),
            ]
        );
        assert_eq!(
            store.with_pod("u2", |r| r.name.clone()),
            store.get("u2").map(|r| r.name)
        );
        assert_eq!(store.with_pod("u3", |r| r.name.clone()), None);
    }

    #[test]
    fn a_record_shows_the_pods_metadata_and_spec_where_the_api_always_had_them() {
        let store = StatusStore::default();
        let mut p = pod("a", "db", "u1");
        p.spec = Some(PodSpec {
            node_name: Some("n1".into()),
            ..PodSpec::default()
        });
        store.add_pod(Arc::new(p));
        let mut rec = store.get("u1").expect("the pod was added");
        rec.first_seen = 7;
        let json = serde_json::to_string(&rec).expect("a record serializes");
        assert_eq!(
            json,
            r#"{"uid":"u1","namespace":"a","name":"db","metadata":{"name":"db","namespace":"a","uid":"u1"},"spec":{"containers":[],"nodeName":"n1"},"status":{"phase":"Pending"},"first_seen":7,"running_at":null,"events":[]}"#
        );
        // A pod without a spec shows it as null, as before.
        store.update_pod(Arc::new(pod("a", "db", "u1")));
        let json = serde_json::to_value(store.get("u1").unwrap()).unwrap();
        assert!(json["spec"].is_null() && json["metadata"]["name"] == "db");
    }
}
