//! The runtime's own spans for pods another client runs. `run` ties a span to its pod by
//! trace ID, which podlapse derived from the pod's UID; here the trace IDs are the
//! client's (a kubelet with tracing on) and say nothing of the pod. What does is what the
//! runtime writes on its server spans: containerd 2.x puts `sandbox.name` on
//! RunPodSandbox (`<pod>_<namespace>_<uid>_<attempt>`, from the CRI metadata kubelet
//! fills), `container.name` on CreateContainer (`<container>_<pod>_<namespace>_<uid>_<attempt>`),
//! and `sandbox.id` / `container.id` on the calls of sandboxes and containers it has.
//! Newer releases also write `pod.uid`.
//!
//! A trace belongs to the pod the first of its spans that names one names, and every span
//! of it with that pod. Spans end (and are exported) before their parents, so the work
//! inside RunPodSandbox reaches the receiver before its server span says whose it was:
//! those are held, up to [`MAX_HELD`] for [`HOLD_FOR`], and kept once a span of their
//! trace names the pod. What never finds its pod (calls outside any pod's work, a trace
//! the observer cannot place) is counted as `unknown_pod` and dropped.

use std::collections::{HashMap, VecDeque};
use std::sync::Mutex;
use std::time::{Duration, Instant};

use opentelemetry_proto::tonic::collector::trace::v1::ExportTraceServiceRequest;

use crate::otel::receiver::{KeepSpans, ReceiverStats, each_span};
use crate::otel::runtime_span::{self, Attributes, Malformed};
use crate::otel::{ClockAnchor, RuntimeSpan};
use crate::trace::{Observation, ObservedRecord};

/// Spans held while their trace names no pod yet.
pub const MAX_HELD: usize = 8_192;
/// How long a held span waits for its trace to name its pod: longer than the runtime's
/// export period (containerd's batches go out every 5 s) and its longest sandbox start.
pub const HOLD_FOR: Duration = Duration::from_secs(60);
/// Traces remembered with their pod; beyond this the map starts over.
const MAX_TRACES: usize = 65_536;
/// Sandbox and container IDs remembered with their pod.
const MAX_IDS: usize = 65_536;

/// A pod UID as the API writes it: 36 characters, hex digits and dashes (8-4-4-4-12).
pub fn is_uid(s: &str) -> bool {
    s.len() == 36
        && s.char_indices().all(|(i, c)| match i {
            8 | 13 | 18 | 23 => c == '-',
            _ => c.is_ascii_hexdigit(),
        })
}

/// The pod UID in a name containerd made from CRI metadata, `uid_from_end` fields from
/// its end (`_`-separated: Kubernetes names and namespaces have no `_`).
fn uid_in_name(name: &str, fields: usize, uid_from_end: usize) -> Option<String> {
    let parts: Vec<&str> = name.split('_').collect();
    if parts.len() != fields {
        return None;
    }
    let uid = parts[parts.len() - uid_from_end];
    is_uid(uid).then(|| uid.to_string())
}

/// What one span's attributes say of its pod: a UID, or an ID the observer knows.
fn named_pod(attributes: &Attributes, known: &HashMap<String, String>) -> Option<String> {
    let text = |k: &str| attributes.get(k).and_then(serde_json::Value::as_str);
    // The kubelet's sync spans (`syncPod`, ...) name the pod they sync.
    if let Some(uid) = text("k8s.pod.uid").filter(|u| is_uid(u)) {
        return Some(uid.to_string());
    }
    if let Some(uid) = text("pod.uid").filter(|u| is_uid(u)) {
        return Some(uid.to_string());
    }
    if let Some(uid) = text("sandbox.name").and_then(|n| uid_in_name(n, 4, 2)) {
        return Some(uid);
    }
    if let Some(uid) = text("container.name").and_then(|n| uid_in_name(n, 5, 2)) {
        return Some(uid);
    }
    ["sandbox.id", "container.id"]
        .iter()
        .filter_map(|k| text(k))
        .find_map(|id| known.get(id).cloned())
}

#[derive(Debug, Default)]
struct State {
    /// Trace ID to the pod (its UID, or the sandbox ID of a pod without labels).
    traces: HashMap<String, String>,
    /// Sandbox and container IDs to their pod, from what the observer recorded.
    ids: HashMap<String, String>,
    held: VecDeque<(Instant, RuntimeSpan)>,
}

/// Where every span read from a request goes, placed or not, before it is placed: the
/// observer's export forwards what it received ([`crate::observe::export`]).
pub type Forward = Box<dyn Fn(&[RuntimeSpan]) + Send + Sync>;

/// Keeps the runtime's spans of the pods the observer sees (see the module's docs).
#[derive(Default)]
pub struct ObservedSpans {
    state: Mutex<State>,
    forward: Option<Forward>,
}

impl ObservedSpans {
    pub fn new() -> ObservedSpans {
        ObservedSpans::default()
    }

