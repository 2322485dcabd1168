//! The real runtime: CRI v1 over a unix socket with tonic, a deadline on every call.

use std::time::Duration;

use hyper_util::rt::TokioIo;
use k8s_cri::v1::image_service_client::ImageServiceClient;
use k8s_cri::v1::runtime_service_client::RuntimeServiceClient;
use tokio::net::UnixStream;
use tonic::transport::{Channel, Uri};

use super::service::CriResult;
use super::{CriError, Endpoint, ImageService, RuntimeService, api};

/// Deadlines for CRI calls. kubelet uses one runtime request timeout (2 min by default) for
/// every call but image pulls, which get their own.
#[derive(Debug, Clone, Copy)]
pub struct Timeouts {
    pub request: Duration,
    pub pull: Duration,
}

impl Default for Timeouts {
    fn default() -> Self {
        Timeouts {
            request: Duration::from_secs(120),
            pull: Duration::from_secs(300),
        }
    }
}

/// A connected CRI client. Cheap to clone: clones share one HTTP/2 connection.
#[derive(Debug, Clone)]
pub struct CriClient {
    endpoint: Endpoint,
    runtime: RuntimeServiceClient<Channel>,
    image: ImageServiceClient<Channel>,
    timeouts: Timeouts,
}

impl CriClient {
    /// Connects and checks that the peer speaks CRI v1 by calling `Version`.
    pub async fn connect(endpoint: Endpoint, timeouts: Timeouts) -> Result<CriClient, CriError> {
        match std::fs::metadata(&endpoint.path) {
            Err(_) => {
                return Err(CriError::SocketMissing {
                    endpoint: endpoint.given.clone(),
                    path: endpoint.path.clone(),
                });
            }
            Ok(meta) => {
                use std::os::unix::fs::FileTypeExt;
                if !meta.file_type().is_socket() {
                    return Err(CriError::BadEndpoint {
                        endpoint: endpoint.given.clone(),
                        reason: format!("{} is not a unix socket", endpoint.path.display()),
                    });
                }
            }
        }
        let path = endpoint.path.clone();
        // The URI is required by tonic but unused: the connector always dials the socket.
        let channel =
            tonic::transport::Endpoint::from_static("http://cri.local")
                .connect_timeout(timeouts.request.min(Duration::from_secs(10)))
                .connect_with_connector(tower::service_fn(move |_: Uri| {
                    let path = path.clone();
                    async move {
                        Ok::<_, std::io::Error>(TokioIo::new(UnixStream::connect(path).await?))
                    }
                }))
                .await
                .map_err(|source| CriError::Connect {
                    endpoint: endpoint.given.clone(),
                    source,
                })?;
        let client = CriClient {
            runtime: RuntimeServiceClient::new(channel.clone()),
            image: ImageServiceClient::new(channel),
            endpoint,
            timeouts,
        };
        // A probe with a short deadline: a socket that is not gRPC never answers properly.
        let probe = client.with_deadline("Version", Duration::from_secs(10), {
            let mut rt = client.runtime.clone();
            move |req| async move { rt.version(req).await }
        });
        match probe(api::VersionRequest {
            version: "v1".into(),
        })
        .await
        {
            Ok(_) => Ok(client),
            Err(CriError::Call { code, message, .. }) => Err(CriError::NotCri {
                endpoint: client.endpoint.given.clone(),
                message: format!("Version answered {code:?}: {message}"),
            }),
            Err(CriError::Timeout { after, .. }) => Err(CriError::NotCri {
                endpoint: client.endpoint.given.clone(),
                message: format!("no CRI answer to Version within {after:?}"),
            }),
            Err(other) => Err(other),
        }
    }

    pub fn endpoint(&self) -> &Endpoint {
        &self.endpoint
    }

