//! The agent's live export: each pod's startup goes out as one trace once it is over:
//! when the pod is Ready, or, for a pod that ran (or failed) and is not Ready, once
//! nothing new happened to it for [`SETTLE_NS`]; at the latest when it is forgotten or
//! the agent stops. Spans are built from the agent's own timeline and the pod's CRI
//! calls, with the same model `podlapse export` applies to the recorded trace. The
//! runtime's spans the agent received for the pod go with them, as the runtime's own
//! (its resource, IDs and parents); those that arrive after the pod went (containerd
//! sends its spans in batches every few seconds) are forwarded as they come.

use std::collections::{BTreeMap, BTreeSet};
use std::sync::atomic::AtomicU64;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use k8s_openapi::api::core::v1::PodStatus;

use super::gate::TraceGate;
use super::queue::{ExportQueue, ExportStats};
use super::runtime_span::RuntimeSpan;
use super::sdk::{ClockAnchor, span_data};
use super::spans::pod_spans;
use crate::cri::CriCall;
use crate::timeline::{Collector, PodTimeline, SourceState, StageKind, Timeline};

/// The runtime owes the pod spans that have not come yet.
fn runtime_spans_pending(pod: &PodTimeline) -> bool {
    pod.sources
        .as_ref()
        .is_some_and(|s| matches!(s.runtime, SourceState::Pending { .. }))
}

/// The kernel owes the pod a container's first exec: its probes saw the pod, and a
/// container started without its `app_first_exec` stage yet. The probes' ring buffer is
/// read every few milliseconds, and a pod with no readiness probe is Ready as soon as
/// its containers started, so the exec can come a moment after Ready.
pub(super) fn first_execs_pending(pod: &PodTimeline) -> bool {
    let probes_saw_it = pod.sources.as_ref().is_some_and(|s| s.kernel.is_present());
    probes_saw_it
        && pod
            .stages
            .iter()
            .filter(|s| {
                s.ok && matches!(
                    s.stage.kind(),
                    StageKind::ContainerStart | StageKind::ContainerStarted
                )
            })
            .filter_map(|s| s.stage.name())
            .any(|container| {
                !pod.stages.iter().any(|e| {
                    e.stage.kind() == &StageKind::AppFirstExec && e.stage.name() == Some(container)
                })
            })
}

/// How long a pod that ran but is not Ready (or failed) goes without a new stage before
/// its startup is exported as it stands.
pub const SETTLE_NS: u64 = 10_000_000_000;
/// CRI calls kept per pod until its export (a crash-looping pod makes many).
const CALLS_PER_POD: usize = 1024;
/// The runtime's spans kept per pod until its export.
const RUNTIME_SPANS_PER_POD: usize = 2048;

#[derive(Default)]
struct State {
    /// CRI calls of the pods not exported yet.
    calls: BTreeMap<String, Vec<CriCall>>,
    /// The runtime's spans for the pods not exported yet.
    runtime: BTreeMap<String, Vec<RuntimeSpan>>,
    exported: BTreeSet<String>,
    /// Pods that ran or failed, not Ready yet: their latest timeline.
    pending: BTreeMap<String, PodTimeline>,
    /// Pods whose status says their startup may be over (Running, Ready, failed): only
    /// their timelines are built, so pods still starting cost the export nothing.
    candidates: BTreeSet<String>,
}

pub struct LiveExport {
    queue: Mutex<Option<ExportQueue>>,
    stats: ExportStats,
    node: String,
    anchor: ClockAnchor,
    state: Mutex<State>,
    seen: AtomicU64,
    /// Told when a pod is exported: its later calls go out unsampled.
    gate: Arc<TraceGate>,
}

impl LiveExport {
    pub fn new(
        queue: ExportQueue,
        node: &str,
        anchor: ClockAnchor,
        gate: Arc<TraceGate>,
    ) -> LiveExport {
        LiveExport {
            gate,
            stats: queue.stats(),
            queue: Mutex::new(Some(queue)),
            node: node.to_string(),
            anchor,
            state: Mutex::new(State::default()),
            seen: AtomicU64::new(0),
        }
    }

    pub fn stats(&self) -> ExportStats {
        self.stats.clone()
    }

    fn state(&self) -> std::sync::MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// A CRI call ended.
    pub fn observe_call(&self, call: &CriCall) {
        if call.pod_uid.is_empty() {
            return;
        }
        let mut st = self.state();
        if st.exported.contains(&call.pod_uid) {
            return;
        }
        let calls = st.calls.entry(call.pod_uid.clone()).or_default();
        if calls.len() < CALLS_PER_POD {
            calls.push(call.clone());
        }
    }

    /// The runtime sent spans (one request's, of known pods): those of pods exported
    /// already go now, the others with their pod.
    pub fn observe_runtime_spans(&self, spans: &[RuntimeSpan]) {
        let mut now = Vec::new();
        {
            let mut st = self.state();
            for s in spans {
                if st.exported.contains(&s.pod_uid) {
                    now.push(s);
                    continue;
                }
                let kept = st.runtime.entry(s.pod_uid.clone()).or_default();
                if kept.len() < RUNTIME_SPANS_PER_POD {
                    kept.push(s.clone());
                }
            }
        }
        self.forward(now);
    }

