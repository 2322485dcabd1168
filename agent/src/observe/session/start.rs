//! The observer's later phases: started (probes, trace, API, span receiver), observing
//! until told to stop, then finished in order so what was observed reaches the trace.

use std::future::Future;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use crate::agent::probes::{Probes, start_probes, unavailable_note};
use crate::agent::recorder::{TraceLoss, close_trace, stop_probes};
use crate::agent::{AgentError, ProbeRequest};
use crate::clock::wall_now;
use crate::ebpf::{KernelProbes, ProbeConfig, now_ktime_ns};
use crate::metrics::Metrics;
use crate::observe::export::ObservedExport;
use crate::observe::node_network::NodeNetworkLook;
use crate::observe::{ObserveConfig, ObserveSummary, ObservedPods, ObservedSpans, Watcher};
use crate::otel::{ClockAnchor, ExportQueue, ExportStats, Listen, ReceiverStats, RuntimeReceiver};
use crate::syncloop::StatusStore;
use crate::syncloop::api;
use crate::timeline::Collector;
use crate::trace::{
    Footer, Header, KernelSource, ObserveMode, ObservedConfig, ObservedFooter, ObservedHeader,
    RecordingEnd, SCHEMA_VERSION, SourcesRecord, SpanWaitEnd, TraceConfig, TraceRecord,
    TraceWriter,
};

use super::connect::Connected;
use super::forget::Forgetting;
use super::metrics::ServedMetrics;
use super::outputs::Outputs;

/// Between lists beside the event stream.
const RELIST: Duration = Duration::from_secs(1);
/// How often the kernel's events are read while they flow. The observer acts on none of
/// them (each carries the kernel's time), so it reads ten times less often than the
/// agent and is never woken for one: at 4 pods created at once, the agent's pace cost it
/// a thread wakeup or more per event, most of its CPU time.
const READ_PERIOD: Duration = Duration::from_millis(100);
/// How long the runtime's OTLP receiver may take to finish the requests under way at the
/// end.
const RECEIVER_CLOSE: Duration = Duration::from_secs(2);
/// How often the export looks for startups that are over.
const EXPORT_TICK: Duration = Duration::from_secs(1);
/// How long the export's queue may take to send what is left at the end.
const EXPORT_CLOSE: Duration = Duration::from_secs(5);

/// What the observer is asked to do: `podlapse observe`'s flags, parsed.
pub struct Options {
    pub trace: PathBuf,
    /// `--trace-max-bytes` and `--trace-keep`.
    pub trace_rotation: Option<crate::trace::Rotation>,
    /// Between lists when polling.
    pub poll: Duration,
    /// The node's name in the trace; the host name when not given.
    pub node_name: Option<String>,
    /// Where to serve the API; `None` serves none.
    pub api_socket: Option<PathBuf>,
    pub runtime_otlp: Option<Listen>,
    /// The probes from the flags (`None`: `--no-ebpf`); the CNI directory is the
    /// runtime's unless the flags named one.
    pub probes: Option<ProbeRequest>,
    /// `--cni-bin-dir`, when given.
    pub cni_bin_dir: Option<String>,
    /// `--metrics-addr`, bound.
    pub metrics: Option<tokio::net::TcpListener>,
    /// `--otlp-endpoint` (or the standard variables'), checked.
    pub otlp_endpoint: Option<String>,
    /// `--deleted-pod-retention`: how long a pod is kept once its last sandbox went.
    pub deleted_pod_retention: Duration,
}

/// The observer with everything started.
pub struct Running {
    runtime: Connected,
    poll: Duration,
    anchor: ClockAnchor,
    writer: TraceWriter,
    out: Outputs,
    store: Arc<StatusStore>,
    server: Option<tokio::task::JoinHandle<()>>,
    spans: Arc<ObservedSpans>,
    span_stats: ReceiverStats,
    receiver: Option<RuntimeReceiver>,
    probes: Option<KernelProbes>,
    forwarder: Option<tokio::task::JoinHandle<()>>,
    metrics: Option<ServedMetrics>,
    export: Option<Export>,
    forgetting: Forgetting,
    sources: Vec<String>,
    /// Whether the probes run, for the `sources` record.
    kernel_source: KernelSource,
    notes: Vec<String>,
}

