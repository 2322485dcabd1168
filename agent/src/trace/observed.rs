//! What `podlapse observe` records about pods another CRI client runs: each change of a
//! sandbox or container the runtime reported, with the runtime's own time for it where
//! the runtime gives one. These are the observer's CRI view; kernel events are recorded
//! beside them as in every trace.

use serde::{Deserialize, Serialize};

/// What changed.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Observation {
    /// A sandbox appeared, ready: its RunPodSandbox returned.
    SandboxReady,
    /// A sandbox is no longer ready (stopped, or its pause process exited).
    SandboxNotReady,
    /// A sandbox is gone (RemovePodSandbox).
    SandboxRemoved,
    /// A container exists (CreateContainer returned).
    ContainerCreated,
    /// A container runs (StartContainer returned).
    ContainerStarted,
    /// A container's process exited.
    ContainerExited,
    /// A container is gone (RemoveContainer).
    ContainerRemoved,
}

/// How the observer learned it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum ObservedVia {
    /// The runtime's event stream (CRI `GetContainerEvents`), as it happened.
    Events,
    /// A list of the runtime's sandboxes and containers: at most one poll period late.
    Polling,
}

impl ObservedVia {
    pub fn name(self) -> &'static str {
        match self {
            ObservedVia::Events => "events",
            ObservedVia::Polling => "polling",
        }
    }
}

/// One change of a sandbox or container, as the runtime reported it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ObservedRecord {
    /// When the observer learned it (CLOCK_MONOTONIC ns, the trace's clock).
    pub at_ns: u64,
    /// When the runtime says it happened, on the trace's clock (the runtime's wall-clock
    /// time placed through the header's clock anchor). None where the runtime gives no
    /// time for it (a sandbox leaving the ready state in a list).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub runtime_ns: Option<u64>,
    pub what: Observation,
    pub via: ObservedVia,
    /// From kubelet's labels (`io.kubernetes.pod.uid`, `.name`, `.namespace`); empty when
    /// the sandbox carries none, and the pod is then known by its sandbox ID.
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub pod_uid: String,
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub namespace: String,
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub name: String,
    pub sandbox_id: String,
    /// The sandbox's or container's attempt (its CRI metadata).
    #[serde(default)]
    pub attempt: u32,
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub container_id: String,
    /// The container's name (`io.kubernetes.container.name`, else its CRI metadata).
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub container: String,
    /// The sandbox's IP, once ready.
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub ip: String,
    /// The sandbox runs on the node's network (its network namespace mode is NODE):
    /// no pod IP by design.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub host_network: bool,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub exit_code: Option<i32>,
    /// The sandbox or container existed before the observer started: its startup was
    /// not seen.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub before_start: bool,
    /// What about the labels needs saying (missing, malformed).
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub note: String,
    /// The runtime's event stream was on but never delivered this change: a list found
    /// it, up to a relist late, and without the runtime's time where its status has none.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub stream_missed: bool,
}

impl ObservedRecord {
    /// The pod this record belongs to in a timeline: its UID, or, for a sandbox without
    /// kubelet's labels, its sandbox ID (64 hex digits, never a UID), so it is never
    /// merged into another pod.
    pub fn pod_key(&self) -> &str {
        if self.pod_uid.is_empty() {
            &self.sandbox_id
        } else {
            &self.pod_uid
        }
    }

    /// When it happened: the runtime's time, else when the observer saw it.
    pub fn happened_ns(&self) -> u64 {
        self.runtime_ns.unwrap_or(self.at_ns)
    }
}

/// The header's note that a trace was observed, not run: who ran the pods is unknown to
/// podlapse, so replay refuses it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ObservedHeader {
    /// What the trace was recorded from: `kernel` (the probes), `cri:events` or
    /// `cri:polling`, `runtime_spans`.
    pub sources: Vec<String>,
    /// How often the runtime's lists were read when there was no event stream.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub poll_ms: Option<u64>,
}

/// What `podlapse observe` could not see, for the trace's footer.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct ObservedFooter {
    /// Changes the event stream never delivered, found by a list instead.
    #[serde(default)]
    pub stream_missed: u64,
    /// Why the event stream ended before the observer did (it polled from then on).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub stream_ended: Option<String>,
    /// The runtime's spans received (`--runtime-otlp-listen`), and those dropped by
    /// reason (`unknown_pod`: their trace named no pod the observer saw; `malformed`).
    #[serde(default)]
    pub runtime_spans_received: u64,
    #[serde(default, skip_serializing_if = "std::collections::BTreeMap::is_empty")]
    pub runtime_spans_dropped: std::collections::BTreeMap<String, u64>,
    /// Looks at the runtime that failed (each retried at the next period).
    #[serde(default)]
    pub runtime_errors: u64,
}
