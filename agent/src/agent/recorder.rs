//! What the agent records besides driving pods: the trace file (`--trace`), the
//! kernel probes feeding it, and the in-memory records the agent builds timelines from.
//! Everything recorded goes through one [`RecordSink`], which feeds both.

use std::path::{Path, PathBuf};
use std::sync::{Arc, OnceLock};

use k8s_openapi::api::core::v1::Pod;

use super::AgentError;
use super::probes::{Probes, start_probes, unavailable_note};
use super::span_wait::SpanWait;
use super::start_feed::StartFeed;
use crate::clock::wall_now;
use crate::config::source::PodUpdate;
use crate::cri::{CallHold, CallSink, CriCall, CriClient, CriMethod, RuntimeService};
use crate::ebpf::{CniOutputGate, KernelProbes, NetnsAttach, NetnsGate, ProbeConfig, now_ktime_ns};
use crate::kuberuntime::event::EventType;
use crate::metrics::Metrics;
use crate::otel::{
    ClockAnchor, ExportQueue, Listen, LiveExport, RuntimeReceiver, RuntimeSpan, TraceGate,
};
use crate::syncloop::{KernelSeen, StatusStore};
use crate::timeline::{Collector, KernelFilter};
use crate::trace::{
    Footer, Header, KernelSource, PodEventRecord, PodOp, PodOpRecord, PodStatusRecord,
    PodWaitRecord, RecordingEnd, SCHEMA_VERSION, SourcesRecord, SpanWaitEnd, TraceConfig,
    TraceRecord, TraceSink, TraceWriter, redact_pod,
};

/// How long the agent's in-memory timeline keeps a pod after it left the config, unless
/// `--deleted-pod-retention` says otherwise.
pub const DEFAULT_DELETED_POD_RETENTION: std::time::Duration = std::time::Duration::from_secs(10);

/// The trace and the agent's timeline records, fed together.
#[derive(Clone)]
pub struct RecordSink {
    trace: TraceSink,
    collector: Arc<Collector>,
    metrics: Arc<Metrics>,
    starts: Arc<StartFeed>,
    /// Set when the probes run with their namespace programs on demand.
    netns: Arc<OnceLock<NetnsGate>>,
    /// Set when the probes capture CNI plugins' output.
    cni_output: Arc<OnceLock<CniOutputGate>>,
    /// Set when pod startups are exported over OTLP.
    otel: Arc<OnceLock<Arc<LiveExport>>>,
    /// Which calls carry a sampled trace context (on when exporting or receiving spans).
    gate: Arc<TraceGate>,
    /// The runtime's server spans the sampled calls are owed.
    owed: Arc<SpanWait>,
}

/// The CRI calls inside which the runtime creates, enters or tears down a pod's network
/// namespace: containerd's unshare and the CNI plugins' setns (RunPodSandbox; DEL in
/// StopPodSandbox or RemovePodSandbox), runc's setns into the sandbox's namespace
/// (CreateContainer, StartContainer). The namespace programs are attached around them.
const NETNS_CALLS: [CriMethod; 5] = [
    CriMethod::RunPodSandbox,
    CriMethod::StopPodSandbox,
    CriMethod::RemovePodSandbox,
    CriMethod::CreateContainer,
    CriMethod::StartContainer,
];

impl RecordSink {
    pub fn send(&self, record: TraceRecord) {
        if self.gate.is_on() {
            self.gate.observe(&record);
        }
        match &record {
            TraceRecord::Cri(call) => {
                self.owed.call(call);
                self.metrics.observe_call(call);
                self.starts.call_ended(call);
                if let Some(otel) = self.otel.get() {
                    otel.observe_call(call);
                }
            }
            TraceRecord::Wait(w) => self.metrics.observe_wait(w),
            TraceRecord::Status(s) => {
                if let Some(otel) = self.otel.get() {
                    otel.observe_status(&s.pod_uid, &s.status);
                }
            }
            TraceRecord::Event(e) if e.event.kind == EventType::Warning => {
                if let Some(otel) = self.otel.get() {
                    otel.observe_warning(&e.pod_uid);
                }
            }
            _ => {}
        }
        self.collector.push(&record);
        self.trace.send(record);
    }
}

