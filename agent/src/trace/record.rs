//! The records of a trace file. Every record is one JSON object on one line, tagged by
//! `type`. Times are CLOCK_MONOTONIC nanoseconds (`*_ns`), the clock of the eBPF probes,
//! unless a name says `wall`.

use std::collections::BTreeMap;
use std::sync::Arc;

use k8s_openapi::api::core::v1::{Pod, PodStatus};
use podlapse_core::record::{CriCall, KernelEvent, PodEvent, PodWait, RuntimeSpan};
use serde::{Deserialize, Serialize};

use super::config::TraceConfig;
use super::node_network::NodeNetworkRecord;
pub use super::observed::{
    Observation, ObservedFooter, ObservedHeader, ObservedRecord, ObservedVia,
};
use super::sources::SourcesRecord;

/// The schema version this podlapse writes and the newest it reads.
pub const SCHEMA_VERSION: u32 = 1;

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Header {
    pub schema_version: u32,
    /// The version of podlapse that wrote the trace. Traces written before the project
    /// took this name carry it as `podtrace_version`; they read the same.
    #[serde(alias = "podtrace_version")]
    pub podlapse_version: String,
    pub node: String,
    /// `uname -r` of the node.
    pub kernel: String,
    pub runtime_name: String,
    pub runtime_version: String,
    /// The settings of the run (the agent's flags, node allocatable, back-off) or of the
    /// observer.
    pub config: TraceConfig,
    /// When the trace started, on both clocks, to place monotonic times in wall time.
    pub started_wall_ns: i64,
    pub started_ns: u64,
    /// Set when `podlapse observe` recorded the trace: another CRI client ran the pods.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub observed: Option<ObservedHeader>,
    /// Set when the trace rotates (`--trace-max-bytes`): which file of the recording
    /// this is.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub part: Option<TracePart>,
}

/// One file of a rotated trace. Each is a whole trace (header, records, footer); the
/// files of one recording share `rotation` and count up in `index`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct TracePart {
    /// The same in every file of one recording, and in no other recording's.
    pub rotation: String,
    /// 0 for the recording's first file, one more for each after it.
    pub index: u64,
}

impl Header {
    /// The trace's clock for a wall-clock time (ns since the epoch), through the anchor
    /// both clocks were read at; None before the anchor's monotonic zero.
    pub fn mono_of_wall(&self, wall_ns: i64) -> Option<u64> {
        let mono = self.started_ns as i128 + (wall_ns as i128 - self.started_wall_ns as i128);
        u64::try_from(mono).ok()
    }
}

/// A change of the desired pods (kubelet's ADD / UPDATE / REMOVE).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "UPPERCASE")]
pub enum PodOp {
    Add,
    Update,
    Remove,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct PodOpRecord {
    pub at_ns: u64,
    pub op: PodOp,
    /// The pod, with environment values removed (see [`redact_pod`]). Shared: a replay
    /// hands the recorded pod to the reconciler as it is.
    pub pod: Arc<Pod>,
}

/// A change of a pod's API status, as the agent published it: the moment podlapse saw a
/// container start or exit, or a pod's phase or conditions change.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct PodStatusRecord {
    pub at_ns: u64,
    pub pod_uid: String,
    pub namespace: String,
    pub name: String,
    pub status: Box<PodStatus>,
}

/// A pod event (Pulling, Started, BackOff, ...).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct PodEventRecord {
    pub at_ns: u64,
    pub pod_uid: String,
    pub namespace: String,
    pub name: String,
    #[serde(flatten)]
    pub event: PodEvent,
}

/// Time a pod's work spent queued behind something the agent decides (the image
/// puller, ...): a stage of its own in the timeline.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct PodWaitRecord {
    pub start_ns: u64,
    pub end_ns: u64,
    pub pod_uid: String,
    pub namespace: String,
    pub name: String,
    #[serde(flatten)]
    pub wait: PodWait,
}

