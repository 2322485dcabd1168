//! kubelet's computeInitContainerActions: where initialization stands, which init
//! containers to (re)start, and whether the pod has initialized. Sidecars (restartable
//! init containers) start in order with the others; the next init container starts once
//! a sidecar is running and, where it has a startupProbe, once that probe succeeded.
//! Sidecars are restarted whenever they exit, whatever the pod's restartPolicy.

use k8s_openapi::api::core::v1::Pod;

use super::pod_actions::{
    PodActions, container_changed, containers, init_containers, is_restartable_init_container,
    starting_resized_init_container,
};
use super::probe_results::{ProbeResult, ProbeResults};
use super::resize_actions::compute_pod_resize_action;
use super::restart_rules::{container_should_restart, restart_on_failure};
use super::runtime_pod::{ContainerState, ContainerStatus, RuntimePodStatus};

/// kubelet's isInitContainerFailed.
pub(super) fn is_init_container_failed(st: &ContainerStatus) -> bool {
    st.reason == "OOMKilled"
        || (st.state == ContainerState::Exited && st.exit_code != 0)
        || st.state == ContainerState::Unknown
}

/// Fills `actions` with the init containers to start (and to kill first) and returns
/// whether the pod has initialized, so its regular containers may be looked at. Sets
/// `kill_pod` when an init container failed and the pod must not restart it.
pub fn compute_init_container_actions(
    pod: &Pod,
    status: &RuntimePodStatus,
    probes: &ProbeResults,
    actions: &mut PodActions,
) -> bool {
    let init = init_containers(pod);
    if init.is_empty() {
        return true;
    }

    // A created or running regular container means every init container ran at some
    // point, though the runtime may have removed them since. Exited ones do not count:
    // after a node reboot every container is exited, and the new sandbox has not
    // initialized.
    let mut initialized = containers(pod).iter().any(|c| {
        status
            .container(&c.name)
            .is_some_and(|st| matches!(st.state, ContainerState::Created | ContainerState::Running))
    });
    let mut previously_initialized = initialized;

    // Walk backwards: completed init containers may have been removed from the runtime,
    // so the last one that has a status tells where initialization stands. The ones
    // before it only matter if they are sidecars to keep running.
    let mut to_start = Vec::new();
    for i in (0..init.len()).rev() {
        let c = &init[i];
        let sidecar = is_restartable_init_container(c);
        let Some(st) = status.container(&c.name) else {
            // Gone from the runtime after initialization: only a sidecar comes back.
            if previously_initialized && sidecar {
                to_start.push(i);
            }
            continue;
        };
        if previously_initialized && !sidecar {
            // After initialization only sidecars need to be kept running.
            continue;
        }

        match st.state {
            // Created but never started (the runtime failed to start it): start it.
            ContainerState::Created => to_start.push(i),
            // An ordinary init container still running: wait for it.
            ContainerState::Running if !sidecar => {}
            ContainerState::Running => 'sidecar: {
                if c.startup_probe.is_some() {
                    match probes.startup(&st.id) {
                        // Not probed yet, or no verdict: wait.
                        None | Some(ProbeResult::Unknown) => break 'sidecar,
                        Some(ProbeResult::Failure) => {
                            actions.kill(
                                st,
                                format!("Init container {} failed startup probe", c.name),
                            );
                            to_start.push(i);
                            break 'sidecar;
                        }
                        Some(ProbeResult::Success) => {}
                    }
                }
                if i == init.len() - 1 {
                    initialized = true;
                } else if !previously_initialized {
                    // Started for the first time: the next init container may start.
                    to_start.push(i + 1);
                }
                if container_changed(c, st) {
                    actions.kill(st, format!("Init container {} definition changed", c.name));
                    to_start.push(i);
                    break 'sidecar;
                }
                // A sidecar's liveness does not hold back the next init container, but a
                // failure restarts it.
                if c.liveness_probe.is_some()
                    && probes.liveness(&st.id) == Some(ProbeResult::Failure)
                {
                    actions.kill(
                        st,
                        format!("Init container {} failed liveness probe", c.name),
                    );
                    to_start.push(i);
                    break 'sidecar;
                }
                if !compute_pod_resize_action(pod, i, true, st, actions) {
                    // Restarted for its resize policy; the resize recorded the kill.
                    to_start.push(i);
                }
            }
            ContainerState::Exited if sidecar => to_start.push(i),
            ContainerState::Exited => {
                if is_init_container_failed(st) {
                    if !container_should_restart(c, pod, st.exit_code) {
                        actions.kill_pod = true;
                        actions.init_containers_to_start.clear();
                        return false;
                    }
                    to_start.push(i);
                } else if i == init.len() - 1 {
                    initialized = true;
                } else {
                    to_start.push(i + 1);
                }
            }
            ContainerState::Unknown => {
                if !sidecar && !restart_on_failure(c, pod) {
                    actions.kill_pod = true;
                    actions.init_containers_to_start.clear();
                    return false;
                }
                actions.kill(
                    st,
                    "Init container is in \"unknown\" state, try killing it before restart".into(),
                );
                to_start.push(i);
            }
        }
        // Everything before this init container has initialized.
        previously_initialized = true;
    }

    // No init container has started yet: start the first.
    if !previously_initialized {
        to_start.push(0);
    }
    // Found walking backwards; start in spec order.
    to_start.reverse();
    actions.init_containers_to_start.extend(to_start);
    if !actions.update_pod_resources {
        actions.update_pod_resources = starting_resized_init_container(pod, actions, status);
    }
    initialized
}
