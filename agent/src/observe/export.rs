//! The observer's OTLP export (`podlapse observe --otlp-endpoint`). Two streams go out
//! through one bounded queue:
//!
//! - everything the receiver took from the kubelet and the runtime, forwarded as it
//!   came, once, on arrival (the observer stands as the node's hop in front of the
//!   cluster's collector), whether or not it names a pod the observer saw; only what
//!   did not decode or had bad IDs is not;
//! - each observed pod's startup once it is over, as [`joined_pod_spans`] makes it: the
//!   kernel's stages and what the observer saw, under the kubelet's calls when the
//!   kubelet's spans for the pod came, else in a trace of the pod's own.
//!
//! A startup is over once the pod ran, or failed, and nothing new happened to it for
//! [`SETTLE_NS`]: the kubelet and the runtime send their spans in batches (every 5 s by
//! default), and the pod's stages go under them, so the export waits for them. Once the
//! kubelet's spans come at all (its tracing is on), a startup also waits for the
//! kubelet's sync that ran or failed it: the kubelet exports a sync's spans when the
//! sync ends, which on a loaded node can be long after the runtime said the containers
//! started. A pod whose sync never comes (the kubelet sampled it out) goes without it
//! after [`KUBELET_WAIT_NS`], in a trace of its own. At the latest the observer's end
//! exports what is left. A pod that was already there when the observer started has no
//! startup to export.

use std::collections::{BTreeMap, BTreeSet, VecDeque};
use std::sync::atomic::AtomicU64;
use std::sync::{Mutex, MutexGuard};
use std::time::Duration;

use crate::otel::joined::startup_unseen;
use crate::otel::runtime_span::RuntimeSpan;
use crate::otel::{ClockAnchor, ExportQueue, ExportStats, joined_pod_spans, span_data};
use crate::timeline::{
    Collector, PodTimeline, StageKind, Timeline, is_kubelet_call, is_kubelet_sync,
};

/// How long a pod that ran (or failed) goes with no new stage before its startup is
/// exported: longer than the kubelet's and containerd's export period (5 s).
pub const SETTLE_NS: u64 = 10_000_000_000;
/// How long a settled startup waits for the kubelet's sync that ran it, once the
/// kubelet's spans come at all.
pub const KUBELET_WAIT_NS: u64 = 60_000_000_000;
/// A sync's end and the runtime's word that the containers started are two clocks (the
/// kubelet's wall clock placed on the trace's, and the runtime's): a sync that ended
/// this little before the pod ran is still the one that ran it.
const CLOCKS_NS: u64 = 1_000_000_000;
/// Forgotten pods remembered, to refuse their late spans.
const FORGOTTEN_KEPT: usize = 1024;
/// The kubelet's spans kept per pod until its export (a pod whose sync keeps failing
/// makes a sync and its calls every few seconds).
const KUBELET_SPANS_PER_POD: usize = 2048;

#[derive(Default)]
struct State {
    /// The kubelet's syncs and calls of the pods not exported yet.
    kubelet: BTreeMap<String, Vec<RuntimeSpan>>,
    /// Pods whose startup went out, or that have none to export.
    done: BTreeSet<String>,
    /// Pods that ran or failed, not exported yet: their latest timeline.
    pending: BTreeMap<String, PodTimeline>,
    /// A span of the kubelet's came: its tracing is on.
    kubelet_traced: bool,
    /// Pods the observer forgot, newest last, bounded: the kubelet's late spans of one
    /// (its terminating syncs) are not kept for an export that will not come.
    forgotten: VecDeque<String>,
}

impl State {
    /// Whether `pod`'s startup is over at `now_ns` (see the module's docs).
    fn settled(&self, pod: &PodTimeline, now_ns: u64) -> bool {
        let quiet_ns = now_ns.saturating_sub(last_ns(pod));
        if quiet_ns < SETTLE_NS {
            return false;
        }
        if !self.kubelet_traced || quiet_ns >= KUBELET_WAIT_NS {
            return true;
        }
        // The moment the kubelet's sync that ran (or failed) the pod ended after.
        let outcome = pod
            .stage(StageKind::Running)
            .map(|s| s.start_ns)
            .or_else(|| pod.failures().map(|s| s.end_ns).max())
            .unwrap_or(0);
        self.kubelet.get(&pod.uid).is_some_and(|spans| {
            spans
                .iter()
                .any(|s| is_kubelet_sync(s) && s.end_ns.saturating_add(CLOCKS_NS) >= outcome)
        })
    }
}

pub struct ObservedExport {
    queue: Mutex<Option<ExportQueue>>,
    stats: ExportStats,
    node: String,
    anchor: ClockAnchor,
    state: Mutex<State>,
    seen: AtomicU64,
}

impl ObservedExport {
    pub fn new(queue: ExportQueue, node: &str, anchor: ClockAnchor) -> ObservedExport {
        ObservedExport {
            stats: queue.stats(),
            queue: Mutex::new(Some(queue)),
            node: node.to_string(),
            anchor,
            state: Mutex::new(State::default()),
            seen: AtomicU64::new(0),
        }
    }

