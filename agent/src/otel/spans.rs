//! The span model, pure: one pod's startup as spans, from its timeline and its CRI calls.
//!
//! - The root span runs from the pod first seen until Ready (Running when it never got
//!   Ready; its last stage when it never ran).
//! - Every CRI call made for the pod in that time, and every call of the pod that went to
//!   the runtime with a sampled trace context (`CriCall::traced`: the gate decides at the
//!   call's start, and may learn that the startup ended a moment after it did), is a
//!   client span named as kubelet
//!   names its own (`runtime.v1.RuntimeService/RunPodSandbox`), a child of the root. A
//!   stage that is a CRI call (sandbox_requested is RunPodSandbox) is that call's span,
//!   with the stage's name as `podlapse.stage`.
//! - The runtime's own stages (`runtime:*`) are not: they are the runtime's spans,
//!   which the export forwards as the runtime sent them.
//! - Every other stage in that time is a span of its own: a kernel stage is a child of
//!   the innermost call of its container that was under way when it began (the netns and
//!   the CNI plugins under RunPodSandbox); the rest are children of the root. An exec a
//!   call causes is that call's even when it came after the reply ([`causing_method`]).
//! - Attributes follow the semantic conventions for Kubernetes, containers, processes
//!   and RPC where there is one, `podlapse.*` where not. A failed call or stage has an
//!   error status with its message.
//!
//! Times stay CLOCK_MONOTONIC here; the SDK conversion places them in wall time.

use crate::cri::CriCall;
use crate::timeline::{PodTimeline, Stage, StageKind, StageSource};

/// How long after its call's reply an exec the call caused still counts as the call's:
/// far more than a scheduling delay, far less than the time to the pod's next call of
/// the method.
pub const EXEC_LAG_NS: u64 = 1_000_000_000;

/// The CRI method whose call causes an exec stage of `kind`: the app's first exec is
/// its container's `StartContainer`'s, the pause exec `RunPodSandbox`'s. `runc start`
/// returns once `runc init` was let go, and `runc init` execs the program when it is
/// next scheduled: on a busy node that is after the runtime replied.
pub fn causing_method(kind: &StageKind) -> Option<&'static str> {
    match kind {
        StageKind::AppFirstExec => Some("StartContainer"),
        StageKind::PauseExec => Some("RunPodSandbox"),
        _ => None,
    }
}

use super::ids;

