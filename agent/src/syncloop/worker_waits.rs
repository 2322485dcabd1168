//! Waits the sync loop decides, kept as they happen so a pod's timeline can name them:
//! an update held while the pod's worker was busy (kubelet keeps only the newest and
//! delivers it when the work ends), and a back-off (the worker requeued at the back-off's
//! end). Each ends when the pod's next unit of work begins.

use std::collections::BTreeMap;

use crate::kuberuntime::event::{PodWait, WaitKind};

use super::clock::mono_now;
use super::status_store::StatusStore;

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
    /// (reason, message), kubelet's reason cache).
    pub fn work_begins(
        &mut self,
        uid: &str,
        store: &StatusStore,
        reasons: &BTreeMap<String, (String, String)>,
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