/// How the observer's run ended.
pub struct Finished {
    pub summary: ObserveSummary,
    /// What was lost or refused that does not fail the run.
    pub notes: Vec<String>,
    /// What the trace lost: the run fails.
    pub failures: Vec<TraceLoss>,
}

impl Connected {
    /// Starts the probes, the trace, the API and the span receiver.
    pub async fn start(self, mut opts: Options) -> Result<Running, AgentError> {
        let mut notes = Vec::new();
        let mut kernel_source = KernelSource::Off {
            why: "--no-ebpf".into(),
        };
        let started = match opts.probes.take() {
            None => None,
            Some(request) => {
                let config = observer_probes(
                    request.config,
                    opts.cni_bin_dir.clone().or(self.cni_bin_dir()),
                );
                match start_probes(config, request.require)? {
                    Probes::Running(started) => {
                        kernel_source = KernelSource::On;
                        Some(*started)
                    }
                    Probes::Unavailable(e) => {
                        notes.push(unavailable_note(&e));
                        kernel_source = KernelSource::Unavailable { why: e.to_string() };
                        None
                    }
                }
            }
        };
        let sources = self.sources(started.is_some(), opts.runtime_otlp.is_some());
        let anchor = ClockAnchor {
            wall_ns: wall_now(),
            mono_ns: now_ktime_ns(),
        };
        let node = node_name(&opts);
        let header = observed_header(&self, &opts, &node, &sources, anchor);
        let exports = opts.otlp_endpoint.is_some();
        let metrics = opts
            .metrics
            .take()
            .map(|l| (l, Arc::new(Metrics::observer(exports))));
        let export = match &opts.otlp_endpoint {
            None => None,
            Some(endpoint) => {
                let stats = metrics
                    .as_ref()
                    .map_or_else(ExportStats::default, |(_, m)| m.otlp_stats());
                let queue = ExportQueue::start(
                    crate::otel::exporter(endpoint, &node)?,
                    endpoint.clone(),
                    stats,
                    crate::otel::resource(&node),
                );
                Some(Arc::new(ObservedExport::new(queue, &node, anchor)))
            }
        };
        let (writer, out) = open_trace(
            &opts.trace,
            header,
            opts.trace_rotation,
            metrics.as_ref().map(|(_, m)| m.clone()),
        )?;
        let store = Arc::new(StatusStore::default());
        let server = match &opts.api_socket {
            None => None,
            Some(socket) => {
                let state = api_state(store.clone(), out.collector.clone());
                Some(api::serve(socket, state).map_err(AgentError::ObserverApi)?)
            }
        };
        let spans = Arc::new(match &export {
            // Everything received is forwarded once, as it came.
            Some(e) => {
                let e = e.clone();
                ObservedSpans::forwarding(Box::new(move |spans| e.forward(spans)))
            }
            None => ObservedSpans::new(),
        });
        let span_stats = metrics
            .as_ref()
            .map_or_else(ReceiverStats::default, |(_, m)| m.runtime_otlp_stats());
        let receiver = match opts.runtime_otlp {
            Some(listen) => {
                let out = out.clone();
                let export = export.clone();
                let deliver = Arc::new(move |kept: Vec<crate::otel::RuntimeSpan>| {
                    if let Some(e) = &export {
                        e.observe_spans(&kept);
                    }
                    for s in kept {
                        out.send(TraceRecord::RuntimeSpan(Box::new(s)));
                    }
                });
                let r = RuntimeReceiver::start(
                    listen,
                    spans.clone(),
                    anchor,
                    span_stats.clone(),
                    deliver,
                )
                .await?;
                Some(r)
            }
            None => None,
        };
        let (probes, forwarder) = match started {
            Some((probes, events)) => (Some(probes), Some(out.forward_kernel_events(events))),
            None => (None, None),
        };
        let metrics = metrics.map(|(listener, metrics)| {
            ServedMetrics::start(listener, metrics, &out, &writer, probes.as_ref())
        });
        let forgetting = Forgetting::start(
            out.collector.clone(),
            metrics.as_ref().map(ServedMetrics::metrics),
            export.clone(),
            opts.deleted_pod_retention,
        );
        let export = export.map(|e| Export::start(e, out.collector.clone()));
        let running = Running {
            runtime: self,
            poll: opts.poll,
            anchor,
            writer,
            out,
            store,
            server,
            spans,
            span_stats,
            receiver,
            probes,
            forwarder,
            metrics,
            export,
            forgetting,
            sources,
            kernel_source,
            notes,
        };
        running
            .out
            .send(TraceRecord::Sources(running.sources_record(None)));
        Ok(running)
    }
}

