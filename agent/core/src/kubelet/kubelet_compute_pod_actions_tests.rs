//! kubelet's own table, TestComputePodActions (pkg/kubelet/kuberuntime/
//! kuberuntime_manager_test.go), ported case by case with kubelet's case names. The base
//! pod and status are kubelet's: three running containers foo1..foo3 in a ready sandbox
//! with an IP. As in kubelet's verifyActions, kill messages are not compared: which
//! containers are killed is.

use std::collections::BTreeMap;

use super::pod_actions::{KillReason, PodActions, compute_pod_actions};
use super::pod_actions_tests::{
    base_pod, base_status, create_sandbox, exited, find, keep, set_policy,
};
use super::probe_results::ProbeResults;
use super::runtime_pod::{ContainerState, RuntimePodStatus, SandboxState};
use k8s_openapi::api::core::v1::Pod;

type Mutation = fn(&mut Pod, &mut RuntimePodStatus, &mut ProbeResults);

/// The kill map kubelet's getKillMap builds: container ID to its name.
fn kill_names(names: &[&str]) -> BTreeMap<String, KillReason> {
    names
        .iter()
        .map(|n| {
            (
                format!("id-{n}-200"),
                KillReason {
                    name: (*n).to_string(),
                    message: String::new(),
                },
            )
        })
        .collect()
}

fn restart(index: usize, name: &str) -> PodActions {
    PodActions {
        containers_to_start: vec![index],
        containers_to_kill: kill_names(&[name]),
        ..keep("sb1")
    }
}

fn all_exited(st: &mut RuntimePodStatus) {
    for c in &mut st.containers {
        c.state = ContainerState::Exited;
        c.exit_code = 0;
    }
}

#[expect(
    clippy::too_many_lines,
    reason = "a table: one entry per case of kubelet's own test"
)]
#[test]
fn kubelets_test_compute_pod_actions() {
    let cases: Vec<(&str, Mutation, PodActions)> = vec![
        ("everything is good; do nothing", |_, _, _| {}, keep("sb1")),
        (
            "start pod sandbox and all containers for a new pod",
            |_, st, _| {
                st.sandboxes.clear();
                st.containers.clear();
            },
            create_sandbox("", 0, vec![0, 1, 2]),
        ),
        (
            "restart exited containers if RestartPolicy == Always",
            |pod, st, _| {
                set_policy(pod, "Always");
                exited(st, "foo1", 0);
                exited(st, "foo2", 111);
            },
            PodActions {
                containers_to_start: vec![0, 1],
                ..keep("sb1")
            },
        ),
        (
            "restart failed containers if RestartPolicy == OnFailure",
            |pod, st, _| {
                set_policy(pod, "OnFailure");
                exited(st, "foo1", 0);
                exited(st, "foo2", 111);
            },
            PodActions {
                containers_to_start: vec![1],
                ..keep("sb1")
            },
        ),
        (
            "restart created but not started containers if RestartPolicy == OnFailure",
            |pod, st, _| {
                set_policy(pod, "OnFailure");
                exited(st, "foo1", 0);
                find(st, "foo2").state = ContainerState::Created;
            },
            PodActions {
                containers_to_start: vec![1],
                ..keep("sb1")
            },
        ),
        (
            "don't restart containers if RestartPolicy == Never",
            |pod, st, _| {
                set_policy(pod, "Never");
                exited(st, "foo1", 0);
                exited(st, "foo2", 111);
            },
            keep("sb1"),
        ),
        (
            "Kill pod and recreate everything if the pod sandbox is dead, and RestartPolicy == Always",
            |pod, st, _| {
                set_policy(pod, "Always");
                st.sandboxes[0].state = SandboxState::NotReady;
            },
            create_sandbox("sb1", 1, vec![0, 1, 2]),
        ),
        (
            "Kill pod and recreate all containers (except for the succeeded one) if the pod sandbox is dead, and RestartPolicy == OnFailure",
            |pod, st, _| {
                set_policy(pod, "OnFailure");
                st.sandboxes[0].state = SandboxState::NotReady;
                exited(st, "foo2", 0);
            },
            create_sandbox("sb1", 1, vec![0, 2]),
        ),
        (
            "Kill pod and recreate all containers if the PodSandbox does not have an IP",
            |_, st, _| st.sandboxes[0].ip.clear(),
            create_sandbox("sb1", 1, vec![0, 1, 2]),
        ),
        (
            "Kill and recreate the container if the container's spec changed",
            |pod, st, _| {
                set_policy(pod, "Always");
                find(st, "foo2").hash = "432423432".into();
            },
            restart(1, "foo2"),
        ),
        (
            "Kill and recreate the container if the liveness check has failed",
            |pod, _, probes| {
                set_policy(pod, "Always");
                probes.liveness_failed.insert("id-foo2-200".into());
            },
            restart(1, "foo2"),
        ),
        (
            "Kill and recreate the container if the startup check has failed",
            |pod, _, probes| {
                set_policy(pod, "Always");
                probes.startup_failed.insert("id-foo2-200".into());
            },
            restart(1, "foo2"),
        ),
        (
            "Verify we do not create a pod sandbox if no ready sandbox for pod with RestartPolicy=Never and all containers exited",
            |pod, st, _| {
                set_policy(pod, "Never");
                st.sandboxes[0].state = SandboxState::NotReady;
                st.sandboxes[0].attempt = 1;
                all_exited(st);
            },
            PodActions {
                kill_pod: true,
                attempt: 2,
                ..keep("sb1")
            },
        ),
        (
            "Verify we do not create a pod sandbox if no ready sandbox for pod with RestartPolicy=OnFailure and all containers succeeded",
            |pod, st, _| {
                set_policy(pod, "OnFailure");
                st.sandboxes[0].state = SandboxState::NotReady;
                st.sandboxes[0].attempt = 1;
                all_exited(st);
            },
            PodActions {
                kill_pod: true,
                attempt: 2,
                ..keep("sb1")
            },
        ),
        (
            "Verify we create a pod sandbox if no ready sandbox for pod with RestartPolicy=Never and no containers have ever been created",
            |pod, st, _| {
                set_policy(pod, "Never");
                st.sandboxes[0].state = SandboxState::NotReady;
                st.sandboxes[0].attempt = 2;
                st.containers.clear();
            },
            create_sandbox("sb1", 3, vec![0, 1, 2]),
        ),
        (
            "Kill and recreate the container if the container is in unknown state",
            |pod, st, _| {
                set_policy(pod, "Never");
                find(st, "foo2").state = ContainerState::Unknown;
            },
            restart(1, "foo2"),
        ),
        (
            "Restart the container if the container is in created state",
            |pod, st, _| {
                set_policy(pod, "Never");
                find(st, "foo2").state = ContainerState::Created;
            },
            PodActions {
                containers_to_start: vec![1],
                ..keep("sb1")
            },
        ),
    ];
    assert_eq!(cases.len(), 17, "every case of kubelet's table");
    let mut failures = Vec::new();
    for (name, mutate, want) in cases {
        let mut pod = base_pod();
        let mut st = base_status(&pod);
        let mut probes = ProbeResults::default();
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
