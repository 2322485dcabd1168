//! The fake runtime on its own: the log, the faults, and answers as containerd gives them.

use std::collections::HashMap;
use std::time::Duration;

use super::*;
use crate::cri::service::CriResult;
use crate::cri::{ImageService, RuntimeService};
use crate::kubelet::labels;

fn sandbox_config(uid: &str, attempt: u32) -> api::PodSandboxConfig {
    api::PodSandboxConfig {
        metadata: Some(api::PodSandboxMetadata {
            name: "web".into(),
            uid: uid.into(),
            namespace: "default".into(),
            attempt,
        }),
        labels: HashMap::from([(labels::POD_UID.to_string(), uid.to_string())]),
        ..Default::default()
    }
}

async fn run_sandbox(fake: &FakeRuntime, uid: &str) -> CriResult<String> {
    fake.run_pod_sandbox(api::RunPodSandboxRequest {
        config: Some(sandbox_config(uid, 0)),
        runtime_handler: String::new(),
    })
    .await
    .map(|r| r.pod_sandbox_id)
}

async fn create(fake: &FakeRuntime, sandbox_id: &str, name: &str) -> CriResult<String> {
    fake.create_container(api::CreateContainerRequest {
        pod_sandbox_id: sandbox_id.into(),
        config: Some(api::ContainerConfig {
            metadata: Some(api::ContainerMetadata {
                name: name.into(),
                attempt: 0,
            }),
            image: Some(api::ImageSpec {
                image: "busybox:1.36".into(),
                ..Default::default()
            }),
            labels: HashMap::from([(labels::POD_UID.to_string(), "u1".to_string())]),
            ..Default::default()
        }),
        sandbox_config: Some(sandbox_config("u1", 0)),
    })
    .await
}

#[tokio::test]
async fn every_call_is_logged_in_order_with_what_it_was_for() {
    let fake = FakeRuntime::new();
    let sb = run_sandbox(&fake, "u1").await.unwrap();
    let image = api::ImageSpec {
        image: "busybox:1.36".into(),
        ..Default::default()
    };
    assert_eq!(fake.image_status(image.clone()).await.unwrap(), None);
    let image_ref = fake.pull_image(image.clone(), None, None).await.unwrap();
    assert!(fake.has_image("busybox:1.36"));
    assert_eq!(
        fake.image_status(image).await.unwrap().map(|i| i.id),
        Some(image_ref)
    );
    let id = create(&fake, &sb, "app").await.unwrap();
    fake.start_container(&id).await.unwrap();
    fake.stop_container(&id, 30).await.unwrap();
    assert_eq!((sb.as_str(), id.as_str()), ("sandbox-1", "app-2"));
    assert_eq!(
        fake.take_calls(),
        [
            FakeCall::RunPodSandbox {
                pod_uid: "u1".into(),
                attempt: 0
            },
            FakeCall::ImageStatus {
                image: "busybox:1.36".into()
            },
            FakeCall::PullImage {
                image: "busybox:1.36".into()
            },
            FakeCall::ImageStatus {
                image: "busybox:1.36".into()
            },
            FakeCall::CreateContainer {
                sandbox_id: "sandbox-1".into(),
                name: "app".into(),
                attempt: 0
            },
            FakeCall::StartContainer {
                container_id: "app-2".into()
            },
            FakeCall::StopContainer {
                container_id: "app-2".into(),
                timeout: 30
            },
        ]
    );
    assert!(fake.calls().is_empty());
    let c = fake.container("app-2").unwrap();
    assert_eq!(
        (c.state, c.exit_code),
        (api::ContainerState::ContainerExited, 137)
    );
}

#[tokio::test]
async fn a_fault_fails_only_the_calls_it_names() {
    let fake = FakeRuntime::new();
    fake.inject(Fault::create_failed("sidecar"));
    fake.inject(Fault::new(Method::StartContainer, tonic::Code::Unknown, "second start").nth(2));
    let sb = run_sandbox(&fake, "u1").await.unwrap();
    let err = create(&fake, &sb, "sidecar").await.unwrap_err();
    assert_eq!(err.code(), Some(tonic::Code::Unknown));
    assert!(
        err.to_string().starts_with(
            "CRI CreateContainer failed: Unknown: failed to create containerd container"
        ),
        "{err}"
    );
    let a = create(&fake, &sb, "a").await.unwrap();
    let b = create(&fake, &sb, "b").await.unwrap();
    fake.start_container(&a).await.unwrap();
    let err = fake.start_container(&b).await.unwrap_err();
    assert!(err.to_string().contains("second start"), "{err}");
    // The failed calls are logged too, and left nothing behind.
    assert_eq!(fake.calls().len(), 6);
    let names: Vec<String> = fake.containers().into_iter().map(|c| c.name).collect();
    assert_eq!(names, ["a", "b"]);
    assert_eq!(
        fake.container(&b).unwrap().state,
        api::ContainerState::ContainerCreated
    );

    fake.clear_faults();
    fake.inject(Fault::timeout(
        Method::ListContainers,
        Duration::from_secs(2),
    ));
    let err = fake.list_containers(None).await.unwrap_err();
    assert_eq!(err.code(), Some(tonic::Code::DeadlineExceeded));
    fake.inject(Fault::cni_failure());
    let err = run_sandbox(&fake, "u2").await.unwrap_err();
    assert!(err.to_string().contains("failed to setup network"), "{err}");
    assert_eq!(fake.sandboxes().len(), 1);
}

