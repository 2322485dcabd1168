//! A container's exit as the kernel reports it, shown before the runtime confirms it.
//!
//! The agent watches each container's process through a pidfd, so it knows of an exit,
//! and its exit status, the moment the kernel does. containerd takes tens of
//! milliseconds more (its shim reaps the process, runs `runc` to clean up, then publishes
//! the exit) before its ContainerStatus stops saying running. Decisions (restart,
//! back-off) still wait for the runtime; only the published status shows the exit early,
//! and the next sync replaces it with the runtime's own account.

use k8s_openapi::api::core::v1::{ContainerState, ContainerStateTerminated, PodStatus};

use super::status::{api_container_id, container_statuses_mut};

/// `status` with the running container `container_id` shown terminated with
/// `exit_code`, and the pod's readiness conditions false; `None` when no running container
/// has that ID (the runtime's account already arrived, or it is another pod's).
pub fn with_observed_exit(
    status: &PodStatus,
    container_id: &str,
    exit_code: i32,
) -> Option<PodStatus> {
    let mut status = status.clone();
    let api_id = api_container_id(container_id);
    let cs = container_statuses_mut(&mut status).find(|cs| {
        cs.container_id.as_deref() == Some(api_id.as_str())
            && cs.state.as_ref().is_some_and(|s| s.running.is_some())
    })?;
    cs.state = Some(ContainerState {
        terminated: Some(ContainerStateTerminated {
            exit_code,
            reason: Some(if exit_code == 0 { "Completed" } else { "Error" }.to_string()),
            container_id: Some(api_id),
            ..ContainerStateTerminated::default()
        }),
        ..ContainerState::default()
    });
    cs.ready = false;
    cs.started = Some(false);
    for c in status.conditions.iter_mut().flatten() {
        if (c.type_ == "Ready" || c.type_ == "ContainersReady") && c.status == "True" {
            c.status = "False".to_string();
            c.reason = Some("ContainersNotReady".to_string());
        }
    }
    Some(status)
}

/// The exit code kubelet shows for a wait status: the exit status, or 128 plus the signal
/// that ended the process.
pub fn exit_code_of_wait_status(wait_status: i32) -> i32 {
    let signal = wait_status & 0x7f;
    if signal == 0 {
        (wait_status >> 8) & 0xff
    } else {
        128 + signal
    }
}

#[cfg(test)]
mod tests {
    use k8s_openapi::api::core::v1::{ContainerStateRunning, ContainerStatus, PodCondition};

    use super::*;

    fn running(id: &str) -> ContainerStatus {
        ContainerStatus {
            name: "app".into(),
            container_id: Some(format!("containerd://{id}")),
            ready: true,
            started: Some(true),
            state: Some(ContainerState {
                running: Some(ContainerStateRunning::default()),
                ..ContainerState::default()
            }),
            ..ContainerStatus::default()
        }
    }

    fn pod_status() -> PodStatus {
        PodStatus {
            phase: Some("Running".into()),
            container_statuses: Some(vec![running("aaa"), running("bbb")]),
            conditions: Some(vec![
                PodCondition {
                    type_: "Ready".into(),
                    status: "True".into(),
                    ..PodCondition::default()
                },
                PodCondition {
                    type_: "PodScheduled".into(),
                    status: "True".into(),
                    ..PodCondition::default()
                },
            ]),
            ..PodStatus::default()
        }
    }

    #[test]
    fn the_exited_container_shows_terminated_and_the_pod_not_ready() {
        let after = with_observed_exit(&pod_status(), "bbb", 3).expect("a change");
        let cs = &after.container_statuses.as_ref().unwrap()[1];
        let t = cs.state.as_ref().unwrap().terminated.as_ref().unwrap();
        assert_eq!(t.exit_code, 3);
        assert_eq!(t.reason.as_deref(), Some("Error"));
        assert_eq!(t.container_id.as_deref(), Some("containerd://bbb"));
        assert!(!cs.ready);
        let first = &after.container_statuses.as_ref().unwrap()[0];
        assert!(first.state.as_ref().unwrap().running.is_some(), "untouched");
        let conds = after.conditions.unwrap();
        assert_eq!(conds[0].status, "False");
        assert_eq!(
            conds[1].status, "True",
            "PodScheduled is not about containers"
        );
        assert_eq!(
            after.phase.as_deref(),
            Some("Running"),
            "the phase waits for the runtime"
        );
    }

    #[test]
    fn nothing_changes_for_an_unknown_or_already_terminated_container() {
        assert!(with_observed_exit(&pod_status(), "ccc", 0).is_none());
        let once = with_observed_exit(&pod_status(), "aaa", 0).unwrap();
        assert_eq!(
            once.container_statuses.as_ref().unwrap()[0]
                .state
                .as_ref()
                .unwrap()
                .terminated
                .as_ref()
                .unwrap()
                .reason
                .as_deref(),
            Some("Completed")
        );
        assert!(with_observed_exit(&once, "aaa", 0).is_none());
    }

    #[test]
    fn wait_statuses_become_kubelet_exit_codes() {
        assert_eq!(exit_code_of_wait_status(0), 0);
        assert_eq!(exit_code_of_wait_status(3 << 8), 3);
        assert_eq!(exit_code_of_wait_status(9), 137, "SIGKILL");
        assert_eq!(
            exit_code_of_wait_status(15 | 0x80),
            143,
            "SIGTERM with a core dump"
        );
    }
}
