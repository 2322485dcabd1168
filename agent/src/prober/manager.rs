//! The prober's shell: kubelet's probe manager. One tokio task per (pod UID, container,
//! probe kind) drives a [`ProbeWorker`] on the monotonic clock, runs its action and sends a
//! [`ProbeUpdate`] whenever the published result changes, the initial value included (as
//! kubelet's results manager does when a worker first sets it).

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};
use std::time::Duration;

use k8s_openapi::api::core::v1::{Container, Pod, Probe};
use nix::time::{ClockId, clock_gettime};
use serde::Serialize;
use tokio::runtime::Handle;
use tokio::sync::watch;
use tokio::task::AbortHandle;

use super::action::run_probe_with_retries;
use super::spec::{ProbeError, ProbeKind, ProbeSpec};
use super::state::{ProbeResult, ProbeWorker, container_started, probe_allowed};
use crate::cri::RuntimeService;
use crate::queues::{self, Full};

const NANOS_PER_SECOND: u64 = 1_000_000_000;

/// Nanoseconds on CLOCK_MONOTONIC, the clock eBPF's `bpf_ktime_get_ns` reads, so probe
/// times line up with kernel events. Every deadline the prober keeps is on this clock.
pub fn now_ns() -> u64 {
    clock_ns(ClockId::CLOCK_MONOTONIC)
}

/// Converts a CRI timestamp (Unix nanoseconds, wall clock) such as a container's
/// `started_at` to the [`now_ns`] clock, by its age now.
pub fn monotonic_from_wall_ns(wall_ns: i64) -> u64 {
    let mono = now_ns();
    let wall = clock_ns(ClockId::CLOCK_REALTIME);
    let age = u64::try_from(i128::from(wall) - i128::from(wall_ns)).unwrap_or(0);
    mono.saturating_sub(age)
}

fn clock_ns(clock: ClockId) -> u64 {
    // Both clocks always exist on Linux; a failure here means no usable clock at all.
    let ts = clock_gettime(clock).expect("clock_gettime on a standard clock");
    let secs = u64::try_from(ts.tv_sec()).unwrap_or(0);
    let nanos = u64::try_from(ts.tv_nsec()).unwrap_or(0);
    secs.saturating_mul(NANOS_PER_SECOND).saturating_add(nanos)
}

/// A probe's published result changed for a container.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct ProbeUpdate {
    pub pod_uid: String,
    pub container_name: String,
    /// The container the result is about; an update for a container ID the pipeline has
    /// since replaced is stale.
    pub container_id: String,
    pub kind: ProbeKind,
    pub result: ProbeResult,
    /// What the probe run that decided it said (kubelet's `Unhealthy` event text); empty
    /// for the initial value.
    pub output: String,
    /// When the container started, on the [`now_ns`] clock.
    pub started_at_ns: u64,
}

/// Runs the probes of the containers it is told about. Must be created inside a tokio
/// runtime, whose handle it keeps to spawn workers. Dropping it stops every worker.
pub struct ProbeManager<R> {
    runtime: Arc<R>,
    handle: Handle,
    shared: Arc<Mutex<Shared>>,
}

struct Shared {
    updates: queues::Sender<ProbeUpdate>,
    containers: BTreeMap<(String, String), Entry>,
    next_generation: u64,
}

/// One container's workers. The generation tells a worker of a replaced container that it
/// must not publish any more.
struct Entry {
    container_id: String,
    generation: u64,
    results: BTreeMap<ProbeKind, ProbeResult>,
    tasks: BTreeMap<ProbeKind, AbortHandle>,
    started: watch::Sender<bool>,
}

impl Entry {
    fn stop(&self) {
        for task in self.tasks.values() {
            task.abort();
        }
    }
}