impl RecordSink {
    /// The runtime's spans of one request (pods the agent knows): the live export
    /// forwards them with their pods, the trace and the timeline keep them.
    fn send_runtime_spans(&self, spans: Vec<RuntimeSpan>) {
        self.owed.batch(&spans);
        if spans.is_empty() {
            return;
        }
        if let Some(otel) = self.otel.get() {
            otel.observe_runtime_spans(&spans);
        }
        for s in spans {
            self.send(TraceRecord::RuntimeSpan(Box::new(s)));
        }
    }
}

impl CallSink for RecordSink {
    fn record(&self, call: CriCall) {
        self.send(TraceRecord::Cri(call));
    }

    fn sampled(&self, call: &CriCall) -> bool {
        self.gate.sampled(call)
    }

    fn begin(&self, call: &CriCall) -> Option<CallHold> {
        self.starts.call_began(call);
        if !NETNS_CALLS.contains(&call.method) {
            return None;
        }
        // The runtime runs the CNI plugins inside the same calls: the write hook is
        // attached before the request goes out, so no plugin can write before it.
        let cni = self
            .cni_output
            .get()
            .map(|gate| gate.hold(call.method.as_str()));
        let netns = self.netns.get().map(NetnsGate::hold);
        Some(Box::new((netns, cni)) as CallHold)
    }
}

pub struct RunRecorder {
    /// How long the in-memory timeline keeps a deleted pod (`--deleted-pod-retention`).
    retention: std::time::Duration,
    writer: Option<TraceWriter>,
    sink: RecordSink,
    probes: Option<KernelProbes>,
    forwarder: Option<tokio::task::JoinHandle<()>>,
    /// Both clocks read at the start: the trace header's, and the OTLP export's wall
    /// times.
    anchor: ClockAnchor,
    /// The OTLP export's pass over finished pods, while it runs.
    otel_ticker: Option<tokio::task::JoinHandle<()>>,
    /// The receiver of the runtime's spans (`--runtime-otlp-listen`).
    receiver: Option<RuntimeReceiver>,
    /// Said to the user by the caller: see [`RunRecorder::take_notes`].
    notes: Vec<String>,
    /// Whether the probes run, as the `sources` record says.
    kernel_source: KernelSource,
    /// How long the end waits for the runtime's spans of sampled calls.
    span_wait: std::time::Duration,
}

/// The probes a run asks for.
pub struct ProbeRequest {
    pub config: ProbeConfig,
    /// A node that cannot run them fails the run (`--require-ebpf`).
    pub require: bool,
}

/// How long a run's end waits for the runtime's spans of its sampled calls, unless
/// `--runtime-span-wait` says otherwise: longer than the OpenTelemetry batch processor's
/// default delay (5 s), which containerd's exporter uses.
pub const DEFAULT_RUNTIME_SPAN_WAIT: std::time::Duration = std::time::Duration::from_secs(8);

/// How often the OTLP export looks for pods whose startup is over.
const OTEL_TICK: std::time::Duration = std::time::Duration::from_secs(1);
/// How long the runtime's OTLP receiver may take to finish the requests under way when
/// the agent stops.
const RECEIVER_CLOSE: std::time::Duration = std::time::Duration::from_secs(2);
/// How long the OTLP export may take to send what is left when the agent stops.
const OTEL_CLOSE: std::time::Duration = std::time::Duration::from_secs(5);

