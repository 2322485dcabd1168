//! computePodActions, table-tested like kubelet's TestComputePodActions: one base pod
//! and runtime status, a mutation per case, and the exact actions expected.

use std::collections::BTreeMap;

use k8s_openapi::api::core::v1::{Container, Pod, PodSpec};

use super::container_hash::container_hash;
use super::pod_actions::{KillReason, PodActions, compute_pod_actions};
use super::probe_results::ProbeResults;
use super::runtime_pod::{
    ContainerState, ContainerStatus, RuntimePodStatus, SandboxState, SandboxStatus,
};

pub(super) fn container(name: &str) -> Container {
    Container {
        name: name.into(),
        image: Some("127.0.0.1:5000/podlapse/app:1.0".into()),
        ..Container::default()
    }
}

pub(super) fn base_pod() -> Pod {
    let mut pod = Pod::default();
    pod.metadata.name = Some("foo".into());
    pod.metadata.namespace = Some("default".into());
    pod.metadata.uid = Some("12345678".into());
    pod.spec = Some(PodSpec {
        containers: vec![container("foo1"), container("foo2"), container("foo3")],
        restart_policy: Some("Always".into()),
        ..PodSpec::default()
    });
    pod
}

pub(super) fn sandbox(
    id: &str,
    state: SandboxState,
    attempt: u32,
    created_at: i64,
) -> SandboxStatus {
    SandboxStatus {
        id: id.into(),
        state,
        attempt,
        created_at,
        ip: "10.244.77.2".into(),
        additional_ips: vec![],
        host_network: false,
    }
}

pub(super) fn status_of(c: &Container, state: ContainerState, created_at: i64) -> ContainerStatus {
    ContainerStatus {
        id: format!("id-{}-{created_at}", c.name),
        name: c.name.clone(),
        state,
        restart_count: 0,
        hash: container_hash(c),
        created_at,
        started_at: created_at,
        finished_at: 0,
        exit_code: 0,
        reason: String::new(),
        message: String::new(),
        image: c.image.clone().unwrap_or_default(),
        image_ref: "sha256:abc".into(),
        resources: None,
    }
}

pub(super) fn base_status(pod: &Pod) -> RuntimePodStatus {
    let spec = pod.spec.as_ref().unwrap();
    let mut st = RuntimePodStatus {
        uid: "12345678".into(),
        name: "foo".into(),
        namespace: "default".into(),
        sandboxes: vec![sandbox("sb1", SandboxState::Ready, 0, 100)],
        containers: spec
            .containers
            .iter()
            .map(|c| status_of(c, ContainerState::Running, 200))
            .collect(),
    };
    st.normalize();
    st
}

pub(super) fn find<'a>(st: &'a mut RuntimePodStatus, name: &str) -> &'a mut ContainerStatus {
    st.containers.iter_mut().find(|c| c.name == name).unwrap()
}

pub(super) fn exited(st: &mut RuntimePodStatus, name: &str, code: i32) {
    let c = find(st, name);
    c.state = ContainerState::Exited;
    c.exit_code = code;
}

pub(super) fn set_policy(pod: &mut Pod, policy: &str) {
    pod.spec.as_mut().unwrap().restart_policy = Some(policy.into());
}

fn with_init(pod: &mut Pod) {
    pod.spec.as_mut().unwrap().init_containers = Some(vec![container("init1"), container("init2")]);
}

/// The pod with init containers, no app container has run, and the given init statuses.
pub(super) fn init_status(pod: &Pod, inits: &[(&str, ContainerState, i32)]) -> RuntimePodStatus {
    let spec = pod.spec.as_ref().unwrap();
    let mut st = base_status(pod);
    st.containers = inits
        .iter()
        .enumerate()
        .map(|(i, (name, state, code))| {
            let c = spec
                .init_containers
                .iter()
                .flatten()
                .find(|c| c.name == *name)
                .unwrap();
            let mut s = status_of(c, *state, 100 + i as i64);
            s.exit_code = *code;
            s
        })
        .collect();
    st.normalize();
    st
}

