//! killPod: stop every container with the grace period, then stop the sandbox; and
//! removal of a pod's runtime objects once it is gone.

use super::{SyncError, SyncReason};
use crate::cri::RuntimeService;
use crate::kubelet::runtime_pod::{ContainerState, RuntimePodStatus};

/// Stops the pod's running containers (in parallel, as kubelet does) then its sandboxes.
pub async fn kill_pod<R: RuntimeService>(
    cri: &R,
    status: &RuntimePodStatus,
    grace_seconds: i64,
) -> Result<(), SyncError> {
    let stops = status
        .containers
        .iter()
        .filter(|c| matches!(c.state, ContainerState::Running | ContainerState::Created))
        .map(|c| async move {
            cri.stop_container(&c.id, grace_seconds)
                .await
                .or_else(|e| if e.is_not_found() { Ok(()) } else { Err(e) })
                .map_err(|e| {
                    SyncError::cri(SyncReason::KillContainerError, e).for_container(&c.name)
                })
        });
    for r in futures::future::join_all(stops).await {
        r?;
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