    /// Wraps a generated client call with the deadline and the error mapping every call
    /// shares: the deadline travels to the runtime as `grpc-timeout` and is enforced here.
    fn with_deadline<Req, Resp, F, Fut>(
        &self,
        method: &'static str,
        after: Duration,
        call: F,
    ) -> impl FnOnce(Req) -> std::pin::Pin<Box<dyn Future<Output = CriResult<Resp>> + Send>>
    where
        Req: Send + 'static,
        Resp: Send + 'static,
        F: FnOnce(tonic::Request<Req>) -> Fut + Send + 'static,
        Fut: Future<Output = Result<tonic::Response<Resp>, tonic::Status>> + Send + 'static,
    {
        move |req| {
            Box::pin(async move {
                let mut request = tonic::Request::new(req);
                request.set_timeout(after);
                super::trace_context::inject(&mut request);
                let started = tokio::time::Instant::now();
                match tokio::time::timeout(after, call(request)).await {
                    Err(_) => Err(CriError::Timeout { method, after }),
                    Ok(Err(status)) if is_deadline(&status, started.elapsed(), after) => {
                        Err(CriError::Timeout { method, after })
                    }
                    Ok(Err(status)) => Err(CriError::Call {
                        method,
                        code: status.code(),
                        message: status.message().to_string(),
                    }),
                    Ok(Ok(resp)) => Ok(resp.into_inner()),
                }
            })
        }
    }
}

/// Whether a failed call ended at its deadline, however the deadline showed: the runtime's
/// DeadlineExceeded, tonic's own timer (Cancelled, "Timeout expired"), or the runtime
/// resetting the stream when the `grpc-timeout` it was sent ran out (Cancelled, an h2
/// error), which can reach the client before its own timer fires. The runtime's clock
/// started when the request arrived, after the client's, so its reset comes no earlier
/// than `after`. As in kubelet, whose gRPC client reports a call whose context deadline
/// passed as DeadlineExceeded.
fn is_deadline(status: &tonic::Status, elapsed: Duration, after: Duration) -> bool {
    match status.code() {
        tonic::Code::DeadlineExceeded => true,
        tonic::Code::Cancelled => status.message() == "Timeout expired" || elapsed >= after,
        _ => false,
    }
}

/// One CRI call on the runtime service with the request deadline.
macro_rules! runtime_call {
    ($self:ident, $method:literal, $rpc:ident, $req:expr) => {{
        let mut rt = $self.runtime.clone();
        $self.with_deadline($method, $self.timeouts.request, move |r| async move {
            rt.$rpc(r).await
        })($req)
        .await
    }};
}

impl CriClient {
    /// CRI `RuntimeConfig` (CRI 1.28+): the runtime's own cgroup driver. Runtimes that
    /// predate it (containerd 1.7) answer Unimplemented.
    pub async fn runtime_config(&self) -> CriResult<api::RuntimeConfigResponse> {
        runtime_call!(
            self,
            "RuntimeConfig",
            runtime_config,
            api::RuntimeConfigRequest {}
        )
    }
}

impl CriClient {
    /// CRI `GetContainerEvents`: the runtime's stream of sandbox and container changes
    /// (what kubelet's Evented PLEG reads). It stays open, so it has no deadline, and it
    /// resolves only once the runtime answers: containerd sends the stream's headers with
    /// its first event, so run it in a task of its own.
    pub async fn container_events(
        &self,
    ) -> CriResult<tonic::Streaming<api::ContainerEventResponse>> {
        let mut rt = self.runtime.clone();
        match rt.get_container_events(api::GetEventsRequest {}).await {
            Ok(resp) => Ok(resp.into_inner()),
            Err(status) => Err(CriError::Call {
                method: "GetContainerEvents",
                code: status.code(),
                message: status.message().to_string(),
            }),
        }
    }
}

impl RuntimeService for CriClient {
    async fn version(&self) -> CriResult<api::VersionResponse> {
        runtime_call!(
            self,
            "Version",
            version,
            api::VersionRequest {
                version: "v1".into()
            }
        )
    }

    async fn status(&self, verbose: bool) -> CriResult<api::StatusResponse> {
        runtime_call!(self, "Status", status, api::StatusRequest { verbose })
    }