impl<R: RuntimeService + 'static> ProbeManager<R> {
    /// Panics outside a tokio runtime.
    pub fn new(runtime: Arc<R>, updates: queues::Sender<ProbeUpdate>) -> Self {
        ProbeManager {
            runtime,
            handle: Handle::current(),
            shared: Arc::new(Mutex::new(Shared {
                updates,
                containers: BTreeMap::new(),
                next_generation: 0,
            })),
        }
    }

    /// Starts workers for the probes the container's spec has, for the container
    /// `container_id` that started at `started_at_ns` (on the [`now_ns`] clock). Adding the
    /// same container ID again does nothing; a new ID (a restart) replaces the workers,
    /// which is kubelet's reset. An invalid probe starts nothing.
    pub fn add_container(
        &self,
        pod: &Pod,
        container_name: &str,
        container_id: &str,
        pod_ip: &str,
        started_at_ns: u64,
    ) -> Result<(), ProbeError> {
        let container = find_container(pod, container_name).ok_or(ProbeError::NoContainer {
            container: container_name.to_string(),
        })?;
        let mut specs = Vec::new();
        for kind in ProbeKind::ALL {
            if let Some(probe) = probe_of(container, kind) {
                specs.push((kind, ProbeSpec::from_probe(kind, probe)?));
            }
        }
        let pod_uid = pod.metadata.uid.clone().unwrap_or_default();
        let key = (pod_uid.clone(), container_name.to_string());
        let mut shared = lock(&self.shared);
        if shared
            .containers
            .get(&key)
            .is_some_and(|e| e.container_id == container_id)
        {
            return Ok(());
        }
        if let Some(old) = shared.containers.remove(&key) {
            old.stop();
        }
        if specs.is_empty() {
            return Ok(());
        }
        let generation = shared.next_generation;
        shared.next_generation += 1;
        let has_startup = specs.iter().any(|(k, _)| *k == ProbeKind::Startup);
        let (started, _) = watch::channel(!has_startup);
        let mut entry = Entry {
            container_id: container_id.to_string(),
            generation,
            results: BTreeMap::new(),
            tasks: BTreeMap::new(),
            started,
        };
        for (kind, spec) in specs {
            let worker = ProbeWorker::new(kind, &spec, started_at_ns);
            entry.results.insert(kind, worker.result());
            // Sent now, in order with what the caller does next; if the queue is full
            // the worker sends it before anything else (this call cannot wait).
            let pending = shared
                .updates
                .try_send(ProbeUpdate {
                    pod_uid: pod_uid.clone(),
                    container_name: container_name.to_string(),
                    container_id: container_id.to_string(),
                    kind,
                    result: worker.result(),
                    output: String::new(),
                    started_at_ns,
                })
                .err();
            let ctx = WorkerCtx {
                updates: shared.updates.clone(),
                runtime: self.runtime.clone(),
                shared: self.shared.clone(),
                key: key.clone(),
                generation,
                kind,
                spec,
                container: container.clone(),
                container_id: container_id.to_string(),
                pod_ip: pod_ip.to_string(),
                started_at_ns,
            };
            // The task cannot publish before this lock is released, by which time its
            // entry is in place.
            let task =
                self.handle
                    .spawn(run_worker(ctx, worker, entry.started.subscribe(), pending));
            entry.tasks.insert(kind, task.abort_handle());
        }
        shared.containers.insert(key, entry);
        Ok(())
    }

    /// Stops a container's workers and forgets its results.
    pub fn remove_container(&self, pod_uid: &str, container_name: &str) {
        let key = (pod_uid.to_string(), container_name.to_string());
        if let Some(entry) = lock(&self.shared).containers.remove(&key) {
            entry.stop();
        }
    }

    /// Stops the workers of every container of the pod and forgets their results.
    pub fn remove_pod(&self, pod_uid: &str) {
        let mut shared = lock(&self.shared);
        let keys: Vec<_> = shared
            .containers
            .keys()
            .filter(|(uid, _)| uid == pod_uid)
            .cloned()
            .collect();
        for key in keys {
            if let Some(entry) = shared.containers.remove(&key) {
                entry.stop();
            }
        }
    }

    /// kubelet's `StopLivenessAndStartup`: a terminating pod's containers must not be
    /// restarted by a probe, so those workers stop while readiness keeps running. Their
    /// last results stay readable.
    pub fn stop_liveness_and_startup(&self, pod_uid: &str) {
        let mut shared = lock(&self.shared);
        for ((uid, _), entry) in shared.containers.iter_mut() {
            if uid != pod_uid {
                continue;
            }
            for kind in [ProbeKind::Liveness, ProbeKind::Startup] {
                if let Some(task) = entry.tasks.remove(&kind) {
                    task.abort();
                }
            }
        }
    }

    /// The result a container's probe last published, if it has that probe.
    pub fn result(
        &self,
        pod_uid: &str,
        container_name: &str,
        kind: ProbeKind,
    ) -> Option<ProbeResult> {
        let key = (pod_uid.to_string(), container_name.to_string());
        lock(&self.shared)
            .containers
            .get(&key)
            .and_then(|e| e.results.get(&kind).copied())
    }
}

impl<R> Drop for ProbeManager<R> {
    fn drop(&mut self) {
        for entry in lock(&self.shared).containers.values() {
            entry.stop();
        }
    }
}

fn lock(shared: &Mutex<Shared>) -> MutexGuard<'_, Shared> {
    // A worker that panicked mid-publish leaves maps that are still consistent.
    shared.lock().unwrap_or_else(PoisonError::into_inner)
}

