//! kubelet's syncTerminatingPod and the cleanup after it: stop every container with the
//! grace period, stop and remove the sandbox, then remove the pod's directories.

use std::sync::Arc;

use k8s_openapi::api::core::v1::Pod;

use crate::cri::RuntimeService;
use crate::kubelet::pod_workers::WorkOutcome;
use crate::kubelet::runtime_pod::ContainerState;
use crate::kuberuntime::event::{EventRecorder, PodEvent};
use crate::kuberuntime::{get_pod_status, kill, labels, volumes};

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
    for c in status
        .containers
        .iter()
        .filter(|c| c.state == ContainerState::Running)
    {
        recorder.record(PodEvent::normal(
            "Killing",
            format!("Stopping container {}", c.name),
            Some(c.name.clone()),
        ));
    }
    if let Err(e) = kill::kill_pod(cri, &status, grace).await {
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