fn kill(id: &str, name: &str, message: &str) -> BTreeMap<String, KillReason> {
    BTreeMap::from([(
        id.to_string(),
        KillReason {
            name: name.into(),
            message: message.into(),
        },
    )])
}

pub(super) fn keep(sandbox_id: &str) -> PodActions {
    PodActions {
        sandbox_id: sandbox_id.into(),
        ..PodActions::default()
    }
}

pub(super) fn create_sandbox(id: &str, attempt: u32, start: Vec<usize>) -> PodActions {
    PodActions {
        kill_pod: true,
        create_sandbox: true,
        sandbox_id: id.into(),
        attempt,
        containers_to_start: start,
        ..PodActions::default()
    }
}

type Mutation = fn(&mut Pod, &mut RuntimePodStatus, &mut ProbeResults);

#[expect(clippy::too_many_lines, reason = "a table: one entry per case")]
#[test]
fn compute_pod_actions_table() {
    let cases: Vec<(&str, Mutation, PodActions)> = vec![
        (
            "everything is running: nothing to do",
            |_, _, _| {},
            keep("sb1"),
        ),
        (
            "no sandbox: create one and start every container",
            |_, st, _| {
                st.sandboxes.clear();
                st.containers.clear();
            },
            create_sandbox("", 0, vec![0, 1, 2]),
        ),
        (
            "sandbox not ready: recreate with the next attempt",
            |_, st, _| st.sandboxes[0].state = SandboxState::NotReady,
            create_sandbox("sb1", 1, vec![0, 1, 2]),
        ),
        (
            "two ready sandboxes: recreate",
            |_, st, _| {
                st.sandboxes
                    .push(sandbox("sb0", SandboxState::Ready, 3, 50));
                st.normalize();
            },
            create_sandbox("sb1", 1, vec![0, 1, 2]),
        ),
        (
            "the newest sandbox decides the attempt",
            |_, st, _| {
                st.sandboxes = vec![
                    sandbox("old", SandboxState::NotReady, 4, 10),
                    sandbox("new", SandboxState::NotReady, 5, 20),
                ];
                st.normalize();
            },
            create_sandbox("new", 6, vec![0, 1, 2]),
        ),
        (
            "sandbox without an IP: recreate",
            |_, st, _| st.sandboxes[0].ip.clear(),
            create_sandbox("sb1", 1, vec![0, 1, 2]),
        ),
        (
            "hostNetwork pod with no IP is fine",
            |pod, st, _| {
                pod.spec.as_mut().unwrap().host_network = Some(true);
                st.sandboxes[0].host_network = true;
                st.sandboxes[0].ip.clear();
            },
            keep("sb1"),
        ),
        (
            "network mode changed: recreate without reusing the sandbox",
            |pod, _, _| pod.spec.as_mut().unwrap().host_network = Some(true),
            create_sandbox("", 1, vec![0, 1, 2]),
        ),
        (
            "exited container, restartPolicy Always: restart it",
            |_, st, _| exited(st, "foo2", 0),
            PodActions {
                containers_to_start: vec![1],
                ..keep("sb1")
            },
        ),
        (
            "succeeded container, OnFailure: leave it",
            |pod, st, _| {
                set_policy(pod, "OnFailure");
                exited(st, "foo2", 0);
            },
            keep("sb1"),
        ),
        (
            "failed container, OnFailure: restart it",
            |pod, st, _| {
                set_policy(pod, "OnFailure");
                exited(st, "foo2", 1);
            },
            PodActions {
                containers_to_start: vec![1],
                ..keep("sb1")
            },
        ),
        (
            "failed container, Never: leave it",
            |pod, st, _| {
                set_policy(pod, "Never");
                exited(st, "foo3", 2);
            },
            keep("sb1"),
        ),
        (
            "all containers exited, Never: kill the pod (sandbox goes)",
            |pod, st, _| {
                set_policy(pod, "Never");
                for n in ["foo1", "foo2", "foo3"] {
                    exited(st, n, 0);
                }
            },
            PodActions {
                kill_pod: true,
                ..keep("sb1")
            },
        ),
        (
            "container image changed: kill and start it",
            |pod, _, _| {
                pod.spec.as_mut().unwrap().containers[0].image = Some("app:2.0".into());
            },
            PodActions {
                containers_to_start: vec![0],
                containers_to_kill: kill(
                    "id-foo1-200",
                    "foo1",
                    "Container foo1 definition changed, will be restarted",
                ),
                ..keep("sb1")
            },
        ),
        (
            "container never created: start it",
            |_, st, _| st.containers.retain(|c| c.name != "foo3"),
            PodActions {
                containers_to_start: vec![2],
                ..keep("sb1")
            },
        ),
        (
            "container created but not started: start it",
            |_, st, _| find(st, "foo1").state = ContainerState::Created,
            PodActions {
                containers_to_start: vec![0],
                ..keep("sb1")
            },
        ),
        (
            "container in unknown state: kill it, then start it",
            |_, st, _| find(st, "foo1").state = ContainerState::Unknown,
            PodActions {
                containers_to_start: vec![0],
                containers_to_kill: kill(
                    "id-foo1-200",
                    "foo1",
                    "Container is in \"unknown\" state, try killing it before restart",
                ),
                ..keep("sb1")
            },
        ),
        (
            "pod being deleted: exited containers are not restarted",
            |pod, st, _| {
                pod.metadata.deletion_timestamp =
                    Some(k8s_openapi::apimachinery::pkg::apis::meta::v1::Time(
                        k8s_openapi::jiff::Timestamp::UNIX_EPOCH,
                    ));
                exited(st, "foo1", 1);
            },
            keep("sb1"),
        ),
        (
            "dead sandbox, Never, containers ran: do not run them again",
            |pod, st, _| {
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
            "dead sandbox, OnFailure: recreate and skip succeeded containers",
            |pod, st, _| {
                set_policy(pod, "OnFailure");
                st.sandboxes[0].state = SandboxState::NotReady;
                exited(st, "foo1", 0);
                exited(st, "foo2", 1);
            },
            create_sandbox("sb1", 1, vec![1, 2]),
        ),
        (
            "init containers, no sandbox: create it and start the first init container",
            |pod, st, _| {
                with_init(pod);
                st.sandboxes.clear();
                st.containers.clear();
            },
            PodActions {
                init_containers_to_start: vec![0],
                ..create_sandbox("", 0, vec![])
            },
        ),
        (
            "first init container running: wait",
            |pod, st, _| {
                with_init(pod);
                *st = init_status(pod, &[("init1", ContainerState::Running, 0)]);
            },
            keep("sb1"),
        ),
        (
            "first init container done: start the second",
            |pod, st, _| {
                with_init(pod);
                *st = init_status(pod, &[("init1", ContainerState::Exited, 0)]);
            },
            PodActions {
                init_containers_to_start: vec![1],
                ..keep("sb1")
            },
        ),
        (
            "all init containers done: start the app containers",
            |pod, st, _| {
                with_init(pod);
                *st = init_status(
                    pod,
                    &[
                        ("init1", ContainerState::Exited, 0),
                        ("init2", ContainerState::Exited, 0),
                    ],
                );
            },
            PodActions {
                containers_to_start: vec![0, 1, 2],
                ..keep("sb1")
            },
        ),
        (
            "init container failed, Always: restart that init container",
            |pod, st, _| {
                with_init(pod);
                *st = init_status(
                    pod,
                    &[
                        ("init1", ContainerState::Exited, 0),
                        ("init2", ContainerState::Exited, 3),
                    ],
                );
            },
            PodActions {
                init_containers_to_start: vec![1],
                ..keep("sb1")
            },
        ),
        (
            "init container failed, Never: kill the pod",
            |pod, st, _| {
                with_init(pod);
                set_policy(pod, "Never");
                *st = init_status(pod, &[("init1", ContainerState::Exited, 1)]);
            },
            PodActions {
                kill_pod: true,
                ..keep("sb1")
            },
        ),
        (
            "init container OOMKilled counts as failed",
            |pod, st, _| {
                with_init(pod);
                set_policy(pod, "Never");
                *st = init_status(pod, &[("init1", ContainerState::Exited, 0)]);
                st.containers[0].reason = "OOMKilled".into();
            },
            PodActions {
                kill_pod: true,
                ..keep("sb1")
            },
        ),
        (
            "init container in unknown state: kill it, then start it again",
            |pod, st, _| {
                with_init(pod);
                *st = init_status(pod, &[("init1", ContainerState::Unknown, 0)]);
            },
            PodActions {
                init_containers_to_start: vec![0],
                containers_to_kill: kill(
                    "id-init1-100",
                    "init1",
                    "Init container is in \"unknown\" state, try killing it before restart",
                ),
                ..keep("sb1")
            },
        ),
        (
            "init done earlier and app containers exist: regular logic applies",
            |pod, st, _| {
                with_init(pod);
                exited(st, "foo1", 1);
            },
            PodActions {
                containers_to_start: vec![0],
                ..keep("sb1")
            },
        ),
        (
            "liveness failure, Always: kill and restart",
            |_, _, probes| {
                probes.liveness_failed.insert("id-foo2-200".into());
            },
            PodActions {
                containers_to_start: vec![1],
                containers_to_kill: kill(
                    "id-foo2-200",
                    "foo2",
                    "Container foo2 failed liveness probe, will be restarted",
                ),
                ..keep("sb1")
            },
        ),
        (
            "liveness failure, Never: kill without restart",
            |pod, _, probes| {
                set_policy(pod, "Never");
                probes.liveness_failed.insert("id-foo2-200".into());
            },
            PodActions {
                containers_to_kill: kill(
                    "id-foo2-200",
                    "foo2",
                    "Container foo2 failed liveness probe",
                ),
                ..keep("sb1")
            },
        ),
        (
            "startup probe failure: kill and restart",
            |_, _, probes| {
                probes.startup_failed.insert("id-foo3-200".into());
            },
            PodActions {
                containers_to_start: vec![2],
                containers_to_kill: kill(
                    "id-foo3-200",
                    "foo3",
                    "Container foo3 failed startup probe, will be restarted",
                ),
                ..keep("sb1")
            },
        ),
        (
            "image changed under Never: still restarted",
            |pod, _, _| {
                set_policy(pod, "Never");
                pod.spec.as_mut().unwrap().containers[2].image = Some("app:2.0".into());
            },
            PodActions {
                containers_to_start: vec![2],
                containers_to_kill: kill(
                    "id-foo3-200",
                    "foo3",
                    "Container foo3 definition changed, will be restarted",
                ),
                ..keep("sb1")
            },
        ),
    ];
    assert!(cases.len() >= 25);
    for (name, mutate, want) in cases {
        let mut pod = base_pod();
        let mut st = base_status(&pod);
        let mut probes = ProbeResults::default();
        mutate(&mut pod, &mut st, &mut probes);
        let got = compute_pod_actions(&pod, &st, &probes);
        assert_eq!(got, want, "case: {name}");
    }
}

#[test]
fn decisions_do_not_depend_on_runtime_listing_order() {
    let pod = base_pod();
    let mut a = base_status(&pod);
    exited(&mut a, "foo2", 1);
    let mut b = a.clone();
    b.containers.reverse();
    b.sandboxes.reverse();
    b.normalize();
    let p = ProbeResults::default();
    assert_eq!(
        compute_pod_actions(&pod, &a, &p),
        compute_pod_actions(&pod, &b, &p)
    );
}
