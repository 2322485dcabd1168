//! The agent's sync loop: kubelet's syncLoop, HandlePodAdditions/Updates/Removals,
//! dispatchWork and housekeeping. The loop owns the deterministic pod workers; each unit
//! of work runs as its own task (syncPod or syncTerminatingPod) and reports back.
//!
//! Inputs the loop selects over: config updates (manifests added, changed, removed), work
//! completions, pod lifecycle events (container exits, relist), worker deadlines (resync,
//! back-off), housekeeping, and shutdown.

mod actuated;
mod allocation;
pub mod api;
mod housekeeping;
mod kernel_seen;
mod pidfd_exit;
mod pleg;
mod pod_sync;
pub mod settings;
mod shared;
mod sorted;
pub mod start_watch;
pub mod status_store;
mod terminate;
mod worker_waits;

use std::collections::{BTreeMap, BTreeSet};
use std::sync::Arc;

use k8s_openapi::api::core::v1::{Pod, PodStatus};
use tokio::sync::{mpsc, watch};

use crate::cm::{CgroupLayout, PodContainerManager};
use crate::config::source::{InvalidManifest, PodUpdate};
use crate::cri::{ImageService, RuntimeService};
use crate::kubelet::admission::can_admit_pod;
use crate::kubelet::pod_workers::{PodWork, PodWorkers, UpdateType, WorkKind, WorkOutcome};
use crate::kuberuntime::event::{EventRecorder, PodEvent};
use crate::kuberuntime::{RuntimeConfig, labels};
use crate::metrics::Metrics;
use crate::prober::{ProbeManager, ProbeResult, ProbeUpdate};

pub use housekeeping::Cleaned;
pub use kernel_seen::KernelSeen;
pub use pleg::{Pleg, PlegEvent};
pub use settings::KubeletSettings;
pub use shared::Shared;
pub use status_store::{PodRecord, StatusStore};

use crate::clock::{instant_at, wall_now};
use crate::queues::{self, Queue, QueueStats};
use worker_waits::WorkerWaits;

struct WorkDone {
    uid: String,
    outcome: WorkOutcome,
    /// kubelet's pod worker operation type, and how long the work took.
    operation: &'static str,
    secs: f64,
}

pub struct Kubelet<R> {
    cri: R,
    shared: Arc<Shared>,
    workers: PodWorkers,
    /// Desired pods by UID (kubelet's pod manager), admitted or not.
    pod_manager: BTreeMap<String, Arc<Pod>>,
    /// Pods admission refused: they end Failed and are never synced.
    rejected: BTreeSet<String>,
    /// Desired pods whose resize the node cannot hold yet, by UID.
    pending_resizes: BTreeMap<String, Arc<Pod>>,
    /// Set once the config sources delivered their first snapshot.
    sources_ready: bool,
    /// Store entries standing for invalid manifests.
    invalid: Vec<String>,
    metrics: Option<Arc<Metrics>>,
    /// Pods whose first Running was counted in the pod start SLI.
    started: BTreeSet<String>,
    pleg: Pleg,
    pleg_rx: mpsc::Receiver<PlegEvent>,
    prober: Arc<ProbeManager<R>>,
    probe_rx: mpsc::Receiver<ProbeUpdate>,
    done_tx: queues::Sender<WorkDone>,
    done_rx: mpsc::Receiver<WorkDone>,
    /// What hitting the bounds of the queues above (and of the pod updates') cost.
    queue_stats: Arc<QueueStats>,
    /// Updates held behind busy workers and back-offs, until the pod's next work.
    waits: WorkerWaits,
}