impl RunRecorder {
    /// Opens the trace (if asked for) and starts the probes (if `probes` says how). A
    /// node that cannot run the probes, when they are not required, leaves a note
    /// ([`RunRecorder::take_notes`]) and the run goes on without kernel events.
    pub async fn start(
        trace: Option<(&Path, Option<crate::trace::Rotation>)>,
        probes: Option<ProbeRequest>,
        cgroup_root: Option<&str>,
        cri: &CriClient,
        node: &str,
        config: TraceConfig,
    ) -> Result<RunRecorder, AgentError> {
        let anchor = ClockAnchor {
            wall_ns: wall_now(),
            mono_ns: now_ktime_ns(),
        };
        let writer = match trace {
            None => None,
            Some((path, rotation)) => {
                let version = cri.version().await.map_err(AgentError::RuntimeVersion)?;
                let header = Header {
                    schema_version: SCHEMA_VERSION,
                    podlapse_version: env!("CARGO_PKG_VERSION").to_string(),
                    node: node.to_string(),
                    kernel: nix::sys::utsname::uname()
                        .map(|u| u.release().to_string_lossy().into_owned())
                        .unwrap_or_default(),
                    runtime_name: version.runtime_name,
                    runtime_version: version.runtime_version,
                    config,
                    started_wall_ns: anchor.wall_ns,
                    started_ns: anchor.mono_ns,
                    observed: None,
                    part: None,
                };
                let w = TraceWriter::create_rotating(path, header, rotation).map_err(|source| {
                    AgentError::TraceCreate {
                        path: path.to_path_buf(),
                        source,
                    }
                })?;
                Some(w)
            }
        };
        let sink = RecordSink {
            trace: writer
                .as_ref()
                .map(|w| w.sink())
                .unwrap_or_else(TraceSink::discard),
            collector: Arc::new(Collector::new()),
            metrics: Arc::new(Metrics::new()),
            starts: Arc::new(StartFeed::default()),
            netns: Arc::new(OnceLock::new()),
            cni_output: Arc::new(OnceLock::new()),
            otel: Arc::new(OnceLock::new()),
            gate: Arc::new(TraceGate::new()),
            owed: Arc::new(SpanWait::default()),
        };
        let mut recorder = RunRecorder {
            retention: DEFAULT_DELETED_POD_RETENTION,
            writer,
            sink,
            probes: None,
            forwarder: None,
            anchor,
            otel_ticker: None,
            receiver: None,
            notes: Vec::new(),
            kernel_source: KernelSource::Off {
                why: "--no-ebpf".into(),
            },
            span_wait: DEFAULT_RUNTIME_SPAN_WAIT,
        };
        if let Some(request) = probes {
            recorder.start_probes(request, cgroup_root)?;
        }
        Ok(recorder)
    }

    /// Starts the probes with the pod cgroups under `cgroup_root` watched and the
    /// namespace programs attached only around the calls that need them.
    fn start_probes(
        &mut self,
        request: ProbeRequest,
        cgroup_root: Option<&str>,
    ) -> Result<(), AgentError> {
        let mut config = request.config;
        if let Some(root) = cgroup_root
            && !config.cgroup_prefixes.iter().any(|p| p == root)
        {
            config.cgroup_prefixes.push(root.to_string());
        }
        config.netns_attach = NetnsAttach::OnDemand;
        let (probes, mut events) = match start_probes(config, request.require)? {
            Probes::Running(started) => *started,
            Probes::Unavailable(e) => {
                self.notes.push(unavailable_note(&e));
                self.kernel_source = KernelSource::Unavailable { why: e.to_string() };
                return Ok(());
            }
        };
        self.kernel_source = KernelSource::On;
        self.sink.starts.set_pace(probes.pace());
        if let Some(gate) = probes.netns_gate() {
            let _ = self.sink.netns.set(gate);
        }
        if let Some(gate) = probes.cni_output_gate() {
            let _ = self.sink.cni_output.set(gate);
        }
        let sink = self.sink.clone();
        // On the event thread with the reader: a container's first exec shows it running
        // without waiting for the sync loop's runtime.
        self.forwarder = Some(crate::event_thread::spawn(async move {
            let mut filter = KernelFilter::new();
            let mut keep = Vec::new();
            while let Some(e) = events.recv().await {
                sink.starts.kernel_event(&e);
                filter.offer(e, &mut keep);
                for e in keep.drain(..) {
                    sink.send(TraceRecord::Kernel(e));
                }
            }
            tracing::debug!(
                dropped = filter.dropped(),
                "node-level kernel events away from pod work were not kept"
            );
        }));
        self.probes = Some(probes);
        Ok(())
    }

    /// How long the end waits for the runtime's spans of sampled calls
    /// (`--runtime-span-wait`).
    pub fn set_runtime_span_wait(&mut self, wait: std::time::Duration) {
        self.span_wait = wait;
    }

    /// The recording's sources as they stand, with how its end went once it ended.
    fn sources(&self, ended: Option<RecordingEnd>) -> SourcesRecord {
        SourcesRecord {
            at_ns: now_ktime_ns(),
            kernel: self.kernel_source.clone(),
            runtime_spans: RuntimeReceiver::span_source(self.receiver.as_ref()),
            ended,
        }
    }

    /// Records which sources the recording has, once the probes and the receiver are
    /// started: a trace cut short says so too.
    pub fn announce_sources(&self) {
        self.sink.send(TraceRecord::Sources(self.sources(None)));
    }

