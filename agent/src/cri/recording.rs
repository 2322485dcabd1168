//! A recording wrapper around any CRI implementation, kubelet's instrumented services in
//! spirit: every call goes through unchanged and comes out as a [`CriCall`] stamped on
//! the monotonic clock the eBPF probes use, tied to the pod, container and attempt it was
//! for. The timeline, the trace file and the metrics all read these.

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};

use super::service::CriResult;
use super::{ImageService, RuntimeService, api};
use crate::clock::now_ktime_ns;
use podlapse_core::record::ids::traceparent;
pub use podlapse_core::record::{CriCall, CriMethod, CriResponse, GrpcCode};
use podlapse_core::record::{
    ExecSyncFields, ImageStatusFields, PullImageFields, RuntimeCondition, RuntimeConditionType,
    StatusFields, StopContainerFields, UpdateContainerResourcesFields, VersionFields,
};

/// Whatever a [`CallSink`] keeps for the length of a call; dropped when the call ends.
pub type CallHold = Box<dyn std::any::Any + Send>;

/// Where recorded calls go.
pub trait CallSink: Send + Sync {
    fn record(&self, call: CriCall);

    /// A call is about to be made: `call` names it, its outcome not filled in yet. What
    /// this returns is held until the call has ended or was cancelled.
    fn begin(&self, _call: &CriCall) -> Option<CallHold> {
        None
    }

    /// Whether `call` (named, its start stamped, its outcome not filled in yet) goes to
    /// the runtime with a sampled trace context: only a call whose span will be
    /// exported. Unsampled unless a sink says otherwise.
    fn sampled(&self, _call: &CriCall) -> bool {
        false
    }
}

/// What the recorder learned about runtime IDs, so a call naming only an ID is tied to
/// its pod and container.
#[derive(Debug, Default)]
struct Ids {
    sandboxes: BTreeMap<String, (String, u32)>,
    containers: BTreeMap<String, (String, String, u32, String)>,
}

/// Wraps `R`, recording every call into `sink`.
#[derive(Clone)]
pub struct Recording<R> {
    inner: R,
    sink: Arc<dyn CallSink>,
    ids: Arc<Mutex<Ids>>,
}

impl<R> Recording<R> {
    pub fn new(inner: R, sink: Arc<dyn CallSink>) -> Recording<R> {
        Recording {
            inner,
            sink,
            ids: Arc::new(Mutex::new(Ids::default())),
        }
    }

    pub fn inner(&self) -> &R {
        &self.inner
    }

    fn ids(&self) -> std::sync::MutexGuard<'_, Ids> {
        self.ids.lock().unwrap_or_else(|e| e.into_inner())
    }

    fn for_sandbox(&self, id: &str, call: &mut CriCall) {
        call.sandbox_id = id.to_string();
        if let Some((uid, attempt)) = self.ids().sandboxes.get(id) {
            call.pod_uid = uid.clone();
            call.attempt = *attempt;
        }
    }

    fn for_container(&self, id: &str, call: &mut CriCall) {
        call.container_id = id.to_string();
        if let Some((uid, name, attempt, sandbox)) = self.ids().containers.get(id) {
            call.pod_uid = uid.clone();
            call.container = name.clone();
            call.attempt = *attempt;
            call.sandbox_id = sandbox.clone();
        }
    }

    /// Runs `fut`, stamps it, fills `call`'s outcome and lets `describe` add response
    /// fields, then records it.
    async fn record<T>(
        &self,
        mut call: CriCall,
        fut: impl Future<Output = CriResult<T>>,
        describe: impl FnOnce(&T, &mut CriCall),
    ) -> CriResult<T> {
        call.start_ns = now_ktime_ns();
        let _hold = self.sink.begin(&call);
        // What `begin` did (attaching probes) is not the call's own time.
        call.start_ns = now_ktime_ns();
        // The call's span, as a trace export will name it, goes to the runtime with it:
        // sampled only when that span will be exported.
        call.traced = !call.pod_uid.is_empty() && self.sink.sampled(&call);
        let traceparent = traceparent(&call);
        let result = super::trace_context::with_traceparent(Some(traceparent), fut).await;
        call.end_ns = now_ktime_ns();
        match &result {
            Ok(v) => {
                call.code = GrpcCode::Ok;
                describe(v, &mut call);
            }
            Err(e) => {
                call.code = e.code().map_or(GrpcCode::Unavailable, grpc_code);
                call.message = e.to_string();
            }
        }
        self.sink.record(call);
        result
    }
}

