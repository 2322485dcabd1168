//! killPod: stop every container with the grace period, then stop the sandbox; and
//! removal of a pod's runtime objects once it is gone.

use k8s_openapi::api::core::v1::Pod;

use super::{SyncError, SyncReason};
use crate::cri::RuntimeService;
use crate::kubelet::pod_actions::is_restartable_init_container;
use crate::kubelet::runtime_pod::{ContainerState, ContainerStatus, RuntimePodStatus};

/// kubelet's minimumGracePeriodInSeconds: what a container gets when the grace period
/// was used up by those stopped before it.
const MIN_GRACE_SECONDS: i64 = 2;

/// The order in which a pod's containers stop (kubelet's terminationOrdering): regular
/// containers first, all at once; then the sidecars one at a time in the reverse of their
/// order in the spec, so each sidecar outlives the containers that may depend on it.
/// Returns the running or created containers in groups to stop one group after another.
pub fn termination_order<'a>(
    pod: &Pod,
    status: &'a RuntimePodStatus,
) -> Vec<Vec<&'a ContainerStatus>> {
    let sidecars: Vec<&str> = pod
        .spec
        .iter()
        .flat_map(|s| s.init_containers.iter().flatten())
        .filter(|c| is_restartable_init_container(c))
        .map(|c| c.name.as_str())
        .collect();
    let live = status
        .containers
        .iter()
        .filter(|c| matches!(c.state, ContainerState::Running | ContainerState::Created));
    let (mut side, regular): (Vec<_>, Vec<_>) =
        live.partition(|c| sidecars.contains(&c.name.as_str()));
    side.sort_by_key(|c| std::cmp::Reverse(sidecars.iter().position(|n| *n == c.name)));
    let mut groups = vec![regular];
    groups.extend(side.into_iter().map(|c| vec![c]));
    groups.retain(|g| !g.is_empty());
    groups
}

/// Stops the pod's running containers in kubelet's termination order, each within what
/// is left of the grace period (at least kubelet's minimum of 2 s), then its sandboxes.
pub async fn kill_pod<R: RuntimeService>(
    cri: &R,
    pod: &Pod,
    status: &RuntimePodStatus,
    grace_seconds: i64,
) -> Result<(), SyncError> {
    let began = tokio::time::Instant::now();
    for group in termination_order(pod, status) {
        let left = (grace_seconds - began.elapsed().as_secs() as i64).max(MIN_GRACE_SECONDS);
        let grace = if grace_seconds <= 0 {
            grace_seconds
        } else {
            left.min(grace_seconds)
        };
        let stops = group.into_iter().map(|c| async move {
            cri.stop_container(&c.id, grace)
                .await
                .or_else(|e| if e.is_not_found() { Ok(()) } else { Err(e) })
                .map_err(|e| {
                    SyncError::cri(SyncReason::KillContainerError, e).for_container(&c.name)
                })
        });
        for r in futures::future::join_all(stops).await {
            r?;
        }
    }
    for sb in &status.sandboxes {
        cri.stop_pod_sandbox(&sb.id)
            .await
            .or_else(|e| if e.is_not_found() { Ok(()) } else { Err(e) })
            .map_err(|e| SyncError::cri(SyncReason::KillPodSandboxError, e))?;
    }
    Ok(())
}

/// Removes the pod's containers and sandboxes from the runtime (after `kill_pod`).
pub async fn remove_pod<R: RuntimeService>(
    cri: &R,
    status: &RuntimePodStatus,
) -> Result<(), SyncError> {
    for c in &status.containers {
        cri.remove_container(&c.id)
            .await
            .or_else(|e| if e.is_not_found() { Ok(()) } else { Err(e) })
            .map_err(|e| {
                SyncError::cri(SyncReason::KillContainerError, e).for_container(&c.name)
            })?;
    }
    for sb in &status.sandboxes {
        cri.remove_pod_sandbox(&sb.id)
            .await
            .or_else(|e| if e.is_not_found() { Ok(()) } else { Err(e) })
            .map_err(|e| SyncError::cri(SyncReason::KillPodSandboxError, e))?;
    }
    Ok(())
}
