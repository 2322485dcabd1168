//! The one error type every CRI call returns.

use std::path::PathBuf;
use std::time::Duration;

/// What went wrong talking to the container runtime. Every variant names the endpoint or
/// the CRI method, so a reader can tell which call failed without a backtrace.
#[derive(Debug, thiserror::Error)]
pub enum CriError {
    /// Nothing exists at the socket path. The message says what to set: on a node that is
    /// not the runtime's usual path, or in a container that mounts another directory.
    #[error(
        "CRI endpoint {endpoint}: no socket at {}: set --cri (or PODLAPSE_CRI) to the node's runtime socket, e.g. unix:///run/containerd/containerd.sock (containerd) or unix:///run/k3s/containerd/containerd.sock (k3s), and in a container mount its directory at that path",
        path.display()
    )]
    SocketMissing { endpoint: String, path: PathBuf },

    /// The endpoint is not a unix socket URL podlapse understands.
    #[error("CRI endpoint {endpoint}: {reason}")]
    BadEndpoint { endpoint: String, reason: String },

    /// The socket exists but a connection could not be made.
    #[error("CRI endpoint {endpoint}: cannot connect: {source}")]
    Connect {
        endpoint: String,
        #[source]
        source: tonic::transport::Error,
    },

    /// Something answers on the socket, but it does not speak CRI v1.
    #[error("CRI endpoint {endpoint}: not a CRI v1 runtime ({message})")]
    NotCri { endpoint: String, message: String },

    /// The runtime answered the call with an error status.
    #[error("CRI {method} failed: {code:?}: {message}")]
    Call {
        method: &'static str,
        code: tonic::Code,
        message: String,
    },

    /// The call did not finish within its deadline (gRPC DeadlineExceeded, as kubelet's
    /// context deadline reads).
    #[error("CRI {method}: no answer within its {after:?} deadline (DeadlineExceeded)")]
    Timeout {
        method: &'static str,
        after: Duration,
    },

    /// The runtime answered, but without a field the call cannot do without.
    #[error("CRI {method} answered without {field}")]
    MissingField {
        method: &'static str,
        field: &'static str,
    },
}

impl CriError {
    /// The gRPC status code when the runtime itself answered with an error.
    pub fn code(&self) -> Option<tonic::Code> {
        match self {
            CriError::Call { code, .. } => Some(*code),
            CriError::Timeout { .. } => Some(tonic::Code::DeadlineExceeded),
            _ => None,
        }
    }

    /// True when the runtime reported the object does not exist.
    pub fn is_not_found(&self) -> bool {
        self.code() == Some(tonic::Code::NotFound)
    }
}
