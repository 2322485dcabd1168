//! kubelet's TestComputePodActionsWithInitContainers, ported case by case with kubelet's
//! case names. The base is kubelet's: three init containers init1..init3 that all exited
//! 0, three regular containers not created yet, a ready sandbox. Kill messages are not
//! compared, as in kubelet's verifyActions.

use std::collections::BTreeMap;

use k8s_openapi::api::core::v1::Pod;

use super::pod_actions::{KillReason, PodActions, compute_pod_actions};
use super::pod_actions_tests::{
    base_pod, container, create_sandbox, init_status, keep, set_policy,
};
use super::probe_results::ProbeResults;
use super::runtime_pod::{ContainerState, RuntimePodStatus, SandboxState};

type Mutation = fn(&mut Pod, &mut RuntimePodStatus);

const INIT3_ID: &str = "id-init3-102";

fn base() -> (Pod, RuntimePodStatus) {
    let mut pod = base_pod();
    pod.spec.as_mut().unwrap().init_containers = Some(vec![
        container("init1"),
        container("init2"),
        container("init3"),
    ]);
    let exited = ContainerState::Exited;
    let st = init_status(
        &pod,
        &[
            ("init1", exited, 0),
            ("init2", exited, 0),
            ("init3", exited, 0),
        ],
    );
    (pod, st)
}

fn init3(st: &mut RuntimePodStatus) -> &mut super::runtime_pod::ContainerStatus {
    st.containers
        .iter_mut()
        .find(|c| c.name == "init3")
        .unwrap()
}

fn start_init(index: usize) -> PodActions {
    PodActions {
        init_containers_to_start: vec![index],
        ..keep("sb1")
    }
}

fn kill_init3() -> BTreeMap<String, KillReason> {
    BTreeMap::from([(
        INIT3_ID.to_string(),
        KillReason {
            name: "init3".into(),
            message: String::new(),
        },
    )])
}

fn kill_pod_only() -> PodActions {
    PodActions {
        kill_pod: true,
        ..keep("sb1")
    }
}

fn recreate_with_first_init() -> PodActions {
    PodActions {
        init_containers_to_start: vec![0],
        ..create_sandbox("sb1", 1, vec![])
    }
}

#[test]
fn kubelets_test_compute_pod_actions_with_init_containers() {
    let cases: Vec<(&str, Mutation, PodActions)> = vec![
        (
            "initialization completed; start all containers",
            |_, _| {},
            PodActions {
                containers_to_start: vec![0, 1, 2],
                ..keep("sb1")
            },
        ),
        (
            "no init containers have been started; start the first one",
            |_, st| st.containers.clear(),
            start_init(0),
        ),
        (
            "initialization in progress; do nothing",
            |pod, st| {
                set_policy(pod, "Always");
                init3(st).state = ContainerState::Running;
            },
            keep("sb1"),
        ),
        (
            "Kill pod and restart the first init container if the pod sandbox is dead",
            |pod, st| {
                set_policy(pod, "Always");
                st.sandboxes[0].state = SandboxState::NotReady;
            },
            recreate_with_first_init(),
        ),
        (
            "initialization failed; restart the last init container if RestartPolicy == Always",
            |pod, st| {
                set_policy(pod, "Always");
                init3(st).exit_code = 137;
            },
            start_init(2),
        ),
        (
            "initialization failed; restart the last init container if RestartPolicy == OnFailure",
            |pod, st| {
                set_policy(pod, "OnFailure");
                init3(st).exit_code = 137;
            },
            start_init(2),
        ),
        (
            "initialization failed; kill pod if RestartPolicy == Never",
            |pod, st| {
                set_policy(pod, "Never");
                init3(st).exit_code = 137;
            },
            kill_pod_only(),
        ),
        (
            "init container state unknown; kill and recreate the last init container if RestartPolicy == Always",
            |pod, st| {
                set_policy(pod, "Always");
                init3(st).state = ContainerState::Unknown;
            },
            PodActions {
                containers_to_kill: kill_init3(),
                ..start_init(2)
            },
        ),
        (
            "init container state unknown; kill and recreate the last init container if RestartPolicy == OnFailure",
            |pod, st| {
                set_policy(pod, "OnFailure");
                init3(st).state = ContainerState::Unknown;
            },
            PodActions {
                containers_to_kill: kill_init3(),
                ..start_init(2)
            },
        ),
        (
            "init container state unknown; kill pod if RestartPolicy == Never",
            |pod, st| {
                set_policy(pod, "Never");
                init3(st).state = ContainerState::Unknown;
            },
            kill_pod_only(),
        ),
        (
            "Pod sandbox not ready, init container failed, but RestartPolicy == Never; kill pod only",
            |pod, st| {
                set_policy(pod, "Never");
                st.sandboxes[0].state = SandboxState::NotReady;
            },
            PodActions {
                kill_pod: true,
                attempt: 1,
                ..keep("sb1")
            },
        ),
        (
            "Pod sandbox not ready, and RestartPolicy == Never, but no visible init containers;  create a new pod sandbox",
            |pod, st| {
                set_policy(pod, "Never");
                st.sandboxes[0].state = SandboxState::NotReady;
                st.containers.clear();
            },
            recreate_with_first_init(),
        ),
        (
            "Pod sandbox not ready, init container failed, and RestartPolicy == OnFailure; create a new pod sandbox",
            |pod, st| {
                set_policy(pod, "OnFailure");
                st.sandboxes[0].state = SandboxState::NotReady;
                init3(st).exit_code = 137;
            },
            recreate_with_first_init(),
        ),
        (
            "some of the init container statuses are missing but the last init container is running, don't restart preceding ones",
            |pod, st| {
                set_policy(pod, "Always");
                init3(st).state = ContainerState::Running;
                st.containers.retain(|c| c.name == "init3");
            },
            keep("sb1"),
        ),
        (
            "an init container is in the created state due to an unknown error when starting container; restart it",
            |pod, st| {
                set_policy(pod, "Always");
                init3(st).state = ContainerState::Created;
            },
            start_init(2),
        ),
    ];
    assert_eq!(cases.len(), 15, "every case of kubelet's table");
    let mut failures = Vec::new();
    for (name, mutate, want) in cases {
        let (mut pod, mut st) = base();
        mutate(&mut pod, &mut st);
        let mut got = compute_pod_actions(&pod, &st, &ProbeResults::default());
        for reason in got.containers_to_kill.values_mut() {
            reason.message.clear();
        }
        if got != want {
            failures.push(format!("{name}:\n  want {want:?}\n  got  {got:?}"));
        }
    }
    assert!(failures.is_empty(), "{}", failures.join("\n"));
}
