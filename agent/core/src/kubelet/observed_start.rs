//! A container's start as the kernel reports it, shown before the runtime confirms it.
//!
//! The probes see the container's program exec in the container's cgroup: from then on
//! the container runs. The runtime's StartContainer returns some milliseconds later
//! (runc and its shim finish their own work first), and kubelet would show the start
//! only at its next relist. The agent shows it at the exec. Readiness and `started` stay
//! false until the sync that follows StartContainer publishes the runtime's account,
//! which also settles the pod's phase and conditions; no decision waits on this.

use k8s_openapi::api::core::v1::{ContainerState, ContainerStateRunning, PodStatus};

use super::status::{api_container_id, container_statuses_mut};

/// `status` with the container named `name` shown running as `container_id` (its
/// `attempt`-th instance); `None` when the status already knows that instance (running,
/// or already exited) or has no container of that name.
pub fn with_observed_start(
    status: &PodStatus,
    name: &str,
    container_id: &str,
    attempt: u32,
) -> Option<PodStatus> {
    let mut status = status.clone();
    let api_id = api_container_id(container_id);
    let cs = container_statuses_mut(&mut status).find(|cs| cs.name == name)?;
    let last_is_this = cs
        .last_state
        .as_ref()
        .and_then(|s| s.terminated.as_ref())
        .is_some_and(|t| t.container_id.as_deref() == Some(api_id.as_str()));
    if cs.container_id.as_deref() == Some(api_id.as_str()) || last_is_this {
        return None;
    }
    // The instance this one replaces, if the status still shows it as its state.
    if let Some(previous) = cs.state.take().filter(|s| s.terminated.is_some()) {
        cs.last_state = Some(previous);
    }
    cs.state = Some(ContainerState {
        running: Some(ContainerStateRunning { started_at: None }),
        ..ContainerState::default()
    });
    cs.container_id = Some(api_id);
    cs.restart_count = i32::try_from(attempt).unwrap_or(i32::MAX);
    cs.ready = false;
    cs.started = Some(false);
    Some(status)
}

#[cfg(test)]
mod tests {
    use k8s_openapi::api::core::v1::{
        ContainerStateTerminated, ContainerStateWaiting, ContainerStatus,
    };

    use super::*;

    fn waiting(name: &str, reason: &str) -> ContainerStatus {
        ContainerStatus {
            name: name.into(),
            state: Some(ContainerState {
                waiting: Some(ContainerStateWaiting {
                    reason: Some(reason.into()),
                    message: None,
                }),
                ..ContainerState::default()
            }),
            started: Some(false),
            ..ContainerStatus::default()
        }
    }

    fn terminated(id: &str) -> ContainerState {
        ContainerState {
            terminated: Some(ContainerStateTerminated {
                exit_code: 1,
                container_id: Some(format!("containerd://{id}")),
                ..ContainerStateTerminated::default()
            }),
            ..ContainerState::default()
        }
    }

    fn pod(statuses: Vec<ContainerStatus>) -> PodStatus {
        PodStatus {
            phase: Some("Pending".into()),
            container_statuses: Some(statuses),
            ..PodStatus::default()
        }
    }

    #[test]
    fn a_creating_container_shows_running_but_not_ready() {
        let before = pod(vec![
            waiting("app", "ContainerCreating"),
            waiting("side", "ContainerCreating"),
        ]);
        let after = with_observed_start(&before, "app", "aaa", 0).expect("a change");
        let cs = &after.container_statuses.as_ref().unwrap()[0];
        assert!(cs.state.as_ref().unwrap().running.is_some());
        assert_eq!(cs.container_id.as_deref(), Some("containerd://aaa"));
        assert!(!cs.ready);
        assert_eq!(cs.started, Some(false));
        assert_eq!(
            after.container_statuses.as_ref().unwrap()[1],
            before.container_statuses.as_ref().unwrap()[1],
            "the other container is untouched"
        );
        assert_eq!(after.phase.as_deref(), Some("Pending"), "the phase waits");
    }

    #[test]
    fn a_restart_keeps_the_previous_exit_as_the_last_state() {
        // In back-off: waiting, with the exit as the last state.
        let mut backoff = waiting("app", "CrashLoopBackOff");
        backoff.container_id = Some("containerd://old".into());
        backoff.last_state = Some(terminated("old"));
        backoff.restart_count = 2;
        let after = with_observed_start(&pod(vec![backoff]), "app", "new", 3).unwrap();
        let cs = &after.container_statuses.unwrap()[0];
        assert!(cs.state.as_ref().unwrap().running.is_some());
        assert_eq!(cs.last_state, Some(terminated("old")));
        assert_eq!(cs.restart_count, 3);

        // Still showing the exit as its state: that becomes the last state.
        let mut exited = waiting("app", "x");
        exited.state = Some(terminated("old"));
        exited.container_id = Some("containerd://old".into());
        let after = with_observed_start(&pod(vec![exited]), "app", "new", 1).unwrap();
        let cs = &after.container_statuses.unwrap()[0];
        assert_eq!(cs.last_state, Some(terminated("old")));
        assert_eq!(cs.container_id.as_deref(), Some("containerd://new"));
    }

    #[test]
    fn an_instance_the_status_already_knows_is_left_alone() {
        let once = with_observed_start(
            &pod(vec![waiting("app", "ContainerCreating")]),
            "app",
            "aaa",
            0,
        )
        .unwrap();
        assert!(with_observed_start(&once, "app", "aaa", 0).is_none());
        // It ran and exited before the exec was seen: the runtime's account stands.
        let mut gone = waiting("app", "CrashLoopBackOff");
        gone.last_state = Some(terminated("aaa"));
        assert!(with_observed_start(&pod(vec![gone]), "app", "aaa", 0).is_none());
        assert!(with_observed_start(&once, "nope", "bbb", 0).is_none());
    }
}
