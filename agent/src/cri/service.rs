//! The runtime and image service traits: one method per CRI call podlapse makes.

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
    /// Resizes a running container in place.
    fn update_container_resources(
        &self,
        container_id: &str,
        linux: api::LinuxContainerResources,
    ) -> impl Future<Output = CriResult<()>> + Send;
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

    /// Not a CRI call: ListContainers reduced to what a relist compares. `visit` is called
    /// with each listed container's ID, the value of its label `label` (empty without
    /// it) and its state (`api::ContainerState` as an integer), in the runtime's listing
    /// order; an error comes before any visit. The default lists whole containers, so a
    /// real runtime answers it with one ListContainers; the replay runtime, which holds its
    /// containers in memory, visits them in place, copying nothing: the relist runs every
    /// second over every container.
    fn visit_container_states<F>(
        &self,
        filter: Option<api::ContainerFilter>,
        label: &str,
        mut visit: F,
    ) -> impl Future<Output = CriResult<()>> + Send
    where
        F: FnMut(&str, &str, i32) + Send,
    {
        async move {
            let containers = self.list_containers(filter).await?;
            for c in &containers {
                let value = c.labels.get(label).map_or("", String::as_str);
                visit(&c.id, value, c.state);
            }
            Ok(())
        }
    }

    /// Not a CRI call: ListPodSandbox reduced to what a pod's status reads of each
    /// sandbox listed: `visit` is called with its ID and attempt, in the runtime's listing
    /// order; an error comes before any visit. The default lists whole sandboxes (one
    /// ListPodSandbox, as before); the replay runtime visits its sandboxes in place, where a
    /// listing would copy each one's labels and annotations only for them to be dropped.
    fn visit_pod_sandboxes<F>(
        &self,
        filter: Option<api::PodSandboxFilter>,
        mut visit: F,
    ) -> impl Future<Output = CriResult<()>> + Send
    where
        F: FnMut(&str, u32) + Send,
    {
        async move {
            let sandboxes = self.list_pod_sandbox(filter).await?;
            for sb in &sandboxes {
                visit(&sb.id, sb.metadata.as_ref().map_or(0, |m| m.attempt));
            }
            Ok(())
        }
    }

    /// Not a CRI call: PodSandboxStatus as the reconciler reads it, without the sandbox's
    /// labels and annotations (which it never reads there). The default makes the call
    /// (a real runtime answers it as before) and drops them; the replay runtime, which
    /// holds its sandboxes in memory, does not copy them in the first place.
    fn pod_sandbox_status_reduced(
        &self,
        pod_sandbox_id: &str,
    ) -> impl Future<Output = CriResult<api::PodSandboxStatusResponse>> + Send {
        async move {
            let mut resp = self.pod_sandbox_status(pod_sandbox_id).await?;
            if let Some(st) = resp.status.as_mut() {
                st.labels.clear();
                st.annotations.clear();
            }
            Ok(resp)
        }
    }

    /// Not a CRI call: ContainerStatus as the reconciler reads it, without the container's
    /// labels and with only the annotations named in `annotations`. The default makes the
    /// call (a real runtime answers it as before) and drops the rest; the replay runtime
    /// copies only what is kept.
    fn container_status_reduced(
        &self,
        container_id: &str,
        verbose: bool,
        annotations: &'static [&'static str],
    ) -> impl Future<Output = CriResult<api::ContainerStatusResponse>> + Send {
        async move {
            let mut resp = self.container_status(container_id, verbose).await?;
            if let Some(st) = resp.status.as_mut() {
                st.labels.clear();
                st.annotations
                    .retain(|k, _| annotations.contains(&k.as_str()));
            }
            Ok(resp)
        }
    }

    /// Not a CRI call: for a runtime that knows when a started container exits without a
    /// process to watch (the replay runtime, whose containers exit when the recording
    /// says), a future that resolves then. `None`, the default and what a real runtime
    /// gives: the PLEG watches the container's process instead.
    fn exit_notice(
        &self,
        _container_id: &str,
    ) -> Option<impl Future<Output = ()> + Send + 'static> {
        None::<std::future::Pending<()>>
    }
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
