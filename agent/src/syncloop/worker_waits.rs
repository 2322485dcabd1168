//! Waits the sync loop decides, kept as they happen so a pod's timeline can name them:
//! an update held while the pod's worker was busy (kubelet keeps only the newest and
//! delivers it when the work ends), and a back-off (the worker requeued at the back-off's
//! end). Each ends when the pod's next unit of work begins.

use std::collections::BTreeMap;

use crate::kuberuntime::event::{PodWait, WaitKind};

use super::status_store::StatusStore;
use crate::clock::mono_now;

#[derive(Debug, Default)]
pub struct WorkerWaits {
    /// Pods with an update held behind busy work: since when, and what the update was.
    held: BTreeMap<String, (u64, &'static str)>,
    /// Pods requeued at a back-off's end: since when.
    backing_off: BTreeMap<String, u64>,
}

impl WorkerWaits {
    /// An update (`what`) for `uid` is held: its worker is busy. The first one held
    /// starts the wait; later ones replace it in the worker but not the wait's start.
    pub fn held(&mut self, uid: &str, what: &'static str) {
        self.held
            .entry(uid.to_string())
            .or_insert_with(|| (mono_now(), what));
    }

    /// `uid`'s work ended with a requeue at a back-off's end.
    pub fn backing_off(&mut self, uid: &str) {
        self.backing_off.insert(uid.to_string(), mono_now());
    }

    /// `uid`'s next unit of work begins now: the waits it ends go to the store, the
    /// back-off naming the containers in back-off and why (`reasons`: container to
    /// (reason, message), kubelet's reason cache, read only when a back-off ends).
    pub fn work_begins(
        &mut self,
        uid: &str,
        store: &StatusStore,
        reasons: impl FnOnce() -> BTreeMap<String, (String, String)>,
    ) {
        let now = mono_now();
        if let Some((since, what)) = self.held.remove(uid) {
            store.record_wait(
                uid,
                PodWait {
                    wait: WaitKind::PodWorker,
                    container: None,
                    behind: Vec::new(),
                    detail: format!("{what}, held while the pod worker finished its earlier work"),
                },
                now.saturating_sub(since),
            );
        }
        if let Some(since) = self.backing_off.remove(uid) {
            let reasons = reasons();
            let backing: Vec<(&String, &(String, String))> = reasons
                .iter()
                .filter(|(_, (reason, _))| reason.ends_with("BackOff"))
                .collect();
            let container = match backing.as_slice() {
                [(c, _)] => Some((*c).clone()),
                _ => None,
            };
            let detail = backing
                .iter()
                .map(|(c, (reason, message))| {
                    let message = message.trim();
                    if message.is_empty() {
                        format!("{c}: {reason}")
                    } else {
                        format!("{c}: {reason}: {message}")
                    }
                })
                .collect::<Vec<_>>()
                .join("; ");
            store.record_wait(
                uid,
                PodWait {
                    wait: WaitKind::BackOff,
                    container,
                    behind: Vec::new(),
                    detail,
                },
                now.saturating_sub(since),
            );
        }
    }

    pub fn forget(&mut self, uid: &str) {
        self.held.remove(uid);
        self.backing_off.remove(uid);
    }
}

#[cfg(test)]
mod tests {
    use std::sync::{Arc, Mutex};

    use k8s_openapi::api::core::v1::Pod;
    use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;

    use super::*;

    type Seen = Arc<Mutex<Vec<(String, u64, u64, PodWait)>>>;

    fn store() -> (StatusStore, Seen) {
        let store = StatusStore::default();
        store.add_pod(std::sync::Arc::new(Pod {
            metadata: ObjectMeta {
                name: Some("p".into()),
                namespace: Some("default".into()),
                uid: Some("u1".into()),
                ..ObjectMeta::default()
            },
            ..Pod::default()
        }));
        let seen: Seen = Arc::default();
        let tap = seen.clone();
        store.set_wait_tap(Arc::new(move |uid, _, _, start, end, wait| {
            tap.lock()
                .unwrap()
                .push((uid.to_string(), start, end, wait.clone()));
        }));
        (store, seen)
    }

    #[test]
    fn a_held_update_is_a_wait_from_the_first_held_until_the_work_begins() {
        let (store, seen) = store();
        let mut waits = WorkerWaits::default();
        waits.held("u1", "a container's change of state");
        waits.held("u1", "a probe result");
        waits.work_begins("u1", &store, BTreeMap::new);
        let seen = seen.lock().unwrap();
        assert_eq!(seen.len(), 1, "{seen:?}");
        let (uid, start, end, wait) = &seen[0];
        assert_eq!(uid, "u1");
        assert!(start <= end);
        assert_eq!(wait.wait, WaitKind::PodWorker);
        assert_eq!(
            wait.detail,
            "a container's change of state, held while the pod worker finished its earlier work"
        );
        drop(seen);
        // Nothing is held any more: the next work records nothing.
        waits.work_begins("u1", &store, BTreeMap::new);
    }

    #[test]
    fn a_back_off_names_the_container_backing_off_and_why() {
        let (store, seen) = store();
        let mut waits = WorkerWaits::default();
        waits.backing_off("u1");
        let reasons = BTreeMap::from([
            (
                "c".to_string(),
                (
                    "CrashLoopBackOff".to_string(),
                    "back-off 10s restarting failed container=c pod=p".to_string(),
                ),
            ),
            (
                "d".to_string(),
                ("ContainerCreating".to_string(), String::new()),
            ),
        ]);
        waits.work_begins("u1", &store, || reasons.clone());
        let got = seen.lock().unwrap();
        let wait = &got.last().unwrap().3;
        assert_eq!(wait.wait, WaitKind::BackOff);
        assert_eq!(wait.container.as_deref(), Some("c"));
        assert_eq!(
            wait.detail,
            "c: CrashLoopBackOff: back-off 10s restarting failed container=c pod=p"
        );
        drop(got);
        waits.backing_off("u1");
        waits.forget("u1");
        waits.work_begins("u1", &store, || reasons.clone());
        assert_eq!(
            seen.lock().unwrap().len(),
            1,
            "a forgotten pod's back-off is gone"
        );
    }
}
