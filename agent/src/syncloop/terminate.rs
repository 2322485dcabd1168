//! kubelet's syncTerminatingPod and the cleanup after it: stop every container with the
//! grace period, stop and remove the sandbox, then remove the pod's directories.

use std::sync::Arc;

use k8s_openapi::api::core::v1::Pod;

use crate::cri::RuntimeService;
use crate::kubelet::pod_actions::is_restartable_init_container;
use crate::kubelet::pod_workers::WorkOutcome;
use crate::kubelet::runtime_pod::{ContainerState, RuntimePodStatus};
use crate::kuberuntime::event::{EventRecorder, PodEvent};
use crate::kuberuntime::{get_pod_status, kill, labels, volumes};
use crate::lifecycle::run_handler;

use super::shared::Shared;

pub async fn terminate<R: RuntimeService>(cri: &R, shared: &Arc<Shared>, pod: &Pod) -> WorkOutcome {
    let (uid, name, ns) = (
        labels::pod_uid(pod),
        labels::pod_name(pod),
        labels::pod_namespace(pod),
    );
    let recorder = shared.store.recorder(uid);
    let status = match get_pod_status(cri, uid, name, ns).await {
        Ok(s) => s,
        Err(e) => {
            recorder.record(PodEvent::warning("FailedKillPod", e.to_string(), None));
            return WorkOutcome::Failed;
        }
    };
    let grace = pod
        .spec
        .as_ref()
        .and_then(|s| s.termination_grace_period_seconds)
        .unwrap_or(30);
    let started = std::time::Instant::now();
    run_pre_stop_hooks(cri, pod, &status, grace, &recorder).await;
    // The hooks used part of the grace period; kubelet leaves the containers at least 2 s.
    let grace = (grace - started.elapsed().as_secs() as i64).max(2);
    for c in kill::termination_order(pod, &status)
        .into_iter()
        .flatten()
        .filter(|c| c.state == ContainerState::Running)
    {
        recorder.record(PodEvent::normal(
            "Killing",
            format!("Stopping container {}", c.name),
            Some(c.name.clone()),
        ));
    }
    if let Err(e) = kill::kill_pod(cri, pod, &status, grace).await {
        recorder.record(PodEvent::warning(
            e.reason.to_string(),
            e.message,
            e.container,
        ));
        return WorkOutcome::Failed;
    }
    if let Err(e) = kill::remove_pod(cri, &status).await {
        recorder.record(PodEvent::warning(
            e.reason.to_string(),
            e.message,
            e.container,
        ));
        return WorkOutcome::Failed;
    }
    if let Some(pcm) = &shared.pcm {
        let destroyed = pcm.destroy_pod_cgroup_blocking(uid).await;
        if let Err(e) = destroyed {
            recorder.record(PodEvent::warning("FailedCleanup", e.to_string(), None));
            return WorkOutcome::Failed;
        }
    }
    if !shared.cfg.touch_host {
        return WorkOutcome::Terminated;
    }
    if let Err(e) = volumes::remove_pod_dir(uid, &shared.cfg) {
        recorder.record(PodEvent::warning(
            "FailedCleanup",
            format!("removing the pod directory: {e}"),
            None,
        ));
        return WorkOutcome::Failed;
    }
    let log_dir = shared.cfg.pod_log_dir(ns, name, uid);
    if let Err(e) = std::fs::remove_dir_all(&log_dir)
        && e.kind() != std::io::ErrorKind::NotFound
    {
        recorder.record(PodEvent::warning(
            "FailedCleanup",
            format!("removing {}: {e}", log_dir.display()),
            None,
        ));
        return WorkOutcome::Failed;
    }
    WorkOutcome::Terminated
}

/// Runs every running container's preStop hook at once, each bounded by the grace period.
async fn run_pre_stop_hooks<R: RuntimeService>(
    cri: &R,
    pod: &Pod,
    status: &RuntimePodStatus,
    grace: i64,
    recorder: &dyn EventRecorder,
) {
    let ip = status
        .newest_sandbox()
        .map(|s| s.ip.clone())
        .unwrap_or_default();
    let limit = std::time::Duration::from_secs(grace.max(0) as u64);
    // Sidecars run their preStop hooks with the others, before anything is stopped.
    let hooks = pod
        .spec
        .iter()
        .flat_map(|s| {
            s.containers.iter().chain(
                s.init_containers
                    .iter()
                    .flatten()
                    .filter(|c| is_restartable_init_container(c)),
            )
        })
        .filter_map(|c| {
            let hook = c.lifecycle.as_ref()?.pre_stop.as_ref()?;
            let st = status
                .container(&c.name)
                .filter(|st| st.state == ContainerState::Running)?;
            Some((c, st.id.clone(), hook))
        })
        .map(|(c, id, hook)| {
            let ip = ip.clone();
            async move {
                let ran =
                    tokio::time::timeout(limit, run_handler(cri, pod, c, &id, &ip, hook, limit))
                        .await;
                match ran {
                    Ok(Ok(())) => None,
                    Ok(Err(e)) => Some((c.name.clone(), e.to_string())),
                    Err(_) => Some((
                        c.name.clone(),
                        format!("PreStop hook did not finish within {grace}s"),
                    )),
                }
            }
        });
    for (name, message) in futures::future::join_all(hooks).await.into_iter().flatten() {
        recorder.record(PodEvent::warning("FailedPreStopHook", message, Some(name)));
    }
}
