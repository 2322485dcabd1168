//! Which sources of stages a recording has: the kernel's probes and the runtime's own
//! spans, each on, off (and by whose choice) or refused by the node. Written once the
//! recording has started (so a trace cut short still says), and again when it ends,
//! with how the wait for the runtime's last spans went. Every output that shows a pod's
//! stages reads it to say which of them a pod has, and why any is absent.

use serde::{Deserialize, Serialize};

/// The recording's sources, as the recorder knew them at `at_ns`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct SourcesRecord {
    /// CLOCK_MONOTONIC ns, the trace's clock.
    pub at_ns: u64,
    pub kernel: KernelSource,
    pub runtime_spans: RuntimeSpanSource,
    /// Set on the record written when the recording ended.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub ended: Option<RecordingEnd>,
}

/// Whether the probes ran.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "state", rename_all = "snake_case")]
pub enum KernelSource {
    /// The probes ran for the whole recording.
    On,
    /// The user turned them off (`--no-ebpf`).
    Off { why: String },
    /// The node could not run them (no permission, no BTF, no tracefs).
    Unavailable { why: String },
}

/// Whether the recorder received the runtime's spans.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "state", rename_all = "snake_case")]
pub enum RuntimeSpanSource {
    /// Not asked for (no `--runtime-otlp-listen`).
    Off,
    /// Received on this address.
    Listening { listen: String },
}

/// How the recording ended, as far as the sources are concerned.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct RecordingEnd {
    /// Spans the runtime sent during the whole recording, for any pod (kept or not).
    pub runtime_spans_received: u64,
    /// How long the end waited for the runtime's spans of sampled calls.
    pub waited_ns: u64,
    /// The longest it would have waited.
    pub bound_ns: u64,
    /// Sampled calls whose runtime span had not come when it stopped waiting.
    pub missing: u64,
    pub wait: SpanWaitEnd,
}

/// Why the end stopped waiting for the runtime's spans.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum SpanWaitEnd {
    /// Nothing to wait for: no receiver, or no call went out sampled.
    NotNeeded,
    /// Every sampled call had its runtime span.
    AllArrived,
    /// The runtime sent a span that ended after the last sampled call had: what was owed
    /// from before it will not come.
    BatchAfterCalls,
    /// The bound passed.
    Bound,
}

impl std::fmt::Display for KernelSource {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            KernelSource::On => f.write_str("on"),
            KernelSource::Off { why } => write!(f, "off ({why})"),
            KernelSource::Unavailable { why } => write!(f, "unavailable ({why})"),
        }
    }
}

/// One pod's sources.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct PodSources {
    /// The CRI calls made for the pod that change something (`podlapse run`; reads of
    /// state are not counted), or the runtime's changes seen of it (`podlapse observe`).
    pub cri: SourceState,
    /// Kernel events the probes attributed to the pod.
    pub kernel: SourceState,
    /// The runtime's own spans under the pod's calls.
    pub runtime: SourceState,
    /// The runtime's spans were being received and the pod's calls went out sampled:
    /// spans were owed, so a call without them is a gap in the record, not the
    /// runtime's own unexplained work.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub runtime_owed: bool,
}

/// What one source gave a pod.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "state", rename_all = "snake_case")]
pub enum SourceState {
    /// All that was expected came: `records` of it.
    Present { records: u64 },
    /// Some came; the rest did not, and `why`.
    Partial { records: u64, why: String },
    /// The recording is still running and the rest is on its way.
    Pending { records: u64, why: String },
    /// Nothing came, and `why`.
    Absent { why: String },
}

impl SourceState {
    pub fn is_present(&self) -> bool {
        matches!(self, SourceState::Present { .. })
    }

    /// Records of the source the pod has.
    pub fn records(&self) -> u64 {
        match self {
            SourceState::Present { records }
            | SourceState::Partial { records, .. }
            | SourceState::Pending { records, .. } => *records,
            SourceState::Absent { .. } => 0,
        }
    }

    /// Why not all of it is there; None when it is.
    pub fn why(&self) -> Option<&str> {
        match self {
            SourceState::Present { .. } => None,
            SourceState::Partial { why, .. }
            | SourceState::Pending { why, .. }
            | SourceState::Absent { why } => Some(why),
        }
    }

    /// `present`, `partial`, `pending` or `absent`.
    pub fn word(&self) -> &'static str {
        match self {
            SourceState::Present { .. } => "present",
            SourceState::Partial { .. } => "partial",
            SourceState::Pending { .. } => "pending",
            SourceState::Absent { .. } => "absent",
        }
    }

    /// `present`, `absent: the probes were off (--no-ebpf)`, ...: the state and its
    /// reason, without the count (which grows after a pod's startup, so the export made
    /// live and the one made from the trace say the same).
    pub fn summary(&self) -> String {
        match self.why() {
            None => self.word().to_string(),
            Some(why) => format!("{}: {why}", self.word()),
        }
    }
}

impl PodSources {
    /// Each source by name, in a fixed order.
    pub fn each(&self) -> [(&'static str, &SourceState); 3] {
        [
            ("cri", &self.cri),
            ("kernel", &self.kernel),
            ("runtime", &self.runtime),
        ]
    }

    /// `cri 14, kernel 212, runtime absent`: each source, with its records or its state.
    pub fn line(&self) -> String {
        self.each()
            .iter()
            .map(|(name, state)| match state {
                SourceState::Present { records } => format!("{name} {records}"),
                SourceState::Partial { records, .. } => format!("{name} {records} (partial)"),
                SourceState::Pending { records, .. } => format!("{name} {records} (pending)"),
                SourceState::Absent { .. } => format!("{name} absent"),
            })
            .collect::<Vec<_>>()
            .join(", ")
    }

    /// The runtime's spans were owed and not all came.
    pub fn runtime_missing(&self) -> bool {
        self.runtime_owed && !self.runtime.is_present()
    }

    /// The sources not wholly there.
    pub fn lacking(&self) -> impl Iterator<Item = (&'static str, &SourceState)> {
        self.each().into_iter().filter(|(_, s)| !s.is_present())
    }
}