impl Running {
    /// The observer's sources as they stand (`ended`: how the recording ended).
    fn sources_record(&self, ended: Option<RecordingEnd>) -> SourcesRecord {
        SourcesRecord {
            at_ns: now_ktime_ns(),
            kernel: self.kernel_source.clone(),
            runtime_spans: RuntimeReceiver::span_source(self.receiver.as_ref()),
            ended,
        }
    }

    /// The runtime's name and version, and what the trace is observed from.
    pub fn describe(&self) -> (String, String, Vec<String>) {
        (
            self.runtime.version.runtime_name.clone(),
            self.runtime.version.runtime_version.clone(),
            self.sources.clone(),
        )
    }

    /// Where `/metrics` is served, when it is.
    pub fn metrics_addr(&self) -> Option<std::net::SocketAddr> {
        self.metrics.as_ref().map(|m| m.addr)
    }

    /// What the user should know that stopped nothing, once each.
    pub fn take_notes(&mut self) -> Vec<String> {
        std::mem::take(&mut self.notes)
    }

    /// Follows the runtime until `stop` resolves, then stops everything in order: the
    /// API, the span receiver, the probes, the trace with its footer.
    pub async fn observe(self, stop: impl Future<Output = ()>) -> Finished {
        let mut watcher = Watcher::new(self.anchor.wall_ns, self.anchor.mono_ns);
        let config = ObserveConfig {
            poll: self.poll,
            relist: RELIST,
        };
        let observed = self.out.clone();
        let mut pods =
            ObservedPods::new(self.store.clone(), self.anchor.wall_ns, self.anchor.mono_ns);
        let learner = self.spans.clone();
        let streamed = self.runtime.stream.is_ok();
        let network = self.watch_network();
        let observing = crate::observe::observe(
            &self.runtime.view,
            streamed,
            config,
            &mut watcher,
            now_ktime_ns,
            move |r| {
                pods.apply(&r);
                learner.learn(&r);
                observed.send(TraceRecord::Observed(r));
            },
            stop,
        );
        let summary = match &self.metrics {
            None => observing.await,
            Some(m) => m.refreshed_while(observing, self.probes.as_ref()).await,
        };
        // One last look, so the trace ends on the network as it was.
        if let Some(mut look) = network.stop().await
            && let Some(r) = look.look(&self.runtime.view, now_ktime_ns()).await
        {
            self.out.send(TraceRecord::Network(Box::new(r)));
        }
        self.finish(summary).await
    }

    /// Looks at the node's pod network every relist, recording each change, until
    /// aborted; hands back its state either way.
    fn watch_network(&self) -> NetworkWatch {
        let shape = self.runtime.shape.clone().unwrap_or_default();
        let look = NodeNetworkLook::new(shape.cni_conf_dir.map(PathBuf::from), shape.cni_bin_dirs);
        let view = self.runtime.view.clone();
        let out = self.out.clone();
        let (stop, mut stopped) = tokio::sync::oneshot::channel::<()>();
        let task = tokio::spawn(async move {
            let mut look = look;
            let mut tick = tokio::time::interval(RELIST);
            tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
            loop {
                tokio::select! {
                    _ = &mut stopped => return look,
                    _ = tick.tick() => {}
                }
                if let Some(r) = look.look(&view, now_ktime_ns()).await {
                    out.send(TraceRecord::Network(Box::new(r)));
                }
            }
        });
        NetworkWatch { stop, task }
    }