/// The pod's container of that name; restartable init containers (sidecars) have probes
/// too.
fn find_container<'a>(pod: &'a Pod, name: &str) -> Option<&'a Container> {
    let spec = pod.spec.as_ref()?;
    spec.containers
        .iter()
        .chain(spec.init_containers.iter().flatten())
        .find(|c| c.name == name)
}

fn probe_of(c: &Container, kind: ProbeKind) -> Option<&Probe> {
    match kind {
        ProbeKind::Liveness => c.liveness_probe.as_ref(),
        ProbeKind::Readiness => c.readiness_probe.as_ref(),
        ProbeKind::Startup => c.startup_probe.as_ref(),
    }
}

/// What one worker task needs besides its state machine.
struct WorkerCtx<R> {
    updates: queues::Sender<ProbeUpdate>,
    runtime: Arc<R>,
    shared: Arc<Mutex<Shared>>,
    key: (String, String),
    generation: u64,
    kind: ProbeKind,
    spec: ProbeSpec,
    container: Container,
    container_id: String,
    pod_ip: String,
    started_at_ns: u64,
}

impl<R> WorkerCtx<R> {
    /// Records and sends a changed result, waiting for room in the sync loop's queue (with
    /// the manager's lock released). False when the container has been removed or
    /// replaced, which ends the worker.
    async fn publish(&self, result: ProbeResult, output: String) -> bool {
        {
            let mut shared = lock(&self.shared);
            let Some(entry) = shared
                .containers
                .get_mut(&self.key)
                .filter(|e| e.generation == self.generation)
            else {
                return false;
            };
            entry.results.insert(self.kind, result);
            if self.kind == ProbeKind::Startup {
                entry.started.send_replace(container_started(Some(result)));
            }
        }
        let update = ProbeUpdate {
            pod_uid: self.key.0.clone(),
            container_name: self.key.1.clone(),
            container_id: self.container_id.clone(),
            kind: self.kind,
            result,
            output,
            started_at_ns: self.started_at_ns,
        };
        self.updates.send(update).await.is_ok()
    }
}

async fn run_worker<R: RuntimeService + 'static>(
    ctx: WorkerCtx<R>,
    mut worker: ProbeWorker,
    mut started: watch::Receiver<bool>,
    initial: Option<Full<ProbeUpdate>>,
) {
    if let Some(initial) = initial
        && ctx.updates.send_counted(initial).await.is_err()
    {
        return;
    }
    while let Some(due) = worker.next_due() {
        let wait = Duration::from_nanos(due.saturating_sub(now_ns()));
        // kubelet triggers a readiness probe as soon as a container counts as started.
        let watch_start = ctx.kind == ProbeKind::Readiness && !*started.borrow();
        tokio::select! {
            biased;
            () = tokio::time::sleep(wait) => {}
            Ok(()) = started.changed(), if watch_start => {
                if *started.borrow_and_update() {
                    worker.expedite(now_ns());
                }
                continue;
            }
        }
        if !probe_allowed(ctx.kind, *started.borrow()) {
            worker.skip(now_ns());
            continue;
        }
        let outcome = run_probe_with_retries(
            &*ctx.runtime,
            &ctx.spec,
            &ctx.container,
            &ctx.container_id,
            &ctx.pod_ip,
        )
        .await;
        let (raw, output) = match outcome {
            Ok(o) => (o.result, o.output),
            Err(e) => {
                tracing::debug!(
                    pod_uid = %ctx.key.0,
                    container = %ctx.key.1,
                    kind = %ctx.kind,
                    "probe errored, result discarded: {e}"
                );
                (ProbeResult::Unknown, String::new())
            }
        };
        if let Some(result) = worker.observe(now_ns(), raw)
            && !ctx.publish(result, output).await
        {
            return;
        }
    }
}

#[cfg(test)]
mod tests {
    use std::time::{SystemTime, UNIX_EPOCH};

    use super::*;

    #[test]
    fn wall_timestamps_map_onto_the_monotonic_clock_by_age() {
        let wall_now = SystemTime::now().duration_since(UNIX_EPOCH).unwrap();
        let wall_now = i64::try_from(wall_now.as_nanos()).unwrap();
        let five_s_ago = monotonic_from_wall_ns(wall_now - 5 * 1_000_000_000);
        let mono = now_ns();
        let age = mono - five_s_ago;
        // Five seconds, give or take the time between the clock reads.
        assert!(
            (5_000_000_000..5_500_000_000).contains(&age),
            "age {age} ns"
        );
        // A timestamp from the future (clock skew) is treated as now, not as later.
        assert!(monotonic_from_wall_ns(wall_now + 60 * 1_000_000_000) <= now_ns());
    }
}