    /// Also hands every span read to `forward`, as it comes.
    pub fn forwarding(forward: Forward) -> ObservedSpans {
        ObservedSpans {
            state: Mutex::default(),
            forward: Some(forward),
        }
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Learns the sandbox and container IDs of a pod from a change the observer recorded:
    /// a span naming only an ID is then placed.
    pub fn learn(&self, r: &ObservedRecord) {
        if matches!(
            r.what,
            Observation::SandboxRemoved | Observation::ContainerRemoved
        ) {
            return;
        }
        let mut st = self.lock();
        if st.ids.len() >= MAX_IDS {
            st.ids.clear();
        }
        let key = r.pod_key().to_string();
        if !r.sandbox_id.is_empty() {
            st.ids.insert(r.sandbox_id.clone(), key.clone());
        }
        if !r.container_id.is_empty() {
            st.ids.insert(r.container_id.clone(), key);
        }
    }

    /// Drops, counting them, the held spans whose trace never named a pod (at the end).
    pub fn drop_held(&self, stats: &ReceiverStats) {
        let mut st = self.lock();
        for _ in st.held.drain(..) {
            stats.drop_span("unknown_pod");
        }
    }

    /// The pure part of [`KeepSpans::keep`], at `now`.
    pub fn keep_at(
        &self,
        request: &ExportTraceServiceRequest,
        anchor: ClockAnchor,
        stats: &ReceiverStats,
        now: Instant,
    ) -> Vec<RuntimeSpan> {
        let mut st = self.lock();
        let mut fresh = Vec::new();
        each_span(
            request,
            stats,
            |span, scope, resource| match runtime_span::from_otlp(span, scope, resource, "", anchor)
            {
                Ok(s) => fresh.push(s),
                Err(Malformed::Ids | Malformed::Times) => stats.drop_span("malformed"),
            },
        );
        if let Some(forward) = &self.forward {
            forward(&fresh);
        }
        // First what this request's spans say of their traces' pods, then every span,
        // held ones included, placed by its trace.
        for s in &fresh {
            if st.traces.contains_key(&s.trace_id) {
                continue;
            }
            if let Some(pod) = named_pod(&s.attributes, &st.ids) {
                if st.traces.len() >= MAX_TRACES {
                    st.traces.clear();
                }
                st.traces.insert(s.trace_id.clone(), pod);
            }
        }
        let mut kept = Vec::new();
        let held = std::mem::take(&mut st.held);
        for (since, mut s) in held {
            if let Some(pod) = st.traces.get(&s.trace_id) {
                s.pod_uid = pod.clone();
                kept.push(s);
            } else if now.duration_since(since) >= HOLD_FOR {
                stats.drop_span("unknown_pod");
            } else {
                st.held.push_back((since, s));
            }
        }
        for mut s in fresh {
            if let Some(pod) = st.traces.get(&s.trace_id) {
                s.pod_uid = pod.clone();
                kept.push(s);
                continue;
            }
            if st.held.len() >= MAX_HELD {
                st.held.pop_front();
                stats.drop_span("unknown_pod");
            }
            st.held.push_back((now, s));
        }
        kept
    }
}

impl KeepSpans for ObservedSpans {
    fn keep(
        &self,
        request: &ExportTraceServiceRequest,
        anchor: ClockAnchor,
        stats: &ReceiverStats,
    ) -> Vec<RuntimeSpan> {
        self.keep_at(request, anchor, stats, Instant::now())
    }
}

#[cfg(test)]
mod tests {
    use opentelemetry_proto::tonic::common::v1::{AnyValue, KeyValue, any_value};
    use opentelemetry_proto::tonic::trace::v1::{ResourceSpans, ScopeSpans, Span};

    use super::*;
    use crate::trace::ObservedVia;

    const ANCHOR: ClockAnchor = ClockAnchor {
        wall_ns: 1_000_000_000_000,
        mono_ns: 0,
    };
    const UID: &str = "0b6c1f9e-2a4d-4c1e-9f3a-5d6e7f8a9b0c";

    fn span(trace: u8, id: u8, parent: u8, name: &str, attrs: &[(&str, &str)]) -> Span {
        Span {
            trace_id: vec![trace; 16],
            span_id: vec![id; 8],
            parent_span_id: if parent == 0 {
                Vec::new()
            } else {
                vec![parent; 8]
            },
            name: name.into(),
            start_time_unix_nano: 1_000_000_000_100,
            end_time_unix_nano: 1_000_000_000_200,
            attributes: attrs
                .iter()
                .map(|(k, v)| KeyValue {
                    key: (*k).into(),
                    value: Some(AnyValue {
                        value: Some(any_value::Value::StringValue((*v).into())),
                    }),
                    ..KeyValue::default()
                })
                .collect(),
            ..Span::default()
        }
    }

    fn request(spans: Vec<Span>) -> ExportTraceServiceRequest {
        ExportTraceServiceRequest {
            resource_spans: vec![ResourceSpans {
                scope_spans: vec![ScopeSpans {
                    spans,
                    ..ScopeSpans::default()
                }],
                ..ResourceSpans::default()
            }],
        }
    }