#[derive(Debug, Clone, PartialEq)]
pub enum Value {
    Str(String),
    Int(i64),
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Kind {
    Internal,
    Client,
}

#[derive(Debug, Clone, PartialEq)]
pub struct PodSpan {
    pub trace_id: [u8; 16],
    pub span_id: [u8; 8],
    pub parent: Option<[u8; 8]>,
    pub name: String,
    pub kind: Kind,
    pub start_ns: u64,
    pub end_ns: u64,
    pub attributes: Vec<(&'static str, Value)>,
    /// The error status's message, for a failed call or stage.
    pub error: Option<String>,
}

/// When the pod's startup ends: Ready, else Running, else its last stage.
pub fn startup_end(pod: &PodTimeline) -> Option<u64> {
    pod.stage(StageKind::Ready)
        .or_else(|| pod.stage(StageKind::Running))
        .map(|s| s.end_ns)
        .or_else(|| pod.stages.iter().map(|s| s.end_ns).max())
}

fn str(v: impl Into<String>) -> Value {
    Value::Str(v.into())
}

/// The pod's spans, root first, then in the order they started.
pub fn pod_spans(pod: &PodTimeline, calls: &[&CriCall], node: &str) -> Vec<PodSpan> {
    let Some(end) = startup_end(pod) else {
        return Vec::new();
    };
    let start = pod
        .seen_ns
        .or_else(|| pod.stages.iter().map(|s| s.start_ns).min())
        .unwrap_or(end);
    pod_spans_in(pod, calls, node, (start, end))
}

/// The pod's spans once its startup settled, as the observer exports it: every stage
/// that began from the pod's first sign (a netns the runtime was still creating when
/// the pod's first event came) until its end, which is Running or, later, the last
/// container's first exec (the runtime shows a container started as its process is
/// told to run, a moment before the app's exec); a stage is whole by the time the
/// startup settled, so it is taken whatever its end.
pub fn settled_pod_spans(pod: &PodTimeline, node: &str) -> Vec<PodSpan> {
    let Some(running) = startup_end(pod) else {
        return Vec::new();
    };
    let first = pod.stages.iter().map(|s| s.start_ns).min();
    let start = match (pod.seen_ns, first) {
        (Some(seen), Some(first)) => seen.min(first),
        (seen, first) => seen.or(first).unwrap_or(running),
    };
    let exec = pod
        .stages
        .iter()
        .filter(|s| *s.kind() == StageKind::AppFirstExec && s.start_ns >= start)
        .map(|s| s.end_ns)
        .max();
    let end = exec.map_or(running, |e| e.max(running));
    let ended: Vec<u64> = pod
        .stages
        .iter()
        .filter(|s| s.start_ns >= start && s.start_ns <= end && exported_as_stage(s))
        .map(|s| s.end_ns)
        .collect();
    let end = ended.into_iter().fold(end, u64::max);
    pod_spans_in(pod, &[], node, (start, end))
}

/// The pod's spans in the startup `window` (from, to: CLOCK_MONOTONIC).
fn pod_spans_in(
    pod: &PodTimeline,
    calls: &[&CriCall],
    node: &str,
    (start, end): (u64, u64),
) -> Vec<PodSpan> {
    let trace_id = ids::trace_id(&pod.uid);
    let root_id = ids::root_span_id(&pod.uid);
    let pod_attrs = vec![
        ("k8s.pod.uid", str(&pod.uid)),
        ("k8s.pod.name", str(&pod.name)),
        ("k8s.namespace.name", str(&pod.namespace)),
        ("k8s.node.name", str(node)),
    ];
    let mut root_attrs = pod_attrs.clone();
    if let Some(ip) = &pod.ip {
        root_attrs.push(("podlapse.pod_ip", str(ip)));
    }
    // Which sources the stages below came from, and why any is absent.
    match &pod.sources {
        Some(sources) => {
            let words: Vec<String> = sources
                .each()
                .iter()
                .map(|(name, state)| format!("{name} {}", state.word()))
                .collect();
            root_attrs.push(("podlapse.sources", str(words.join(", "))));
            for (name, state) in sources.each() {
                let key = match name {
                    "cri" => "podlapse.source.cri",
                    "kernel" => "podlapse.source.kernel",
                    _ => "podlapse.source.runtime",
                };
                root_attrs.push((key, str(state.summary())));
            }
        }
        None => root_attrs.push((
            "podlapse.sources",
            str("not recorded (a trace from before podlapse recorded them)"),
        )),
    }
    let ran = pod.stage(StageKind::Running).is_some();
    let root = PodSpan {
        trace_id,
        span_id: root_id,
        parent: None,
        name: "pod_startup".into(),
        kind: Kind::Internal,
        start_ns: start,
        end_ns: end.max(start),
        attributes: root_attrs,
        error: (!ran)
            .then(|| pod.failures().next().map(failure_message))
            .flatten(),
    };
    let mut calls: Vec<&CriCall> = calls
        .iter()
        .copied()
        .filter(|c| {
            c.pod_uid == pod.uid && (c.traced || (c.start_ns >= start && c.start_ns <= end))
        })
        .collect();
    calls.sort_by_key(|c| (c.start_ns, c.end_ns));
    // The runtime's stages made from its spans (`runtime:*`) and the kubelet's are their
    // own spans, which the export forwards as they came: not made again here. What the
    // observer saw of the runtime (sandbox_ready, running) is a stage like any other.
    let stages: Vec<&Stage> = pod
        .stages
        .iter()
        .filter(|s| exported_as_stage(s))
        // A stage still under way when the startup ended (a pod worker's wait the Ready
        // sync was held in) is not part of it: the live export, made at that end, cannot
        // see how it ends, and the export of the trace must give the same spans.
        .filter(|s| s.start_ns >= start && s.end_ns <= end)
        .collect();
    let is_call = |s: &Stage, c: &CriCall| {
        s.source == StageSource::Cri
            && s.start_ns == c.start_ns
            && s.end_ns == c.end_ns.max(c.start_ns)
            && (s.container.is_none() || s.container.as_deref() == Some(c.container.as_str()))
    };
    let mut out = vec![root];
    for c in &calls {
        let stage = stages.iter().find(|s| is_call(s, c));
        out.push(call_span(c, stage.copied(), trace_id, root_id, &pod_attrs));
    }
    for s in stages
        .iter()
        .filter(|s| !calls.iter().any(|c| is_call(s, c)))
    {
        let parent = if s.source == StageSource::Kernel {
            let ours = |c: &&&CriCall| {
                c.end_ns > c.start_ns
                    && c.start_ns <= s.start_ns
                    && s.container.as_deref().unwrap_or("") == c.container
            };
            let cause = causing_method(s.kind()).and_then(|m| {
                calls
                    .iter()
                    .filter(ours)
                    .filter(|c| {
                        c.method.as_str() == m && s.start_ns <= c.end_ns.saturating_add(EXEC_LAG_NS)
                    })
                    .max_by_key(|c| (c.start_ns, c.end_ns))
            });
            cause
                .or_else(|| {
                    calls
                        .iter()
                        .filter(ours)
                        .filter(|c| s.start_ns <= c.end_ns)
                        .min_by_key(|c| (c.end_ns - c.start_ns, c.start_ns))
                })
                .map_or(root_id, |c| ids::call_span_id(c))
        } else {
            root_id
        };
        out.push(stage_span(s, trace_id, parent, &pod_attrs));
    }
    out[1..].sort_by_key(|s| (s.start_ns, s.end_ns, s.span_id));
    out
}

/// Whether a stage is a span of podlapse's: not one made from the runtime's spans
/// (`runtime:*`) or the kubelet's, which go as they came.
fn exported_as_stage(s: &Stage) -> bool {
    s.source != StageSource::Kubelet && *s.kind() != StageKind::Runtime
}

fn failure_message(s: &Stage) -> String {
    if s.detail.is_empty() {
        format!("{} failed", s.stage)
    } else {
        format!("{}: {}", s.stage, s.detail)
    }
}

fn call_span(
    c: &CriCall,
    stage: Option<&Stage>,
    trace_id: [u8; 16],
    root: [u8; 8],
    pod_attrs: &[(&'static str, Value)],
) -> PodSpan {
    let service = c.method.service();
    let mut attributes = pod_attrs.to_vec();
    attributes.push(("rpc.system", str("grpc")));
    attributes.push(("rpc.service", str(service)));
    attributes.push(("rpc.method", str(c.method.as_str())));
    attributes.push((
        "rpc.grpc.status_code",
        Value::Int(i64::from(c.code.number())),
    ));
    if !c.container.is_empty() {
        attributes.push(("k8s.container.name", str(&c.container)));
    }
    if !c.container_id.is_empty() {
        attributes.push(("container.id", str(&c.container_id)));
    }
    if !c.sandbox_id.is_empty() {
        attributes.push(("podlapse.sandbox_id", str(&c.sandbox_id)));
    }
    if !c.image.is_empty() {
        attributes.push(("container.image.name", str(&c.image)));
    }
    if let Some(s) = stage {
        attributes.push(("podlapse.stage", str(s.stage.to_string())));
    }
    PodSpan {
        trace_id,
        span_id: ids::call_span_id(c),
        parent: Some(root),
        name: format!("{service}/{}", c.method),
        kind: Kind::Client,
        start_ns: c.start_ns,
        end_ns: c.end_ns.max(c.start_ns),
        attributes,
        error: (!c.ok()).then(|| {
            if c.message.is_empty() {
                c.code.to_string()
            } else {
                c.message.clone()
            }
        }),
    }
}

fn stage_span(
    s: &Stage,
    trace_id: [u8; 16],
    parent: [u8; 8],
    pod_attrs: &[(&'static str, Value)],
) -> PodSpan {
    let mut attributes = pod_attrs.to_vec();
    attributes.push(("podlapse.stage", str(s.stage.to_string())));
    attributes.push(("podlapse.source", str(s.source.to_string())));
    if let Some(c) = &s.container {
        attributes.push(("k8s.container.name", str(c)));
    }
    if let Some(id) = &s.container_id {
        attributes.push(("container.id", str(id)));
    }
    if let Some(plugin) = s.stage.cni_plugin() {
        attributes.push(("podlapse.cni.plugin", str(plugin)));
    }
    if let Some(code) = s.exit_code {
        attributes.push(("process.exit.code", Value::Int(i64::from(code))));
    }
    if let Some(sig) = s.signal {
        attributes.push(("podlapse.signal", Value::Int(i64::from(sig))));
    }
    if let Some(pid) = s.pid {
        attributes.push(("process.pid", Value::Int(i64::from(pid))));
    }
    if !s.detail.is_empty() {
        attributes.push(("podlapse.detail", str(&s.detail)));
    }
    PodSpan {
        trace_id,
        span_id: ids::stage_span_id(&s.pod_uid, &s.stage.to_string(), s.start_ns),
        parent: Some(parent),
        name: s.stage.to_string(),
        kind: Kind::Internal,
        start_ns: s.start_ns,
        end_ns: s.end_ns,
        attributes,
        error: (!s.ok).then(|| failure_message(s)),
    }
}