    async fn run_pod_sandbox(
        &self,
        req: api::RunPodSandboxRequest,
    ) -> CriResult<api::RunPodSandboxResponse> {
        runtime_call!(self, "RunPodSandbox", run_pod_sandbox, req)
    }

    async fn stop_pod_sandbox(&self, pod_sandbox_id: &str) -> CriResult<()> {
        let req = api::StopPodSandboxRequest {
            pod_sandbox_id: pod_sandbox_id.to_string(),
        };
        runtime_call!(self, "StopPodSandbox", stop_pod_sandbox, req).map(|_| ())
    }

    async fn remove_pod_sandbox(&self, pod_sandbox_id: &str) -> CriResult<()> {
        let req = api::RemovePodSandboxRequest {
            pod_sandbox_id: pod_sandbox_id.to_string(),
        };
        runtime_call!(self, "RemovePodSandbox", remove_pod_sandbox, req).map(|_| ())
    }

    async fn pod_sandbox_status(
        &self,
        pod_sandbox_id: &str,
    ) -> CriResult<api::PodSandboxStatusResponse> {
        let req = api::PodSandboxStatusRequest {
            pod_sandbox_id: pod_sandbox_id.to_string(),
            verbose: false,
        };
        runtime_call!(self, "PodSandboxStatus", pod_sandbox_status, req)
    }

    async fn list_pod_sandbox(
        &self,
        filter: Option<api::PodSandboxFilter>,
    ) -> CriResult<Vec<api::PodSandbox>> {
        let req = api::ListPodSandboxRequest { filter };
        runtime_call!(self, "ListPodSandbox", list_pod_sandbox, req).map(|r| r.items)
    }

    async fn create_container(&self, req: api::CreateContainerRequest) -> CriResult<String> {
        runtime_call!(self, "CreateContainer", create_container, req).map(|r| r.container_id)
    }

    async fn start_container(&self, container_id: &str) -> CriResult<()> {
        let req = api::StartContainerRequest {
            container_id: container_id.to_string(),
        };
        runtime_call!(self, "StartContainer", start_container, req).map(|_| ())
    }

    async fn stop_container(&self, container_id: &str, timeout_seconds: i64) -> CriResult<()> {
        let req = api::StopContainerRequest {
            container_id: container_id.to_string(),
            timeout: timeout_seconds,
        };
        // The runtime may wait the whole grace period before it answers.
        let after = self.timeouts.request + Duration::from_secs(timeout_seconds.max(0) as u64);
        let mut rt = self.runtime.clone();
        self.with_deadline("StopContainer", after, move |r| async move {
            rt.stop_container(r).await
        })(req)
        .await
        .map(|_| ())
    }

    async fn update_container_resources(
        &self,
        container_id: &str,
        linux: api::LinuxContainerResources,
    ) -> CriResult<()> {
        let req = api::UpdateContainerResourcesRequest {
            container_id: container_id.to_string(),
            linux: Some(linux),
            ..Default::default()
        };
        runtime_call!(
            self,
            "UpdateContainerResources",
            update_container_resources,
            req
        )
        .map(|_| ())
    }

    async fn remove_container(&self, container_id: &str) -> CriResult<()> {
        let req = api::RemoveContainerRequest {
            container_id: container_id.to_string(),
        };
        runtime_call!(self, "RemoveContainer", remove_container, req).map(|_| ())
    }

    async fn list_containers(
        &self,
        filter: Option<api::ContainerFilter>,
    ) -> CriResult<Vec<api::Container>> {
        let req = api::ListContainersRequest { filter };
        runtime_call!(self, "ListContainers", list_containers, req).map(|r| r.containers)
    }

    async fn container_status(
        &self,
        container_id: &str,
        verbose: bool,
    ) -> CriResult<api::ContainerStatusResponse> {
        let req = api::ContainerStatusRequest {
            container_id: container_id.to_string(),
            verbose,
        };
        runtime_call!(self, "ContainerStatus", container_status, req)
    }

