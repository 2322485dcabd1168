//! The runtime as the observer may use it: only the CRI calls that read. The observer is
//! handed this view, never the client, so no code path of it can create, stop or remove
//! anything another client owns.

use tokio::sync::mpsc;

use crate::cri::service::CriResult;
use crate::cri::{CriClient, CriError, RuntimeService, api};

/// What the event stream's task passes on: an event, or why the stream ended.
pub enum StreamMsg {
    Event(Box<api::ContainerEventResponse>),
    Ended(String),
}

#[derive(Clone)]
pub struct RuntimeView {
    client: CriClient,
}

impl RuntimeView {
    pub fn new(client: CriClient) -> RuntimeView {
        RuntimeView { client }
    }

    pub async fn version(&self) -> CriResult<api::VersionResponse> {
        self.client.version().await
    }

    /// The runtime's conditions (NetworkReady, RuntimeReady); `verbose` adds its info.
    pub async fn status(&self, verbose: bool) -> CriResult<api::StatusResponse> {
        self.client.status(verbose).await
    }

    pub async fn sandboxes(&self) -> CriResult<Vec<api::PodSandbox>> {
        self.client.list_pod_sandbox(None).await
    }

    pub async fn containers(&self) -> CriResult<Vec<api::Container>> {
        self.client.list_containers(None).await
    }

    /// A sandbox's status; None when it went away meanwhile.
    pub async fn sandbox_status(&self, id: &str) -> CriResult<Option<api::PodSandboxStatus>> {
        match self.client.pod_sandbox_status(id).await {
            Ok(resp) => Ok(resp.status),
            Err(e) if e.is_not_found() => Ok(None),
            Err(e) => Err(e),
        }
    }

    /// A container's status; None when it went away meanwhile.
    pub async fn container_status(&self, id: &str) -> CriResult<Option<api::ContainerStatus>> {
        match self.client.container_status(id, false).await {
            Ok(resp) => Ok(resp.status),
            Err(e) if e.is_not_found() => Ok(None),
            Err(e) => Err(e),
        }
    }

    /// Subscribes to the runtime's event stream in a task of its own, which passes every
    /// event on at once: containerd 2.x holds back the call or exit that produced an
    /// event while a subscriber's buffer is full, so the observer never makes it wait.
    pub fn events(&self) -> mpsc::UnboundedReceiver<StreamMsg> {
        let (tx, rx) = mpsc::unbounded_channel();
        let client = self.client.clone();
        tokio::spawn(async move {
            let mut stream = match client.container_events().await {
                Ok(s) => s,
                Err(e) => {
                    let _ = tx.send(StreamMsg::Ended(refusal(&e)));
                    return;
                }
            };
            loop {
                match stream.message().await {
                    Ok(Some(ev)) => {
                        if tx.send(StreamMsg::Event(Box::new(ev))).is_err() {
                            return;
                        }
                    }
                    Ok(None) => {
                        let _ = tx.send(StreamMsg::Ended("the runtime closed it".into()));
                        return;
                    }
                    Err(status) => {
                        let _ = tx.send(StreamMsg::Ended(format!(
                            "{:?}: {}",
                            status.code(),
                            status.message()
                        )));
                        return;
                    }
                }
            }
        });
        rx
    }
}

fn refusal(e: &CriError) -> String {
    match e.code() {
        Some(tonic::Code::Unimplemented) => "the runtime does not serve it".into(),
        _ => e.to_string(),
    }
}