    /// Waits for the runtime's spans the sampled calls are owed (when they are being
    /// received), and records how the sources ended.
    async fn end_sources(&mut self) -> SourcesRecord {
        let bound = self.span_wait;
        let waited = match &self.receiver {
            Some(_) => Some(self.sink.owed.wait(bound).await),
            None => None,
        };
        let end = RecordingEnd {
            runtime_spans_received: self.sink.metrics.runtime_otlp_stats().received(),
            waited_ns: waited.map_or(0, |w| {
                u64::try_from(w.waited.as_nanos()).unwrap_or(u64::MAX)
            }),
            bound_ns: u64::try_from(bound.as_nanos()).unwrap_or(u64::MAX),
            missing: waited.map_or(0, |w| w.missing),
            wait: waited.map_or(SpanWaitEnd::NotNeeded, |w| w.end),
        };
        if end.missing > 0 {
            self.notes.push(format!(
                "the runtime's spans of {} sampled CRI calls did not arrive ({}; waited {:.1} s)",
                end.missing,
                match end.wait {
                    SpanWaitEnd::Bound => "none came within the bound",
                    _ => "its last batch did not hold them",
                },
                end.waited_ns as f64 / 1e9
            ));
        }
        let record = self.sources(Some(end));
        self.sink.send(TraceRecord::Sources(record.clone()));
        record
    }

    /// What the user should know that stopped nothing (probes unavailable), once each.
    pub fn take_notes(&mut self) -> Vec<String> {
        std::mem::take(&mut self.notes)
    }

    pub fn sink(&self) -> RecordSink {
        self.sink.clone()
    }

    /// Exports each pod's startup over OTLP to `endpoint` from now on (a collector that
    /// is slow or away costs spans, counted, never pod work).
    pub fn start_otlp(&mut self, endpoint: &str, node: &str) -> Result<(), crate::otel::OtelError> {
        let exporter = crate::otel::exporter(endpoint, node)?;
        let queue = ExportQueue::start(
            exporter,
            endpoint.to_string(),
            self.sink.metrics.otlp_stats(),
            crate::otel::resource(node),
        );
        self.sink.gate.enable();
        let live = Arc::new(LiveExport::new(
            queue,
            node,
            self.anchor,
            self.sink.gate.clone(),
        ));
        let _ = self.sink.otel.set(live.clone());
        let collector = self.sink.collector.clone();
        self.otel_ticker = Some(tokio::spawn(async move {
            let mut tick = tokio::time::interval(OTEL_TICK);
            loop {
                tick.tick().await;
                live.tick(&collector, now_ktime_ns());
            }
        }));
        Ok(())
    }

    /// Receives the runtime's own spans over OTLP/gRPC on `listen` from now on; CRI calls
    /// of starting pods go out sampled so the runtime traces them.
    pub async fn start_runtime_receiver(
        &mut self,
        listen: Listen,
    ) -> Result<(), crate::otel::OtelError> {
        let sink = self.sink.clone();
        let receiver = RuntimeReceiver::start(
            listen,
            self.sink.gate.clone(),
            self.anchor,
            self.sink.metrics.runtime_otlp_stats(),
            Arc::new(move |spans| sink.send_runtime_spans(spans)),
        )
        .await?;
        self.sink.gate.enable();
        self.receiver = Some(receiver);
        Ok(())
    }

    /// What the agent builds its timelines from (`GET /timeline`).
    pub fn metrics(&self) -> Arc<Metrics> {
        self.sink.metrics.clone()
    }

    /// Brings the metrics computed from the timeline and the probes' loss counters up to
    /// date (before a scrape).
    pub fn refresh_metrics(&self) {
        self.sink.metrics.observe_collector(&self.sink.collector);
        self.forget_deleted();
        self.sink
            .metrics
            .set_collector(&self.sink.collector.stats());
        if let Some(w) = &self.writer {
            let stats = w.stats();
            self.sink
                .metrics
                .set_trace_losses(stats.unwritten(), stats.dropped());
        }
        if let Some(lost) = self.probes.as_ref().and_then(|p| p.lost().ok()) {
            let by_kind = lost
                .by_kind
                .iter()
                .map(|(k, v)| (k.to_string(), *v))
                .collect();
            self.sink.metrics.set_lost(&by_kind);
        }
        self.netns_refresher()();
    }

