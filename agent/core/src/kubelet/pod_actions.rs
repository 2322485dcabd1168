//! computePodActions: given the pod as desired (with its allocated resources) and the
//! runtime's view of it, decide what SyncPod must do. Pure: no IO, no clock; the same
//! inputs always give the same actions. Follows kubelet 1.37 with its default feature
//! gates: sidecars (restartable init containers) and in-place pod resize.

use std::collections::BTreeMap;

use k8s_openapi::api::core::v1::{Container, Pod};
use serde::Serialize;

use super::container_hash::container_hash;
use super::init_container_actions::compute_init_container_actions;
use super::probe_results::{ProbeResult, ProbeResults};
use super::resize_actions::{ResourceName, compute_pod_resize_action, desired_resources};
use super::restart_rules::{container_should_restart, restart_on_failure, runs_once};
use super::runtime_pod::{
    ContainerResources, ContainerState, ContainerStatus, RuntimePodStatus, SandboxState,
};

/// Why a running container is to be killed.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct KillReason {
    pub name: String,
    pub message: String,
}

/// One container whose resources change in place (kubelet's containerToUpdateInfo).
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct ContainerUpdate {
    pub name: String,
    pub container_id: String,
    /// A restartable init container (index into `spec.initContainers`), else a regular
    /// container (index into `spec.containers`).
    pub init: bool,
    pub index: usize,
    pub desired: ContainerResources,
    pub current: ContainerResources,
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
    /// Indices into `spec.initContainers` to start, in spec order: the next ordinary init
    /// container and any sidecars to (re)start.
    pub init_containers_to_start: Vec<usize>,
    /// Indices into `spec.containers` to start, ascending.
    pub containers_to_start: Vec<usize>,
    /// Running containers to kill, by container ID (ordered).
    pub containers_to_kill: BTreeMap<String, KillReason>,
    /// In-place resizes per resource, decreases before increases.
    pub containers_to_update: BTreeMap<ResourceName, Vec<ContainerUpdate>>,
    /// The pod cgroup must be resized (a container's resources change).
    pub update_pod_resources: bool,
}

impl PodActions {
    /// True when SyncPod has nothing to do.
    pub fn is_noop(&self) -> bool {
        !self.kill_pod
            && !self.create_sandbox
            && self.init_containers_to_start.is_empty()
            && self.containers_to_start.is_empty()
            && self.containers_to_kill.is_empty()
            && self.containers_to_update.is_empty()
            && !self.update_pod_resources
    }

    pub(super) fn kill(&mut self, st: &ContainerStatus, message: String) {
        self.containers_to_kill.insert(
            st.id.clone(),
            KillReason {
                name: st.name.clone(),
                message,
            },
        );
    }
}

/// kubelet's startingResizedContainer over the init containers about to start.
pub(super) fn starting_resized_init_container(
    pod: &Pod,
    actions: &PodActions,
    status: &RuntimePodStatus,
) -> bool {
    starting_resized_container(
        init_containers(pod),
        &actions.init_containers_to_start,
        status,
    )
}

pub(super) fn restart_policy(pod: &Pod) -> &str {
    pod.spec
        .as_ref()
        .and_then(|s| s.restart_policy.as_deref())
        .unwrap_or("Always")
}

pub(super) fn should_restart_on_failure(pod: &Pod) -> bool {
    restart_policy(pod) != "Never"
}

fn host_network(pod: &Pod) -> bool {
    pod.spec
        .as_ref()
        .and_then(|s| s.host_network)
        .unwrap_or(false)
}

pub(super) fn containers(pod: &Pod) -> &[Container] {
    pod.spec
        .as_ref()
        .map(|s| &s.containers[..])
        .unwrap_or_default()
}

pub(super) fn init_containers(pod: &Pod) -> &[Container] {
    pod.spec
        .as_ref()
        .and_then(|s| s.init_containers.as_deref())
        .unwrap_or_default()
}

/// A sidecar: an init container with `restartPolicy: Always`.
pub fn is_restartable_init_container(c: &Container) -> bool {
    c.restart_policy.as_deref() == Some("Always")
}

/// kubelet's containerChanged: the running container was created from another spec, as
/// far as the container hash covers it.
pub(super) fn container_changed(c: &Container, st: &ContainerStatus) -> bool {
    st.hash != container_hash(c)
}