/// tonic's code as the trace records it (both are gRPC's numbering).
pub fn grpc_code(code: tonic::Code) -> GrpcCode {
    GrpcCode::from_number(code as i32)
}

/// The code a replayed call answers with.
pub fn tonic_code(code: GrpcCode) -> tonic::Code {
    tonic::Code::from_i32(code.number())
}

impl<R: RuntimeService> RuntimeService for Recording<R> {
    async fn version(&self) -> CriResult<api::VersionResponse> {
        self.record(
            CriCall::new(CriMethod::Version),
            self.inner.version(),
            |v, c| {
                c.response = VersionFields {
                    runtime_name: Some(v.runtime_name.clone()),
                    runtime_version: Some(v.runtime_version.clone()),
                }
                .into();
            },
        )
        .await
    }

    async fn status(&self, verbose: bool) -> CriResult<api::StatusResponse> {
        self.record(
            CriCall::new(CriMethod::Status),
            self.inner.status(verbose),
            |v, c| {
                let conditions = v.status.iter().flat_map(|s| s.conditions.iter());
                c.response = StatusFields::new(conditions.map(|cond| RuntimeCondition {
                    // Why a condition is false is what a diagnosis needs ("cni plugin not
                    // initialized"); a true one has nothing to say.
                    reason: (!cond.status).then(|| cond.reason.clone()),
                    message: (!cond.status).then(|| cond.message.clone()),
                    ..RuntimeCondition::new(RuntimeConditionType::new(&cond.r#type), cond.status)
                }))
                .into();
            },
        )
        .await
    }

    async fn run_pod_sandbox(
        &self,
        req: api::RunPodSandboxRequest,
    ) -> CriResult<api::RunPodSandboxResponse> {
        let mut c = CriCall::new(CriMethod::RunPodSandbox);
        let meta = req
            .config
            .as_ref()
            .and_then(|cfg| cfg.metadata.clone())
            .unwrap_or_default();
        c.pod_uid = meta.uid.clone();
        c.attempt = meta.attempt;
        let ids = self.ids.clone();
        self.record(c, self.inner.run_pod_sandbox(req), move |v, c| {
            c.sandbox_id = v.pod_sandbox_id.clone();
            ids.lock()
                .unwrap_or_else(|e| e.into_inner())
                .sandboxes
                .insert(v.pod_sandbox_id.clone(), (meta.uid, meta.attempt));
        })
        .await
    }

    async fn stop_pod_sandbox(&self, pod_sandbox_id: &str) -> CriResult<()> {
        let mut c = CriCall::new(CriMethod::StopPodSandbox);
        self.for_sandbox(pod_sandbox_id, &mut c);
        self.record(c, self.inner.stop_pod_sandbox(pod_sandbox_id), |_, _| {})
            .await
    }

    async fn remove_pod_sandbox(&self, pod_sandbox_id: &str) -> CriResult<()> {
        let mut c = CriCall::new(CriMethod::RemovePodSandbox);
        self.for_sandbox(pod_sandbox_id, &mut c);
        let ids = self.ids.clone();
        // Nothing names a removed sandbox or its containers again: what was learned of
        // them goes, so the agent does not keep an entry per sandbox it ever ran.
        self.record(
            c,
            self.inner.remove_pod_sandbox(pod_sandbox_id),
            move |_, c| {
                let mut ids = ids.lock().unwrap_or_else(|e| e.into_inner());
                ids.sandboxes.remove(&c.sandbox_id);
                ids.containers
                    .retain(|_, (_, _, _, sandbox)| *sandbox != c.sandbox_id);
            },
        )
        .await
    }

    async fn pod_sandbox_status(
        &self,
        pod_sandbox_id: &str,
    ) -> CriResult<api::PodSandboxStatusResponse> {
        let mut c = CriCall::new(CriMethod::PodSandboxStatus);
        self.for_sandbox(pod_sandbox_id, &mut c);
        let ids = self.ids.clone();
        let id = pod_sandbox_id.to_string();
        self.record(
            c,
            self.inner.pod_sandbox_status(pod_sandbox_id),
            move |v, c| {
                if let Some(st) = &v.status {
                    let meta = st.metadata.clone().unwrap_or_default();
                    c.pod_uid = meta.uid.clone();
                    c.attempt = meta.attempt;
                    let ip = st.network.as_ref().map(|net| net.ip.as_str());
                    c.response = CriResponse::pod_sandbox_status(st.state, ip);
                    // Learn sandboxes made before this recorder existed (adopted pods).
                    ids.lock()
                        .unwrap_or_else(|e| e.into_inner())
                        .sandboxes
                        .entry(id)
                        .or_insert((meta.uid, meta.attempt));
                }
            },
        )
        .await
    }

    async fn list_pod_sandbox(
        &self,
        filter: Option<api::PodSandboxFilter>,
    ) -> CriResult<Vec<api::PodSandbox>> {
        let mut c = CriCall::new(CriMethod::ListPodSandbox);
        if let Some(uid) = filter
            .as_ref()
            .and_then(|f| f.label_selector.get(crate::kubelet::labels::POD_UID))
        {
            c.pod_uid = uid.clone();
        }
        self.record(c, self.inner.list_pod_sandbox(filter), |v, c| {
            c.response = CriResponse::listed(CriMethod::ListPodSandbox, v.len());
        })
        .await
    }

    async fn create_container(&self, req: api::CreateContainerRequest) -> CriResult<String> {
        let mut c = CriCall::new(CriMethod::CreateContainer);
        let meta = req
            .config
            .as_ref()
            .and_then(|cfg| cfg.metadata.clone())
            .unwrap_or_default();
        let sandbox = req.pod_sandbox_id.clone();
        self.for_sandbox(&sandbox, &mut c);
        c.container = meta.name.clone();
        c.attempt = meta.attempt;
        c.image = req
            .config
            .as_ref()
            .and_then(|cfg| cfg.image.as_ref())
            .map(|i| i.user_specified_image.clone())
            .unwrap_or_default();
        let uid = c.pod_uid.clone();
        let ids = self.ids.clone();
        self.record(c, self.inner.create_container(req), move |id, c| {
            c.container_id = id.clone();
            ids.lock()
                .unwrap_or_else(|e| e.into_inner())
                .containers
                .insert(id.clone(), (uid, meta.name, meta.attempt, sandbox));
        })
        .await
    }

    async fn start_container(&self, container_id: &str) -> CriResult<()> {
        let mut c = CriCall::new(CriMethod::StartContainer);
        self.for_container(container_id, &mut c);
        self.record(c, self.inner.start_container(container_id), |_, _| {})
            .await
    }

    async fn stop_container(&self, container_id: &str, timeout_seconds: i64) -> CriResult<()> {
        let mut c = CriCall::new(CriMethod::StopContainer);
        self.for_container(container_id, &mut c);
        c.response = StopContainerFields {
            timeout: Some(timeout_seconds),
        }
        .into();
        self.record(
            c,
            self.inner.stop_container(container_id, timeout_seconds),
            |_, _| {},
        )
        .await
    }

    async fn update_container_resources(
        &self,
        container_id: &str,
        linux: api::LinuxContainerResources,
    ) -> CriResult<()> {
        let mut c = CriCall::new(CriMethod::UpdateContainerResources);
        self.for_container(container_id, &mut c);
        c.response = UpdateContainerResourcesFields {
            cpu_quota: Some(linux.cpu_quota),
            cpu_shares: Some(linux.cpu_shares),
            memory_limit_in_bytes: Some(linux.memory_limit_in_bytes),
        }
        .into();
        self.record(
            c,
            self.inner.update_container_resources(container_id, linux),
            |_, _| {},
        )
        .await
    }

    async fn remove_container(&self, container_id: &str) -> CriResult<()> {
        let mut c = CriCall::new(CriMethod::RemoveContainer);
        self.for_container(container_id, &mut c);
        let ids = self.ids.clone();
        self.record(c, self.inner.remove_container(container_id), move |_, c| {
            ids.lock()
                .unwrap_or_else(|e| e.into_inner())
                .containers
                .remove(&c.container_id);
        })
        .await
    }

    async fn list_containers(
        &self,
        filter: Option<api::ContainerFilter>,
    ) -> CriResult<Vec<api::Container>> {
        let mut c = CriCall::new(CriMethod::ListContainers);
        if let Some(uid) = filter
            .as_ref()
            .and_then(|f| f.label_selector.get(crate::kubelet::labels::POD_UID))
        {
            c.pod_uid = uid.clone();
        }
        self.record(c, self.inner.list_containers(filter), |v, c| {
            c.response = CriResponse::listed(CriMethod::ListContainers, v.len());
        })
        .await
    }

    async fn container_status(
        &self,
        container_id: &str,
        verbose: bool,
    ) -> CriResult<api::ContainerStatusResponse> {
        let mut c = CriCall::new(CriMethod::ContainerStatus);
        self.for_container(container_id, &mut c);
        let ids = self.ids.clone();
        let id = container_id.to_string();
        self.record(
            c,
            self.inner.container_status(container_id, verbose),
            move |v, c| {
                if let Some(st) = &v.status {
                    let meta = st.metadata.clone().unwrap_or_default();
                    let reason = Some(st.reason.as_str()).filter(|r| !r.is_empty());
                    c.response = CriResponse::container_status(st.state, st.exit_code, reason);
                    let uid = st
                        .labels
                        .get(crate::kubelet::labels::POD_UID)
                        .cloned()
                        .unwrap_or_default();
                    c.pod_uid = uid.clone();
                    c.container = meta.name.clone();
                    c.attempt = meta.attempt;
                    ids.lock()
                        .unwrap_or_else(|e| e.into_inner())
                        .containers
                        .entry(id)
                        .or_insert((uid, meta.name, meta.attempt, String::new()));
                }
            },
        )
        .await
    }

    async fn exec_sync(
        &self,
        container_id: &str,
        cmd: Vec<String>,
        timeout_seconds: i64,
    ) -> CriResult<api::ExecSyncResponse> {
        let mut c = CriCall::new(CriMethod::ExecSync);
        self.for_container(container_id, &mut c);
        self.record(
            c,
            self.inner.exec_sync(container_id, cmd, timeout_seconds),
            |v, c| {
                c.response = ExecSyncFields {
                    exit_code: Some(v.exit_code),
                }
                .into();
            },
        )
        .await
    }

    fn exit_notice(
        &self,
        container_id: &str,
    ) -> Option<impl std::future::Future<Output = ()> + Send + 'static> {
        self.inner.exit_notice(container_id)
    }
}

impl<R: ImageService> ImageService for Recording<R> {
    async fn image_status(&self, image: api::ImageSpec) -> CriResult<Option<api::Image>> {
        let mut c = CriCall::new(CriMethod::ImageStatus);
        c.image = image.image.clone();
        self.record(c, self.inner.image_status(image), |v, c| {
            c.response = ImageStatusFields {
                present: Some(v.is_some()),
            }
            .into();
        })
        .await
    }

    async fn pull_image(
        &self,
        image: api::ImageSpec,
        auth: Option<api::AuthConfig>,
        sandbox_config: Option<api::PodSandboxConfig>,
    ) -> CriResult<String> {
        let mut c = CriCall::new(CriMethod::PullImage);
        c.image = image.image.clone();
        if let Some(meta) = sandbox_config.as_ref().and_then(|s| s.metadata.as_ref()) {
            c.pod_uid = meta.uid.clone();
            c.attempt = meta.attempt;
        }
        // Credentials are never recorded; only whether there were any.
        let auth_given = auth.is_some();
        c.response = PullImageFields {
            auth: Some(auth_given),
            image_ref: None,
        }
        .into();
        self.record(
            c,
            self.inner.pull_image(image, auth, sandbox_config),
            |v, c| {
                c.response = PullImageFields {
                    auth: Some(auth_given),
                    image_ref: Some(v.clone()),
                }
                .into();
            },
        )
        .await
    }
}