#[tokio::test]
async fn missing_objects_answer_as_containerd_does() {
    let fake = FakeRuntime::new();
    for err in [
        fake.start_container("nope").await.unwrap_err(),
        fake.stop_container("nope", 1).await.unwrap_err(),
        fake.container_status("nope", false).await.unwrap_err(),
        fake.pod_sandbox_status("nope").await.unwrap_err(),
        create(&fake, "nope", "app").await.unwrap_err(),
    ] {
        assert!(err.is_not_found(), "{err}");
    }
    // Removal and stopping a sandbox are idempotent in CRI.
    fake.remove_container("nope").await.unwrap();
    fake.stop_pod_sandbox("nope").await.unwrap();
    fake.remove_pod_sandbox("nope").await.unwrap();

    let sb = run_sandbox(&fake, "u1").await.unwrap();
    let id = create(&fake, &sb, "app").await.unwrap();
    fake.start_container(&id).await.unwrap();
    let err = fake.start_container(&id).await.unwrap_err();
    assert!(err.to_string().contains("CONTAINER_RUNNING"), "{err}");
    fake.set_sandbox_ready(&sb, false);
    let err = create(&fake, &sb, "other").await.unwrap_err();
    assert!(err.to_string().contains("is not running"), "{err}");
}

#[tokio::test]
async fn lists_filter_by_label_and_sandboxes_stop_their_containers() {
    let fake = FakeRuntime::new();
    fake.set_time(1_000);
    let sb = run_sandbox(&fake, "u1").await.unwrap();
    let other = run_sandbox(&fake, "u2").await.unwrap();
    let id = create(&fake, &sb, "app").await.unwrap();
    fake.start_container(&id).await.unwrap();
    let selector = |uid: &str| {
        Some(api::PodSandboxFilter {
            label_selector: HashMap::from([(labels::POD_UID.to_string(), uid.to_string())]),
            ..Default::default()
        })
    };
    let listed = fake.list_pod_sandbox(selector("u2")).await.unwrap();
    assert_eq!(listed.len(), 1);
    assert_eq!(listed[0].id, other);
    let status = fake.pod_sandbox_status(&sb).await.unwrap().status.unwrap();
    assert_eq!(status.network.unwrap().ip, "10.88.0.2");
    assert_eq!(status.created_at, 1_000);

    fake.stop_pod_sandbox(&sb).await.unwrap();
    assert!(!fake.sandbox(&sb).unwrap().ready);
    let c = fake.container(&id).unwrap();
    assert_eq!(c.state, api::ContainerState::ContainerExited);
    fake.remove_pod_sandbox(&sb).await.unwrap();
    assert_eq!(fake.containers(), []);
    assert_eq!(fake.sandboxes().len(), 1);
}

#[tokio::test]
async fn a_scheduled_exit_happens_when_the_test_moves_time_past_it() {
    let fake = FakeRuntime::new();
    fake.exit_after_start("app", 500, 3);
    let sb = run_sandbox(&fake, "u1").await.unwrap();
    let id = create(&fake, &sb, "app").await.unwrap();
    fake.set_time(1_000);
    fake.start_container(&id).await.unwrap();
    fake.set_time(1_499);
    assert_eq!(
        fake.container(&id).unwrap().state,
        api::ContainerState::ContainerRunning
    );
    fake.set_time(1_500);
    let st = fake
        .container_status(&id, false)
        .await
        .unwrap()
        .status
        .unwrap();
    assert_eq!(st.state, api::ContainerState::ContainerExited as i32);
    assert_eq!(
        (st.exit_code, st.finished_at, st.reason.as_str()),
        (3, 1_500, "Error")
    );
}

#[tokio::test]
async fn a_reduced_status_is_the_call_made_with_labels_and_unnamed_annotations_dropped() {
    let fake = FakeRuntime::new();
    let sb = run_sandbox(&fake, "u1").await.unwrap();
    let id = create(&fake, &sb, "app").await.unwrap();
    let whole = fake.container_status(&id, false).await.unwrap();
    let reduced = fake
        .container_status_reduced(&id, false, &[])
        .await
        .unwrap();
    let mut expected = whole.clone();
    let st = expected.status.as_mut().unwrap();
    assert!(!st.labels.is_empty());
    st.labels.clear();
    st.annotations.clear();
    assert_eq!(reduced, expected);
    let whole = fake.pod_sandbox_status(&sb).await.unwrap();
    let reduced = fake.pod_sandbox_status_reduced(&sb).await.unwrap();
    let mut expected = whole.clone();
    let st = expected.status.as_mut().unwrap();
    assert!(!st.labels.is_empty());
    st.labels.clear();
    st.annotations.clear();
    assert_eq!(reduced, expected);
    // Each is the runtime's call, logged as such.
    let methods: Vec<_> = fake.calls().iter().map(|c| c.method()).collect();
    assert_eq!(
        methods[methods.len() - 4..],
        [
            Method::ContainerStatus,
            Method::ContainerStatus,
            Method::PodSandboxStatus,
            Method::PodSandboxStatus
        ]
    );
}
