//! computePodActions: given the pod as desired and the runtime's view of it, decide what
//! SyncPod must do. Pure: no IO, no clock; the same inputs always give the same actions.

use std::collections::BTreeMap;

use k8s_openapi::api::core::v1::{Container, Pod};
use serde::Serialize;

use super::container_hash::container_hash;
use super::probe_results::ProbeResults;
use super::runtime_pod::{ContainerState, ContainerStatus, RuntimePodStatus, SandboxState};

/// Why a running container is to be killed.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct KillReason {
    pub name: String,
    pub message: String,
}

/// What SyncPod must do for one pod, in the order it does it.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize)]
pub struct PodActions {
    /// Stop every container and the sandbox before anything else.
    pub kill_pod: bool,
    /// Create a new sandbox (after `kill_pod`).
    pub create_sandbox: bool,
    /// The sandbox to reuse, or the one being replaced.
    pub sandbox_id: String,
    /// Attempt number of the sandbox to create.
    pub attempt: u32,
    /// Index into `spec.initContainers` of the init container to start next.
    pub next_init_container_to_start: Option<usize>,
    /// Indices into `spec.containers` to start, ascending.
    pub containers_to_start: Vec<usize>,
    /// Running containers to kill, by container ID (ordered).
    pub containers_to_kill: BTreeMap<String, KillReason>,
}

impl PodActions {
    /// True when SyncPod has nothing to do.
    pub fn is_noop(&self) -> bool {
        !self.kill_pod
            && !self.create_sandbox
            && self.next_init_container_to_start.is_none()
            && self.containers_to_start.is_empty()
            && self.containers_to_kill.is_empty()
    }
}

fn restart_policy(pod: &Pod) -> &str {
    pod.spec
        .as_ref()
        .and_then(|s| s.restart_policy.as_deref())
        .unwrap_or("Always")
}

fn should_restart_on_failure(pod: &Pod) -> bool {
    restart_policy(pod) != "Never"
}

fn host_network(pod: &Pod) -> bool {
    pod.spec
        .as_ref()
        .and_then(|s| s.host_network)
        .unwrap_or(false)
}

fn containers(pod: &Pod) -> &[Container] {
    pod.spec
        .as_ref()
        .map(|s| &s.containers[..])
        .unwrap_or_default()
}

fn init_containers(pod: &Pod) -> &[Container] {
    pod.spec
        .as_ref()
        .and_then(|s| s.init_containers.as_deref())
        .unwrap_or_default()
}

/// kubelet's podSandboxChanged: (create a new sandbox?, its attempt, current sandbox ID).
fn pod_sandbox_changed(pod: &Pod, status: &RuntimePodStatus) -> (bool, u32, String) {
    let Some(newest) = status.newest_sandbox() else {
        return (true, 0, String::new());
    };
    let ready = status
        .sandboxes
        .iter()
        .filter(|s| s.state == SandboxState::Ready)
        .count();
    let next = newest.attempt + 1;
    if ready > 1 || newest.state != SandboxState::Ready {
        return (true, next, newest.id.clone());
    }
    if newest.host_network != host_network(pod) {
        return (true, next, String::new());
    }
    if !host_network(pod) && newest.ip.is_empty() {
        return (true, next, newest.id.clone());
    }
    (false, newest.attempt, newest.id.clone())
}

/// kubelet's ShouldContainerBeRestarted, for a container that is not running.
pub fn should_container_be_restarted(pod: &Pod, c: &Container, status: &RuntimePodStatus) -> bool {
    if pod.metadata.deletion_timestamp.is_some() {
        return false;
    }
    let Some(st) = status.container(&c.name) else {
        return true;
    };
    match st.state {
        ContainerState::Running => false,
        ContainerState::Created | ContainerState::Unknown => true,
        ContainerState::Exited => match restart_policy(pod) {
            "Never" => false,
            "OnFailure" => st.exit_code != 0,
            _ => true,
        },
    }
}

fn init_container_failed(st: &ContainerStatus) -> bool {
    st.reason == "OOMKilled"
        || (st.state == ContainerState::Exited && st.exit_code != 0)
        || st.state == ContainerState::Unknown
}

/// Where init containers stand: done, or the last one's status and the next to run.
enum InitProgress<'a> {
    Done,
    /// An init container is running: wait.
    Running,
    Next {
        last: Option<&'a ContainerStatus>,
        index: usize,
    },
}