    async fn exec_sync(
        &self,
        container_id: &str,
        cmd: Vec<String>,
        timeout_seconds: i64,
    ) -> CriResult<api::ExecSyncResponse> {
        let req = api::ExecSyncRequest {
            container_id: container_id.to_string(),
            cmd,
            timeout: timeout_seconds,
        };
        // kubelet gives ExecSync the command's own timeout on top of the request timeout.
        let after = self.timeouts.request + Duration::from_secs(timeout_seconds.max(0) as u64);
        let mut rt = self.runtime.clone();
        self.with_deadline(
            "ExecSync",
            after,
            move |r| async move { rt.exec_sync(r).await },
        )(req)
        .await
    }
}

impl ImageService for CriClient {
    async fn image_status(&self, image: api::ImageSpec) -> CriResult<Option<api::Image>> {
        let req = api::ImageStatusRequest {
            image: Some(image),
            verbose: false,
        };
        let mut svc = self.image.clone();
        self.with_deadline("ImageStatus", self.timeouts.request, move |r| async move {
            svc.image_status(r).await
        })(req)
        .await
        .map(|r| r.image)
    }

    async fn pull_image(
        &self,
        image: api::ImageSpec,
        auth: Option<api::AuthConfig>,
        sandbox_config: Option<api::PodSandboxConfig>,
    ) -> CriResult<String> {
        let req = api::PullImageRequest {
            image: Some(image),
            auth,
            sandbox_config,
        };
        let mut svc = self.image.clone();
        self.with_deadline("PullImage", self.timeouts.pull, move |r| async move {
            svc.pull_image(r).await
        })(req)
        .await
        .map(|r| r.image_ref)
    }
}

#[cfg(test)]
mod tests {
    use super::{CriClient, Timeouts, is_deadline};
    use crate::cri::{CriError, Endpoint, EndpointSource};
    use std::time::Duration;
    use tonic::{Code, Status};

    const AFTER: Duration = Duration::from_secs(3);

    #[test]
    fn a_call_that_ends_at_its_deadline_is_a_deadline_however_it_ended() {
        let early = Duration::from_millis(2_999);
        let at = AFTER;
        let cases = [
            // (code, message, elapsed, is it the deadline)
            (
                Code::DeadlineExceeded,
                "context deadline exceeded",
                early,
                true,
            ),
            (Code::Cancelled, "Timeout expired", early, true),
            // The runtime reset the stream when its grpc-timeout ran out.
            (Code::Cancelled, "h2 protocol error: http2 error", at, true),
            (
                Code::Cancelled,
                "h2 protocol error: http2 error",
                AFTER * 2,
                true,
            ),
            // Cancelled before the deadline: something else cancelled it.
            (
                Code::Cancelled,
                "h2 protocol error: http2 error",
                early,
                false,
            ),
            // Other failures stay what they are, whenever they came.
            (Code::Unavailable, "connection reset", at, false),
            (Code::NotFound, "no such image", at, false),
        ];
        for (code, message, elapsed, want) in cases {
            assert_eq!(
                is_deadline(&Status::new(code, message), elapsed, AFTER),
                want,
                "{code:?} {message:?} after {elapsed:?}"
            );
        }
    }

    /// A DaemonSet whose CRI socket is not where its manifest says: one message naming
    /// the path and the value to set.
    #[tokio::test]
    async fn a_missing_socket_names_its_path_and_what_to_set() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("containerd.sock");
        let given = format!("unix://{}", path.display());
        let endpoint = Endpoint::parse(&given, EndpointSource::Flag).unwrap();
        let timeouts = Timeouts {
            request: Duration::from_secs(1),
            pull: Duration::from_secs(1),
        };
        let err = CriClient::connect(endpoint, timeouts).await.unwrap_err();
        assert!(matches!(err, CriError::SocketMissing { .. }), "{err:?}");
        let text = err.to_string();
        assert!(
            text.contains(&format!("no socket at {}", path.display())),
            "{text}"
        );
        assert!(text.contains("set --cri (or PODLAPSE_CRI)"), "{text}");
        assert!(!text.contains('\n'), "one line: {text}");
    }
}
