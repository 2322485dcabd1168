//! The metric families and how records feed them.

use std::collections::{BTreeMap, BTreeSet};
use std::sync::Mutex;
use std::sync::atomic::AtomicU64;

use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::metrics::histogram::Histogram;
use prometheus_client::registry::Registry;

use k8s_openapi::api::core::v1::PodSpec;

use crate::cri::{CriCall, CriMethod};
use crate::kubelet::pod_startup_latency::PodStartupLatencyTracker;
use crate::kuberuntime::event::WaitKind;
use crate::otel::{ExportStats, ReceiverStats};
use crate::queues::{Queue as SyncLoopQueue, QueueStats};
use crate::timeline::{Collector, CollectorStats, Forgotten, StageKind, Timeline};
use crate::trace::{ObservedRecord, PodWaitRecord};

use super::diagnosis::DiagnosisGauges;
use super::observed::ObservedFamilies;

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct Operation {
    operation_type: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct Handler {
    runtime_handler: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct StageLabel {
    stage: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct Plugin {
    plugin: String,
    exit_code: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct Kind {
    kind: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct Queue {
    queue: String,
}

/// kubelet's runtime operation buckets (0.005 s to 10 s, exponential) extended to 60 s.
const OPERATION_BUCKETS: [f64; 12] = [
    0.005,
    0.0125,
    0.03125,
    0.078125,
    0.1953125,
    0.48828125,
    1.220703125,
    3.0517578125,
    7.62939453125,
    19.073486328125,
    30.0,
    60.0,
];
/// kubelet's pod startup buckets (`podStartupDurationBuckets`), of both pod-start
/// histograms.
const POD_START_BUCKETS: [f64; 25] = [
    0.5, 1.0, 2.0, 3.0, 4.0, 5.0, 6.0, 8.0, 10.0, 20.0, 30.0, 45.0, 60.0, 120.0, 180.0, 240.0,
    300.0, 360.0, 480.0, 600.0, 900.0, 1200.0, 1800.0, 2700.0, 3600.0,
];
/// Stages run from microseconds (a cgroup mkdir) to minutes (a pull).
const STAGE_BUCKETS: [f64; 16] = [
    0.0001, 0.00025, 0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5,
    10.0, 60.0,
];

fn histogram(buckets: &'static [f64]) -> impl Fn() -> Histogram + Clone {
    move || Histogram::new(buckets.iter().copied())
}

type HistFamily<L> = Family<L, Histogram, fn() -> Histogram>;

fn ops() -> Histogram {
    histogram(&OPERATION_BUCKETS)()
}
fn stages() -> Histogram {
    histogram(&STAGE_BUCKETS)()
}

/// Every metric the agent exposes.
pub struct Metrics {
    registry: Registry,
    runtime_ops: HistFamily<Operation>,
    runtime_ops_total: Family<Operation, Counter>,
    runtime_ops_errors: Family<Operation, Counter>,
    run_podsandbox: HistFamily<Handler>,
    image_pull: Histogram,
    pod_worker: HistFamily<Operation>,
    pod_start_sli: Histogram,
    pod_start_total: Histogram,
    first_network_pod_start_sli: Gauge<f64, AtomicU64>,
    stage: HistFamily<StageLabel>,
    cni_plugin: HistFamily<Plugin>,
    lost: Family<Kind, Counter>,
    probes_loaded: Gauge,
    netns_attached: Gauge,
    netns_attaches: Counter,
    cni_hook_attached: Gauge,
    cni_hook_attaches: Counter,
    trace_unwritten: Counter,
    trace_dropped: Counter,
    timeline_evicted: Family<Kind, Counter>,
    timeline_pods: Gauge,
    timeline_deleted_pods: Gauge,
    timeline_forgotten: Counter,
    timeline_forgotten_early: Counter,
    pleg_discard: Counter,
    queue_waits: Family<Queue, Counter>,
    otlp: ExportStats,
    runtime_otlp: ReceiverStats,
    diagnosis: DiagnosisGauges,
    /// `podlapse observe`'s own families; None for `run`.
    observed: Option<ObservedFamilies>,
    state: Mutex<State>,
    /// The collector's generation whose timeline was observed last.
    timeline_seen: AtomicU64,
}

/// How long after a pod is first seen done its timeline is still built for stages that
/// come late: the runtime sends its spans in batches every 5 s, and a retried export
/// later still.
const STAGES_SETTLE_NS: u64 = 30_000_000_000;
/// How long after a pod is first seen done its stages wait for a started container's
/// exec that the kernel has not delivered yet (a loaded node reads the probes' ring
/// late); past this it is sealed without it.
const EXEC_WAIT_NS: u64 = 120_000_000_000;

#[derive(Default)]
struct StagedPod {
    /// (stage name, start) of each stage observed.
    seen: BTreeSet<(String, u64)>,
    done_ns: u64,
    /// Its time to Running was observed (the observer's pod-start histogram).
    start_observed: bool,
    /// At its last look, a started container's exec had not come from the kernel yet
    /// ([`crate::timeline::PodTimeline::kernel_exec_pending`]): it is not sealed without it before
    /// [`EXEC_WAIT_NS`].
    exec_pending: bool,
}

#[derive(Default)]
struct State {
    /// What the pod-start metrics need per pod: pulls and init container runs to leave
    /// out of the SLI.
    startup: PodStartupLatencyTracker,
    /// When a pull that waited behind the image puller was asked for, by (pod UID,
    /// container): the pull's start for the SLI, as kubelet counts it.
    puller_waits: BTreeMap<(String, String), u64>,
    /// Pods that got to Running or failed: the stages of each observed so far, and when
    /// it was first seen done. Stages that come later (a kernel exec read after the
    /// runtime's reply, the runtime's spans in their batch) are observed as they come.
    staged: BTreeMap<String, StagedPod>,
    /// Pods done for longer than [`STAGES_SETTLE_NS`]: their stages are all in, and the
    /// timeline is no longer built for them.
    sealed: BTreeSet<String>,
    lost_seen: BTreeMap<String, u64>,
    netns_attaches_seen: u64,
    cni_hook_attaches_seen: u64,
    trace_unwritten_seen: u64,
    trace_dropped_seen: u64,
    evicted_seen: BTreeMap<&'static str, u64>,
    forgotten_seen: u64,
    forgotten_early_seen: u64,
    pleg_discard_seen: u64,
    queue_waits_seen: BTreeMap<&'static str, u64>,
}

/// A stage's `stage` label: its kind, with the step for the runtime's spans
/// (`runtime:task_start`), the method for the kubelet's calls (`kubelet_call:RunPodSandbox`)
/// and the update type for its syncs (`kubelet_sync:create`); a value outside the known
/// few is `other`, so what a client sends cannot grow the label's values.
fn stage_label(stage: &crate::timeline::StageName) -> String {
    let step = stage.name().map(|n| n.split(':').next().unwrap_or(n));
    let known = match (stage.kind(), step) {
        (StageKind::Runtime, Some(step)) => crate::timeline::RuntimeStep::ALL
            .iter()
            .any(|s| s.name() == step),
        (StageKind::KubeletCall, Some(step)) => step.parse::<CriMethod>().is_ok(),
        (StageKind::KubeletSync, Some(step)) => matches!(
            step,
            "create" | "update" | "sync" | "kill" | "terminating" | "terminated"
        ),
        _ => return stage.kind().to_string(),
    };
    match (known, step) {
        (true, Some(step)) => format!("{}:{step}", stage.kind()),
        _ => format!("{}:other", stage.kind()),
    }
}

/// kubelet's `operation_type` label for a CRI method (`RunPodSandbox` -> `run_podsandbox`).
pub fn operation_type(method: &str) -> String {
    let mut out = String::new();
    for (i, ch) in method.chars().enumerate() {
        if ch.is_ascii_uppercase() && i > 0 {
            out.push('_');
        }
        out.push(ch.to_ascii_lowercase());
    }
    out.replace("pod_sandbox", "podsandbox")
}

impl Default for Metrics {
    fn default() -> Self {
        Metrics::new()
    }
}

/// Which command serves the metrics: the families differ.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Mode {
    /// `podlapse run`: kubelet's families too, from the calls the agent makes.
    Agent,
    /// `podlapse observe`: what applies to another client's pods.
    Observer,
}

impl Metrics {
    /// The metrics of `podlapse run`.
    pub fn new() -> Metrics {
        Metrics::build(Mode::Agent, true)
    }

    /// The metrics of `podlapse observe`: the families of `run` that apply to pods it
    /// did not make (stages, CNI plugins, the probes', the trace's and the timeline's
    /// losses, the spans received, the live diagnosis, and the OTLP export's when
    /// `exports`), and its own.
    pub fn observer(exports: bool) -> Metrics {
        Metrics::build(Mode::Observer, exports)
    }

    fn build(mode: Mode, exports: bool) -> Metrics {
        let mut metrics = Metrics {
            runtime_ops: HistFamily::<Operation>::new_with_constructor(ops as fn() -> Histogram),
            runtime_ops_total: Family::<Operation, Counter>::default(),
            runtime_ops_errors: Family::<Operation, Counter>::default(),
            run_podsandbox: HistFamily::<Handler>::new_with_constructor(ops as fn() -> Histogram),
            image_pull: ops(),
            pod_worker: HistFamily::<Operation>::new_with_constructor(ops as fn() -> Histogram),
            pod_start_sli: histogram(&POD_START_BUCKETS)(),
            pod_start_total: histogram(&POD_START_BUCKETS)(),
            first_network_pod_start_sli: Gauge::<f64, AtomicU64>::default(),
            stage: HistFamily::<StageLabel>::new_with_constructor(stages as fn() -> Histogram),
            cni_plugin: HistFamily::<Plugin>::new_with_constructor(stages as fn() -> Histogram),
            lost: Family::<Kind, Counter>::default(),
            pleg_discard: Counter::default(),
            probes_loaded: Gauge::default(),
            netns_attached: Gauge::default(),
            netns_attaches: Counter::default(),
            cni_hook_attached: Gauge::default(),
            cni_hook_attaches: Counter::default(),
            trace_unwritten: Counter::default(),
            trace_dropped: Counter::default(),
            timeline_evicted: Family::<Kind, Counter>::default(),
            timeline_pods: Gauge::default(),
            timeline_deleted_pods: Gauge::default(),
            timeline_forgotten: Counter::default(),
            timeline_forgotten_early: Counter::default(),
            queue_waits: Family::<Queue, Counter>::default(),
            otlp: ExportStats::default(),
            runtime_otlp: ReceiverStats::default(),
            diagnosis: DiagnosisGauges::new(),
            observed: (mode == Mode::Observer).then(|| ObservedFamilies::new(&POD_START_BUCKETS)),
            registry: Registry::default(),
            state: Mutex::new(State::default()),
            timeline_seen: AtomicU64::new(0),
        };
        let mut registry = std::mem::take(&mut metrics.registry);
        if mode == Mode::Agent {
            metrics.register_kubelets(registry.sub_registry_with_prefix("kubelet"));
        }
        let podlapse = registry.sub_registry_with_prefix("podlapse");
        metrics.register_podlapses(podlapse, mode, exports);
        metrics.diagnosis.register(podlapse);
        if let Some(observed) = &metrics.observed {
            observed.register(podlapse);
        }
        metrics.registry = registry;
        metrics
    }

    /// kubelet's own metrics, by kubelet's names and help.
    fn register_kubelets(&self, kubelet: &mut Registry) {
        kubelet.register(
            "runtime_operations_duration_seconds",
            "Duration in seconds of runtime operations, by operation type",
            self.runtime_ops.clone(),
        );
        kubelet.register(
            "runtime_operations",
            "Cumulative number of runtime operations by operation type",
            self.runtime_ops_total.clone(),
        );
        kubelet.register(
            "runtime_operations_errors",
            "Cumulative number of runtime operation errors by operation type",
            self.runtime_ops_errors.clone(),
        );
        kubelet.register(
            "run_podsandbox_duration_seconds",
            "Duration in seconds of the run_podsandbox operations, by RuntimeClass handler",
            self.run_podsandbox.clone(),
        );
        kubelet.register(
            "image_pull_duration_seconds",
            "Duration in seconds to pull an image",
            self.image_pull.clone(),
        );
        kubelet.register(
            "pod_worker_duration_seconds",
            "Duration in seconds to sync a single pod, by operation type: create, update, sync or kill",
            self.pod_worker.clone(),
        );
        kubelet.register(
            "pod_start_sli_duration_seconds",
            "Duration in seconds from a pod's creation (first seen) until all its containers \
             were running, less the time spent pulling images and running init containers; \
             stateless pods only",
            self.pod_start_sli.clone(),
        );
        kubelet.register(
            "pod_start_total_duration_seconds",
            "Duration in seconds from a pod's creation (first seen) until all its containers \
             were running, image pulls and init containers included",
            self.pod_start_total.clone(),
        );
        kubelet.register(
            "first_network_pod_start_sli_duration_seconds",
            "The pod start SLI of the first stateless pod not on the host's network",
            self.first_network_pod_start_sli.clone(),
        );
        kubelet.register(
            "pleg_discard_events",
            "The number of discard events in PLEG (the relist found the sync loop's queue full)",
            self.pleg_discard.clone(),
        );
    }

    /// podlapse's metrics: stages, the probes' losses, the trace, the timeline, the
    /// queues and the OTLP export and receiver.
    fn register_podlapses(&self, podlapse: &mut Registry, mode: Mode, exports: bool) {
        podlapse.register(
            "stage_duration_seconds",
            "Duration in seconds of each stage of pod startup, from CRI spans and kernel events",
            self.stage.clone(),
        );
        podlapse.register(
            "cni_plugin_duration_seconds",
            "Duration in seconds of each CNI plugin run, from its exec to its exit in the kernel",
            self.cni_plugin.clone(),
        );
        podlapse.register(
            "ebpf_lost_events",
            "Kernel events the probes could not deliver because the ring buffer was full",
            self.lost.clone(),
        );
        podlapse.register(
            "ebpf_probes_loaded",
            "1 while the eBPF probes are loaded; 0 when they are off (--no-ebpf, or the \
             kernel refused them: the log says why), and the kernel's stages are missing",
            self.probes_loaded.clone(),
        );
        podlapse.register(
            "ebpf_netns_probes_attached",
            "1 while the network-namespace probes are attached: kernel-function hooks \
             always, syscall tracepoints around the CRI calls that create or enter pod \
             namespaces, and a second after",
            self.netns_attached.clone(),
        );
        podlapse.register(
            "ebpf_netns_probe_attaches",
            "Times the network-namespace syscall tracepoints were attached (0 where \
             kernel-function hooks feed the namespace events)",
            self.netns_attaches.clone(),
        );
        podlapse.register(
            "ebpf_cni_write_hook_attached",
            "1 while the write hook that captures CNI plugins' output is attached: around \
             the CRI calls that run plugins, from a plugin's exec to its exit, and briefly \
             after",
            self.cni_hook_attached.clone(),
        );
        podlapse.register(
            "ebpf_cni_write_hook_attaches",
            "Times the write hook that captures CNI plugins' output was attached",
            self.cni_hook_attaches.clone(),
        );
        podlapse.register(
            "trace_records_unwritten",
            "Trace records that could not be written (a write error or a full disk); the pods \
             keep running",
            self.trace_unwritten.clone(),
        );
        podlapse.register(
            "trace_records_dropped",
            "Trace records dropped because the trace writer's queue was full (it fell behind)",
            self.trace_dropped.clone(),
        );
        podlapse.register(
            "timeline_records_evicted",
            "Records the agent's in-memory timeline let go at its cap, oldest first, by kind \
             (the trace keeps them; GET /timeline no longer shows them)",
            self.timeline_evicted.clone(),
        );
        podlapse.register(
            "timeline_pods",
            "Pods the agent's in-memory timeline holds records of",
            self.timeline_pods.clone(),
        );
        podlapse.register(
            "timeline_deleted_pods",
            "Of those, pods no longer in the config, kept until --deleted-pod-retention ends",
            self.timeline_deleted_pods.clone(),
        );
        podlapse.register(
            "timeline_pods_forgotten",
            "Deleted pods whose records the agent let go after the retention",
            self.timeline_forgotten.clone(),
        );
        podlapse.register(
            "timeline_pods_forgotten_early",
            "Deleted pods let go before the retention ended because the agent kept its \
             bound of deleted pods",
            self.timeline_forgotten_early.clone(),
        );
        podlapse.register(
            "runtime_spans_received",
            "Spans the container runtime sent to the agent's OTLP receiver \
             (--runtime-otlp-listen), in requests that decoded",
            self.runtime_otlp.received.clone(),
        );
        podlapse.register(
            "runtime_spans_dropped",
            "Received runtime spans not kept, by reason: unknown_pod (in the trace of no pod \
             the agent runs), malformed (bad IDs or times)",
            self.runtime_otlp.dropped.clone(),
        );
        podlapse.register(
            "runtime_otlp_requests_rejected",
            "Connections and requests the runtime's OTLP receiver refused, by reason: \
             non_local (a peer not on this host), oversized, malformed (did not decode)",
            self.runtime_otlp.rejected.clone(),
        );
        if mode == Mode::Agent {
            podlapse.register(
                "syncloop_queue_waits",
                "Sends that found one of the sync loop's bounded queues full and waited for \
                 room, by queue (pod_updates, pleg, probe_results, work_done)",
                self.queue_waits.clone(),
            );
        }
        if !exports {
            // An observer without --otlp-endpoint exports nothing: these would only read 0.
            return;
        }
        podlapse.register(
            "otlp_spans_exported",
            "Spans the OTLP export delivered to the collector",
            self.otlp.exported.clone(),
        );
        podlapse.register(
            "otlp_spans_dropped",
            "Spans the OTLP export dropped: its queue was full (the collector is slow or \
             away) or the collector refused or never answered their batch",
            self.otlp.dropped.clone(),
        );
        podlapse.register(
            "otlp_export_failures",
            "OTLP export requests that failed",
            self.otlp.failed_exports.clone(),
        );
    }

    fn state(&self) -> std::sync::MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// The counters the OTLP export counts into.
    pub fn otlp_stats(&self) -> ExportStats {
        self.otlp.clone()
    }

    /// The counters the runtime's OTLP receiver counts into.
    pub fn runtime_otlp_stats(&self) -> ReceiverStats {
        self.runtime_otlp.clone()
    }

    /// One CRI call.
    pub fn observe_call(&self, call: &CriCall) {
        let secs = call.end_ns.saturating_sub(call.start_ns) as f64 / 1e9;
        let op = Operation {
            operation_type: operation_type(call.method.as_str()),
        };
        self.runtime_ops.get_or_create(&op).observe(secs);
        self.runtime_ops_total.get_or_create(&op).inc();
        if !call.ok() {
            self.runtime_ops_errors.get_or_create(&op).inc();
        }
        match call.method {
            CriMethod::RunPodSandbox => {
                // The handler is the request's, which the recording does not keep: the
                // default handler's label, empty.
                let h = Handler {
                    runtime_handler: String::new(),
                };
                self.run_podsandbox.get_or_create(&h).observe(secs);
            }
            CriMethod::PullImage => {
                if call.ok() {
                    self.image_pull.observe(secs);
                }
                if !call.pod_uid.is_empty() {
                    // Pulling time for the SLI runs from when the pull was asked for
                    // (before any wait behind the image puller) until it succeeded; a
                    // failed pull stays open, as kubelet's does. A pod's pulls run one
                    // after another, so telling the start when the call ends keeps
                    // kubelet's order.
                    let mut st = self.state();
                    let key = (call.pod_uid.clone(), call.container.clone());
                    let asked = st.puller_waits.remove(&key).unwrap_or(call.start_ns);
                    st.startup.image_started_pulling(&call.pod_uid, asked);
                    if call.ok() {
                        st.startup
                            .image_finished_pulling(&call.pod_uid, call.end_ns);
                    }
                }
            }
            _ => {}
        }
    }

    /// A pod worker finished a unit of work (`create`, `update`, `sync`, `kill`).
    pub fn observe_pod_worker(&self, operation: &str, secs: f64) {
        let op = Operation {
            operation_type: operation.to_string(),
        };
        self.pod_worker.get_or_create(&op).observe(secs);
    }

    /// A wait a pod's work spent queued ended.
    pub fn observe_wait(&self, w: &PodWaitRecord) {
        if w.wait.wait == WaitKind::ImagePuller {
            let key = (
                w.pod_uid.clone(),
                w.wait.container.clone().unwrap_or_default(),
            );
            self.state().puller_waits.insert(key, w.start_ns);
        }
    }

    /// Drops what is kept for a pod that is gone (the pulls of a pod that never ran).
    pub fn forget_pod(&self, uid: &str) {
        let mut st = self.state();
        st.startup.delete(uid);
        st.puller_waits.retain(|(pod, _), _| pod != uid);
    }

    /// Every container of a pod was running for the first time, `total_ns` after it was
    /// first seen: kubelet's pod-start histograms, once per pod.
    pub fn observe_pod_started(
        &self,
        uid: &str,
        total_ns: u64,
        init_runs: &BTreeMap<String, (i64, i64)>,
        spec: Option<&PodSpec>,
    ) {
        let latency = {
            let mut st = self.state();
            for (id, (started, finished)) in init_runs {
                st.startup.init_container_ran(uid, id, *started, *finished);
            }
            let latency = st.startup.observed_started(uid, total_ns, spec);
            // Nothing more is counted for the pod; the tracker keeps only that it was.
            st.puller_waits.retain(|(pod, _), _| pod != uid);
            latency
        };
        let Some(l) = latency else {
            return;
        };
        self.pod_start_total.observe(l.total_s);
        if let Some(sli) = l.sli_s {
            self.pod_start_sli.observe(sli);
        }
        if let Some(first) = l.first_network_sli_s {
            self.first_network_pod_start_sli.set(first);
        }
    }

    /// [`Metrics::observe_timeline`] of what `collector` kept, when it kept anything
    /// since the last time (an unchanged timeline has no pod to observe), building only
    /// the pods not observed yet: building the timeline is the costly part.
    pub fn observe_collector(&self, collector: &Collector) {
        let now_ns = crate::clock::now_ktime_ns();
        let sealed = self.state().sealed.clone();
        if let Some(timeline) =
            collector.timeline_if_changed(&self.timeline_seen, |uid| !sealed.contains(uid))
        {
            self.observe_timeline_at(&timeline, now_ns);
        }
        self.seal_settled(now_ns);
    }

    /// Seals the pods done long enough that no stage of theirs is still to come.
    fn seal_settled(&self, now_ns: u64) {
        let mut st = self.state();
        let settled: Vec<String> = st
            .staged
            .iter()
            .filter(|(_, p)| {
                let done_for = now_ns.saturating_sub(p.done_ns);
                done_for >= STAGES_SETTLE_NS && (!p.exec_pending || done_for >= EXEC_WAIT_NS)
            })
            .map(|(uid, _)| uid.clone())
            .collect();
        for uid in settled {
            st.staged.remove(&uid);
            st.sealed.insert(uid);
        }
    }

    /// Stage and CNI plugin durations of pods that got to Running or failed, each stage
    /// once, as the stages come.
    pub fn observe_timeline(&self, timeline: &Timeline) {
        self.observe_timeline_at(timeline, crate::clock::now_ktime_ns());
    }

    fn observe_timeline_at(&self, timeline: &Timeline, now_ns: u64) {
        let mut st = self.state();
        for pod in &timeline.pods {
            let done =
                pod.stage(StageKind::Running).is_some() || pod.settled_failures().next().is_some();
            if !done || st.sealed.contains(&pod.uid) {
                continue;
            }
            let staged = st
                .staged
                .entry(pod.uid.clone())
                .or_insert_with(|| StagedPod {
                    seen: BTreeSet::new(),
                    done_ns: now_ns,
                    start_observed: false,
                    exec_pending: false,
                });
            staged.exec_pending = pod.kernel_exec_pending();
            if let Some(observed) = &self.observed
                && !staged.start_observed
                && let Some(ns) = pod.to_running_ns()
            {
                staged.start_observed = true;
                observed.pod_start.observe(ns as f64 / 1e9);
            }
            for s in &pod.stages {
                if !staged.seen.insert((s.stage.to_string(), s.start_ns)) {
                    continue;
                }
                let secs = s.duration_ns as f64 / 1e9;
                if let Some(plugin) = s.stage.cni_plugin() {
                    let labels = Plugin {
                        plugin: plugin.to_string(),
                        exit_code: s.exit_code.map(|c| c.to_string()).unwrap_or_default(),
                    };
                    self.cni_plugin.get_or_create(&labels).observe(secs);
                }
                // Per-container stages are folded by kind: label values stay bounded (an
                // observed `container_started:app` is `container_started`). The runtime's
                // spans keep their step (`runtime:task_start`), one of a known few.
                let kind = stage_label(&s.stage);
                self.stage
                    .get_or_create(&StageLabel { stage: kind })
                    .observe(secs);
            }
        }
    }

    /// The probes' lost-event totals by kind (monotonic; only growth is added).
    pub fn set_lost(&self, by_kind: &BTreeMap<String, u64>) {
        let mut st = self.state();
        for (kind, total) in by_kind {
            let seen = st.lost_seen.entry(kind.clone()).or_default();
            if *total > *seen {
                self.lost
                    .get_or_create(&Kind { kind: kind.clone() })
                    .inc_by(*total - *seen);
                *seen = *total;
            }
        }
    }

    /// The trace writer's totals of records it could not write and records dropped at its
    /// full queue (monotonic; only growth is added).
    pub fn set_trace_losses(&self, unwritten: u64, dropped: u64) {
        let mut st = self.state();
        if unwritten > st.trace_unwritten_seen {
            self.trace_unwritten
                .inc_by(unwritten - st.trace_unwritten_seen);
            st.trace_unwritten_seen = unwritten;
        }
        if dropped > st.trace_dropped_seen {
            self.trace_dropped.inc_by(dropped - st.trace_dropped_seen);
            st.trace_dropped_seen = dropped;
        }
    }

    /// What the in-memory timeline keeps and let go (its counters are monotonic; only
    /// growth is added).
    pub fn set_collector(&self, stats: &CollectorStats) {
        self.timeline_pods.set(stats.pods as i64);
        self.timeline_deleted_pods.set(stats.deleted_pods as i64);
        let mut st = self.state();
        for (kind, total) in stats.evicted {
            let seen = st.evicted_seen.entry(kind).or_default();
            if total > *seen {
                self.timeline_evicted
                    .get_or_create(&Kind {
                        kind: kind.to_string(),
                    })
                    .inc_by(total - *seen);
                *seen = total;
            }
        }
        if stats.forgotten_pods > st.forgotten_seen {
            self.timeline_forgotten
                .inc_by(stats.forgotten_pods - st.forgotten_seen);
            st.forgotten_seen = stats.forgotten_pods;
        }
        if stats.forgotten_early > st.forgotten_early_seen {
            self.timeline_forgotten_early
                .inc_by(stats.forgotten_early - st.forgotten_early_seen);
            st.forgotten_early_seen = stats.forgotten_early;
        }
    }

    /// What hitting the sync loop's queue bounds cost (monotonic; only growth is added).
    pub fn set_syncloop_queues(&self, stats: &QueueStats) {
        let mut st = self.state();
        let discarded = stats.pleg_discarded();
        if discarded > st.pleg_discard_seen {
            self.pleg_discard.inc_by(discarded - st.pleg_discard_seen);
            st.pleg_discard_seen = discarded;
        }
        for queue in SyncLoopQueue::ALL {
            let (total, seen) = (
                stats.waits(queue),
                st.queue_waits_seen.entry(queue.name()).or_default(),
            );
            if total > *seen {
                self.queue_waits
                    .get_or_create(&Queue {
                        queue: queue.name().to_string(),
                    })
                    .inc_by(total - *seen);
                *seen = total;
            }
        }
    }

    /// Pods the timeline forgot: their stages are observed now if they were not yet,
    /// and nothing is kept about them any more.
    pub fn forget_timeline(&self, forgotten: &Forgotten) {
        self.observe_timeline(&forgotten.timeline);
        let mut st = self.state();
        for uid in &forgotten.uids {
            st.staged.remove(uid);
            st.sealed.remove(uid);
        }
    }

    /// A change the observer recorded.
    pub fn observe_observed(&self, r: &ObservedRecord) {
        if let Some(observed) = &self.observed {
            observed.observed(r);
        }
    }

    /// The live diagnosis's gauges, from what `collector` keeps (worked out again only
    /// when it changed, or every 30 s as pods age out).
    pub fn refresh_diagnosis(&self, collector: &Collector) {
        self.diagnosis
            .refresh(collector, crate::clock::now_ktime_ns());
    }

    /// Whether the eBPF probes are loaded.
    pub fn set_probes_loaded(&self, loaded: bool) {
        self.probes_loaded.set(i64::from(loaded));
    }

    /// Whether the network-namespace probes are attached, and how many times they were.
    pub fn set_netns_probes(&self, attached: bool, attaches: u64) {
        self.netns_attached.set(i64::from(attached));
        let mut st = self.state();
        if attaches > st.netns_attaches_seen {
            self.netns_attaches
                .inc_by(attaches - st.netns_attaches_seen);
            st.netns_attaches_seen = attaches;
        }
    }

    /// Whether the CNI write hook is attached, and how many times it was.
    pub fn set_cni_write_hook(&self, attached: bool, attaches: u64) {
        self.cni_hook_attached.set(i64::from(attached));
        let mut st = self.state();
        if attaches > st.cni_hook_attaches_seen {
            self.cni_hook_attaches
                .inc_by(attaches - st.cni_hook_attaches_seen);
            st.cni_hook_attaches_seen = attaches;
        }
    }

    /// The Prometheus text exposition (format 0.0.4), what `promtool` and scrapers that
    /// do not ask for OpenMetrics read: the same samples, with counters' HELP and TYPE
    /// named as their `_total` samples and no `# EOF`.
    pub fn encode_prometheus(&self) -> String {
        openmetrics_to_prometheus(&self.encode())
    }

    /// The OpenMetrics text exposition.
    pub fn encode(&self) -> String {
        let mut out = String::new();
        // Writing to a String cannot fail.
        let _ = prometheus_client::encoding::text::encode(&mut out, &self.registry);
        out
    }
}

fn openmetrics_to_prometheus(text: &str) -> String {
    let counters: BTreeSet<&str> = text
        .lines()
        .filter_map(|l| l.strip_prefix("# TYPE "))
        .filter_map(|l| l.strip_suffix(" counter"))
        .collect();
    let mut out = String::with_capacity(text.len());
    for line in text.lines() {
        if line == "# EOF" {
            continue;
        }
        let renamed = ["# HELP ", "# TYPE "].iter().find_map(|prefix| {
            let rest = line.strip_prefix(prefix)?;
            let (name, tail) = rest.split_once(' ')?;
            counters
                .contains(name)
                .then(|| format!("{prefix}{name}_total {tail}"))
        });
        out.push_str(renamed.as_deref().unwrap_or(line));
        out.push('\n');
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A timeline of one pod `default/web` (uid `u`) with these stages and kernel events.
    fn one_pod(
        stages: Vec<crate::timeline::Stage>,
        kernel_events: BTreeMap<String, u64>,
    ) -> Timeline {
        Timeline {
            pods: vec![crate::timeline::PodTimeline {
                uid: "u".into(),
                namespace: "default".into(),
                name: "web".into(),
                seen_ns: Some(0),
                sandbox_ids: Vec::new(),
                containers: BTreeMap::new(),
                ip: None,
                stages,
                kernel_events,
                notes: Vec::new(),
                sources: None,
            }],
            ..Timeline::default()
        }
    }
    use crate::kuberuntime::event::PodWait;

    #[test]
    fn a_stage_that_comes_after_running_is_observed_once_when_it_comes() {
        use crate::timeline::{Stage, StageSource};
        let stage = |kind: StageKind, at: u64, source: StageSource| {
            Stage::new("u", "default", "web", kind.into(), at, at + 5, source)
        };
        let pod = |stages: Vec<Stage>| one_pod(stages, BTreeMap::new());
        let count = |m: &Metrics, kind: &str| {
            let text = m.encode_prometheus();
            let key = format!("podlapse_stage_duration_seconds_count{{stage=\"{kind}\"}} ");
            text.lines()
                .find_map(|l| l.strip_prefix(key.as_str()).map(str::to_string))
        };
        let m = Metrics::new();
        let running = stage(StageKind::Running, 10, StageSource::Cri);
        m.observe_timeline_at(&pod(vec![running.clone()]), 100);
        assert_eq!(count(&m, "running").as_deref(), Some("1"));
        assert_eq!(count(&m, "pause_exec"), None);
        // The kernel's exec is read after the reply that made the pod Running.
        let exec = stage(StageKind::PauseExec, 8, StageSource::Kernel);
        m.observe_timeline_at(&pod(vec![exec.clone(), running.clone()]), 200);
        m.observe_timeline_at(&pod(vec![exec, running.clone()]), 300);
        assert_eq!(count(&m, "pause_exec").as_deref(), Some("1"));
        assert_eq!(count(&m, "running").as_deref(), Some("1"));
        // An observed container's stage is by kind, never by the container's name; a
        // runtime span's keeps its step.
        let named = |name: &str| {
            Stage::new(
                "u",
                "default",
                "web",
                crate::timeline::StageName::parse(name),
                20,
                25,
                StageSource::Runtime,
            )
        };
        m.observe_timeline_at(
            &pod(vec![
                named("container_started:app"),
                named("runtime:task_start:app"),
                running,
            ]),
            400,
        );
        assert_eq!(count(&m, "container_started").as_deref(), Some("1"));
        assert_eq!(count(&m, "runtime:task_start").as_deref(), Some("1"));
        assert!(!m.encode().contains(":app"), "{}", m.encode());
    }

    /// On a slow node a CNI plugin runs for seconds: until it exits, the timeline marks it
    /// "exit not seen", which is not the pod failing. Its stages are counted once it is
    /// Running, the plugin with the exit code it had.
    #[test]
    fn a_plugin_still_running_does_not_make_the_pod_done_and_is_counted_with_its_exit() {
        use crate::timeline::{Stage, StageName, StageSource};
        let pod = |stages: Vec<Stage>| one_pod(stages, BTreeMap::new());
        let plugin = |exit: Option<i32>| {
            let mut s = Stage::new(
                "u",
                "default",
                "web",
                StageName::of(StageKind::CniPlugin, "bridge"),
                5,
                if exit.is_some() { 9 } else { 5 },
                StageSource::Kernel,
            );
            s.exit_code = exit;
            s.ok = exit == Some(0);
            s
        };
        let running = Stage::new(
            "u",
            "default",
            "web",
            StageKind::Running.into(),
            20,
            20,
            StageSource::Cri,
        );
        // The ADD around it, as the timeline builds it while the plugin runs: pending too.
        let mut add = Stage::new(
            "u",
            "default",
            "web",
            StageKind::CniAdd.into(),
            5,
            5,
            StageSource::Kernel,
        );
        add.ok = false;
        let m = Metrics::new();
        m.observe_timeline_at(&pod(vec![add, plugin(None)]), 100);
        assert!(
            !m.encode_prometheus()
                .contains("podlapse_cni_plugin_duration_seconds_count"),
            "{}",
            m.encode_prometheus()
        );
        m.observe_timeline_at(&pod(vec![plugin(Some(0)), running]), 200);
        let text = m.encode_prometheus();
        assert!(
            text.contains(
                "podlapse_cni_plugin_duration_seconds_count{plugin=\"bridge\",exit_code=\"0\"} 1"
            ),
            "{text}"
        );
        assert!(!text.contains("exit_code=\"\""), "{text}");
        // A plugin that exited 1 fails the pod at once, running or not.
        let m = Metrics::new();
        m.observe_timeline_at(&pod(vec![plugin(Some(1))]), 100);
        assert!(
            m.encode_prometheus().contains(
                "podlapse_cni_plugin_duration_seconds_count{plugin=\"bridge\",exit_code=\"1\"} 1"
            ),
            "{}",
            m.encode_prometheus()
        );
    }

    /// A started container's exec the kernel delivers late (a loaded node reads the
    /// probes' ring behind the runtime's events) is still counted: the pod is not sealed
    /// without it until EXEC_WAIT_NS.
    #[test]
    fn a_pod_waits_for_its_containers_exec_before_it_is_sealed() {
        use crate::timeline::{Stage, StageName, StageSource};
        let stage = |name: StageName, at: u64, source: StageSource| {
            Stage::new("u", "default", "web", name, at, at, source)
        };
        let pod = |stages: Vec<Stage>| one_pod(stages, BTreeMap::from([("exec".to_string(), 3)]));
        let started = stage(
            StageName::of(StageKind::ContainerStarted, "app"),
            20,
            StageSource::Runtime,
        );
        let running = stage(StageKind::Running.into(), 20, StageSource::Runtime);
        let exec = stage(
            StageName::of(StageKind::AppFirstExec, "app"),
            19,
            StageSource::Kernel,
        );
        let m = Metrics::new();
        m.observe_timeline_at(&pod(vec![started.clone(), running.clone()]), 0);
        m.seal_settled(STAGES_SETTLE_NS + 1);
        assert!(!m.state().sealed.contains("u"), "sealed without its exec");
        m.observe_timeline_at(&pod(vec![exec, started.clone(), running.clone()]), 0);
        assert!(
            m.encode_prometheus()
                .contains("podlapse_stage_duration_seconds_count{stage=\"app_first_exec\"} 1"),
            "{}",
            m.encode_prometheus()
        );
        m.seal_settled(STAGES_SETTLE_NS + 2);
        assert!(m.state().sealed.contains("u"));
        // An exec that never comes holds the pod back at most EXEC_WAIT_NS.
        let m = Metrics::new();
        m.observe_timeline_at(&pod(vec![started, running]), 0);
        m.seal_settled(EXEC_WAIT_NS - 1);
        assert!(!m.state().sealed.contains("u"));
        m.seal_settled(EXEC_WAIT_NS);
        assert!(m.state().sealed.contains("u"));
    }

    #[test]
    fn prometheus_text_names_counters_by_their_samples() {
        let m = Metrics::new();
        m.set_lost(&BTreeMap::from([("exec".to_string(), 1)]));
        let text = m.encode_prometheus();
        assert!(
            text.contains("# TYPE podlapse_ebpf_lost_events_total counter"),
            "{text}"
        );
        assert!(!text.contains("# EOF"));
    }

    #[test]
    fn the_namespace_probes_gauge_and_attach_count_follow_the_gate() {
        let m = Metrics::new();
        assert!(
            m.encode_prometheus()
                .contains("podlapse_ebpf_probes_loaded 0\n"),
            "off until loaded"
        );
        m.set_probes_loaded(true);
        assert!(
            m.encode_prometheus()
                .contains("podlapse_ebpf_probes_loaded 1\n")
        );
        m.set_netns_probes(true, 2);
        m.set_netns_probes(false, 3);
        let text = m.encode_prometheus();
        assert!(
            text.contains("podlapse_ebpf_netns_probes_attached 0\n"),
            "{text}"
        );
        assert!(
            text.contains("podlapse_ebpf_netns_probe_attaches_total 3\n"),
            "{text}"
        );
        assert!(
            text.contains("# TYPE podlapse_ebpf_netns_probes_attached gauge"),
            "{text}"
        );
    }

    #[test]
    fn the_cni_write_hook_gauge_and_attach_count_follow_the_gate() {
        let m = Metrics::new();
        m.set_cni_write_hook(true, 1);
        m.set_cni_write_hook(false, 4);
        let text = m.encode_prometheus();
        assert!(
            text.contains("podlapse_ebpf_cni_write_hook_attached 0\n"),
            "{text}"
        );
        assert!(
            text.contains("podlapse_ebpf_cni_write_hook_attaches_total 4\n"),
            "{text}"
        );
    }

    #[test]
    fn operation_types_are_kubelets() {
        assert_eq!(operation_type("RunPodSandbox"), "run_podsandbox");
        assert_eq!(operation_type("PodSandboxStatus"), "podsandbox_status");
        assert_eq!(operation_type("ListPodSandbox"), "list_podsandbox");
        assert_eq!(operation_type("CreateContainer"), "create_container");
        assert_eq!(operation_type("PullImage"), "pull_image");
        assert_eq!(operation_type("ExecSync"), "exec_sync");
    }

    #[test]
    fn calls_feed_kubelets_histograms() {
        let m = Metrics::new();
        let call = CriCall::new(CriMethod::RunPodSandbox)
            .with_pod_uid("u")
            .with_sandbox_id("s")
            .with_times(0, 150_000_000)
            .with_code(crate::cri::GrpcCode::Ok);
        m.observe_call(&call);
        let text = m.encode();
        assert!(
            text.contains("kubelet_run_podsandbox_duration_seconds_count{runtime_handler=\"\"} 1"),
            "{text}"
        );
        assert!(
            text.contains("kubelet_runtime_operations_duration_seconds_sum{operation_type=\"run_podsandbox\"} 0.15"),
            "{text}"
        );
        assert!(
            text.contains("kubelet_runtime_operations_total{operation_type=\"run_podsandbox\"} 1"),
            "{text}"
        );
    }

    #[test]
    fn a_pods_stages_are_observed_once_as_the_collector_grows() {
        let collector = Collector::new();
        let pod = serde_json::from_value(serde_json::json!({
            "metadata": {"name": "web", "namespace": "default", "uid": "u"},
            "spec": {"containers": [{"name": "app", "image": "app:1"}]}
        }))
        .unwrap();
        collector.push(&crate::trace::TraceRecord::Pod(crate::trace::PodOpRecord {
            at_ns: 0,
            op: crate::trace::PodOp::Add,
            pod: std::sync::Arc::new(pod),
        }));
        let call = |method: CriMethod, t: u64| {
            let sandbox = method == CriMethod::RunPodSandbox;
            CriCall::new(method)
                .with_pod_uid("u")
                .with_container(if sandbox { "" } else { "app" })
                .with_sandbox_id("s")
                .with_container_id(if sandbox { "" } else { "c" })
                .with_times(t, t + 1)
                .with_code(crate::cri::GrpcCode::Ok)
        };
        let m = Metrics::new();
        let count = |m: &Metrics| {
            let text = m.encode_prometheus();
            text.lines()
                .find_map(|l| {
                    l.strip_prefix(
                        "podlapse_stage_duration_seconds_count{stage=\"container_start\"} ",
                    )
                })
                .map(str::to_string)
        };
        for (method, t) in [
            (CriMethod::RunPodSandbox, 10),
            (CriMethod::CreateContainer, 20),
        ] {
            collector.push(&crate::trace::TraceRecord::Cri(call(method, t)));
        }
        m.observe_collector(&collector);
        assert_eq!(count(&m), None, "not Running yet");
        collector.push(&crate::trace::TraceRecord::Cri(call(
            CriMethod::StartContainer,
            30,
        )));
        m.observe_collector(&collector);
        m.observe_collector(&collector);
        collector.push(&crate::trace::TraceRecord::Cri(call(
            CriMethod::StopContainer,
            40,
        )));
        m.observe_collector(&collector);
        assert_eq!(count(&m).as_deref(), Some("1"));
    }

    #[test]
    fn lost_events_only_grow() {
        let m = Metrics::new();
        m.set_lost(&BTreeMap::from([("exec".to_string(), 5)]));
        m.set_lost(&BTreeMap::from([("exec".to_string(), 7)]));
        m.set_lost(&BTreeMap::from([("exec".to_string(), 7)]));
        assert!(
            m.encode()
                .contains("podlapse_ebpf_lost_events_total{kind=\"exec\"} 7")
        );
    }

    #[test]
    fn trace_losses_only_grow() {
        let m = Metrics::new();
        m.set_trace_losses(3, 0);
        m.set_trace_losses(5, 2);
        m.set_trace_losses(5, 2);
        let text = m.encode();
        assert!(
            text.contains("podlapse_trace_records_unwritten_total 5"),
            "{text}"
        );
        assert!(
            text.contains("podlapse_trace_records_dropped_total 2"),
            "{text}"
        );
    }

    #[tokio::test]
    async fn full_sync_loop_queues_show_as_waits_and_pleg_discards() {
        use crate::queues::{self, Queue};
        let m = Metrics::new();
        let stats = std::sync::Arc::new(QueueStats::default());
        assert!(m.encode().contains("kubelet_pleg_discard_events_total 0"));
        let (pleg, _pleg_rx) = queues::channel::<u8>(Queue::Pleg, &stats);
        for _ in 0..Queue::Pleg.capacity() + 3 {
            pleg.send_or_discard(0);
        }
        let (done, _done_rx) = queues::channel::<u8>(Queue::WorkDone, &stats);
        for _ in 0..Queue::WorkDone.capacity() + 2 {
            let _ = done.try_send(0);
        }
        m.set_syncloop_queues(&stats);
        m.set_syncloop_queues(&stats);
        let text = m.encode();
        assert!(
            text.contains("kubelet_pleg_discard_events_total 3"),
            "{text}"
        );
        assert!(
            text.contains("podlapse_syncloop_queue_waits_total{queue=\"work_done\"} 2"),
            "{text}"
        );
        assert!(!text.contains("queue=\"probe_results\""), "{text}");
    }

    fn pull(uid: &str, start_ns: u64, end_ns: u64, code: &str) -> CriCall {
        CriCall::new(CriMethod::PullImage)
            .with_pod_uid(uid)
            .with_container("c")
            .with_image("i")
            .with_times(start_ns, end_ns)
            .with_code(code.parse().expect("a gRPC code"))
    }

    #[test]
    fn a_deleted_pod_that_never_ran_leaves_no_pull_time_behind() {
        let m = Metrics::new();
        let failed = pull("never-ran", 0, 5, "NotFound");
        m.observe_call(&failed);
        assert_eq!(m.state().startup.len(), 1);
        m.forget_pod("never-ran");
        assert!(m.state().startup.is_empty());
    }

    fn sample(text: &str, name: &str) -> f64 {
        text.lines()
            .find_map(|l| l.strip_prefix(name)?.strip_prefix(' ')?.parse().ok())
            .unwrap_or_else(|| panic!("no {name} in:\n{text}"))
    }

    #[test]
    fn the_pod_start_sli_leaves_out_the_pull_and_its_wait_behind_the_puller() {
        let m = Metrics::new();
        // Asked for at 1 s, waited behind another pod's pull until 1.5 s, pulled until
        // 2.25 s; every container running 4 s after the pod was first seen.
        m.observe_wait(&PodWaitRecord {
            start_ns: 1_000_000_000,
            end_ns: 1_500_000_000,
            pod_uid: "p".into(),
            namespace: "default".into(),
            name: "p".into(),
            wait: PodWait {
                wait: WaitKind::ImagePuller,
                container: Some("c".into()),
                behind: vec!["default/other".into()],
                detail: String::new(),
            },
        });
        let call = pull("p", 1_500_000_000, 2_250_000_000, "OK");
        m.observe_call(&call);
        m.observe_pod_started("p", 4_000_000_000, &BTreeMap::new(), None);
        // Told again (another sync of a running pod): observed once.
        m.observe_pod_started("p", 9_000_000_000, &BTreeMap::new(), None);
        let text = m.encode();
        assert_eq!(
            sample(&text, "kubelet_pod_start_total_duration_seconds_sum"),
            4.0
        );
        assert_eq!(
            sample(&text, "kubelet_pod_start_total_duration_seconds_count"),
            1.0
        );
        assert_eq!(
            sample(&text, "kubelet_pod_start_sli_duration_seconds_sum"),
            2.75
        );
        assert_eq!(
            sample(
                &text,
                "kubelet_first_network_pod_start_sli_duration_seconds"
            ),
            2.75
        );
        // kubelet's buckets, 0.5 s to an hour.
        assert!(text.contains("kubelet_pod_start_sli_duration_seconds_bucket{le=\"240.0\"} 1"));
        assert!(text.contains("kubelet_pod_start_total_duration_seconds_bucket{le=\"3600.0\"} 1"));
        assert!(m.state().puller_waits.is_empty());
    }
}
