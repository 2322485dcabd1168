//! GetPodStatus: the runtime's view of one pod, read over CRI by the pod's UID label.

use std::collections::{BTreeMap, HashMap};

use super::labels;
use crate::cri::{CriError, RuntimeService, api};
use crate::kubelet::runtime_pod::{
    ContainerState, ContainerStatus, RuntimePodStatus, SandboxState, SandboxStatus,
};

/// The annotations of a container's status a pod's status reads: its hash.
const READ_ANNOTATIONS: &[&str] = &[labels::CONTAINER_HASH];

fn uid_selector(uid: &str) -> HashMap<String, String> {
    HashMap::from([(labels::POD_UID.to_string(), uid.to_string())])
}

pub async fn get_pod_status<R: RuntimeService>(
    cri: &R,
    uid: &str,
    name: &str,
    namespace: &str,
) -> Result<RuntimePodStatus, CriError> {
    // The reads are independent, so they go out together: this runs before every sync and
    // after every change, on the path from a pod's ADD to its Running status. Of each
    // listed sandbox only its ID and attempt are kept, of each container only its ID.
    let (mut sandboxes, mut containers) = (Vec::new(), Vec::new());
    futures::future::try_join(
        cri.visit_pod_sandboxes(
            Some(api::PodSandboxFilter {
                label_selector: uid_selector(uid),
                ..Default::default()
            }),
            |id, attempt| sandboxes.push((id.to_string(), attempt)),
        ),
        cri.visit_container_states(
            Some(api::ContainerFilter {
                label_selector: uid_selector(uid),
                ..Default::default()
            }),
            "",
            |id, _, _| containers.push(id.to_string()),
        ),
    )
    .await?;
    let (sandbox_statuses, container_statuses) = futures::future::join(
        futures::future::join_all(
            sandboxes
                .iter()
                .map(|(id, _)| cri.pod_sandbox_status_reduced(id)),
        ),
        futures::future::join_all(
            containers
                .iter()
                .map(|id| cri.container_status_reduced(id, false, READ_ANNOTATIONS)),
        ),
    )
    .await;
    let mut status = RuntimePodStatus {
        uid: uid.to_string(),
        name: name.to_string(),
        namespace: namespace.to_string(),
        ..Default::default()
    };
    // Results come back in list order, so the status does not depend on which read
    // finished first.
    for ((id, attempt), result) in sandboxes.iter().zip(sandbox_statuses) {
        match result {
            Ok(resp) => status
                .sandboxes
                .push(sandbox_status(id, *attempt, resp.status)),
            // Removed between list and status: it no longer counts.
            Err(e) if e.is_not_found() => {}
            Err(e) => return Err(e),
        }
    }
    for result in container_statuses {
        match result {
            Ok(resp) => {
                if let Some(st) = resp.status {
                    status.containers.push(container_status(st));
                }
            }
            Err(e) if e.is_not_found() => {}
            Err(e) => return Err(e),
        }
    }
    status.normalize();
    Ok(status)
}

/// The pod's status after a sync that only added to it: `before`, the sync's input, with
/// the sandbox it created (`new_sandbox`, as read right after creation) and the
/// containers it started, each read again. The containers are read verbosely, which also
/// gives their host pids, by container ID (those the runtime gave).
///
/// kubelet publishes what its next relist finds; reading only what the sync touched
/// keeps the runtime, busy creating other pods, from answering lists of everything
/// else it already reported.
pub async fn status_after_start<R: RuntimeService>(
    cri: &R,
    before: &RuntimePodStatus,
    new_sandbox: Option<&api::PodSandboxStatus>,
    started: &[&str],
) -> Result<(RuntimePodStatus, BTreeMap<String, u32>), CriError> {
    let replies = futures::future::join_all(
        started
            .iter()
            .map(|id| cri.container_status_reduced(id, true, READ_ANNOTATIONS)),
    )
    .await;
    let mut status = before.clone();
    if let Some(sb) = new_sandbox {
        let attempt = sb.metadata.as_ref().map(|m| m.attempt).unwrap_or(0);
        status.sandboxes.retain(|s| s.id != sb.id);
        status
            .sandboxes
            .push(sandbox_status(&sb.id, attempt, Some(sb.clone())));
    }
    let mut pids = BTreeMap::new();
    for (id, reply) in started.iter().zip(replies) {
        let resp = match reply {
            Ok(resp) => resp,
            // Removed since it started: it no longer counts.
            Err(e) if e.is_not_found() => {
                status.containers.retain(|c| c.id != *id);
                continue;
            }
            Err(e) => return Err(e),
        };
        if let Some(pid) = pid_of(&resp) {
            pids.insert(id.to_string(), pid);
        }
        if let Some(st) = resp.status {
            let st = container_status(st);
            status.containers.retain(|c| c.id != st.id);
            status.containers.push(st);
        }
    }
    status.normalize();
    Ok((status, pids))
}

fn sandbox_status(id: &str, attempt: u32, st: Option<api::PodSandboxStatus>) -> SandboxStatus {
    let st = st.unwrap_or_default();
    let network = st.network.unwrap_or_default();
    let host_network = st
        .linux
        .and_then(|l| l.namespaces)
        .and_then(|n| n.options)
        .is_some_and(|o| o.network == api::NamespaceMode::Node as i32);
    SandboxStatus {
        id: id.to_string(),
        state: if st.state == api::PodSandboxState::SandboxReady as i32 {
            SandboxState::Ready
        } else {
            SandboxState::NotReady
        },
        attempt,
        created_at: st.created_at,
        ip: network.ip,
        additional_ips: network.additional_ips.into_iter().map(|i| i.ip).collect(),
        host_network,
    }
}

/// The host pid of a running container, from containerd's verbose status info.
pub async fn container_pid<R: RuntimeService>(cri: &R, container_id: &str) -> Option<u32> {
    pid_of(
        &cri.container_status_reduced(container_id, true, &[])
            .await
            .ok()?,
    )
}

/// The host pid in a verbose ContainerStatus reply (containerd's `info`), if any.
fn pid_of(resp: &api::ContainerStatusResponse) -> Option<u32> {
    let info: serde_json::Value = serde_json::from_str(resp.info.get("info")?).ok()?;
    info.get("pid")?
        .as_u64()
        .and_then(|p| u32::try_from(p).ok())
        .filter(|p| *p > 0)
}

fn container_status(st: api::ContainerStatus) -> ContainerStatus {
    let state = match api::ContainerState::try_from(st.state) {
        Ok(api::ContainerState::ContainerCreated) => ContainerState::Created,
        Ok(api::ContainerState::ContainerRunning) => ContainerState::Running,
        Ok(api::ContainerState::ContainerExited) => ContainerState::Exited,
        _ => ContainerState::Unknown,
    };
    ContainerStatus {
        name: st
            .metadata
            .as_ref()
            .map(|m| m.name.clone())
            .unwrap_or_default(),
        restart_count: st.metadata.as_ref().map(|m| m.attempt).unwrap_or(0),
        hash: st
            .annotations
            .get(labels::CONTAINER_HASH)
            .cloned()
            .unwrap_or_default(),
        id: st.id,
        state,
        created_at: st.created_at,
        started_at: st.started_at,
        finished_at: st.finished_at,
        exit_code: st.exit_code,
        reason: st.reason,
        message: st.message,
        image: st.image.map(|i| i.image).unwrap_or_default(),
        image_ref: st.image_ref,
        resources: None,
    }
}
