//! kubelet's TestComputePodActionsWithRestartableInitContainers, ported case by case
//! with kubelet's case names. The base is kubelet's: three running sidecars
//! (restartable-init-1..3; 2 and 3 with liveness and startup probes that succeeded), no
//! regular container created yet, a ready sandbox. Kill messages are not compared, as in
//! kubelet's verifyActions.
//!
//! podlapse's probe results keep a liveness verdict only when it failed: kubelet's
//! "liveness not run yet" and "liveness in progress" are, for podlapse, a container whose
//! liveness has not failed, which is all computePodActions asks of them.

use std::collections::BTreeMap;

use k8s_openapi::api::core::v1::{Pod, Probe};

use super::pod_actions::{KillReason, PodActions, compute_pod_actions};
use super::pod_actions_tests::{
    base_pod, container, create_sandbox, init_status, keep, set_policy, status_of,
};
use super::probe_results::ProbeResults;
use super::runtime_pod::{ContainerState, ContainerStatus, RuntimePodStatus, SandboxState};

type Mutation = fn(&mut Pod, &mut RuntimePodStatus, &mut ProbeResults);

const INIT2: &str = "id-restartable-init-2-101";
const INIT3: &str = "id-restartable-init-3-102";

fn base() -> (Pod, RuntimePodStatus, ProbeResults) {
    let mut pod = base_pod();
    let sidecar = |name: &str, probes: bool| {
        let mut c = container(name);
        c.restart_policy = Some("Always".into());
        if probes {
            c.liveness_probe = Some(Probe::default());
            c.startup_probe = Some(Probe::default());
        }
        c
    };
    pod.spec.as_mut().unwrap().init_containers = Some(vec![
        sidecar("restartable-init-1", false),
        sidecar("restartable-init-2", true),
        sidecar("restartable-init-3", true),
    ]);
    let running = ContainerState::Running;
    let st = init_status(
        &pod,
        &[
            ("restartable-init-1", running, 0),
            ("restartable-init-2", running, 0),
            ("restartable-init-3", running, 0),
        ],
    );
    // kubelet's test sets liveness and startup Success for sidecars 2 and 3.
    let mut probes = ProbeResults::default();
    probes.registered.insert(INIT2.into());
    probes.registered.insert(INIT3.into());
    (pod, st, probes)
}

fn sidecar(st: &mut RuntimePodStatus, n: usize) -> &mut ContainerStatus {
    let name = format!("restartable-init-{n}");
    st.containers.iter_mut().find(|c| c.name == name).unwrap()
}

/// Keeps only the statuses of sidecars `keep` (1-based).
fn only(st: &mut RuntimePodStatus, keep: &[usize]) {
    st.containers.retain(|c| {
        keep.iter()
            .any(|n| c.name == format!("restartable-init-{n}"))
    });
}

fn regular_containers(pod: &Pod, st: &mut RuntimePodStatus, state: ContainerState) {
    for c in &pod.spec.as_ref().unwrap().containers {
        st.containers.push(status_of(c, state, 200));
    }
    st.normalize();
}

fn start_init(indices: &[usize]) -> PodActions {
    PodActions {
        init_containers_to_start: indices.to_vec(),
        ..keep("sb1")
    }
}

fn kill_init3() -> BTreeMap<String, KillReason> {
    BTreeMap::from([(
        INIT3.to_string(),
        KillReason {
            name: "restartable-init-3".into(),
            message: String::new(),
        },
    )])
}

fn recreate_with_first_init() -> PodActions {
    PodActions {
        init_containers_to_start: vec![0],
        ..create_sandbox("sb1", 1, vec![])
    }
}

