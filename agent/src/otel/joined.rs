//! The span model for a pod another client ran, pure: its startup inside the kubelet's
//! own traces, when the observer received them.
//!
//! The pod's spans are those [`settled_pod_spans`] makes from its timeline with no CRI
//! call of podlapse's (the observer made none): a `pod_startup` root and a span per stage
//! that is neither made from the runtime's spans nor the kubelet's (the kernel's, and
//! what the observer saw of the runtime), the app's first exec included. With the kubelet's spans for the pod, they move into the kubelet's
//! traces:
//!
//! - each stage span becomes a child of the innermost of the kubelet's spans under way
//!   when the stage began: a CRI call as the kubelet's client saw it
//!   (`runtime.v1.RuntimeService/RunPodSandbox` holds the netns and the CNI plugins),
//!   else its `syncPod`;
//! - an exec a call causes goes under that call even when it came after the kubelet had
//!   the reply: the app's first exec under its container's `StartContainer`, the pause
//!   exec under `RunPodSandbox`. `runc start` returns once `runc init` was let go, and
//!   `runc init` execs the program when it is next scheduled: on a busy node that is
//!   after the runtime replied. The call is the latest of its method (for the stage's
//!   container, where the runtime's server span names one) begun before the exec and
//!   ended less than [`super::spans::EXEC_LAG_NS`] before it;
//! - `pod_startup`, with the sources and the pod's IP, becomes a child of the sync under
//!   way when the pod was first seen (else the first sync), and holds the stages no span
//!   of the kubelet's was under way for.
//!
//! The kubelet's and the runtime's spans themselves are forwarded as they came, so a
//! backend shows one trace per sync: `syncPod`, its CRI calls, the runtime's server spans
//! under those, and podlapse's stages under the call they happened in. Without the
//! kubelet's spans the pod's trace is its own, as `podlapse run` exports it.

use podlapse_core::record::RuntimeSpan;

use super::runtime_span::unhex;
use super::spans::{PodSpan, causing_method, settled_pod_spans};
use crate::timeline::{PodTimeline, StageKind, StageName, is_kubelet_sync, kubelet_call_method};

/// A pod the observer found running: its startup was not observed (no `pod_seen`), so
/// there is none to export.
pub fn startup_unseen(pod: &PodTimeline) -> bool {
    pod.stage(StageKind::PodSeen).is_none() && pod.stage(StageKind::SandboxReady).is_some()
}

/// One of the kubelet's spans a stage can hang under.
#[derive(Debug, Clone)]
struct Holder<'a> {
    trace_id: [u8; 16],
    span_id: [u8; 8],
    start_ns: u64,
    end_ns: u64,
    sync: bool,
    /// A call's CRI method.
    method: Option<&'a str>,
    /// The container a call was for, as the runtime's server span under it names it.
    container: Option<&'a str>,
}

impl<'a> Holder<'a> {
    fn of(s: &'a RuntimeSpan, received: &[&'a RuntimeSpan]) -> Option<Holder<'a>> {
        let sync = is_kubelet_sync(s);
        let method = kubelet_call_method(s);
        if !sync && method.is_none() {
            return None;
        }
        let container = method.and_then(|_| {
            received
                .iter()
                .find(|c| c.parent_span_id == s.span_id && c.kind == "server")
                .and_then(|c| c.attributes.get("container.name"))
                .and_then(serde_json::Value::as_str)
                .and_then(|n| n.split('_').next())
                .filter(|n| !n.is_empty())
        });
        Some(Holder {
            trace_id: unhex::<16>(&s.trace_id)?,
            span_id: unhex::<8>(&s.span_id)?,
            start_ns: s.start_ns,
            end_ns: s.end_ns.max(s.start_ns),
            sync,
            method,
            container,
        })
    }

    fn holds(&self, at_ns: u64) -> bool {
        self.start_ns <= at_ns && at_ns <= self.end_ns
    }

    /// Whether this call caused the exec stage `name` begun at `at_ns`.
    fn caused(&self, name: &StageName, at_ns: u64) -> bool {
        let container_fits = match (self.container, name.name()) {
            (Some(ours), Some(theirs)) => ours == theirs,
            _ => true,
        };
        causing_method(name.kind()).is_some_and(|m| self.method == Some(m))
            && container_fits
            && self.start_ns <= at_ns
            && at_ns <= self.end_ns.saturating_add(super::spans::EXEC_LAG_NS)
    }
}

/// The pod's spans, root first, inside the kubelet's traces where `received` (the spans
/// the observer kept for the pod: the kubelet's and the runtime's) has the kubelet's.
pub fn joined_pod_spans(pod: &PodTimeline, received: &[&RuntimeSpan], node: &str) -> Vec<PodSpan> {
    if startup_unseen(pod) {
        return Vec::new();
    }
    let mut spans = settled_pod_spans(pod, node);
    let mut holders: Vec<Holder> = received
        .iter()
        .filter_map(|s| Holder::of(s, received))
        .collect();
    if spans.is_empty() || holders.is_empty() {
        return spans;
    }
    holders.sort_by_key(|h| (h.start_ns, h.end_ns, h.span_id));
    let root_start = spans[0].start_ns;
    let syncs = || holders.iter().filter(|h| h.sync);
    let anchor = syncs()
        .filter(|h| h.holds(root_start))
        .max_by_key(|h| h.start_ns)
        .or_else(|| syncs().next())
        .or_else(|| holders.first())
        .cloned()
        .unwrap_or_else(|| holders[0].clone());
    let (root, stages) = spans.split_at_mut(1);
    let root = &mut root[0];
    root.trace_id = anchor.trace_id;
    root.parent = Some(anchor.span_id);
    for s in stages {
        let name = StageName::parse(&s.name);
        // The call that caused an exec: the latest of them begun before it.
        let cause = holders
            .iter()
            .filter(|h| h.caused(&name, s.start_ns))
            .max_by_key(|h| (h.start_ns, h.end_ns));
        // Else the innermost: the shortest of those under way (a call before its sync).
        let inner = cause.or_else(|| {
            holders
                .iter()
                .filter(|h| h.holds(s.start_ns))
                .min_by_key(|h| (h.end_ns - h.start_ns, std::cmp::Reverse(h.start_ns)))
        });
        match inner {
            Some(h) => {
                s.trace_id = h.trace_id;
                s.parent = Some(h.span_id);
            }
            None => {
                s.trace_id = anchor.trace_id;
                s.parent = Some(root.span_id);
            }
        }
    }
    spans
}

#[cfg(test)]
#[path = "joined_tests.rs"]
mod tests;
