//! The runtime and image service traits: one method per CRI call podtrace makes.

use std::future::Future;

use super::CriError;
use super::api;

/// Result of one CRI call.
pub type CriResult<T> = Result<T, CriError>;

/// kubelet's `RuntimeService`: sandboxes, containers, exec and runtime status.
pub trait RuntimeService: Send + Sync {
    fn version(&self) -> impl Future<Output = CriResult<api::VersionResponse>> + Send;
    fn status(&self, verbose: bool) -> impl Future<Output = CriResult<api::StatusResponse>> + Send;
    fn run_pod_sandbox(
        &self,
        req: api::RunPodSandboxRequest,
    ) -> impl Future<Output = CriResult<api::RunPodSandboxResponse>> + Send;
    fn stop_pod_sandbox(&self, pod_sandbox_id: &str) -> impl Future<Output = CriResult<()>> + Send;
    fn remove_pod_sandbox(
        &self,
        pod_sandbox_id: &str,
    ) -> impl Future<Output = CriResult<()>> + Send;
    fn pod_sandbox_status(
        &self,
        pod_sandbox_id: &str,
    ) -> impl Future<Output = CriResult<api::PodSandboxStatusResponse>> + Send;
    fn list_pod_sandbox(
        &self,
        filter: Option<api::PodSandboxFilter>,
    ) -> impl Future<Output = CriResult<Vec<api::PodSandbox>>> + Send;
    fn create_container(
        &self,
        req: api::CreateContainerRequest,
    ) -> impl Future<Output = CriResult<String>> + Send;
    fn start_container(&self, container_id: &str) -> impl Future<Output = CriResult<()>> + Send;
    fn stop_container(
        &self,
        container_id: &str,
        timeout_seconds: i64,
    ) -> impl Future<Output = CriResult<()>> + Send;
    fn remove_container(&self, container_id: &str) -> impl Future<Output = CriResult<()>> + Send;
    fn list_containers(
        &self,
        filter: Option<api::ContainerFilter>,
    ) -> impl Future<Output = CriResult<Vec<api::Container>>> + Send;
    /// `verbose` adds the runtime's info map (containerd puts the container's pid there).
    fn container_status(
        &self,
        container_id: &str,
        verbose: bool,
    ) -> impl Future<Output = CriResult<api::ContainerStatusResponse>> + Send;
    fn exec_sync(
        &self,
        container_id: &str,
        cmd: Vec<String>,
        timeout_seconds: i64,
    ) -> impl Future<Output = CriResult<api::ExecSyncResponse>> + Send;
}

/// kubelet's `ImageManagerService`: image presence and pulls.
pub trait ImageService: Send + Sync {
    fn image_status(
        &self,
        image: api::ImageSpec,
    ) -> impl Future<Output = CriResult<Option<api::Image>>> + Send;
    fn pull_image(
        &self,
        image: api::ImageSpec,
        auth: Option<api::AuthConfig>,
        sandbox_config: Option<api::PodSandboxConfig>,
    ) -> impl Future<Output = CriResult<String>> + Send;
}