    async fn finish(self, summary: ObserveSummary) -> Finished {
        let sources = self.sources_record(None);
        let mut notes = self.notes;
        self.forgetting.stop().await;
        if let Some(server) = self.server {
            server.abort();
            let _ = server.await;
        }
        if let Some(m) = self.metrics {
            m.stop().await;
        }
        // The runtime's last batch may still be on its way (containerd sends every few
        // seconds); what comes after this is not taken.
        if let Some(r) = self.receiver {
            r.stop(RECEIVER_CLOSE).await;
            self.spans.drop_held(&self.span_stats);
            notes.push(format!(
                "the runtime sent {} spans; {} were of no pod observed, {} malformed",
                self.span_stats.received(),
                self.span_stats.dropped("unknown_pod"),
                self.span_stats.dropped("malformed")
            ));
        }
        let ended = SourcesRecord {
            ended: Some(RecordingEnd {
                runtime_spans_received: self.span_stats.received(),
                waited_ns: 0,
                bound_ns: 0,
                missing: 0,
                wait: SpanWaitEnd::NotNeeded,
            }),
            ..sources
        };
        // The observer made none of the calls, so it owes the runtime no wait: the
        // sources end as they are.
        self.out.send(TraceRecord::Sources(ended.clone()));
        let streamed = self.runtime.stream.is_ok();
        let mut footer = Footer {
            ebpf: self.probes.is_some(),
            observed: Some(observed_footer(&summary, streamed, &self.span_stats)),
            ..Footer::default()
        };
        if let Some(probes) = self.probes {
            notes.extend(stop_probes(probes, &mut footer).await);
        }
        if let Some(f) = self.forwarder {
            let _ = f.await;
        }
        // Every record is in: what did not settle goes as it stands.
        if let Some(export) = self.export {
            let stats = export.close(&self.out.collector.timeline()).await;
            notes.push(format!(
                "OTLP: {} spans exported, {} dropped ({} failed exports)",
                stats.exported(),
                stats.dropped(),
                stats.failed_exports()
            ));
        }
        footer.pod_sources = self
            .out
            .collector
            .timeline()
            .pods
            .into_iter()
            .filter_map(|p| Some((p.uid, p.sources?)))
            .collect();
        footer.sources = Some(ended);
        footer.ended_ns = now_ktime_ns();
        let failures = close_trace(self.writer, footer).await;
        Finished {
            summary,
            notes,
            failures,
        }
    }
}

/// The OTLP export and its ticker.
struct Export {
    export: Arc<ObservedExport>,
    ticker: tokio::task::JoinHandle<()>,
}

impl Export {
    fn start(export: Arc<ObservedExport>, collector: Arc<Collector>) -> Export {
        let ticking = export.clone();
        let ticker = tokio::spawn(async move {
            let mut tick = tokio::time::interval(EXPORT_TICK);
            tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
            loop {
                tick.tick().await;
                ticking.tick(&collector, now_ktime_ns());
            }
        });
        Export { export, ticker }
    }

    async fn close(self, timeline: &crate::timeline::Timeline) -> ExportStats {
        self.ticker.abort();
        let _ = self.ticker.await;
        self.export.close(timeline, EXPORT_CLOSE).await
    }
}

/// The network look's task, stopped between two looks.
struct NetworkWatch {
    stop: tokio::sync::oneshot::Sender<()>,
    task: tokio::task::JoinHandle<NodeNetworkLook>,
}