fn find_next_init_container_to_run<'a>(
    pod: &Pod,
    status: &'a RuntimePodStatus,
) -> InitProgress<'a> {
    let init = init_containers(pod);
    if init.is_empty() {
        return InitProgress::Done;
    }
    // Once any app container exists, initialization finished earlier.
    if containers(pod)
        .iter()
        .any(|c| status.container(&c.name).is_some())
    {
        return InitProgress::Done;
    }
    for (i, c) in init.iter().enumerate().rev() {
        if let Some(st) = status
            .container(&c.name)
            .filter(|st| init_container_failed(st))
        {
            return InitProgress::Next {
                last: Some(st),
                index: i,
            };
        }
    }
    for (i, c) in init.iter().enumerate().rev() {
        let Some(st) = status.container(&c.name) else {
            continue;
        };
        match st.state {
            ContainerState::Running => return InitProgress::Running,
            ContainerState::Exited if i == init.len() - 1 => return InitProgress::Done,
            ContainerState::Exited => {
                return InitProgress::Next {
                    last: Some(st),
                    index: i + 1,
                };
            }
            _ => {}
        }
    }
    InitProgress::Next {
        last: None,
        index: 0,
    }
}

/// Decides what SyncPod does for `pod` given the runtime's `status` of it.
pub fn compute_pod_actions(
    pod: &Pod,
    status: &RuntimePodStatus,
    probes: &ProbeResults,
) -> PodActions {
    let (create_sandbox, attempt, sandbox_id) = pod_sandbox_changed(pod, status);
    let mut actions = PodActions {
        kill_pod: create_sandbox,
        create_sandbox,
        sandbox_id,
        attempt,
        ..PodActions::default()
    };

    if create_sandbox {
        // With restartPolicy Never, a pod whose sandbox died after its containers ran is
        // not brought back: the containers would run twice.
        if !should_restart_on_failure(pod) && attempt != 0 && !status.containers.is_empty() {
            actions.create_sandbox = false;
            return actions;
        }
        if !init_containers(pod).is_empty() {
            actions.next_init_container_to_start = Some(0);
            return actions;
        }
        let on_failure = restart_policy(pod) == "OnFailure";
        for (i, c) in containers(pod).iter().enumerate() {
            let succeeded = status
                .container(&c.name)
                .is_some_and(|st| st.state == ContainerState::Exited && st.exit_code == 0);
            if on_failure && succeeded {
                continue;
            }
            actions.containers_to_start.push(i);
        }
        return actions;
    }

    match find_next_init_container_to_run(pod, status) {
        InitProgress::Done => {}
        InitProgress::Running => return actions,
        InitProgress::Next { last, index } => {
            let failed = last.is_some_and(init_container_failed);
            if failed && !should_restart_on_failure(pod) {
                actions.kill_pod = true;
            } else {
                if let Some(st) = last.filter(|st| st.state == ContainerState::Unknown) {
                    actions.containers_to_kill.insert(
                        st.id.clone(),
                        KillReason {
                            name: st.name.clone(),
                            message:
                                "init container is in unknown state, try killing it before restart"
                                    .into(),
                        },
                    );
                }
                actions.next_init_container_to_start = Some(index);
            }
            return actions;
        }
    }

    let mut keep = 0;
    for (i, c) in containers(pod).iter().enumerate() {
        let Some(st) = status
            .container(&c.name)
            .filter(|st| st.state == ContainerState::Running)
        else {
            if should_container_be_restarted(pod, c, status) {
                actions.containers_to_start.push(i);
            }
            continue;
        };
        let mut restart = should_restart_on_failure(pod);
        let message = if st.hash != container_hash(c) {
            // A changed spec restarts the container whatever the restart policy.
            restart = true;
            format!("Container {} definition changed", c.name)
        } else if probes.liveness_failed.contains(&st.id) {
            format!("Container {} failed liveness probe", c.name)
        } else if probes.startup_failed.contains(&st.id) {
            format!("Container {} failed startup probe", c.name)
        } else {
            keep += 1;
            continue;
        };
        let message = if restart {
            actions.containers_to_start.push(i);
            format!("{message}, will be restarted")
        } else {
            message
        };
        actions.containers_to_kill.insert(
            st.id.clone(),
            KillReason {
                name: c.name.clone(),
                message,
            },
        );
    }
    if keep == 0 && actions.containers_to_start.is_empty() {
        actions.kill_pod = true;
    }
    actions
}