    fn owners(kept: &[RuntimeSpan]) -> Vec<(String, String)> {
        kept.iter()
            .map(|s| (s.name.clone(), s.pod_uid.clone()))
            .collect()
    }

    #[test]
    fn spans_wait_for_the_span_that_names_their_pod_then_all_are_its() {
        let keeper = ObservedSpans::new();
        let stats = ReceiverStats::default();
        let t0 = Instant::now();
        // containerd exports the work inside RunPodSandbox before the call's own span.
        let first = request(vec![span(1, 2, 1, "metadata.sandbox.Create", &[])]);
        assert!(keeper.keep_at(&first, ANCHOR, &stats, t0).is_empty());
        let sandbox_name = format!("web_default_{UID}_0");
        let second = request(vec![span(
            1,
            1,
            9,
            "runtime.v1.RuntimeService/RunPodSandbox",
            &[("sandbox.id", "abc"), ("sandbox.name", &sandbox_name)],
        )]);
        let kept = keeper.keep_at(&second, ANCHOR, &stats, t0 + Duration::from_secs(5));
        assert_eq!(
            owners(&kept),
            vec![
                ("metadata.sandbox.Create".into(), UID.into()),
                ("runtime.v1.RuntimeService/RunPodSandbox".into(), UID.into()),
            ]
        );
        // Later spans of the same trace are the pod's at once.
        let third = request(vec![span(1, 3, 9, "task.Start", &[])]);
        assert_eq!(keeper.keep_at(&third, ANCHOR, &stats, t0).len(), 1);
        assert_eq!(stats.received(), 3);
        assert_eq!(stats.dropped("unknown_pod"), 0);
    }

    #[test]
    fn a_container_name_or_an_id_the_observer_saw_also_names_the_pod() {
        let keeper = ObservedSpans::new();
        let stats = ReceiverStats::default();
        let now = Instant::now();
        let name = format!("app_web_default_{UID}_0");
        let create = request(vec![span(
            2,
            1,
            0,
            "runtime.v1.RuntimeService/CreateContainer",
            &[("container.name", &name)],
        )]);
        assert_eq!(keeper.keep_at(&create, ANCHOR, &stats, now)[0].pod_uid, UID);
        // A pod without kubelet's labels is keyed by its sandbox ID.
        keeper.learn(&ObservedRecord {
            at_ns: 1,
            runtime_ns: None,
            what: Observation::SandboxReady,
            via: ObservedVia::Events,
            pod_uid: String::new(),
            namespace: String::new(),
            name: String::new(),
            sandbox_id: "f00d".into(),
            attempt: 0,
            container_id: String::new(),
            container: String::new(),
            ip: String::new(),
            host_network: false,
            exit_code: None,
            before_start: false,
            note: String::new(),
            stream_missed: false,
        });
        let start = request(vec![span(
            3,
            1,
            0,
            "runtime.v1.RuntimeService/StopPodSandbox",
            &[("sandbox.id", "f00d")],
        )]);
        assert_eq!(
            keeper.keep_at(&start, ANCHOR, &stats, now)[0].pod_uid,
            "f00d"
        );
        // Names that only look like containerd's are not taken for a pod.
        for bad in ["web_default_not-a-uid_0", "web_default", ""] {
            let r = request(vec![span(4, 1, 0, "x", &[("sandbox.name", bad)])]);
            assert!(keeper.keep_at(&r, ANCHOR, &stats, now).is_empty(), "{bad}");
        }
    }

    #[test]
    fn spans_of_no_pod_are_dropped_after_the_hold_and_counted() {
        let keeper = ObservedSpans::new();
        let stats = ReceiverStats::default();
        let t0 = Instant::now();
        let stray = request(vec![span(
            5,
            1,
            0,
            "runtime.v1.RuntimeService/ListPodSandbox",
            &[],
        )]);
        assert!(keeper.keep_at(&stray, ANCHOR, &stats, t0).is_empty());
        assert_eq!(stats.dropped("unknown_pod"), 0, "held, not dropped yet");
        let later = request(Vec::new());
        assert!(
            keeper
                .keep_at(&later, ANCHOR, &stats, t0 + HOLD_FOR)
                .is_empty()
        );
        assert_eq!(stats.dropped("unknown_pod"), 1);
        // What is still held at the end is dropped and counted too.
        assert!(keeper.keep_at(&stray, ANCHOR, &stats, t0).is_empty());
        keeper.drop_held(&stats);
        assert_eq!(stats.dropped("unknown_pod"), 2);
        let bad = request(vec![Span {
            trace_id: vec![1; 3],
            ..span(6, 1, 0, "x", &[])
        }]);
        assert!(keeper.keep_at(&bad, ANCHOR, &stats, t0).is_empty());
        assert_eq!(stats.dropped("malformed"), 1);
    }
}