/// kubelet's PodSandboxChanged: (create a new sandbox?, its attempt, current sandbox ID).
/// The newest sandbox decides; the attempt counts on from it.
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
        ContainerState::Exited => container_should_restart(c, pod, st.exit_code),
    }
}

/// kubelet's startingResizedContainer: a container about to start whose allocation is not
/// what the runtime last applied to it (a missing record counts as nothing applied).
fn starting_resized_container(
    list: &[Container],
    to_start: &[usize],
    status: &RuntimePodStatus,
) -> bool {
    to_start.iter().filter_map(|&i| list.get(i)).any(|c| {
        let actuated = status
            .container(&c.name)
            .and_then(|st| st.resources)
            .unwrap_or_default();
        actuated != desired_resources(c)
    })
}

fn container_succeeded(c: &Container, status: &RuntimePodStatus) -> bool {
    status
        .container(&c.name)
        .is_some_and(|st| st.state == ContainerState::Exited && st.exit_code == 0)
}

/// kubelet's hasAnyRegularContainerCreated: a regular container exists in the runtime
/// (created, running or exited), so initialization finished at some point.
fn has_any_regular_container_created(pod: &Pod, status: &RuntimePodStatus) -> bool {
    containers(pod).iter().any(|c| {
        status.container(&c.name).is_some_and(|st| {
            matches!(
                st.state,
                ContainerState::Created | ContainerState::Running | ContainerState::Exited
            )
        })
    })
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

    // A new sandbox restarts the pod from scratch: everything is killed, initialization
    // starts over from the first init container.
    if create_sandbox {
        // With restartPolicy Never, a pod whose sandbox died after its containers ran is
        // not brought back: the containers would run twice.
        if !should_restart_on_failure(pod) && attempt != 0 && !status.containers.is_empty() {
            actions.create_sandbox = false;
            return actions;
        }
        let to_start: Vec<usize> = containers(pod)
            .iter()
            .enumerate()
            .filter(|(_, c)| !(runs_once(c, pod) && container_succeeded(c, status)))
            .map(|(i, _)| i)
            .collect();
        // Initialization is done and no container would start: only kill the pod.
        if to_start.is_empty() && has_any_regular_container_created(pod, status) {
            actions.create_sandbox = false;
            return actions;
        }
        if !init_containers(pod).is_empty() {
            actions.init_containers_to_start = vec![0];
            return actions;
        }
        actions.containers_to_start = to_start;
        return actions;
    }

    let initialized = compute_init_container_actions(pod, status, probes, &mut actions);
    if actions.kill_pod || !initialized {
        return actions;
    }

    let mut keep = 0;
    for (i, c) in containers(pod).iter().enumerate() {
        let st = status.container(&c.name);
        let Some(st) = st.filter(|st| st.state == ContainerState::Running) else {
            if should_container_be_restarted(pod, c, status) {
                actions.containers_to_start.push(i);
                // Unknown may still be running: kill it first so two never run at once.
                if let Some(st) = st.filter(|st| st.state == ContainerState::Unknown) {
                    actions.kill(
                        st,
                        "Container is in \"unknown\" state, try killing it before restart".into(),
                    );
                }
            }
            continue;
        };
        let mut restart = restart_on_failure(c, pod);
        let message = if container_changed(c, st) {
            // A changed spec restarts the container whatever the restart policy.
            restart = true;
            format!("Container {} definition changed", c.name)
        } else if probes.liveness(&st.id) == Some(ProbeResult::Failure) {
            format!("Container {} failed liveness probe", c.name)
        } else if probes.startup(&st.id) == Some(ProbeResult::Failure) {
            format!("Container {} failed startup probe", c.name)
        } else if !compute_pod_resize_action(pod, i, false, st, &mut actions) {
            // Its resize policy restarts it; the resize recorded the kill.
            actions.containers_to_start.push(i);
            continue;
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
        actions.kill(st, message);
    }

    if keep == 0 && actions.containers_to_start.is_empty() {
        actions.kill_pod = true;
        // Sidecars must not keep a finished pod alive.
        actions.init_containers_to_start.clear();
    }
    if !actions.update_pod_resources {
        actions.update_pod_resources =
            starting_resized_container(containers(pod), &actions.containers_to_start, status);
    }
    actions
}
