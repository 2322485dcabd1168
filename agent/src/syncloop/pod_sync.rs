//! kubelet's syncPod for one pod: read the runtime's view, publish the API status, gate on
//! network readiness, then run the runtime's SyncPod and publish again.

use std::sync::Arc;

use k8s_openapi::api::core::v1::Pod;

use crate::credentialprovider::{
    FAILED_TO_RETRIEVE_IMAGE_PULL_SECRET, PullSecrets, failed_secrets_message, load_pull_secrets,
};
use crate::cri::{ImageService, RuntimeService};
use crate::kubelet::pod_actions::is_restartable_init_container;
use crate::kubelet::pod_startup_latency::init_container_runs;
use crate::kubelet::pod_workers::WorkOutcome;
use crate::kubelet::status::generate_api_pod_status;
use crate::kubelet::sync_outcome::outcome_after_sync;
use crate::kuberuntime::event::{EventRecorder, PodEvent, PodWait, WaitKind};
use crate::kuberuntime::pod_status::status_after_start;
use crate::kuberuntime::{
    ContainerOutcome, PodSyncResult, SyncContext, get_pod_status, labels, sync_pod,
};

use super::pleg::Pleg;
use super::shared::{Shared, lock};
use super::status_store::PodRecorder;
use crate::clock::{mono_now, wall_now};
use crate::kubelet::RuntimePodStatus;
use crate::kubelet::runtime_pod::ContainerState;
use crate::prober::{ProbeManager, monotonic_from_wall_ns};

/// Syncs `pod` once and says when to look at it again.
pub async fn sync<R: RuntimeService + ImageService + Clone + 'static>(
    cri: &R,
    shared: &Arc<Shared>,
    pleg: &Pleg,
    prober: &ProbeManager<R>,
    pod: &Pod,
) -> WorkOutcome {
    let uid = labels::pod_uid(pod).to_string();
    let recorder = shared.store.recorder(&uid);
    let host_network = pod
        .spec
        .as_ref()
        .and_then(|s| s.host_network)
        .unwrap_or(false);
    // The runtime's view of the pod and its network condition are independent reads.
    let (status, network) = futures::future::join(
        get_pod_status(cri, &uid, labels::pod_name(pod), labels::pod_namespace(pod)),
        async {
            if host_network {
                None
            } else {
                network_not_ready(cri, shared).await
            }
        },
    )
    .await;
    let status = match status {
        Ok(mut s) => {
            shared.actuated.fill(&uid, &mut s);
            s
        }
        Err(e) => {
            recorder.record(PodEvent::warning("FailedSync", e.to_string(), None));
            return WorkOutcome::Failed;
        }
    };
    publish(shared, pod, &status);

    if !network_gate(shared, &recorder, &uid, network) {
        return WorkOutcome::Failed;
    }

    let Some(cgroup_parent) = pod_cgroup(shared, &recorder, pod) else {
        return WorkOutcome::Failed;
    };
    let secrets = pull_secrets(shared, &recorder, pod);
    // kubelet tries each matching credential in turn; podlapse passes the most specific.
    let auth = |image: &str| {
        secrets
            .lookup(image)
            .ok()
            .and_then(|creds| creds.into_iter().next())
            .map(|c| c.auth)
    };
    let probes = shared.probes_of(&uid);
    let now = wall_now;
    let ctx = SyncContext {
        cfg: &shared.cfg,
        events: &recorder,
        probes: &probes,
        backoff: &shared.backoff,
        limiter: &shared.limiter,
        now: &now,
        cgroup_parent: &cgroup_parent,
        auth: &auth,
        actuated: &|name, id, r| shared.actuated.record(&uid, name, id, r),
    };
    // Boxed: a Pod inline is about 2.4 KB, and this future is held by every pod in sync.
    let flipped: Box<Pod>;
    let pod = if shared.settings.flip_pull_policy {
        flipped = Box::new(always_pull(pod));
        &*flipped
    } else {
        pod
    };
    let result = sync_pod(cri, &ctx, pod, &status).await;

    remember_reasons(shared, &uid, &result);
    // Publish what the sync changed right away rather than at the next event. A sync
    // that only started things reads just those (verbosely: that gives their pids too);
    // any other change reads the whole pod again.
    let mut latest = status;
    let mut pids = std::collections::BTreeMap::new();
    if !result.actions.is_noop() {
        let after = match result.only_started() {
            Some(started) => {
                status_after_start(cri, &latest, result.new_sandbox.as_ref(), &started)
                    .await
                    .map(|(after, known)| {
                        pids = known;
                        after
                    })
            }
            None => {
                get_pod_status(cri, &uid, labels::pod_name(pod), labels::pod_namespace(pod)).await
            }
        };
        if let Ok(mut after) = after {
            shared.actuated.fill(&uid, &mut after);
            publish(shared, pod, &after);
            latest = after;
        }
    }
    // After publishing, so watching the new processes is not on the way to Running. An exit
    // in between is not missed: a watch whose process is already gone reports it at once,
    // and one that finds no pid leaves it to the relist.
    for outcome in result.containers.values() {
        if let ContainerOutcome::Started { container_id } = outcome {
            let pid = pids.get(container_id).copied();
            pleg.watch_container(cri, &uid, container_id, pid).await;
        }
    }
    register_probes(shared, prober, pod, &latest);

    outcome_after_sync(result.summary(), wall_now())
}

