use k8s_openapi::api::core::v1::{
    Container, ContainerState, ContainerStateRunning, ContainerStateTerminated,
    ContainerStateWaiting, ContainerStatus, Pod, PodCondition, PodSpec, PodStatus,
};

use super::{PodRow, api_pod, pod_list, pod_row};

fn container(name: &str, restart_policy: Option<&str>) -> Container {
    Container {
        name: name.into(),
        restart_policy: restart_policy.map(Into::into),
        ..Container::default()
    }
}

fn running(name: &str, ready: bool, started: bool, restarts: i32) -> ContainerStatus {
    ContainerStatus {
        name: name.into(),
        ready,
        started: Some(started),
        restart_count: restarts,
        state: Some(ContainerState {
            running: Some(ContainerStateRunning::default()),
            ..ContainerState::default()
        }),
        ..ContainerStatus::default()
    }
}

fn waiting(name: &str, reason: &str) -> ContainerStatus {
    ContainerStatus {
        name: name.into(),
        started: Some(false),
        state: Some(ContainerState {
            waiting: Some(ContainerStateWaiting {
                reason: Some(reason.into()),
                ..ContainerStateWaiting::default()
            }),
            ..ContainerState::default()
        }),
        ..ContainerStatus::default()
    }
}

fn terminated(name: &str, code: i32, reason: Option<&str>) -> ContainerStatus {
    ContainerStatus {
        name: name.into(),
        started: Some(false),
        state: Some(ContainerState {
            terminated: Some(ContainerStateTerminated {
                exit_code: code,
                reason: reason.map(Into::into),
                ..ContainerStateTerminated::default()
            }),
            ..ContainerState::default()
        }),
        ..ContainerStatus::default()
    }
}

fn condition(kind: &str, status: bool) -> PodCondition {
    PodCondition {
        type_: kind.into(),
        status: if status { "True" } else { "False" }.into(),
        ..PodCondition::default()
    }
}

fn pod(
    init: Vec<Container>,
    containers: Vec<Container>,
    phase: &str,
    init_st: Vec<ContainerStatus>,
    st: Vec<ContainerStatus>,
    conditions: Vec<PodCondition>,
) -> Pod {
    Pod {
        spec: Some(PodSpec {
            init_containers: Some(init),
            containers,
            ..PodSpec::default()
        }),
        status: Some(PodStatus {
            phase: Some(phase.into()),
            init_container_statuses: Some(init_st),
            container_statuses: Some(st),
            conditions: Some(conditions),
            ..PodStatus::default()
        }),
        ..Pod::default()
    }
}

fn row(ready: usize, total: usize, status: &str, restarts: i32) -> PodRow {
    PodRow {
        ready,
        total,
        status: status.into(),
        restarts,
    }
}

#[test]
fn a_started_ready_sidecar_counts_in_ready_and_total() {
    let p = pod(
        vec![container("proxy", Some("Always"))],
        vec![container("app", None)],
        "Running",
        vec![running("proxy", true, true, 2)],
        vec![running("app", true, true, 1)],
        vec![condition("Initialized", true), condition("Ready", true)],
    );
    assert_eq!(pod_row(&p), row(2, 2, "Running", 3));
}

#[test]
fn a_sidecar_not_yet_started_holds_the_pod_in_init() {
    let p = pod(
        vec![container("proxy", Some("Always"))],
        vec![container("app", None)],
        "Pending",
        vec![running("proxy", false, false, 0)],
        vec![waiting("app", "PodInitializing")],
        vec![condition("Initialized", false)],
    );
    assert_eq!(pod_row(&p), row(0, 2, "Init:0/1", 0));
}

#[test]
fn a_completed_init_container_then_a_sidecar_in_back_off() {
    let p = pod(
        vec![container("setup", None), container("proxy", Some("Always"))],
        vec![container("app", None)],
        "Pending",
        vec![
            terminated("setup", 0, Some("Completed")),
            waiting("proxy", "CrashLoopBackOff"),
        ],
        vec![waiting("app", "PodInitializing")],
        vec![condition("Initialized", false)],
    );
    assert_eq!(pod_row(&p), row(0, 2, "Init:CrashLoopBackOff", 0));
}

#[test]
fn a_failed_init_container_shows_its_reason_or_exit_code() {
    let failed = |reason: Option<&str>| {
        pod(
            vec![container("setup", None)],
            vec![container("app", None)],
            "Failed",
            vec![terminated("setup", 3, reason)],
            vec![waiting("app", "PodInitializing")],
            vec![],
        )
    };
    assert_eq!(pod_row(&failed(Some("Error"))).status, "Init:Error");
    assert_eq!(pod_row(&failed(None)).status, "Init:ExitCode:3");
}

#[test]
fn the_first_telling_regular_container_reason_wins() {
    let p = pod(
        vec![],
        vec![container("a", None), container("b", None)],
        "Running",
        vec![],
        vec![
            waiting("a", "CrashLoopBackOff"),
            running("b", true, true, 0),
        ],
        vec![condition("Initialized", true), condition("Ready", false)],
    );
    assert_eq!(pod_row(&p), row(1, 2, "CrashLoopBackOff", 0));
}

#[test]
fn completed_with_a_running_container_is_running_or_not_ready() {
    let p = |ready: bool| {
        pod(
            vec![],
            vec![container("a", None), container("b", None)],
            "Running",
            vec![],
            vec![
                terminated("a", 0, Some("Completed")),
                running("b", true, true, 0),
            ],
            vec![condition("Initialized", true), condition("Ready", ready)],
        )
    };
    assert_eq!(pod_row(&p(true)).status, "Running");
    assert_eq!(pod_row(&p(false)).status, "NotReady");
}

#[test]
fn json_is_a_list_of_pods_with_metadata_spec_and_status() {
    let record = serde_json::json!({
        "uid": "u1", "namespace": "default", "name": "web",
        "metadata": {"name": "web", "namespace": "default", "labels": {"app": "web"}},
        "spec": {"containers": [{"name": "c", "image": "img"}]},
        "status": {"phase": "Running", "podIP": "10.1.2.3"},
        "first_seen": 1_700_000_000_000_000_000i64,
        "events": [],
    });
    let doc = pod_list(&[api_pod(&record)]);
    assert_eq!(doc["apiVersion"], "v1");
    assert_eq!(doc["kind"], "List");
    let item = &doc["items"][0];
    assert_eq!(item["apiVersion"], "v1");
    assert_eq!(item["kind"], "Pod");
    assert_eq!(item["metadata"]["uid"], "u1");
    assert_eq!(item["metadata"]["labels"]["app"], "web");
    assert_eq!(
        item["metadata"]["creationTimestamp"],
        "2023-11-14T22:13:20Z"
    );
    assert_eq!(item["spec"]["containers"][0]["image"], "img");
    assert_eq!(item["status"]["podIP"], "10.1.2.3");
    assert!(
        item.get("events").is_none(),
        "events stay in `podlapse events`"
    );
}
