//! kubelet's pod workers as a state machine: one worker per pod, one update at a time.
//! While a worker is busy only the newest undelivered update is kept, a pending kill is
//! never overwritten, and finished work schedules the next sync (resync, or a retry after
//! an error or back-off). No IO, no clock: the shell calls in with `now` and runs the work
//! this returns, then reports back with `complete_work`.

use std::collections::{BTreeMap, BTreeSet};
use std::sync::Arc;

use k8s_openapi::api::core::v1::Pod;
use serde::Serialize;

use super::runtime_pod::Nanos;

/// Why a pod is being synced (kubelet's SyncPodType).
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Serialize)]
pub enum UpdateType {
    Create,
    Update,
    Sync,
    Kill,
}

/// What a worker is asked to do.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Serialize)]
pub enum WorkKind {
    /// syncPod: drive the pod towards its spec.
    Sync,
    /// syncTerminatingPod: stop everything and clean up.
    Terminate,
}

/// One unit of work for the shell to run.
#[derive(Debug, Clone, PartialEq)]
pub struct PodWork {
    pub uid: String,
    pub kind: WorkKind,
    pub update_type: UpdateType,
    pub pod: Arc<Pod>,
}

/// How a unit of work ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
pub enum WorkOutcome {
    /// Synced; look again after the resync interval.
    Synced,
    /// Synced, but something waits until `at` (a back-off ending): look again then.
    RetryAt(Nanos),
    /// The sync failed; retry after the error back-off period.
    Failed,
    /// Termination finished: the worker accepts no more work until forgotten.
    Terminated,
}

#[derive(Debug, Clone)]
struct Worker {
    working: bool,
    pending: Option<PodWork>,
    terminating: bool,
    terminated: bool,
    requeue_at: Option<Nanos>,
    pod: Arc<Pod>,
}

impl Worker {
    /// When this worker is due for work: its requeue time while it is idle and alive.
    fn deadline(&self) -> Option<Nanos> {
        self.requeue_at
            .filter(|_| !self.working && !self.terminated)
    }
}

/// Every pod's worker, keyed by UID (ordered, so outputs come out in a fixed order).
#[derive(Debug, Clone)]
pub struct PodWorkers {
    resync_interval: Nanos,
    error_backoff: Nanos,
    workers: BTreeMap<String, Worker>,
    /// Every idle worker's deadline, earliest first: the loop asks for the next one after
    /// every event, so it is kept rather than searched for among all the workers.
    deadlines: BTreeSet<(Nanos, String)>,
}

fn uid_of(pod: &Pod) -> String {
    pod.metadata.uid.clone().unwrap_or_default()
}

impl PodWorkers {
    /// `resync_interval` is kubelet's syncFrequency; `error_backoff` its backOffPeriod.
    pub fn new(resync_interval: Nanos, error_backoff: Nanos) -> PodWorkers {
        PodWorkers {
            resync_interval,
            error_backoff,
            workers: BTreeMap::new(),
            deadlines: BTreeSet::new(),
        }
    }

    /// Keeps [`Self::deadlines`] true after `uid`'s worker changed from `before`.
    fn reindex(&mut self, uid: &str, before: Option<Nanos>) {
        let after = self.workers.get(uid).and_then(Worker::deadline);
        if before == after {
            return;
        }
        if let Some(t) = before {
            self.deadlines.remove(&(t, uid.to_string()));
        }
        if let Some(t) = after {
            self.deadlines.insert((t, uid.to_string()));
        }
    }

    /// kubelet's UpdatePod. Returns work to start now, if the pod's worker was idle.
    pub fn update_pod(&mut self, update_type: UpdateType, pod: Arc<Pod>) -> Option<PodWork> {
        let uid = uid_of(&pod);
        let before = self.workers.get(&uid).and_then(Worker::deadline);
        let w = self.workers.entry(uid.clone()).or_insert_with(|| Worker {
            working: false,
            pending: None,
            terminating: false,
            terminated: false,
            requeue_at: None,
            pod: pod.clone(),
        });
        if w.terminated {
            return None;
        }
        let kind = if update_type == UpdateType::Kill {
            WorkKind::Terminate
        } else if w.terminating {
            // Once a pod is being killed, nothing brings it back under the same UID.
            return None;
        } else {
            WorkKind::Sync
        };
        if kind == WorkKind::Terminate {
            w.terminating = true;
        }
        w.pod = pod.clone();
        let work = PodWork {
            uid,
            kind,
            update_type,
            pod,
        };
        if w.working {
            let keep_pending_kill = w
                .pending
                .as_ref()
                .is_some_and(|p| p.kind == WorkKind::Terminate && kind == WorkKind::Sync);
            if !keep_pending_kill {
                w.pending = Some(work);
            }
            return None;
        }
        w.working = true;
        w.requeue_at = None;
        self.reindex(&work.uid, before);
        Some(work)
    }