    pub fn set_deleted_pod_retention(&mut self, retention: std::time::Duration) {
        self.retention = retention;
    }

    /// Lets the in-memory timeline forget pods deleted longer than the retention ago.
    /// Their stages are counted in the metrics if they were not yet, and written to the
    /// trace now: the stages written when the run ends are those of the pods kept then.
    fn forget_deleted(&self) {
        let retention = u64::try_from(self.retention.as_nanos()).unwrap_or(u64::MAX);
        let forgotten = self
            .sink
            .collector
            .forget_deleted(now_ktime_ns(), retention);
        if forgotten.uids.is_empty() {
            return;
        }
        self.sink.metrics.forget_timeline(&forgotten);
        self.sink.gate.forget(&forgotten.uids);
        if let Some(otel) = self.sink.otel.get() {
            otel.forget(&forgotten.uids, &forgotten.timeline);
        }
        if self.writer.is_some() {
            send_stages(&self.sink.trace, &forgotten.timeline);
        }
    }

    /// Brings what the metrics show of the namespace probes' gate up to date; cheap
    /// enough to run before every scrape.
    pub fn netns_refresher(&self) -> impl Fn() + Send + Sync + 'static {
        let (cell, metrics) = (self.sink.netns.clone(), self.sink.metrics.clone());
        let cni = self.sink.cni_output.clone();
        move || {
            // The namespace probes' gate exists once the probes are loaded.
            metrics.set_probes_loaded(cell.get().is_some());
            if let Some(gate) = cell.get() {
                metrics.set_netns_probes(gate.is_attached(), gate.attaches());
            }
            if let Some(gate) = cni.get() {
                metrics.set_cni_write_hook(gate.is_attached(), gate.attaches());
            }
        }
    }

    pub fn collector(&self) -> Arc<Collector> {
        self.sink.collector.clone()
    }

    /// Shows each container start the kernel reports, and the exit of its process, through
    /// `seen` as it happens (when the probes run).
    pub fn show_kernel_seen(&self, seen: KernelSeen) {
        self.sink.starts.set_target(seen);
    }

    /// Sends the store's pod events and status changes to the trace.
    pub fn tap_events(&self, store: &StatusStore) {
        let status_sink = self.sink.clone();
        store.set_status_tap(Arc::new(move |uid, ns, name, at_ns, status| {
            status_sink.send(TraceRecord::Status(PodStatusRecord {
                at_ns,
                pod_uid: uid.to_string(),
                namespace: ns.to_string(),
                name: name.to_string(),
                status: Box::new(status.clone()),
            }));
        }));
        let wait_sink = self.sink.clone();
        store.set_wait_tap(Arc::new(move |uid, ns, name, start_ns, end_ns, wait| {
            wait_sink.send(TraceRecord::Wait(PodWaitRecord {
                start_ns,
                end_ns,
                pod_uid: uid.to_string(),
                namespace: ns.to_string(),
                name: name.to_string(),
                wait: wait.clone(),
            }));
        }));
        let sink = self.sink.clone();
        store.set_event_tap(Arc::new(move |uid, ns, name, e| {
            sink.send(TraceRecord::Event(PodEventRecord {
                at_ns: e.at_ns,
                pod_uid: uid.to_string(),
                namespace: ns.to_string(),
                name: name.to_string(),
                event: e.event.clone(),
            }));
        }));
    }

    /// Records a config change as pod records.
    pub fn pod_update(&self, update: &PodUpdate) {
        let (op, pods): (PodOp, &[Arc<Pod>]) = match update {
            PodUpdate::Add(p) => (PodOp::Add, p),
            PodUpdate::Update(p) => (PodOp::Update, p),
            PodUpdate::Remove(p) => (PodOp::Remove, p),
            PodUpdate::Invalid(_) | PodUpdate::SourcesReady => return,
        };
        for pod in pods {
            self.sink.send(TraceRecord::Pod(PodOpRecord {
                at_ns: now_ktime_ns(),
                op,
                pod: Arc::new(redact_pod(pod)),
            }));
        }
    }

    /// Stops the probes and closes the trace with its footer. What was lost on the way
    /// (kernel events, spans, trace records) is in the result; nothing is lost silently.
    pub async fn finish(mut self) -> Finished {
        let mut finished = Finished::default();
        // First, while the receiver still takes them: the runtime's last spans.
        let sources = self.end_sources().await;
        finished.notes.append(&mut self.notes);
        let mut footer = Footer {
            ebpf: self.probes.is_some(),
            ..Footer::default()
        };
        if let Some(probes) = self.probes {
            finished
                .notes
                .extend(stop_probes(probes, &mut footer).await);
        }
        if let Some(f) = self.forwarder {
            let _ = f.await;
        }
        // The runtime's last batch may still be on its way: it sends every few seconds,
        // and what it sends after this is not taken.
        if let Some(r) = self.receiver {
            r.stop(RECEIVER_CLOSE).await;
        }
        if let Some(ticker) = self.otel_ticker {
            ticker.abort();
        }
        if let Some(otel) = self.sink.otel.get() {
            let stats = otel
                .close(&self.sink.collector.timeline(), OTEL_CLOSE)
                .await;
            if stats.dropped() > 0 {
                finished.notes.push(format!(
                    "the OTLP export dropped {} spans (sent {})",
                    stats.dropped(),
                    stats.exported()
                ));
            }
        }
        if self.writer.is_some() {
            // Every record is in by now: the probes are stopped and their events drained.
            let timeline = self.sink.collector.timeline();
            send_stages(&self.sink.trace, &timeline);
            footer.pod_sources = timeline
                .pods
                .iter()
                .filter_map(|p| Some((p.uid.clone(), p.sources.clone()?)))
                .collect();
        }
        footer.sources = Some(sources);
        footer.ended_ns = now_ktime_ns();
        if let Some(w) = self.writer {
            finished.failures = close_trace(w, footer).await;
        }
        finished
    }
}