/// The network-readiness gate: no new pod network while the runtime's network is not
/// ready (`network` says why). False while it holds; once it opens, the time the pod
/// waited is recorded.
fn network_gate(
    shared: &Shared,
    recorder: &PodRecorder,
    uid: &str,
    network: Option<String>,
) -> bool {
    // The network-readiness gate: no new pod network while the runtime's network
    // is not ready.
    if let Some(why) = network {
        recorder.record(PodEvent::warning(
            "NetworkNotReady",
            format!("network is not ready: {why}"),
            None,
        ));
        lock(&shared.network_waits)
            .entry(uid.to_string())
            .or_insert_with(|| (mono_now(), why));
        return false;
    }
    let waited = lock(&shared.network_waits).remove(uid);
    if let Some((since, why)) = waited {
        recorder.waited(
            PodWait {
                wait: WaitKind::Network,
                container: None,
                behind: Vec::new(),
                detail: format!("the runtime's network was not ready: {why}"),
            },
            mono_now().saturating_sub(since),
        );
    }
    true
}

/// The pod's cgroup (kubelet's pod container manager), as the runtime's cgroup parent;
/// none when the runtime places the pod itself. `None` when it could not be made.
fn pod_cgroup(shared: &Shared, recorder: &PodRecorder, pod: &Pod) -> Option<String> {
    Some(match &shared.pcm {
        Some(pcm) => match pcm.ensure_pod_cgroup(pod) {
            Ok(parent) => parent,
            Err(e) => {
                recorder.record(PodEvent::warning(
                    "FailedCreatePodCgroup",
                    format!("unable to ensure pod container exists: {e}"),
                    None,
                ));
                return None;
            }
        },
        None => String::new(),
    })
}

/// The pod's image pull secrets; what could not be read is said as kubelet says it.
fn pull_secrets(shared: &Shared, recorder: &PodRecorder, pod: &Pod) -> PullSecrets {
    let secrets = match &shared.settings.secrets_dir {
        Some(dir) => match load_pull_secrets(dir, pod) {
            Ok(s) => s,
            Err(e) => {
                recorder.record(PodEvent::warning(
                    FAILED_TO_RETRIEVE_IMAGE_PULL_SECRET,
                    e.to_string(),
                    None,
                ));
                PullSecrets::default()
            }
        },
        None => PullSecrets::default(),
    };
    if let Some(message) = failed_secrets_message(&secrets.warnings) {
        recorder.record(PodEvent::warning(
            FAILED_TO_RETRIEVE_IMAGE_PULL_SECRET,
            message,
            None,
        ));
    }
    secrets
}

/// Keeps each container's waiting reason from the sync (or forgets it once it started),
/// for the statuses published until the next sync.
fn remember_reasons(shared: &Shared, uid: &str, result: &PodSyncResult) {
    let mut reasons = lock(&shared.reasons);
    let pod_reasons = reasons.entry(uid.to_string()).or_default();
    for (name, outcome) in &result.containers {
        match outcome {
            ContainerOutcome::Started { .. } => {
                pod_reasons.remove(name);
            }
            ContainerOutcome::BackOff {
                reason, message, ..
            }
            | ContainerOutcome::Failed { reason, message } => {
                pod_reasons.insert(name.clone(), (reason.to_string(), message.clone()));
            }
        }
    }
}

