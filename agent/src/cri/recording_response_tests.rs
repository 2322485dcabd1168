//! What the recording layer keeps of each answer, as a trace writes it: the same map of
//! strings, key for key, that the recorder wrote when a response was one, for every
//! method, and for a call that failed what was recorded before it was made.

use super::recording_trace_tests::sandbox_config;
use std::sync::{Arc, Mutex};

use super::fake::{FakeRuntime, Fault};
use super::recording::{CallSink, CriCall, Recording};
use super::{ImageService, RuntimeService, api};

#[derive(Default)]
struct Calls(Mutex<Vec<CriCall>>);

impl CallSink for Calls {
    fn record(&self, call: CriCall) {
        self.0.lock().unwrap().push(call);
    }
}

fn image(name: &str) -> api::ImageSpec {
    api::ImageSpec {
        image: name.into(),
        ..Default::default()
    }
}

/// Every method once through a recorder over the fake runtime (a pull that fails, a
/// network that is not ready); the calls recorded, in order.
async fn record_every_method() -> Vec<CriCall> {
    let sink = Arc::new(Calls::default());
    let fake = FakeRuntime::new();
    fake.set_network_ready(false, "cni plugin not initialized");
    fake.inject(Fault::image_not_found("missing:1"));
    let rec = Recording::new(fake.clone(), sink.clone());
    let config = sandbox_config();
    rec.version().await.unwrap();
    rec.status(false).await.unwrap();
    let sandbox = rec
        .run_pod_sandbox(api::RunPodSandboxRequest {
            config: Some(config.clone()),
            runtime_handler: String::new(),
        })
        .await
        .unwrap()
        .pod_sandbox_id;
    fake.set_sandbox_ip(&sandbox, "10.88.0.7");
    rec.pod_sandbox_status(&sandbox).await.unwrap();
    rec.list_pod_sandbox(None).await.unwrap();
    rec.image_status(image("app:1")).await.unwrap();
    let auth = api::AuthConfig::default();
    rec.pull_image(image("app:1"), Some(auth), Some(config.clone()))
        .await
        .unwrap();
    rec.pull_image(image("missing:1"), None, Some(config.clone()))
        .await
        .unwrap_err();
    let id = rec
        .create_container(api::CreateContainerRequest {
            pod_sandbox_id: sandbox.clone(),
            config: Some(api::ContainerConfig {
                metadata: Some(api::ContainerMetadata {
                    name: "app".into(),
                    attempt: 0,
                }),
                image: Some(image("app:1")),
                ..Default::default()
            }),
            sandbox_config: Some(config),
        })
        .await
        .unwrap();
    rec.start_container(&id).await.unwrap();
    rec.container_status(&id, false).await.unwrap();
    rec.exec_sync(&id, vec!["true".into()], 1).await.unwrap();
    let linux = api::LinuxContainerResources {
        cpu_quota: 50_000,
        cpu_shares: 512,
        memory_limit_in_bytes: 1 << 27,
        ..Default::default()
    };
    rec.update_container_resources(&id, linux).await.unwrap();
    rec.list_containers(None).await.unwrap();
    rec.stop_container(&id, 30).await.unwrap();
    rec.container_status(&id, false).await.unwrap();
    rec.remove_container(&id).await.unwrap();
    rec.stop_pod_sandbox(&sandbox).await.unwrap();
    rec.pod_sandbox_status(&sandbox).await.unwrap();
    rec.remove_pod_sandbox(&sandbox).await.unwrap();
    sink.0.lock().unwrap().clone()
}

#[tokio::test]
async fn each_method_records_the_fields_it_always_did() {
    let calls = record_every_method().await;
    let image_ref = calls
        .iter()
        .find_map(|c| c.response.image_ref())
        .expect("a pull that answered")
        .to_string();
    let expected = [
        ("Version", r#"{"runtime_name":"fake","runtime_version":"0.1.0"}"#.to_string()),
        (
            "Status",
            r#"{"NetworkReady":"false","NetworkReady_message":"cni plugin not initialized","NetworkReady_reason":"NetworkPluginNotReady","RuntimeReady":"true"}"#.into(),
        ),
        ("RunPodSandbox", String::new()),
        ("PodSandboxStatus", r#"{"ip":"10.88.0.7","state":"0"}"#.into()),
        ("ListPodSandbox", r#"{"count":"1"}"#.into()),
        ("ImageStatus", r#"{"present":"false"}"#.into()),
        ("PullImage", format!(r#"{{"auth":"true","image_ref":"{image_ref}"}}"#)),
        // A failed call keeps what was recorded before it was made.
        ("PullImage", r#"{"auth":"false"}"#.into()),
        ("CreateContainer", String::new()),
        ("StartContainer", String::new()),
        ("ContainerStatus", r#"{"exit_code":"0","state":"1"}"#.into()),
        ("ExecSync", r#"{"exit_code":"0"}"#.into()),
        (
            "UpdateContainerResources",
            r#"{"cpu_quota":"50000","cpu_shares":"512","memory_limit_in_bytes":"134217728"}"#
                .into(),
        ),
        ("ListContainers", r#"{"count":"1"}"#.into()),
        ("StopContainer", r#"{"timeout":"30"}"#.into()),
        (
            "ContainerStatus",
            r#"{"exit_code":"137","reason":"Error","state":"2"}"#.into(),
        ),
        ("RemoveContainer", String::new()),
        ("StopPodSandbox", String::new()),
        ("PodSandboxStatus", r#"{"ip":"10.88.0.7","state":"1"}"#.into()),
        ("RemovePodSandbox", String::new()),
    ];
    let got: Vec<(&str, String)> = calls
        .iter()
        .map(|c| {
            let line = serde_json::to_string(c).unwrap();
            let response = match line.split_once(r#","response":"#) {
                Some((_, rest)) => rest[..=rest.find('}').unwrap()].to_string(),
                None => String::new(),
            };
            (c.method.as_str(), response)
        })
        .collect();
    assert_eq!(got, expected);
    // Each reads back as it was recorded.
    for c in &calls {
        let line = serde_json::to_string(c).unwrap();
        let read: CriCall = serde_json::from_str(&line).unwrap();
        assert_eq!(&read, c, "{line}");
        assert!(!read.response.has_unknown_fields(), "{line}");
    }
}
