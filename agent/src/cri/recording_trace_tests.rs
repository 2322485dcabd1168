//! The recording layer gives each call made for a pod the `traceparent` of the span the
//! trace export makes for it: the pod's trace, the call's own span ID.

use std::sync::{Arc, Mutex};

use super::recording::{CallSink, CriCall, Recording};
use super::service::{CriResult, ListedContainerState};
use super::{ImageService, RuntimeService, api, trace_context};
use crate::otel::ids;

/// A runtime that answers the calls a pod's start makes and notes the trace context
/// each one ran with.
/// (method, the traceparent it ran with), in call order.
type Log = Arc<Mutex<Vec<(&'static str, Option<String>)>>>;

#[derive(Default)]
struct Seen(Log);

impl Seen {
    fn note(&self, method: &'static str) {
        self.0
            .lock()
            .unwrap()
            .push((method, trace_context::current()));
    }
}

impl RuntimeService for Seen {
    async fn version(&self) -> CriResult<api::VersionResponse> {
        self.note("Version");
        Ok(api::VersionResponse::default())
    }
    async fn status(&self, _verbose: bool) -> CriResult<api::StatusResponse> {
        unreachable!()
    }
    async fn run_pod_sandbox(
        &self,
        _req: api::RunPodSandboxRequest,
    ) -> CriResult<api::RunPodSandboxResponse> {
        self.note("RunPodSandbox");
        Ok(api::RunPodSandboxResponse {
            pod_sandbox_id: "sb-1".into(),
        })
    }
    async fn stop_pod_sandbox(&self, _id: &str) -> CriResult<()> {
        unreachable!()
    }
    async fn remove_pod_sandbox(&self, _id: &str) -> CriResult<()> {
        unreachable!()
    }
    async fn pod_sandbox_status(&self, _id: &str) -> CriResult<api::PodSandboxStatusResponse> {
        unreachable!()
    }
    async fn list_pod_sandbox(
        &self,
        _filter: Option<api::PodSandboxFilter>,
    ) -> CriResult<Vec<api::PodSandbox>> {
        unreachable!()
    }
    async fn create_container(&self, _req: api::CreateContainerRequest) -> CriResult<String> {
        self.note("CreateContainer");
        Ok("c-1".into())
    }
    async fn start_container(&self, _id: &str) -> CriResult<()> {
        self.note("StartContainer");
        Ok(())
    }
    async fn stop_container(&self, _id: &str, _timeout: i64) -> CriResult<()> {
        unreachable!()
    }
    async fn remove_container(&self, _id: &str) -> CriResult<()> {
        unreachable!()
    }
    async fn update_container_resources(
        &self,
        _id: &str,
        _linux: api::LinuxContainerResources,
    ) -> CriResult<()> {
        unreachable!()
    }
    async fn list_containers(
        &self,
        _filter: Option<api::ContainerFilter>,
    ) -> CriResult<Vec<api::Container>> {
        unreachable!()
    }
    async fn container_status(
        &self,
        _id: &str,
        _verbose: bool,
    ) -> CriResult<api::ContainerStatusResponse> {
        unreachable!()
    }
    async fn exec_sync(
        &self,
        _id: &str,
        _cmd: Vec<String>,
        _timeout: i64,
    ) -> CriResult<api::ExecSyncResponse> {
        unreachable!()
    }
    async fn list_container_states(
        &self,
        _filter: Option<api::ContainerFilter>,
        _label: &str,
    ) -> CriResult<Vec<ListedContainerState>> {
        unreachable!()
    }
}

impl ImageService for Seen {
    async fn image_status(&self, _image: api::ImageSpec) -> CriResult<Option<api::Image>> {
        unreachable!()
    }
    async fn pull_image(
        &self,
        _image: api::ImageSpec,
        _auth: Option<api::AuthConfig>,
        _sandbox: Option<api::PodSandboxConfig>,
    ) -> CriResult<String> {
        self.note("PullImage");
        Ok("sha256:1".into())
    }
}

#[derive(Default)]
struct Calls(Mutex<Vec<CriCall>>);

impl CallSink for Calls {
    fn record(&self, call: CriCall) {
        self.0.lock().unwrap().push(call);
    }
}

#[tokio::test]
async fn every_call_for_a_pod_carries_its_own_spans_traceparent() {
    let runtime = Seen::default();
    let seen = runtime.0.clone();
    let calls = Arc::new(Calls::default());
    let rec = Recording::new(runtime, calls.clone());
    let config = api::PodSandboxConfig {
        metadata: Some(api::PodSandboxMetadata {
            name: "p".into(),
            uid: "uid-1".into(),
            namespace: "default".into(),
            attempt: 0,
        }),
        ..Default::default()
    };
    rec.version().await.unwrap();
    let sandbox = rec
        .run_pod_sandbox(api::RunPodSandboxRequest {
            config: Some(config.clone()),
            runtime_handler: String::new(),
        })
        .await
        .unwrap();
    rec.pull_image(
        api::ImageSpec {
            image: "i".into(),
            ..Default::default()
        },
        None,
        Some(config.clone()),
    )
    .await
    .unwrap();
    let id = rec
        .create_container(api::CreateContainerRequest {
            pod_sandbox_id: sandbox.pod_sandbox_id,
            config: Some(api::ContainerConfig {
                metadata: Some(api::ContainerMetadata {
                    name: "c".into(),
                    attempt: 0,
                }),
                ..Default::default()
            }),
            sandbox_config: Some(config),
        })
        .await
        .unwrap();
    rec.start_container(&id).await.unwrap();
    let seen = seen.lock().unwrap().clone();
    let calls = calls.0.lock().unwrap().clone();
    assert_eq!(seen.len(), calls.len());
    for ((method, tp), call) in seen.iter().zip(&calls) {
        assert_eq!(*method, call.method);
        if call.pod_uid.is_empty() {
            // The node's own calls belong to no pod's trace.
            assert_eq!(*tp, None, "{method}");
        } else {
            assert_eq!(call.pod_uid, "uid-1", "{method} is tied to its pod");
            assert_eq!(tp.as_deref(), ids::traceparent(call).as_deref(), "{method}");
        }
    }
    let traced = seen.iter().filter(|(_, tp)| tp.is_some()).count();
    assert_eq!(traced, 4, "{seen:?}");
    // Outside a call, nothing.
    assert_eq!(trace_context::current(), None);
}