    /// The shell finished a unit of work for `uid` at `now`. Returns the pending update to
    /// start next, if one arrived meanwhile.
    pub fn complete_work(
        &mut self,
        uid: &str,
        now: Nanos,
        outcome: WorkOutcome,
    ) -> Option<PodWork> {
        let w = self.workers.get_mut(uid)?;
        let before = w.deadline();
        w.working = false;
        w.requeue_at = match outcome {
            WorkOutcome::Synced => Some(now + self.resync_interval),
            WorkOutcome::RetryAt(at) => Some(at.min(now + self.resync_interval).max(now)),
            WorkOutcome::Failed => Some(now + self.error_backoff),
            WorkOutcome::Terminated => {
                w.terminated = true;
                w.pending = None;
                None
            }
        };
        let next = w.pending.take();
        if next.is_some() {
            w.working = true;
            w.requeue_at = None;
        }
        self.reindex(uid, before);
        next
    }

    /// Work for every idle pod whose requeue time has come, in UID order.
    pub fn due(&mut self, now: Nanos) -> Vec<PodWork> {
        let mut uids = Vec::new();
        while self.deadlines.first().is_some_and(|(t, _)| *t <= now) {
            uids.extend(self.deadlines.pop_first().map(|(_, uid)| uid));
        }
        uids.sort_unstable();
        uids.into_iter()
            .filter_map(|uid| {
                let w = self.workers.get_mut(&uid)?;
                w.working = true;
                w.requeue_at = None;
                let kind = if w.terminating {
                    WorkKind::Terminate
                } else {
                    WorkKind::Sync
                };
                let pod = w.pod.clone();
                Some(PodWork {
                    uid,
                    kind,
                    update_type: UpdateType::Sync,
                    pod,
                })
            })
            .collect()
    }

    /// The earliest requeue time of an idle worker.
    pub fn next_deadline(&self) -> Option<Nanos> {
        self.deadlines.first().map(|(t, _)| *t)
    }

    /// Forgets a terminated pod's worker (kubelet's housekeeping of removed pods).
    pub fn forget(&mut self, uid: &str) -> bool {
        match self.workers.get(uid) {
            Some(w) if w.terminated => {
                self.workers.remove(uid);
                true
            }
            _ => false,
        }
    }

    pub fn is_terminated(&self, uid: &str) -> bool {
        self.workers.get(uid).is_some_and(|w| w.terminated)
    }

    pub fn is_terminating(&self, uid: &str) -> bool {
        self.workers.get(uid).is_some_and(|w| w.terminating)
    }

    /// UIDs whose worker is terminating its pod, in order.
    pub fn terminating(&self) -> impl Iterator<Item = &str> {
        self.workers
            .iter()
            .filter(|(_, w)| w.terminating)
            .map(|(uid, _)| uid.as_str())
    }

    pub fn is_working(&self, uid: &str) -> bool {
        self.workers.get(uid).is_some_and(|w| w.working)
    }