    fn state(&self) -> MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Every span of one request the receiver read, pod or not: forwarded now, as it
    /// came, batched by its sender's resource.
    pub fn forward(&self, spans: &[RuntimeSpan]) {
        if let Some(q) = self
            .queue
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .as_ref()
        {
            q.forward(spans, self.anchor);
        }
    }

    /// Spans the receiver placed with their pod: the kubelet's syncs and calls are kept
    /// until the pod's startup goes out, to hang its stages under.
    pub fn observe_spans(&self, kept: &[RuntimeSpan]) {
        let mut st = self.state();
        for s in kept
            .iter()
            .filter(|s| is_kubelet_sync(s) || is_kubelet_call(s))
        {
            st.kubelet_traced = true;
            if st.forgotten.contains(&s.pod_uid) {
                continue;
            }
            if st.done.contains(&s.pod_uid) {
                tracing::debug!(
                    uid = %s.pod_uid,
                    span = %s.name,
                    "a kubelet span came after the pod's startup was exported"
                );
                continue;
            }
            let spans = st.kubelet.entry(s.pod_uid.clone()).or_default();
            if spans.len() < KUBELET_SPANS_PER_POD {
                spans.push(s.clone());
            }
        }
    }

    /// Exports the startups over by `now_ns` (CLOCK_MONOTONIC).
    pub fn tick(&self, collector: &Collector, now_ns: u64) {
        let wanted = |uid: &str| !self.state().done.contains(uid);
        if let Some(timeline) = collector.timeline_if_changed(&self.seen, wanted) {
            let mut st = self.state();
            for pod in timeline.pods {
                if st.done.contains(&pod.uid) {
                    continue;
                }
                if startup_unseen(&pod) {
                    st.done.insert(pod.uid.clone());
                    st.kubelet.remove(&pod.uid);
                } else if pod.stage(StageKind::Running).is_some() || pod.failures().next().is_some()
                {
                    st.pending.insert(pod.uid.clone(), pod);
                }
            }
        }
        let mut st = self.state();
        if !st.pending.is_empty() {
            tracing::debug!(
                pending = st.pending.len(),
                now_ns,
                last_ns = st.pending.values().map(last_ns).max(),
                "startups waiting to settle"
            );
        }
        let settled: Vec<String> = st
            .pending
            .iter()
            .filter(|(_, p)| st.settled(p, now_ns))
            .map(|(uid, _)| uid.clone())
            .collect();
        for uid in settled {
            if let Some(pod) = st.pending.remove(&uid) {
                self.export(&mut st, &pod);
            }
        }
    }

    /// The observer forgot these pods (their timeline as it was): a startup not
    /// exported yet goes as it stands, and nothing of theirs is kept.
    pub fn forget(&self, uids: &[String], timeline: &Timeline) {
        let mut st = self.state();
        self.export_unsent(&mut st, timeline);
        for uid in uids {
            st.done.remove(uid);
            st.pending.remove(uid);
            st.kubelet.remove(uid);
            if st.forgotten.len() == FORGOTTEN_KEPT {
                st.forgotten.pop_front();
            }
            st.forgotten.push_back(uid.clone());
        }
    }

    /// The observer stops: every startup not exported yet goes as it stands, then the
    /// queue has `deadline` to send.
    pub async fn close(&self, timeline: &Timeline, deadline: Duration) -> ExportStats {
        self.export_unsent(&mut self.state(), timeline);
        let queue = self.queue.lock().unwrap_or_else(|e| e.into_inner()).take();
        match queue {
            Some(q) => q.close(deadline).await,
            None => self.stats.clone(),
        }
    }

    /// Every startup of `timeline` not sent yet goes as it stands.
    fn export_unsent(&self, st: &mut State, timeline: &Timeline) {
        for pod in &timeline.pods {
            if !st.done.contains(&pod.uid) && !pod.stages.is_empty() && !startup_unseen(pod) {
                self.export(st, pod);
            }
        }
    }

    fn export(&self, st: &mut State, pod: &PodTimeline) {
        st.pending.remove(&pod.uid);
        st.done.insert(pod.uid.clone());
        let kubelet = st.kubelet.remove(&pod.uid).unwrap_or_default();
        let refs: Vec<&RuntimeSpan> = kubelet.iter().collect();
        let spans: Vec<_> = joined_pod_spans(pod, &refs, &self.node)
            .iter()
            .map(|s| span_data(s, self.anchor))
            .collect();
        tracing::debug!(
            pod = %pod.name,
            uid = %pod.uid,
            spans = spans.len(),
            kubelet_spans = refs.len(),
            "exporting the pod's startup"
        );
        if let Some(q) = self
            .queue
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .as_ref()
        {
            q.send(spans);
        }
    }
}

/// When anything last happened to the pod.
fn last_ns(pod: &PodTimeline) -> u64 {
    pod.stages
        .iter()
        .map(|s| s.end_ns.max(s.start_ns))
        .max()
        .unwrap_or(0)
}

#[cfg(test)]
#[path = "export_tests.rs"]
mod tests;