/// Gives the prober every running container that has probes (it ignores ones it already
/// runs) and takes exited ones away, so results always belong to the current container.
fn register_probes<R: RuntimeService + 'static>(
    shared: &Shared,
    prober: &ProbeManager<R>,
    pod: &Pod,
    status: &RuntimePodStatus,
) {
    let uid = labels::pod_uid(pod);
    let ip = status
        .newest_sandbox()
        .map(|s| s.ip.clone())
        .unwrap_or_default();
    let spec = pod.spec.as_ref();
    let sidecars = spec
        .and_then(|s| s.init_containers.as_deref())
        .unwrap_or_default()
        .iter()
        .filter(|c| is_restartable_init_container(c));
    for c in spec
        .map(|s| s.containers.as_slice())
        .unwrap_or_default()
        .iter()
        .chain(sidecars)
    {
        if c.liveness_probe.is_none() && c.readiness_probe.is_none() && c.startup_probe.is_none() {
            continue;
        }
        let Some(st) = status.container(&c.name) else {
            continue;
        };
        if st.state != ContainerState::Running {
            prober.remove_container(uid, &c.name);
            continue;
        }
        let fresh = {
            let mut all = lock(&shared.probes);
            let r = all.entry(uid.to_string()).or_default();
            let fresh = r.registered.insert(st.id.clone());
            if fresh {
                if c.readiness_probe.is_some() {
                    r.has_readiness_probe.insert(st.id.clone());
                }
                if c.startup_probe.is_some() {
                    r.not_started.insert(st.id.clone());
                }
            }
            fresh
        };
        if fresh {
            let started = monotonic_from_wall_ns(st.started_at);
            if let Err(e) = prober.add_container(pod, &c.name, &st.id, &ip, started) {
                shared.store.recorder(uid).record(PodEvent::warning(
                    "InvalidProbe",
                    e.to_string(),
                    Some(c.name.clone()),
                ));
            }
        }
    }
}

/// The pod with every image pull policy Always (the test-only flipped decision).
fn always_pull(pod: &Pod) -> Pod {
    let mut pod = pod.clone();
    if let Some(spec) = pod.spec.as_mut() {
        for c in spec
            .containers
            .iter_mut()
            .chain(spec.init_containers.iter_mut().flatten())
        {
            c.image_pull_policy = Some("Always".into());
        }
    }
    pod
}

fn publish(shared: &Shared, pod: &Pod, status: &RuntimePodStatus) {
    let uid = labels::pod_uid(pod);
    if let Some(spec) = &pod.spec {
        shared
            .store
            .record_init_runs(uid, init_container_runs(spec, status));
    }
    let api = generate_api_pod_status(
        pod,
        status,
        &shared.reasons_of(uid),
        &shared.probes_of(uid),
        &shared.cfg.node_ip,
        lock(&shared.resize_pending).get(uid),
    );
    let api = k8s_openapi::api::core::v1::PodStatus {
        qos_class: Some(crate::kubelet::qos::pod_qos(pod).to_string()),
        ..api
    };
    let resizing = |s: &k8s_openapi::api::core::v1::PodStatus| {
        s.conditions
            .iter()
            .flatten()
            .any(|c| c.type_ == "PodResizeInProgress")
    };
    if shared
        .store
        .with_pod(uid, |before| resizing(&before.status))
        .unwrap_or(false)
        && !resizing(&api)
    {
        shared.store.recorder(uid).record(PodEvent::normal(
            "ResizeCompleted",
            "Pod resize completed",
            None,
        ));
    }
    shared.store.set_status(uid, api);
}

/// How long a NetworkReady=true from the runtime stands: kubelet reads the runtime's
/// status every 5 s (its runtime-state loop) rather than in every pod sync. A false one is
/// not kept, so pods waiting for the network go on as soon as the runtime says it is up.
const NETWORK_READY_FOR_NS: u64 = 5_000_000_000;

/// The runtime's NetworkReady condition, when it is false.
async fn network_not_ready<R: RuntimeService>(cri: &R, shared: &Shared) -> Option<String> {
    let now = mono_now();
    if lock(&shared.network_ready_at)
        .is_some_and(|at| now.saturating_sub(at) < NETWORK_READY_FOR_NS)
    {
        return None;
    }
    let status = cri.status(false).await.ok()?.status?;
    let cond = status
        .conditions
        .iter()
        .find(|c| c.r#type == "NetworkReady")?;
    *lock(&shared.network_ready_at) = cond.status.then_some(now);
    (!cond.status).then(|| format!("{}: {}", cond.reason, cond.message))
}