    fn forward<'a>(&self, spans: impl IntoIterator<Item = &'a RuntimeSpan>) {
        if let Some(q) = self
            .queue
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .as_ref()
        {
            q.forward(spans, self.anchor);
        }
    }

    /// A pod's status was published: Running, ended, or a container that exited or
    /// waits for a reason other than its creation makes the pod a candidate.
    pub fn observe_status(&self, uid: &str, status: &PodStatus) {
        let phase = status.phase.as_deref().unwrap_or_default();
        let container_says = status.container_statuses.iter().flatten().any(|c| {
            c.state.as_ref().is_some_and(|s| {
                s.terminated.is_some()
                    || s.waiting.as_ref().is_some_and(|w| {
                        !matches!(
                            w.reason.as_deref(),
                            None | Some("ContainerCreating" | "PodInitializing")
                        )
                    })
            })
        });
        if matches!(phase, "Running" | "Succeeded" | "Failed") || container_says {
            self.candidate(uid);
        }
    }

    /// A warning about a pod (a sandbox that failed, a pull that failed): its startup
    /// may be over.
    pub fn observe_warning(&self, uid: &str) {
        self.candidate(uid);
    }

    fn candidate(&self, uid: &str) {
        let mut st = self.state();
        if !st.exported.contains(uid) {
            st.candidates.insert(uid.to_string());
        }
    }

    /// Exports the pods whose startup is over by `now_ns` (CLOCK_MONOTONIC).
    pub fn tick(&self, collector: &Collector, now_ns: u64) {
        let wanted = self.state().candidates.clone();
        let timeline = if wanted.is_empty() {
            None
        } else {
            collector.timeline_if_changed(&self.seen, |uid| wanted.contains(uid))
        };
        let mut st = self.state();
        for pod in timeline.map(|t| t.pods).unwrap_or_default() {
            if st.exported.contains(&pod.uid) {
                continue;
            }
            // A Ready pod whose runtime spans or containers' first execs are still on
            // their way waits for them (at most until it settles), so its trace goes out
            // whole.
            if pod.stage(StageKind::Ready).is_some()
                && !runtime_spans_pending(&pod)
                && !first_execs_pending(&pod)
            {
                st.pending.remove(&pod.uid);
                self.export(&mut st, &pod);
            } else if pod.stage(StageKind::Ready).is_some()
                || pod.stage(StageKind::Running).is_some()
                || pod.settled_failures().next().is_some()
            {
                st.pending.insert(pod.uid.clone(), pod);
            }
        }
        let settled: Vec<String> = st
            .pending
            .iter()
            .filter(|(_, p)| {
                let last = p.stages.iter().map(|s| s.end_ns).max().unwrap_or(0);
                now_ns.saturating_sub(last) >= SETTLE_NS
            })
            .map(|(uid, _)| uid.clone())
            .collect();
        for uid in settled {
            if let Some(pod) = st.pending.remove(&uid) {
                self.export(&mut st, &pod);
            }
        }
    }

    /// The agent let go of these pods (deleted, retention over): what was not exported
    /// yet goes now, and nothing is kept of them.
    pub fn forget(&self, uids: &[String], timeline: &Timeline) {
        let mut st = self.state();
        for pod in &timeline.pods {
            if !st.exported.contains(&pod.uid) && !pod.stages.is_empty() {
                self.export(&mut st, pod);
            }
        }
        for uid in uids {
            st.exported.remove(uid);
            st.calls.remove(uid);
            st.runtime.remove(uid);
            st.pending.remove(uid);
            st.candidates.remove(uid);
        }
    }

    /// The agent stops: every pod not exported yet goes as it stands, then the queue is
    /// given `deadline` to send.
    pub async fn close(&self, timeline: &Timeline, deadline: Duration) -> ExportStats {
        {
            let mut st = self.state();
            for pod in &timeline.pods {
                if !st.exported.contains(&pod.uid) && !pod.stages.is_empty() {
                    self.export(&mut st, pod);
                }
            }
        }
        let queue = self.queue.lock().unwrap_or_else(|e| e.into_inner()).take();
        match queue {
            Some(q) => q.close(deadline).await,
            None => self.stats.clone(),
        }
    }

    fn export(&self, st: &mut State, pod: &PodTimeline) {
        self.gate.mark_over(&pod.uid);
        st.candidates.remove(&pod.uid);
        let calls = st.calls.remove(&pod.uid).unwrap_or_default();
        let runtime = st.runtime.remove(&pod.uid).unwrap_or_default();
        let refs: Vec<&CriCall> = calls.iter().collect();
        let spans: Vec<_> = pod_spans(pod, &refs, &self.node)
            .iter()
            .map(|s| span_data(s, self.anchor))
            .collect();
        st.exported.insert(pod.uid.clone());
        if let Some(q) = self
            .queue
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .as_ref()
        {
            q.send(spans);
        }
        self.forward(&runtime);
    }
}
