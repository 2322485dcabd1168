//! The observer's first phase: the runtime, what it is, and how to follow it.

use crate::agent::AgentError;
use crate::cri::{CriClient, NodeShape, api};
use crate::observe::{EventsMode, RuntimeView, use_stream};

/// The runtime as the observer sees it, and how it learns of its changes.
pub struct Connected {
    pub(super) view: RuntimeView,
    pub(super) version: api::VersionResponse,
    pub(super) shape: Option<NodeShape>,
    /// The event stream, or why the runtime is polled instead.
    pub(super) stream: Result<(), String>,
}

/// Asks the runtime what it is, and decides between its event stream and polling.
pub async fn connect(client: CriClient, events: EventsMode) -> Result<Connected, AgentError> {
    let shape = NodeShape::detect(&client, None, false).await.ok();
    let view = RuntimeView::new(client);
    let version = view.version().await.map_err(AgentError::RuntimeVersion)?;
    let stream = use_stream(events, &version.runtime_name, &version.runtime_version);
    Ok(Connected {
        view,
        version,
        shape,
        stream,
    })
}

impl Connected {
    /// Why the runtime is polled rather than streamed, when it is.
    pub fn polling_because(&self) -> Option<&str> {
        self.stream.as_ref().err().map(String::as_str)
    }

    /// Where the runtime runs its CNI plugins, as it says.
    pub fn cni_bin_dir(&self) -> Option<String> {
        self.shape
            .as_ref()
            .and_then(|s| s.cni_bin_dirs.first().cloned())
    }

    /// What the trace is observed from, for its header.
    pub(super) fn sources(&self, kernel: bool, runtime_spans: bool) -> Vec<String> {
        let mut sources = Vec::new();
        if kernel {
            sources.push("kernel".to_string());
        }
        sources.push(
            match self.stream {
                Ok(()) => "cri:events",
                Err(_) => "cri:polling",
            }
            .to_string(),
        );
        if runtime_spans {
            sources.push("runtime_spans".to_string());
        }
        sources
    }
}
