//! What stops the agent, phase by phase. Each error names the input or the part of the
//! node it is about; [`AgentError::is_bad_input`] tells a wrong flag, manifest or
//! collector address (which the user fixes) from a node that failed the agent.

use std::path::PathBuf;

use crate::cri::{CriError, NodeShapeError};
use crate::ebpf::EbpfError;
use crate::otel::OtelError;

#[derive(Debug, thiserror::Error)]
pub enum AgentError {
    /// The OTLP collector address, or the runtime span receiver's.
    #[error(transparent)]
    Otlp(#[from] OtelError),
    /// The runtime's version, asked for the trace header.
    #[error(transparent)]
    RuntimeVersion(CriError),
    /// The node's shape (cgroup driver, CNI directory) from the runtime.
    #[error(transparent)]
    NodeShape(#[from] NodeShapeError),
    #[error(
        "the CNI plugin directory {dir} (from {from}) does not exist; the runtime {runtime_says}"
    )]
    CniBinDirMissing {
        dir: String,
        /// `--cni-bin-dir`, or the runtime's status info.
        from: &'static str,
        runtime_says: String,
    },
    #[error("--trace {}: {source}", path.display())]
    TraceCreate {
        path: PathBuf,
        source: std::io::Error,
    },
    /// The probes could not run, and the run needs them (`--require-ebpf`).
    #[error("kernel events unavailable (--require-ebpf): {0}")]
    ProbesRequired(EbpfError),
    /// The probes failed for a reason other than the node's lack of support.
    #[error(transparent)]
    Probes(EbpfError),
    #[error("pod cgroups: {0} (use --cgroup-root \"\" to leave cgroups to the runtime)")]
    PodCgroups(#[from] crate::cm::CmError),
    #[error(transparent)]
    Api(#[from] crate::syncloop::api::ApiError),
    /// The observer's API (which it can do without).
    #[error("{0} (--api-socket, or --no-api)")]
    ObserverApi(crate::syncloop::api::ApiError),
    #[error("--metrics-addr: {0}")]
    Metrics(#[from] crate::metrics::MetricsError),
    #[error("watching {paths:?}: {source}")]
    WatchManifests {
        paths: Vec<PathBuf>,
        source: notify::Error,
    },
    /// The manifest watch ended, so the agent would no longer see changes.
    #[error("watching {0:?} stopped")]
    WatchEnded(Vec<PathBuf>),
    #[error("no valid pods in {0:?}")]
    NoPods(Vec<PathBuf>),
    #[error("cannot handle SIGTERM: {0}")]
    Signals(std::io::Error),
    /// The sync loop stopped taking config changes while the agent still had some.
    #[error("the sync loop stopped")]
    SyncLoopStopped,
}

impl AgentError {
    /// The user's input is wrong (a flag, a manifest directory, an address), as opposed
    /// to the node or the agent failing.
    pub fn is_bad_input(&self) -> bool {
        !matches!(
            self,
            AgentError::RuntimeVersion(_)
                | AgentError::ProbesRequired(_)
                | AgentError::Probes(_)
                | AgentError::Signals(_)
                | AgentError::WatchEnded(_)
                | AgentError::SyncLoopStopped
        )
    }
}
