//! The fake runtime's answers to the runtime service's calls. Each call is logged, then
//! failed if an injected fault says so (`entry.rs`), then answered from the objects as
//! containerd would: IDs that do not exist are NotFound, except where CRI makes the call
//! idempotent (StopPodSandbox, RemovePodSandbox, RemoveContainer).

use super::objects::{Container, Sandbox};
use super::{FakeCall, FakeRuntime, Method};
use crate::cri::service::CriResult;
use crate::cri::{CriError, RuntimeService, api};

fn not_found(method: Method, what: &str, id: &str) -> CriError {
    CriError::Call {
        method: method.as_str(),
        code: tonic::Code::NotFound,
        message: format!("an error occurred when try to find {what} {id:?}: not found"),
    }
}

fn refused(method: Method, message: String) -> CriError {
    CriError::Call {
        method: method.as_str(),
        code: tonic::Code::Unknown,
        message,
    }
}

fn container_status(id: &str, c: &Container) -> api::ContainerStatus {
    api::ContainerStatus {
        id: id.to_string(),
        metadata: c.config.metadata.clone(),
        state: c.state as i32,
        created_at: c.created_at,
        started_at: c.started_at,
        finished_at: c.finished_at,
        exit_code: c.exit_code,
        image: c.config.image.clone(),
        image_ref: c.image_ref.clone(),
        image_id: c.image_ref.clone(),
        reason: c.reason.clone(),
        labels: c.config.labels.clone(),
        annotations: c.config.annotations.clone(),
        mounts: c.config.mounts.clone(),
        log_path: c.config.log_path.clone(),
        resources: Some(api::ContainerResources {
            linux: c.config.linux.as_ref().and_then(|l| l.resources.clone()),
            windows: None,
        }),
        ..Default::default()
    }
}

impl RuntimeService for FakeRuntime {
    async fn version(&self) -> CriResult<api::VersionResponse> {
        let _st = self.enter(FakeCall::Version)?;
        Ok(api::VersionResponse {
            version: "0.1.0".into(),
            runtime_name: "fake".into(),
            runtime_version: "0.1.0".into(),
            runtime_api_version: "v1".into(),
        })
    }

    async fn status(&self, _verbose: bool) -> CriResult<api::StatusResponse> {
        let st = self.enter(FakeCall::Status)?;
        let (ready, message) = st.network.clone();
        let network = api::RuntimeCondition {
            r#type: "NetworkReady".into(),
            status: ready,
            reason: if ready {
                String::new()
            } else {
                "NetworkPluginNotReady".into()
            },
            message: if ready { String::new() } else { message },
        };
        Ok(api::StatusResponse {
            status: Some(api::RuntimeStatus {
                conditions: vec![
                    api::RuntimeCondition {
                        r#type: "RuntimeReady".into(),
                        status: true,
                        ..Default::default()
                    },
                    network,
                ],
            }),
            ..Default::default()
        })
    }

    async fn run_pod_sandbox(
        &self,
        req: api::RunPodSandboxRequest,
    ) -> CriResult<api::RunPodSandboxResponse> {
        let config = req.config.unwrap_or_default();
        let meta = config.metadata.clone().unwrap_or_default();
        let mut st = self.enter(FakeCall::RunPodSandbox {
            pod_uid: meta.uid.clone(),
            attempt: meta.attempt,
        })?;
        let host_network = config
            .linux
            .as_ref()
            .and_then(|l| l.security_context.as_ref())
            .and_then(|s| s.namespace_options.as_ref())
            .is_some_and(|n| n.network == api::NamespaceMode::Node as i32);
        let id = st.next_id("sandbox");
        let ip = if host_network {
            String::new()
        } else {
            st.next_ip()
        };
        let now = st.now;
        st.objects.add_sandbox(
            id.clone(),
            Sandbox {
                uid: meta.uid,
                attempt: meta.attempt,
                config,
                ready: true,
                ip,
                created_at: now,
            },
        );
        Ok(api::RunPodSandboxResponse { pod_sandbox_id: id })
    }

    async fn stop_pod_sandbox(&self, id: &str) -> CriResult<()> {
        let mut st = self.enter(FakeCall::StopPodSandbox {
            sandbox_id: id.to_string(),
        })?;
        let now = st.now;
        st.objects.stop_sandbox(id, now);
        Ok(())
    }

    async fn remove_pod_sandbox(&self, id: &str) -> CriResult<()> {
        let mut st = self.enter(FakeCall::RemovePodSandbox {
            sandbox_id: id.to_string(),
        })?;
        st.objects.remove_sandbox(id);
        Ok(())
    }

    async fn pod_sandbox_status(&self, id: &str) -> CriResult<api::PodSandboxStatusResponse> {
        let st = self.enter(FakeCall::PodSandboxStatus {
            sandbox_id: id.to_string(),
        })?;
        let sb = st
            .objects
            .sandbox(id)
            .ok_or_else(|| not_found(Method::PodSandboxStatus, "sandbox", id))?;
        Ok(api::PodSandboxStatusResponse {
            status: Some(sb.status(id)),
            ..Default::default()
        })
    }

    async fn list_pod_sandbox(
        &self,
        filter: Option<api::PodSandboxFilter>,
    ) -> CriResult<Vec<api::PodSandbox>> {
        let st = self.enter(FakeCall::ListPodSandbox)?;
        let filter = filter.unwrap_or_default();
        Ok(st
            .objects
            .sandboxes_matching(&filter.label_selector)
            .filter(|(id, _)| filter.id.is_empty() || **id == filter.id)
            .filter(|(_, sb)| filter.state.as_ref().is_none_or(|s| s.state == sb.state()))
            .map(|(id, sb)| sb.listed(id))
            .collect())
    }