#[expect(
    clippy::too_many_lines,
    reason = "a table: one entry per case of kubelet's own test"
)]
#[test]
fn kubelets_test_compute_pod_actions_with_restartable_init_containers() {
    let cases: Vec<(&str, Mutation, PodActions)> = vec![
        (
            "initialization completed; start all containers",
            |_, _, _| {},
            PodActions {
                containers_to_start: vec![0, 1, 2],
                ..keep("sb1")
            },
        ),
        (
            "no init containers have been started; start the first one",
            |_, st, _| st.containers.clear(),
            start_init(&[0]),
        ),
        (
            "an init container is stuck in the created state; restart it",
            |pod, st, _| {
                set_policy(pod, "Always");
                sidecar(st, 3).state = ContainerState::Created;
            },
            start_init(&[2]),
        ),
        (
            "restartable init container has started; start the next",
            |pod, st, _| {
                set_policy(pod, "Always");
                only(st, &[1]);
            },
            start_init(&[1]),
        ),
        (
            "livenessProbe has not been run; start the nothing",
            |pod, st, _| {
                set_policy(pod, "Always");
                only(st, &[1, 2]);
            },
            start_init(&[2]),
        ),
        (
            "livenessProbe in progress; start the next",
            |pod, st, _| {
                set_policy(pod, "Always");
                only(st, &[1, 2]);
            },
            start_init(&[2]),
        ),
        (
            "livenessProbe has completed; start the next",
            |pod, st, _| {
                set_policy(pod, "Always");
                only(st, &[1, 2]);
            },
            start_init(&[2]),
        ),
        (
            "kill and recreate the restartable init container if the liveness check has failed",
            |pod, _, probes| {
                set_policy(pod, "Always");
                probes.liveness_failed.insert(INIT3.into());
            },
            PodActions {
                containers_to_start: vec![0, 1, 2],
                containers_to_kill: kill_init3(),
                ..start_init(&[2])
            },
        ),
        (
            "startupProbe has not been run; do nothing",
            |pod, st, probes| {
                set_policy(pod, "Always");
                probes.registered.remove(INIT2);
                only(st, &[1, 2]);
            },
            keep("sb1"),
        ),
        (
            "startupProbe in progress; do nothing",
            |pod, st, probes| {
                set_policy(pod, "Always");
                probes.not_started.insert(INIT2.into());
                only(st, &[1, 2]);
            },
            keep("sb1"),
        ),
        (
            "startupProbe has completed; start the next",
            |pod, st, _| {
                set_policy(pod, "Always");
                only(st, &[1, 2]);
            },
            start_init(&[2]),
        ),
        (
            "kill and recreate the restartable init container if the startup check has failed",
            |pod, _, probes| {
                set_policy(pod, "Always");
                probes.startup_failed.insert(INIT3.into());
            },
            PodActions {
                containers_to_kill: kill_init3(),
                ..start_init(&[2])
            },
        ),
        (
            "kill and recreate the restartable init container if the container definition changes",
            |pod, _, _| {
                set_policy(pod, "Always");
                pod.spec.as_mut().unwrap().init_containers.as_mut().unwrap()[2].image =
                    Some("foo-image".into());
            },
            PodActions {
                containers_to_start: vec![0, 1, 2],
                containers_to_kill: kill_init3(),
                ..start_init(&[2])
            },
        ),
        (
            "restart terminated restartable init container and next init container",
            |pod, st, _| {
                set_policy(pod, "Always");
                sidecar(st, 1).state = ContainerState::Exited;
                sidecar(st, 3).state = ContainerState::Exited;
            },
            start_init(&[0, 2]),
        ),
        (
            "restart terminated restartable init container and regular containers",
            |pod, st, _| {
                set_policy(pod, "Always");
                sidecar(st, 1).state = ContainerState::Exited;
            },
            PodActions {
                containers_to_start: vec![0, 1, 2],
                ..start_init(&[0])
            },
        ),
        (
            "Pod sandbox not ready, restartable init container failed, but RestartPolicy == Never; kill pod only",
            |pod, st, _| {
                set_policy(pod, "Never");
                st.sandboxes[0].state = SandboxState::NotReady;
                sidecar(st, 3).state = ContainerState::Exited;
                sidecar(st, 3).exit_code = 137;
            },
            PodActions {
                kill_pod: true,
                attempt: 1,
                ..keep("sb1")
            },
        ),
        (
            "Pod sandbox not ready, and RestartPolicy == Never, but no visible restartable init containers;  create a new pod sandbox",
            |pod, st, _| {
                set_policy(pod, "Never");
                st.sandboxes[0].state = SandboxState::NotReady;
                st.containers.clear();
            },
            recreate_with_first_init(),
        ),
        (
            "Pod sandbox not ready, restartable init container failed, and RestartPolicy == OnFailure; create a new pod sandbox",
            |pod, st, _| {
                set_policy(pod, "OnFailure");
                st.sandboxes[0].state = SandboxState::NotReady;
                sidecar(st, 3).state = ContainerState::Exited;
                sidecar(st, 3).exit_code = 137;
            },
            recreate_with_first_init(),
        ),
        (
            "Pod sandbox not ready, restartable init container failed, and RestartPolicy == Always; create a new pod sandbox",
            |pod, st, _| {
                set_policy(pod, "Always");
                st.sandboxes[0].state = SandboxState::NotReady;
                sidecar(st, 3).state = ContainerState::Exited;
                sidecar(st, 3).exit_code = 137;
            },
            recreate_with_first_init(),
        ),
        (
            "initialization failed; restart the last restartable init container even if pod's RestartPolicy == Never",
            |pod, st, _| {
                set_policy(pod, "Never");
                sidecar(st, 3).state = ContainerState::Exited;
                sidecar(st, 3).exit_code = 137;
            },
            start_init(&[2]),
        ),
        (
            "restartable init container state unknown; kill and recreate the last restartable init container even if pod's RestartPolicy == Never",
            |pod, st, _| {
                set_policy(pod, "Never");
                sidecar(st, 3).state = ContainerState::Unknown;
            },
            PodActions {
                containers_to_kill: kill_init3(),
                ..start_init(&[2])
            },
        ),
        (
            "restart restartable init container if regular containers are running even if pod's RestartPolicy == Never",
            |pod, st, _| {
                set_policy(pod, "Never");
                sidecar(st, 3).state = ContainerState::Exited;
                sidecar(st, 3).exit_code = 137;
                regular_containers(pod, st, ContainerState::Running);
            },
            start_init(&[2]),
        ),
        (
            "kill the pod if all main containers succeeded if pod's RestartPolicy == Never",
            |pod, st, _| {
                set_policy(pod, "Never");
                regular_containers(pod, st, ContainerState::Exited);
            },
            PodActions {
                kill_pod: true,
                ..keep("sb1")
            },
        ),
        (
            "some of the init container statuses are missing but the last init container is running, restart restartable init and regular containers",
            |pod, st, _| {
                set_policy(pod, "Always");
                only(st, &[3]);
            },
            PodActions {
                containers_to_start: vec![0, 1, 2],
                ..start_init(&[0, 1])
            },
        ),
    ];
    assert_eq!(cases.len(), 24, "every case of kubelet's table");
    let mut failures = Vec::new();
    for (name, mutate, want) in cases {
        let (mut pod, mut st, mut probes) = base();
        mutate(&mut pod, &mut st, &mut probes);
        let mut got = compute_pod_actions(&pod, &st, &probes);
        for reason in got.containers_to_kill.values_mut() {
            reason.message.clear();
        }
        if got != want {
            failures.push(format!("{name}:\n  want {want:?}\n  got  {got:?}"));
        }
    }
    assert!(failures.is_empty(), "{}", failures.join("\n"));
}
