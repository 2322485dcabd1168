//! SyncPod: carry out computePodActions' decisions over CRI, in kubelet's order:
//! kill what must go, create the sandbox, start the next init container, then the
//! containers to start.

use k8s_openapi::api::core::v1::Pod;

use super::config::RuntimeConfig;
use super::container::{PodRuntimeFacts, start_container};
use super::event::{EventRecorder, PodEvent};
use super::kill::kill_pod;
use super::sandbox::{create_pod_sandbox, generate_pod_sandbox_config};
use super::volumes::mount_pod_volumes;
use super::{SyncError, SyncReason};
use crate::cri::{ImageService, RuntimeService};
use crate::kubelet::pod_actions::{PodActions, compute_pod_actions};
use crate::kubelet::runtime_pod::RuntimePodStatus;

/// What one SyncPod did: the decisions it acted on and the first error, if any.
#[derive(Debug)]
pub struct PodSyncResult {
    pub actions: PodActions,
    pub error: Option<SyncError>,
}

fn grace_period(pod: &Pod) -> i64 {
    pod.spec
        .as_ref()
        .and_then(|s| s.termination_grace_period_seconds)
        .unwrap_or(30)
}

pub async fn sync_pod<R: RuntimeService + ImageService>(
    cri: &R,
    cfg: &RuntimeConfig,
    pod: &Pod,
    status: &RuntimePodStatus,
    events: &dyn EventRecorder,
) -> PodSyncResult {
    let actions = compute_pod_actions(pod, status);
    let error = execute(cri, cfg, pod, status, &actions, events).await.err();
    if let Some(e) = &error {
        events.record(PodEvent::warning(
            e.reason.to_string(),
            e.message.clone(),
            e.container.clone(),
        ));
    }
    PodSyncResult { actions, error }
}

async fn execute<R: RuntimeService + ImageService>(
    cri: &R,
    cfg: &RuntimeConfig,
    pod: &Pod,
    status: &RuntimePodStatus,
    actions: &PodActions,
    events: &dyn EventRecorder,
) -> Result<(), SyncError> {
    let grace = grace_period(pod);
    if actions.kill_pod {
        if !status.sandboxes.is_empty() {
            if actions.create_sandbox {
                events.record(PodEvent::normal(
                    "SandboxChanged",
                    "Pod sandbox changed, it will be killed and re-created.",
                    None,
                ));
            }
            kill_pod(cri, status, grace).await?;
        }
    } else {
        for (id, why) in &actions.containers_to_kill {
            events.record(PodEvent::normal(
                "Killing",
                format!("Stopping container {}: {}", why.name, why.message),
                Some(why.name.clone()),
            ));
            cri.stop_container(id, grace).await.map_err(|e| {
                SyncError::cri(SyncReason::KillContainerError, e).for_container(&why.name)
            })?;
        }
    }

    let mut sandbox_id = actions.sandbox_id.clone();
    let mut facts = PodRuntimeFacts::default();
    if actions.create_sandbox {
        mount_pod_volumes(pod, cfg)?;
        let config = generate_pod_sandbox_config(pod, actions.attempt, cfg);
        let handler = pod
            .spec
            .as_ref()
            .and_then(|s| s.runtime_class_name.clone())
            .map(|class| cfg.runtime_handler(&class))
            .transpose()?
            .unwrap_or_default();
        sandbox_id = create_pod_sandbox(cri, config, &handler).await?;
        let st = cri
            .pod_sandbox_status(&sandbox_id)
            .await
            .map_err(|e| SyncError::cri(SyncReason::CreatePodSandboxError, e))?;
        if let Some(net) = st.status.and_then(|s| s.network) {
            facts.pod_ip = net.ip.clone();
            facts.pod_ips = std::iter::once(net.ip)
                .chain(net.additional_ips.into_iter().map(|i| i.ip))
                .filter(|ip| !ip.is_empty())
                .collect();
        }
    } else if let Some(sb) = status.newest_sandbox() {
        facts.pod_ip = sb.ip.clone();
        facts.pod_ips = std::iter::once(sb.ip.clone())
            .chain(sb.additional_ips.iter().cloned())
            .filter(|ip| !ip.is_empty())
            .collect();
    }
    if actions.next_init_container_to_start.is_none() && actions.containers_to_start.is_empty() {
        return Ok(());
    }

    let sandbox_config = generate_pod_sandbox_config(pod, actions.attempt, cfg);
    let spec = pod.spec.as_ref().expect("validated pods have a spec");
    let restart_count = |name: &str| {
        status
            .container(name)
            .map(|c| c.restart_count + 1)
            .unwrap_or(0)
    };
    let mut to_start = Vec::new();
    if let Some(i) = actions.next_init_container_to_start {
        to_start.extend(spec.init_containers.iter().flatten().nth(i));
    }
    to_start.extend(
        actions
            .containers_to_start
            .iter()
            .map(|&i| &spec.containers[i]),
    );

    let mut first_error = None;
    for c in to_start {
        let started = start_container(
            cri,
            pod,
            c,
            &sandbox_id,
            &sandbox_config,
            restart_count(&c.name),
            &facts,
            cfg,
            events,
        )
        .await;
        match started {
            Ok(_) => {}
            // kubelet tries every container and reports each failure; keep the first.
            Err(e) => {
                if first_error.is_none() {
                    first_error = Some(e);
                } else {
                    events.record(PodEvent::warning(
                        e.reason.to_string(),
                        e.message,
                        e.container,
                    ));
                }
            }
        }
    }
    match first_error {
        Some(e) => Err(e),
        None => Ok(()),
    }
}