impl<R: RuntimeService + ImageService + Clone + 'static> Kubelet<R> {
    /// Sets up the agent. With a cgroup root, the pod cgroups' QoS level is created now.
    pub fn new(
        cri: R,
        cfg: RuntimeConfig,
        settings: KubeletSettings,
    ) -> Result<Kubelet<R>, crate::cm::CmError> {
        let pcm = match &settings.cgroup_root {
            Some(root) => {
                let pcm = PodContainerManager::new(
                    root,
                    CgroupLayout::discover()?,
                    settings.cgroup_driver,
                )?;
                pcm.ensure_qos_cgroups()?;
                Some(pcm)
            }
            None => None,
        };
        let ns = |d: std::time::Duration| d.as_nanos() as i64;
        let workers = PodWorkers::new(ns(settings.resync_interval), ns(settings.error_backoff));
        let queue_stats = Arc::new(QueueStats::default());
        let (mut pleg, pleg_rx) = Pleg::new(&queue_stats);
        let (done_tx, done_rx) = queues::channel(Queue::WorkDone, &queue_stats);
        let (probe_tx, probe_rx) = queues::channel(Queue::ProbeResults, &queue_stats);
        let prober = Arc::new(ProbeManager::new(Arc::new(cri.clone()), probe_tx));
        let shared = Arc::new(Shared::new(cfg, settings, pcm));
        // Show an exit as soon as the kernel reports it; the sync that follows the
        // runtime's confirmation publishes the runtime's own account.
        pleg.set_kernel_seen(KernelSeen::new(shared.store.clone()));
        Ok(Kubelet {
            cri,
            shared,
            workers,
            pod_manager: BTreeMap::new(),
            rejected: BTreeSet::new(),
            pending_resizes: BTreeMap::new(),
            sources_ready: false,
            invalid: Vec::new(),
            metrics: None,
            started: BTreeSet::new(),
            waits: WorkerWaits::default(),
            pleg,
            pleg_rx,
            prober,
            probe_rx,
            done_tx,
            done_rx,
            queue_stats,
        })
    }

    /// Reports pod worker durations and pod start latency into `metrics`.
    pub fn set_metrics(&mut self, metrics: Arc<Metrics>) {
        self.metrics = Some(metrics);
    }

    /// The queue the config sources send pod updates to [`Kubelet::run`] on.
    pub fn pod_update_channel(&self) -> (queues::Sender<PodUpdate>, mpsc::Receiver<PodUpdate>) {
        queues::channel(Queue::PodUpdates, &self.queue_stats)
    }

    /// What hitting the bounds of the sync loop's queues cost so far.
    pub fn queue_stats(&self) -> Arc<QueueStats> {
        self.queue_stats.clone()
    }

    /// Where the kernel's view of container starts and exits goes (from the probes).
    pub fn kernel_seen(&self) -> KernelSeen {
        KernelSeen::new(self.shared.store.clone())
    }

    /// The status store, for the local API and for callers waiting on pod states.
    pub fn store(&self) -> Arc<StatusStore> {
        self.shared.store.clone()
    }

    /// Runs until `shutdown` turns true or `updates` closes and every worker is done.
    pub async fn run(
        mut self,
        mut updates: mpsc::Receiver<PodUpdate>,
        mut shutdown: watch::Receiver<bool>,
    ) {
        let settings = self.shared.settings.clone();
        let first = tokio::time::Instant::now() + settings.housekeeping_interval;
        let mut housekeeping = tokio::time::interval_at(first, settings.housekeeping_interval);
        housekeeping.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        let mut relist = tokio::time::interval(settings.relist_period);
        relist.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        let mut updates_open = true;
        // One timer for the workers' next deadline, moved when the deadline moves: not a
        // new one each turn of the loop, which runs once per event.
        let wake = tokio::time::sleep_until(instant_at(i64::MAX / 2));
        tokio::pin!(wake);
        let mut wake_at = None;
        loop {
            let deadline = self.workers.next_deadline();
            if let Some(d) = deadline
                && wake_at != Some(d)
            {
                wake.as_mut().reset(instant_at(d));
                wake_at = Some(d);
            }
            // Branches are polled in this order, never at random: replay must see the
            // same interleaving every time it runs the same trace.
            tokio::select! {
                biased;
                u = updates.recv(), if updates_open => match u {
                    Some(u) => self.handle_update(u),
                    None => updates_open = false,
                },
                Some(done) = self.done_rx.recv() => self.complete(done),
                Some(ev) = self.pleg_rx.recv() => self.handle_pleg(ev),
                Some(u) = self.probe_rx.recv() => self.handle_probe(u),
                () = &mut wake, if deadline.is_some() => {
                    let now = wall_now();
                    for work in self.workers.due(now) {
                        self.dispatch(work);
                    }
                }
                _ = relist.tick() => {
                    self.pleg.relist(&self.cri, &self.shared.cfg.node_name).await;
                }
                _ = housekeeping.tick() => self.housekeeping().await,
                changed = shutdown.changed() => {
                    if changed.is_err() || *shutdown.borrow() {
                        return;
                    }
                }
            }
        }
    }

    fn handle_update(&mut self, update: PodUpdate) {
        match update {
            PodUpdate::Add(pods) => self.handle_pod_additions(pods),
            PodUpdate::Update(pods) => {
                for pod in pods {
                    let uid = labels::pod_uid(&pod).to_string();
                    self.shared.store.update_pod(pod.clone());
                    let pod = if self.rejected.contains(&uid) {
                        pod
                    } else {
                        self.allocate(pod)
                    };
                    self.pod_manager.insert(uid.clone(), pod.clone());
                    if !self.rejected.contains(&uid) {
                        self.update_worker(UpdateType::Update, pod, "a spec update");
                    }
                }
            }
            PodUpdate::Remove(pods) => {
                for pod in pods {
                    let uid = labels::pod_uid(&pod).to_string();
                    self.pod_manager.remove(&uid);
                    if self.rejected.remove(&uid) {
                        self.shared.store.remove(&uid);
                        continue;
                    }
                    self.update_worker(UpdateType::Kill, pod, "the pod's removal");
                }
                self.retry_pending_resizes();
            }
            PodUpdate::SourcesReady => self.sources_ready = true,
            PodUpdate::Invalid(errors) => self.handle_invalid(errors),
        }
    }

    /// Manifests that name a pod but cannot become one show up as that pod, Failed with
    /// the reason and an event, so `podlapse pods` says what is wrong where the pod
    /// would be. They are replaced whenever the set of invalid manifests changes.
    fn handle_invalid(&mut self, errors: Vec<InvalidManifest>) {
        for uid in std::mem::take(&mut self.invalid) {
            self.shared.store.remove(&uid);
        }
        for e in errors {
            eprintln!("podlapse: {}", e.message);
            let Some((namespace, name)) = e.pod else {
                continue;
            };
            let uid = format!("invalid:{}", e.location);
            let mut pod = Pod::default();
            pod.metadata.name = Some(name);
            pod.metadata.namespace = Some(namespace);
            pod.metadata.uid = Some(uid.clone());
            self.shared.store.add_pod(Arc::new(pod));
            self.shared.store.recorder(&uid).record(PodEvent::warning(
                "FailedValidation",
                e.message.clone(),
                None,
            ));
            self.shared.store.set_status(
                &uid,
                PodStatus {
                    phase: Some("Failed".into()),
                    reason: Some("InvalidManifest".into()),
                    message: Some(e.message),
                    ..PodStatus::default()
                },
            );
            self.invalid.push(uid);
        }
    }

    /// HandlePodAdditions: oldest first, admission against what is already admitted, then
    /// dispatch to the pod's worker.
    fn handle_pod_additions(&mut self, mut pods: Vec<Arc<Pod>>) {
        pods.sort_by(|a, b| {
            let t = |p: &Pod| p.metadata.creation_timestamp.clone().map(|t| t.0);
            t(a).cmp(&t(b))
        });
        for pod in pods {
            let uid = labels::pod_uid(&pod).to_string();
            self.shared.store.add_pod(pod.clone());
            let admitted: Vec<&Pod> = self.admitted().map(|(_, p)| p).collect();
            let verdict = can_admit_pod(
                &pod,
                &admitted,
                &self.shared.settings.allocatable,
                self.shared.settings.node.as_ref(),
            );
            self.pod_manager.insert(uid.clone(), pod.clone());
            if let Err(rejection) = verdict {
                self.rejected.insert(uid.clone());
                self.shared.store.recorder(&uid).record(PodEvent::warning(
                    rejection.reason.clone(),
                    rejection.message.clone(),
                    None,
                ));
                self.shared.store.set_status(
                    &uid,
                    PodStatus {
                        phase: Some("Failed".into()),
                        reason: Some(rejection.reason),
                        // kubelet's rejectPod: the event has the handler's message, the
                        // status says the pod was rejected.
                        message: Some(format!("Pod was rejected: {}", rejection.message)),
                        ..PodStatus::default()
                    },
                );
                continue;
            }
            self.update_worker(UpdateType::Create, pod, "the pod's creation");
        }
    }

    /// The pods admission counts as on the node: known, neither rejected nor being
    /// terminated, in UID order. One pass over the three lists, all in UID order, rather
    /// than two lookups per pod on every pod's admission.
    fn admitted(&self) -> impl Iterator<Item = (&str, &Pod)> {
        sorted::without(
            self.pod_manager
                .iter()
                .map(|(uid, pod)| (uid.as_str(), pod.as_ref())),
            self.rejected.iter().map(String::as_str),
            self.workers.terminating(),
        )
    }

    fn handle_pleg(&mut self, ev: PlegEvent) {
        if let Some(pod) = self.pod_manager.get(&ev.uid).cloned() {
            self.update_worker(UpdateType::Sync, pod, "a container's change of state");
        }
    }

    /// A probe result changed: record it where the core reads it, and sync the pod so
    /// readiness reaches its status and a liveness failure restarts the container.
    fn handle_probe(&mut self, u: ProbeUpdate) {
        let applied = shared::lock(&self.shared.probes)
            .entry(u.pod_uid.clone())
            .or_default()
            .apply(u.kind, u.result, &u.container_id);
        if applied.startup_passed {
            // Until now the container counted as not started: what follows a sidecar
            // waited for this.
            let waited = crate::prober::now_ns().saturating_sub(u.started_at_ns);
            self.shared.store.recorder(&u.pod_uid).waited(
                crate::kuberuntime::event::PodWait {
                    wait: crate::kuberuntime::event::WaitKind::StartupProbe,
                    container: Some(u.container_name.clone()),
                    behind: Vec::new(),
                    detail: "until its startup probe passed".into(),
                },
                waited,
            );
        }
        if u.result == ProbeResult::Failure {
            let mut message = format!("{} probe failed", u.kind);
            if !u.output.is_empty() {
                message.push_str(": ");
                message.push_str(u.output.trim_end());
            }
            self.shared
                .store
                .recorder(&u.pod_uid)
                .record(PodEvent::warning(
                    "Unhealthy",
                    message,
                    Some(u.container_name.clone()),
                ));
        }
        if applied.changed
            && let Some(pod) = self.pod_manager.get(&u.pod_uid).cloned()
        {
            self.update_worker(UpdateType::Sync, pod, "a probe result");
        }
    }

    fn complete(&mut self, done: WorkDone) {
        if let Some(m) = &self.metrics {
            m.observe_pod_worker(done.operation, done.secs);
            // Looked at in place until the pod has started, then copied once.
            if !self.started.contains(&done.uid)
                && self
                    .shared
                    .store
                    .with_pod(&done.uid, |rec| rec.all_started_at.is_some())
                    .unwrap_or(false)
                && let Some(rec) = self.shared.store.get(&done.uid)
                && let Some(started) = rec.all_started_at
            {
                self.started.insert(done.uid.clone());
                let total_ns = u64::try_from(started - rec.first_seen).unwrap_or(0);
                m.observe_pod_started(&done.uid, total_ns, &rec.init_runs, rec.pod.spec());
            }
        }
        let next = self
            .workers
            .complete_work(&done.uid, wall_now(), done.outcome);
        if matches!(done.outcome, WorkOutcome::RetryAt(_)) {
            self.waits.backing_off(&done.uid);
        }
        if done.outcome == WorkOutcome::Terminated {
            self.waits.forget(&done.uid);
            self.started.remove(&done.uid);
            self.prober.remove_pod(&done.uid);
            self.workers.forget(&done.uid);
            self.shared.forget_pod(&done.uid);
            self.shared.store.remove(&done.uid);
            if let Some(m) = &self.metrics {
                m.forget_pod(&done.uid);
            }
        }
        self.dispatch_opt(next);
    }

    /// kubelet's UpdatePod: runs the update now if the pod's worker is idle, else holds it
    /// (`what` names it for the wait that follows).
    fn update_worker(&mut self, update_type: UpdateType, pod: Arc<Pod>, what: &'static str) {
        let uid = labels::pod_uid(&pod).to_string();
        let busy = self.workers.is_working(&uid);
        match self.workers.update_pod(update_type, pod) {
            Some(work) => self.dispatch(work),
            None if busy => self.waits.held(&uid, what),
            None => {}
        }
    }

    fn dispatch_opt(&mut self, work: Option<PodWork>) {
        if let Some(work) = work {
            self.dispatch(work);
        }
    }

    /// Runs one unit of work in its own task; its outcome comes back as `WorkDone`.
    fn dispatch(&mut self, work: PodWork) {
        let shared = &self.shared;
        self.waits
            .work_begins(&work.uid, &shared.store, || shared.reasons_of(&work.uid));
        let (cri, shared, pleg, prober, done) = (
            self.cri.clone(),
            self.shared.clone(),
            self.pleg.clone(),
            self.prober.clone(),
            self.done_tx.clone(),
        );
        let operation = match work.update_type {
            UpdateType::Create => "create",
            UpdateType::Update => "update",
            UpdateType::Sync => "sync",
            UpdateType::Kill => "kill",
        };
        tokio::spawn(async move {
            let began = tokio::time::Instant::now();
            let outcome = match work.kind {
                // A sync's future is about 15 KiB, a termination's about 1 KiB: both boxed,
                // a task holds only the one it runs (a hundred pods terminating at once do
                // not each hold a sync's worth), and the task itself is small to make.
                WorkKind::Sync => {
                    Box::pin(pod_sync::sync(&cri, &shared, &pleg, &prober, &work.pod)).await
                }
                WorkKind::Terminate => {
                    prober.stop_liveness_and_startup(&work.uid);
                    Box::pin(terminate::terminate(&cri, &shared, &work.pod)).await
                }
            };
            let _ = done
                .send(WorkDone {
                    uid: work.uid,
                    outcome,
                    operation,
                    secs: began.elapsed().as_secs_f64(),
                })
                .await;
        });
    }

    async fn housekeeping(&mut self) {
        lock_gc(&self.shared);
        if let Some(m) = &self.metrics {
            m.set_syncloop_queues(&self.queue_stats);
        }
        if !self.shared.settings.housekeeping || !self.sources_ready {
            return;
        }
        let keep: BTreeSet<String> = self
            .pod_manager
            .keys()
            .cloned()
            .chain(self.workers.uids())
            .collect();
        let cleaned = housekeeping::cleanup_orphans(&self.cri, &self.shared, &keep).await;
        if cleaned != Cleaned::default() {
            tracing::info!(?cleaned, "housekeeping removed orphans");
        }
    }
}

fn lock_gc(shared: &Shared) {
    shared::lock(&shared.backoff).gc(wall_now());
}