/// How a run's recording ended.
#[derive(Debug, Default)]
pub struct Finished {
    /// What was lost that does not fail the run (kernel events, exported spans).
    pub notes: Vec<String>,
    /// What the trace lost: the run fails, as its record is not whole.
    pub failures: Vec<TraceLoss>,
}

/// Records the trace file lost.
#[derive(Debug, thiserror::Error)]
pub enum TraceLoss {
    #[error("writing {}: {source}", path.display())]
    Write {
        path: PathBuf,
        source: std::io::Error,
    },
    #[error("trace {}: {records} records were dropped while the writer was behind", path.display())]
    Dropped { path: PathBuf, records: u64 },
    #[error("trace {}: {records} records could not be written ({why})", path.display())]
    Unwritten {
        path: PathBuf,
        records: u64,
        why: String,
    },
}

/// Writes the trace's footer and closes it; what the trace lost on the way, if anything.
pub async fn close_trace(writer: TraceWriter, footer: Footer) -> Vec<TraceLoss> {
    let path = writer.path().to_path_buf();
    let stats = writer.stats();
    if let Err(source) = writer.finish(footer).await {
        return vec![TraceLoss::Write { path, source }];
    }
    let mut losses = Vec::new();
    if stats.dropped() > 0 {
        losses.push(TraceLoss::Dropped {
            path: path.clone(),
            records: stats.dropped(),
        });
    }
    if stats.unwritten() > 0 {
        losses.push(TraceLoss::Unwritten {
            path,
            records: stats.unwritten(),
            why: stats.failure().unwrap_or("the writer stopped").to_string(),
        });
    }
    losses
}

/// Stops the probes and puts what the kernel lost into the trace's footer. A loss, or a
/// failure to stop, comes back as a line to say: a loss is never silent.
pub async fn stop_probes(probes: KernelProbes, footer: &mut Footer) -> Option<String> {
    match probes.stop().await {
        Ok(summary) => {
            footer.lost_events = summary.lost.total;
            footer.lost_by_kind = summary
                .lost
                .by_kind
                .iter()
                .map(|(k, v)| (k.to_string(), *v))
                .collect();
            (summary.lost.total > 0).then(|| {
                format!(
                    "the kernel lost {} events (ring buffer full)",
                    summary.lost.total
                )
            })
        }
        Err(e) => Some(format!("stopping the probes: {e}")),
    }
}

/// The timeline's stages as stage records.
fn send_stages(trace: &TraceSink, timeline: &crate::timeline::Timeline) {
    for stage in timeline.stages() {
        match serde_json::to_value(stage) {
            Ok(v) => trace.send(TraceRecord::Stage(v)),
            Err(e) => eprintln!("podlapse: a timeline stage: {e}"),
        }
    }
}