impl NetworkWatch {
    async fn stop(self) -> Option<NodeNetworkLook> {
        let _ = self.stop.send(());
        self.task.await.ok()
    }
}

/// The probes as the observer runs them: every program attached all the time, the pods'
/// processes only (the node's own execs and exits are dropped in the kernel: an observer
/// times pods, and the agent's context around its own pod work means nothing here), and
/// no wakeup for any event.
fn observer_probes(mut config: ProbeConfig, cni_bin_dir: Option<String>) -> ProbeConfig {
    if let Some(dir) = cni_bin_dir {
        config.cni_bin_dir = dir;
    }
    config.node_processes = false;
    config.wake_for_pod_work = false;
    config.read_period = READ_PERIOD;
    config
}

/// The trace file, with `header` written, and where every record goes from here on.
fn open_trace(
    path: &Path,
    header: Header,
    rotation: Option<crate::trace::Rotation>,
    metrics: Option<Arc<Metrics>>,
) -> Result<(TraceWriter, Outputs), AgentError> {
    let header_copy = header.clone();
    let writer = TraceWriter::create_rotating(path, header, rotation).map_err(|source| {
        AgentError::TraceCreate {
            path: path.to_path_buf(),
            source,
        }
    })?;
    let collector = Arc::new(Collector::new());
    collector.push(&TraceRecord::Header(header_copy));
    let out = Outputs {
        sink: writer.sink(),
        collector,
        metrics,
    };
    Ok((writer, out))
}

/// The node's name: `--node-name`, else the host name, as kubelet names its node.
fn node_name(opts: &Options) -> String {
    opts.node_name.clone().unwrap_or_else(|| {
        nix::unistd::gethostname()
            .ok()
            .and_then(|h| h.into_string().ok())
            .unwrap_or_else(|| "localhost".into())
            .to_lowercase()
    })
}

/// The trace's header: the node, the runtime, and what the trace was observed from.
fn observed_header(
    runtime: &Connected,
    opts: &Options,
    node: &str,
    sources: &[String],
    anchor: ClockAnchor,
) -> Header {
    let node = node.to_string();
    let polling = runtime.stream.is_err();
    let poll_ms = opts.poll.as_millis() as u64;
    Header {
        schema_version: SCHEMA_VERSION,
        podlapse_version: env!("CARGO_PKG_VERSION").to_string(),
        node,
        kernel: nix::sys::utsname::uname()
            .map(|u| u.release().to_string_lossy().into_owned())
            .unwrap_or_default(),
        runtime_name: runtime.version.runtime_name.clone(),
        runtime_version: runtime.version.runtime_version.clone(),
        config: TraceConfig::Observe(ObservedConfig {
            cri_events: !polling,
            mode: ObserveMode::Observe,
            poll_ms,
        }),
        started_wall_ns: anchor.wall_ns,
        started_ns: anchor.mono_ns,
        observed: Some(ObservedHeader {
            sources: sources.to_vec(),
            poll_ms: polling.then_some(poll_ms),
        }),
        part: None,
    }
}

/// What the API answers from: the pods' statuses and the kept records (the node's
/// network among them, so `diagnose --live` reads what the trace will hold).
fn api_state(store: Arc<StatusStore>, collector: Arc<Collector>) -> api::ApiState {
    api::ApiState::new(store, collector)
}

/// What the observer missed on the runtime's side, for the footer.
fn observed_footer(
    summary: &ObserveSummary,
    streamed: bool,
    spans: &ReceiverStats,
) -> ObservedFooter {
    ObservedFooter {
        stream_missed: summary.stream_missed,
        stream_ended: summary.polling_because.clone().filter(|_| streamed),
        runtime_spans_received: spans.received(),
        runtime_spans_dropped: ["unknown_pod", "malformed"]
            .into_iter()
            .map(|r| (r.to_string(), spans.dropped(r)))
            .filter(|(_, n)| *n > 0)
            .collect(),
        runtime_errors: summary.runtime_errors.values().sum(),
    }
}