    /// UIDs with a worker, in order.
    pub fn uids(&self) -> Vec<String> {
        self.workers.keys().cloned().collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn pod(uid: &str, generation: i64) -> Arc<Pod> {
        let mut p = Pod::default();
        p.metadata.uid = Some(uid.into());
        p.metadata.generation = Some(generation);
        Arc::new(p)
    }

    fn generation(w: &PodWork) -> i64 {
        w.pod.metadata.generation.unwrap()
    }

    const S: Nanos = 1_000_000_000;

    #[test]
    fn an_idle_worker_starts_at_once() {
        let mut pw = PodWorkers::new(60 * S, 10 * S);
        let w = pw.update_pod(UpdateType::Create, pod("a", 1)).unwrap();
        assert_eq!(
            (w.kind, w.update_type),
            (WorkKind::Sync, UpdateType::Create)
        );
        assert!(pw.is_working("a"));
    }

    #[test]
    fn a_busy_worker_keeps_only_the_newest_update() {
        let mut pw = PodWorkers::new(60 * S, 10 * S);
        pw.update_pod(UpdateType::Create, pod("a", 1)).unwrap();
        assert!(pw.update_pod(UpdateType::Update, pod("a", 2)).is_none());
        assert!(pw.update_pod(UpdateType::Update, pod("a", 3)).is_none());
        let next = pw.complete_work("a", 0, WorkOutcome::Synced).unwrap();
        assert_eq!(generation(&next), 3);
        assert!(pw.complete_work("a", 0, WorkOutcome::Synced).is_none());
    }

    #[test]
    fn a_pending_kill_is_never_overwritten() {
        let mut pw = PodWorkers::new(60 * S, 10 * S);
        pw.update_pod(UpdateType::Create, pod("a", 1)).unwrap();
        pw.update_pod(UpdateType::Kill, pod("a", 2));
        pw.update_pod(UpdateType::Update, pod("a", 3));
        pw.update_pod(UpdateType::Sync, pod("a", 4));
        let next = pw.complete_work("a", 0, WorkOutcome::Synced).unwrap();
        assert_eq!((next.kind, generation(&next)), (WorkKind::Terminate, 2));
        // Nothing revives a terminating pod.
        assert!(pw.complete_work("a", 0, WorkOutcome::Synced).is_none());
        assert!(pw.update_pod(UpdateType::Update, pod("a", 5)).is_none());
    }

    #[test]
    fn resync_retry_and_error_backoff_deadlines() {
        let mut pw = PodWorkers::new(60 * S, 10 * S);
        for uid in ["a", "b", "c"] {
            pw.update_pod(UpdateType::Create, pod(uid, 1)).unwrap();
        }
        pw.complete_work("a", 0, WorkOutcome::Synced);
        pw.complete_work("b", 0, WorkOutcome::Failed);
        pw.complete_work("c", 0, WorkOutcome::RetryAt(25 * S));
        assert_eq!(pw.next_deadline(), Some(10 * S));
        assert!(pw.due(9 * S).is_empty());
        let due: Vec<_> = pw.due(10 * S).into_iter().map(|w| w.uid).collect();
        assert_eq!(due, ["b"]);
        assert_eq!(pw.next_deadline(), Some(25 * S));
        let due: Vec<_> = pw.due(61 * S).into_iter().map(|w| w.uid).collect();
        assert_eq!(due, ["a", "c"], "due work comes out in UID order");
    }

    #[test]
    fn terminated_workers_are_forgotten() {
        let mut pw = PodWorkers::new(60 * S, 10 * S);
        pw.update_pod(UpdateType::Create, pod("a", 1)).unwrap();
        assert!(!pw.forget("a"), "a live worker is not forgotten");
        pw.complete_work("a", 0, WorkOutcome::Synced);
        let kill = pw.update_pod(UpdateType::Kill, pod("a", 1)).unwrap();
        assert_eq!(kill.kind, WorkKind::Terminate);
        pw.complete_work("a", 1, WorkOutcome::Terminated);
        assert!(pw.is_terminated("a"));
        assert_eq!(pw.next_deadline(), None);
        assert!(pw.forget("a"));
        assert!(pw.uids().is_empty());
        // The same UID can come back as a new pod after it was forgotten.
        assert!(pw.update_pod(UpdateType::Create, pod("a", 9)).is_some());
    }

    #[test]
    fn a_failed_termination_is_retried_as_termination() {
        let mut pw = PodWorkers::new(60 * S, 10 * S);
        pw.update_pod(UpdateType::Kill, pod("a", 1)).unwrap();
        pw.complete_work("a", 0, WorkOutcome::Failed);
        let retry = pw.due(10 * S);
        assert_eq!(retry[0].kind, WorkKind::Terminate);
    }

    /// What the deadlines are, worked out from every worker as the loop once did.
    fn scanned(pw: &PodWorkers) -> BTreeSet<(Nanos, String)> {
        pw.workers
            .iter()
            .filter(|(_, w)| !w.working && !w.terminated)
            .filter_map(|(uid, w)| Some((w.requeue_at?, uid.clone())))
            .collect()
    }

    #[test]
    fn the_kept_deadlines_are_the_workers_own_through_every_kind_of_change() {
        let mut pw = PodWorkers::new(60 * S, 10 * S);
        let uids = ["a", "b", "c", "d", "e"];
        let outcomes = [
            WorkOutcome::Synced,
            WorkOutcome::Failed,
            WorkOutcome::RetryAt(7 * S),
            WorkOutcome::Terminated,
        ];
        let updates = [
            UpdateType::Create,
            UpdateType::Update,
            UpdateType::Sync,
            UpdateType::Kill,
        ];
        // A fixed pseudo-random walk (a linear congruential generator): every operation on
        // every worker state, thousands of times, with time moving forward.
        let mut x: u64 = 0x2545_f491_4f6c_dd1d;
        let mut now: Nanos = 0;
        let mut due_seen = 0;
        for step in 0..5000 {
            x = x.wrapping_mul(6_364_136_223_846_793_005).wrapping_add(1);
            let r = (x >> 33) as usize;
            let uid = uids[r % uids.len()];
            match (r / 7) % 5 {
                0 => {
                    pw.update_pod(updates[(r / 41) % updates.len()], pod(uid, step));
                }
                1 | 2 => {
                    pw.complete_work(uid, now, outcomes[(r / 41) % outcomes.len()]);
                }
                3 => {
                    now += ((r / 41) % 20) as Nanos * S;
                    let expected: Vec<String> = scanned(&pw)
                        .into_iter()
                        .filter(|(t, _)| *t <= now)
                        .map(|(_, uid)| uid)
                        .collect::<BTreeSet<_>>()
                        .into_iter()
                        .collect();
                    let due: Vec<String> = pw.due(now).into_iter().map(|w| w.uid).collect();
                    assert_eq!(due, expected, "step {step}: due work, in UID order");
                    due_seen += due.len();
                }
                _ => {
                    pw.forget(uid);
                }
            }
            assert_eq!(pw.deadlines, scanned(&pw), "step {step}");
            assert_eq!(
                pw.next_deadline(),
                scanned(&pw).first().map(|(t, _)| *t),
                "step {step}"
            );
        }
        assert!(due_seen > 100, "the walk reached due work ({due_seen})");
    }
}
