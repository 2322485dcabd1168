//! The spans of a recorded trace: every pod's startup, with the same model and IDs the
//! live export used, placed in wall time by the trace header's clock anchor.

use opentelemetry_sdk::trace::SpanData;

use super::joined::joined_pod_spans;
use super::runtime_span::RuntimeSpan;
use super::sdk::{ClockAnchor, span_data};
use super::spans::pod_spans;
use crate::cri::CriCall;
use crate::timeline::Timeline;
use crate::trace::{Header, TraceRecord};

/// Every pod's spans in `records` (with their `timeline`), in timeline order: an
/// observed trace's inside the kubelet's traces, as `observe --otlp-endpoint` exports
/// them.
pub fn trace_spans(header: &Header, records: &[TraceRecord], timeline: &Timeline) -> Vec<SpanData> {
    let anchor = ClockAnchor {
        wall_ns: header.started_wall_ns,
        mono_ns: header.started_ns,
    };
    if header.observed.is_some() {
        let received: Vec<&RuntimeSpan> = records
            .iter()
            .filter_map(|r| match r {
                TraceRecord::RuntimeSpan(s) => Some(&**s),
                _ => None,
            })
            .collect();
        return timeline
            .pods
            .iter()
            .flat_map(|pod| {
                let mine: Vec<&RuntimeSpan> = received
                    .iter()
                    .copied()
                    .filter(|s| s.pod_uid == pod.uid)
                    .collect();
                joined_pod_spans(pod, &mine, &header.node)
            })
            .map(|s| span_data(&s, anchor))
            .collect();
    }
    let calls = cri_calls(records);
    timeline
        .pods
        .iter()
        .flat_map(|pod| {
            let mine: Vec<&CriCall> = calls
                .iter()
                .copied()
                .filter(|c| c.pod_uid == pod.uid)
                .collect();
            pod_spans(pod, &mine, &header.node)
        })
        .map(|s| span_data(&s, anchor))
        .collect()
}

/// The runtime's spans among `records` of the pods `timeline` has, as the live export
/// forwards them: batches by the runtime's resource.
pub fn runtime_batches(
    header: &Header,
    records: &[TraceRecord],
    timeline: &Timeline,
) -> Vec<super::runtime_span::Batch> {
    let anchor = ClockAnchor {
        wall_ns: header.started_wall_ns,
        mono_ns: header.started_ns,
    };
    let pods: std::collections::BTreeSet<&str> =
        timeline.pods.iter().map(|p| p.uid.as_str()).collect();
    let spans = records.iter().filter_map(|r| match r {
        TraceRecord::RuntimeSpan(s) if pods.contains(s.pod_uid.as_str()) => Some(&**s),
        _ => None,
    });
    super::runtime_span::batches(spans, anchor)
}

/// The CRI calls among `records`, in order.
pub fn cri_calls(records: &[TraceRecord]) -> Vec<&CriCall> {
    records
        .iter()
        .filter_map(|r| match r {
            TraceRecord::Cri(c) => Some(c),
            _ => None,
        })
        .collect()
}
