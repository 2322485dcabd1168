//! Which sources of stages a pod has (its CRI calls, the kernel's events, the runtime's
//! spans) and, for each it lacks, why: the probes were off or refused, no span was
//! asked for, the runtime sent none, the recording ended before they came. Read from
//! the recording's `sources` record and the pod's own records; no IO, no clock.

use std::collections::BTreeSet;

use podlapse_core::record::{CriCall, RuntimeSpan, ids};

use crate::trace::{KernelSource, RuntimeSpanSource, SourcesRecord, SpanWaitEnd};
pub use crate::trace::{PodSources, SourceState};

/// What the builder knows of one pod's records.
pub(super) struct PodRecords<'a> {
    pub calls: &'a [&'a CriCall],
    /// The runtime's changes an observer saw of the pod.
    pub observed: u64,
    pub kernel_events: u64,
    pub runtime_spans: &'a [&'a RuntimeSpan],
}

/// The pod's sources; None for a recording that did not record its sources (older
/// traces, replays).
pub(super) fn of_pod(sources: Option<&SourcesRecord>, pod: &PodRecords<'_>) -> Option<PodSources> {
    let sources = sources?;
    Some(PodSources {
        cri: cri(pod),
        kernel: kernel(&sources.kernel, pod.kernel_events),
        runtime: runtime(sources, pod),
        runtime_owed: matches!(sources.runtime_spans, RuntimeSpanSource::Listening { .. })
            && pod.calls.iter().any(|c| c.traced),
    })
}

fn cri(pod: &PodRecords<'_>) -> SourceState {
    // Reads of state (statuses, lists) are not counted: the live agent keeps only those
    // that changed something, and the count must not depend on where it is read.
    let calls = pod.calls.iter().filter(|c| !c.is_observation()).count();
    let records = calls as u64 + pod.observed;
    if records > 0 {
        SourceState::Present { records }
    } else {
        SourceState::Absent {
            why: "no CRI call was made for the pod".into(),
        }
    }
}

fn kernel(source: &KernelSource, events: u64) -> SourceState {
    match source {
        KernelSource::On if events > 0 => SourceState::Present { records: events },
        KernelSource::On => SourceState::Absent {
            why: "the probes ran and saw none of the pod's work".into(),
        },
        KernelSource::Off { why } => SourceState::Absent {
            why: format!("the probes were off ({why})"),
        },
        KernelSource::Unavailable { why } => SourceState::Absent {
            why: format!("the probes could not run on this node: {why}"),
        },
    }
}

/// The most missing calls a reason names.
const METHODS_NAMED: usize = 3;

fn runtime(sources: &SourcesRecord, pod: &PodRecords<'_>) -> SourceState {
    let listen = match &sources.runtime_spans {
        RuntimeSpanSource::Off => {
            return SourceState::Absent {
                why: "the runtime's spans were not asked for (no --runtime-otlp-listen)".into(),
            };
        }
        RuntimeSpanSource::Listening { listen } => listen,
    };
    let records = pod.runtime_spans.len() as u64;
    let served: BTreeSet<&str> = pod
        .runtime_spans
        .iter()
        .filter(|s| s.kind == "server")
        .map(|s| s.parent_span_id.as_str())
        .collect();
    let traced: Vec<&CriCall> = pod.calls.iter().copied().filter(|c| c.traced).collect();
    let missing: Vec<&CriCall> = traced
        .iter()
        .copied()
        .filter(|c| !served.contains(ids::hex(&ids::call_span_id(c)).as_str()))
        .collect();
    if traced.is_empty() {
        return if records > 0 {
            SourceState::Present { records }
        } else if pod.calls.is_empty() && pod.observed > 0 {
            // Another client's pod: its calls reach the runtime sampled only when that
            // client traces them.
            SourceState::Absent {
                why: "the runtime sent no span for the pod (the kubelet's calls are traced \
                      only when its own tracing is on and samples them)"
                    .into(),
            }
        } else {
            SourceState::Absent {
                why: "no CRI call of the pod went to the runtime sampled".into(),
            }
        };
    }
    if missing.is_empty() {
        return SourceState::Present { records };
    }
    let mut methods: Vec<&str> = Vec::new();
    for c in &missing {
        if !methods.contains(&c.method.as_str()) {
            methods.push(c.method.as_str());
        }
    }
    let more = methods.len().saturating_sub(METHODS_NAMED);
    methods.truncate(METHODS_NAMED);
    let mut named = methods.join(", ");
    if more > 0 {
        named.push_str(&format!(" and {more} more"));
    }
    let calls = format!(
        "{} of the {} sampled calls ({named}) have no runtime span",
        missing.len(),
        traced.len()
    );
    let Some(end) = &sources.ended else {
        return SourceState::Pending {
            records,
            why: format!("{calls} yet: the runtime sends its spans in batches"),
        };
    };
    let why = if end.runtime_spans_received == 0 {
        format!(
            "the runtime sent no span to {listen} during the recording (its tracing is off, or \
             it exports elsewhere); the end waited {} for them",
            seconds(end.waited_ns)
        )
    } else {
        match end.wait {
            SpanWaitEnd::Bound => format!(
                "{calls}: none came in the {} the end waited",
                seconds(end.bound_ns)
            ),
            SpanWaitEnd::BatchAfterCalls => format!(
                "{calls}: the runtime's spans of later work came, and these did not (it makes \
                 no span for these calls)"
            ),
            SpanWaitEnd::NotNeeded | SpanWaitEnd::AllArrived => {
                format!("{calls}: they came for no other pod either")
            }
        }
    };
    if records == 0 {
        SourceState::Absent { why }
    } else {
        SourceState::Partial { records, why }
    }
}

fn seconds(ns: u64) -> String {
    format!("{:.1} s", ns as f64 / 1e9)
}

#[cfg(test)]
#[path = "sources_tests.rs"]
mod tests;