    async fn create_container(&self, req: api::CreateContainerRequest) -> CriResult<String> {
        let config = req.config.unwrap_or_default();
        let meta = config.metadata.clone().unwrap_or_default();
        let mut st = self.enter(FakeCall::CreateContainer {
            sandbox_id: req.pod_sandbox_id.clone(),
            name: meta.name.clone(),
            attempt: meta.attempt,
        })?;
        let sb = st
            .objects
            .sandbox(&req.pod_sandbox_id)
            .ok_or_else(|| not_found(Method::CreateContainer, "sandbox", &req.pod_sandbox_id))?;
        if !sb.ready {
            return Err(refused(
                Method::CreateContainer,
                format!("sandbox container {:?} is not running", req.pod_sandbox_id),
            ));
        }
        let uid = sb.uid.clone();
        let id = st.next_id(&meta.name);
        let runs_for = st.runs.get(&meta.name).copied();
        let now = st.now;
        st.objects.add_container(
            id.clone(),
            Container {
                uid,
                sandbox_id: req.pod_sandbox_id,
                image_ref: config
                    .image
                    .as_ref()
                    .map(|i| i.image.clone())
                    .unwrap_or_default(),
                config,
                state: api::ContainerState::ContainerCreated,
                created_at: now,
                started_at: 0,
                finished_at: 0,
                exit_code: 0,
                reason: String::new(),
                runs_for,
                exited: tokio::sync::watch::Sender::new(false),
            },
        );
        Ok(id)
    }

    async fn start_container(&self, id: &str) -> CriResult<()> {
        let mut st = self.enter(FakeCall::StartContainer {
            container_id: id.to_string(),
        })?;
        let c = st
            .objects
            .container(id)
            .ok_or_else(|| not_found(Method::StartContainer, "container", id))?;
        if c.state != api::ContainerState::ContainerCreated {
            return Err(refused(
                Method::StartContainer,
                format!(
                    "failed to set starting state for container {id:?}: container is in {} state",
                    c.state.as_str_name()
                ),
            ));
        }
        let now = st.now;
        st.objects.start_container(id, now);
        Ok(())
    }

    async fn stop_container(&self, id: &str, timeout_seconds: i64) -> CriResult<()> {
        let mut st = self.enter(FakeCall::StopContainer {
            container_id: id.to_string(),
            timeout: timeout_seconds,
        })?;
        let c = st
            .objects
            .container(id)
            .ok_or_else(|| not_found(Method::StopContainer, "container", id))?;
        // As containerd: only a running container has a process to stop.
        if c.state == api::ContainerState::ContainerRunning {
            let now = st.now;
            st.objects.stop_container(id, now, 137, "Error");
        }
        Ok(())
    }

    async fn remove_container(&self, id: &str) -> CriResult<()> {
        let mut st = self.enter(FakeCall::RemoveContainer {
            container_id: id.to_string(),
        })?;
        st.objects.remove_container(id);
        Ok(())
    }

    async fn update_container_resources(
        &self,
        id: &str,
        linux: api::LinuxContainerResources,
    ) -> CriResult<()> {
        let mut st = self.enter(FakeCall::UpdateContainerResources {
            container_id: id.to_string(),
        })?;
        let c = st
            .objects
            .container_mut(id)
            .ok_or_else(|| not_found(Method::UpdateContainerResources, "container", id))?;
        c.config.linux.get_or_insert_default().resources = Some(linux);
        Ok(())
    }

    async fn list_containers(
        &self,
        filter: Option<api::ContainerFilter>,
    ) -> CriResult<Vec<api::Container>> {
        let st = self.enter(FakeCall::ListContainers)?;
        let filter = filter.unwrap_or_default();
        Ok(st
            .objects
            .containers_matching(&filter.label_selector)
            .filter(|(id, c)| {
                (filter.id.is_empty() || **id == filter.id)
                    && (filter.pod_sandbox_id.is_empty() || c.sandbox_id == filter.pod_sandbox_id)
                    && filter
                        .state
                        .as_ref()
                        .is_none_or(|s| s.state == c.state as i32)
            })
            .map(|(id, c)| c.listed(id))
            .collect())
    }

    async fn container_status(
        &self,
        id: &str,
        _verbose: bool,
    ) -> CriResult<api::ContainerStatusResponse> {
        let st = self.enter(FakeCall::ContainerStatus {
            container_id: id.to_string(),
        })?;
        let c = st
            .objects
            .container(id)
            .ok_or_else(|| not_found(Method::ContainerStatus, "container", id))?;
        Ok(api::ContainerStatusResponse {
            status: Some(container_status(id, c)),
            ..Default::default()
        })
    }

    async fn exec_sync(
        &self,
        id: &str,
        _cmd: Vec<String>,
        _timeout_seconds: i64,
    ) -> CriResult<api::ExecSyncResponse> {
        let st = self.enter(FakeCall::ExecSync {
            container_id: id.to_string(),
        })?;
        let c = st
            .objects
            .container(id)
            .ok_or_else(|| not_found(Method::ExecSync, "container", id))?;
        if c.state != api::ContainerState::ContainerRunning {
            return Err(refused(
                Method::ExecSync,
                format!("container {id:?} is not running"),
            ));
        }
        Ok(api::ExecSyncResponse::default())
    }
}