#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct Footer {
    pub ended_ns: u64,
    /// Records written, by type.
    pub counts: BTreeMap<String, u64>,
    /// Kernel events the probes lost (ring buffer full), by kind, and in all.
    pub lost_events: u64,
    #[serde(default)]
    pub lost_by_kind: BTreeMap<String, u64>,
    /// False when the probes did not run (no permission, no tracefs).
    pub ebpf: bool,
    /// Records that reached the writer but not the file (a write error, a full disk).
    #[serde(default)]
    pub unwritten_records: u64,
    /// Records dropped because the writer fell too far behind (its queue was full).
    #[serde(default)]
    pub dropped_records: u64,
    /// An observed trace's losses on the runtime's side (`podlapse observe`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub observed: Option<super::observed::ObservedFooter>,
    /// The recording's sources as it ended (the last `sources` record's).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub sources: Option<SourcesRecord>,
    /// Each pod's sources, by UID: which it has, and why any is absent.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub pod_sources: BTreeMap<String, super::sources::PodSources>,
    /// The recording goes on in the rotation's next file (`index` + 1): this footer
    /// ends the file, not the recording, and holds only the file's counts.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub continued: bool,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(tag = "type", rename_all = "snake_case")]
pub enum TraceRecord {
    Header(Header),
    Pod(PodOpRecord),
    Cri(CriCall),
    Kernel(KernelEvent),
    Event(PodEventRecord),
    Status(PodStatusRecord),
    Wait(PodWaitRecord),
    /// A computed stage of a pod's startup (see the timeline).
    Stage(serde_json::Value),
    /// A span the container runtime exported to the agent, under one of a pod's CRI
    /// calls (`podlapse run --runtime-otlp-listen`).
    RuntimeSpan(Box<RuntimeSpan>),
    /// A change of a sandbox or container another CRI client runs (`podlapse observe`).
    Observed(ObservedRecord),
    /// The node's pod network when it changed: NetworkReady, the CNI configuration,
    /// host-local's pool.
    Network(Box<NodeNetworkRecord>),
    /// Which sources of stages the recording has (the probes, the runtime's spans).
    Sources(SourcesRecord),
    Footer(Footer),
}

impl TraceRecord {
    /// When the record's event happened on the trace's clock (a CRI call: when it ended);
    /// None for the header, stages and the footer.
    pub fn at_ns(&self) -> Option<u64> {
        match self {
            TraceRecord::Pod(p) => Some(p.at_ns),
            TraceRecord::Cri(c) => Some(c.end_ns.max(c.start_ns)),
            TraceRecord::Kernel(k) => Some(k.ktime_ns()),
            TraceRecord::Event(e) => Some(e.at_ns),
            TraceRecord::Status(s) => Some(s.at_ns),
            TraceRecord::Wait(w) => Some(w.end_ns),
            TraceRecord::RuntimeSpan(s) => Some(s.end_ns.max(s.start_ns)),
            TraceRecord::Observed(o) => Some(o.at_ns),
            TraceRecord::Network(n) => Some(n.at_ns),
            TraceRecord::Sources(s) => Some(s.at_ns),
            TraceRecord::Header(_) | TraceRecord::Stage(_) | TraceRecord::Footer(_) => None,
        }
    }

    pub fn type_name(&self) -> &'static str {
        match self {
            TraceRecord::Header(_) => "header",
            TraceRecord::Pod(_) => "pod",
            TraceRecord::Cri(_) => "cri",
            TraceRecord::Kernel(_) => "kernel",
            TraceRecord::Event(_) => "event",
            TraceRecord::Status(_) => "status",
            TraceRecord::Wait(_) => "wait",
            TraceRecord::Stage(_) => "stage",
            TraceRecord::RuntimeSpan(_) => "runtime_span",
            TraceRecord::Observed(_) => "observed",
            TraceRecord::Network(_) => "network",
            TraceRecord::Sources(_) => "sources",
            TraceRecord::Footer(_) => "footer",
        }
    }
}

/// Record types this version knows; others are skipped when read (forward compatible).
pub(super) const KNOWN_TYPES: &[&str] = &[
    "header",
    "pod",
    "cri",
    "kernel",
    "event",
    "status",
    "wait",
    "stage",
    "runtime_span",
    "observed",
    "network",
    "sources",
    "footer",
];

/// A pod as a trace keeps it: environment variable values are dropped (names stay), so
/// no configuration value or secret reaches the file.
pub fn redact_pod(pod: &Pod) -> Pod {
    let mut pod = pod.clone();
    if let Some(spec) = pod.spec.as_mut() {
        for c in spec
            .containers
            .iter_mut()
            .chain(spec.init_containers.iter_mut().flatten())
        {
            for e in c.env.iter_mut().flatten() {
                e.value = None;
            }
        }
    }
    pod
}
