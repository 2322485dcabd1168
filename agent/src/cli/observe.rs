//! `podtrace observe`: record the pods another CRI client runs, with the probes, as a
//! trace in `run`'s format marked as observed. It calls no mutating CRI method and
//! touches no cgroup; its only outputs are the trace, what it prints, and its API
//! (`podtrace pods`, `timeline` and `diagnose --live` read it while it runs).

use std::path::PathBuf;
use std::process::ExitCode;
use std::sync::Arc;
use std::time::Duration;

use super::CriArgs;
use super::kernel_events::EbpfArgs;
use crate::clock::wall_now;
use crate::ebpf::now_ktime_ns;
use crate::observe::ipam::{IpamStore, add_evidence};
use crate::observe::{
    EventsMode, ObserveConfig, ObservedPods, ObservedSpans, RuntimeView, Watcher, observe,
    use_stream,
};
use crate::otel::{ClockAnchor, ReceiverStats, RuntimeReceiver};
use crate::syncloop::StatusStore;
use crate::syncloop::api;
use crate::timeline::{Collector, KernelFilter};
use crate::trace::{
    Footer, Header, ObserveMode, ObservedConfig, ObservedFooter, ObservedHeader, SCHEMA_VERSION,
    TraceConfig, TraceRecord, TraceWriter,
};

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

#[derive(Debug, Clone, clap::Args)]
pub struct ObserveArgs {
    /// Where to write the trace (JSON Lines, docs/trace-format.md).
    #[arg(long, value_name = "FILE")]
    pub trace: PathBuf,
    /// Stop after this many seconds (default: until SIGINT or SIGTERM).
    #[arg(long, value_name = "SECONDS")]
    pub duration: Option<f64>,
    /// How to learn of the runtime's changes: its event stream (CRI GetContainerEvents),
    /// or lists every --poll-ms. `auto` streams on containerd 2.x only: containerd 1.x
    /// gives each event to one subscriber, so streaming there would take events from the
    /// kubelet.
    #[arg(long, value_enum, default_value_t = EventsMode::Auto)]
    pub cri_events: EventsMode,
    /// Between lists when polling, in milliseconds.
    #[arg(long, default_value_t = 200, value_name = "MS", value_parser = clap::value_parser!(u64).range(10..=60_000))]
    pub poll_ms: u64,
    /// The node's name in the trace. Default: the host name.
    #[arg(long, value_name = "NAME")]
    pub node_name: Option<String>,
    /// The socket to serve the observer's API on: the pods as the runtime shows them,
    /// their timelines and diagnoses so far (`podtrace pods`, `podtrace timeline`,
    /// `podtrace diagnose --live`).
    #[arg(long, default_value = api::DEFAULT_API_SOCKET, value_name = "PATH")]
    pub api_socket: PathBuf,
    /// Serve no API.
    #[arg(long, conflicts_with = "api_socket")]
    pub no_api: bool,
    /// Receive the container runtime's own spans over OTLP/gRPC here (off by default):
    /// 127.0.0.1:PORT, [::1]:PORT or a unix socket path. Point the runtime's
    /// OTEL_EXPORTER_OTLP_ENDPOINT at it. A span is a pod's when its trace names the pod
    /// (containerd's `sandbox.name`, `container.name`, or an ID the observer saw); its
    /// work becomes the pod's `runtime:*` stages.
    #[arg(long, value_name = "ADDR")]
    pub runtime_otlp_listen: Option<String>,
    /// Do not load the kernel probes: the runtime's view only.
    #[arg(long, conflicts_with = "require_ebpf")]
    pub no_ebpf: bool,
    #[command(flatten)]
    pub ebpf: EbpfArgs,
    #[command(flatten)]
    pub cri: CriArgs,
}

pub async fn run(args: ObserveArgs) -> ExitCode {
    let (mut sigint, mut sigterm) = match super::stop_signals() {
        Ok(s) => s,
        Err(code) => return code,
    };
    let runtime_otlp = match super::runtime_otlp_listen(args.runtime_otlp_listen.as_deref()) {
        Ok(l) => l,
        Err(code) => return code,
    };
    let runtime = match Runtime::connect(&args).await {
        Ok(r) => r,
        Err(code) => return code,
    };
    let started = if args.no_ebpf {
        None
    } else {
        let mut ebpf = args.ebpf.clone();
        if ebpf.cni_bin_dir.is_none() {
            ebpf.cni_bin_dir = runtime.cni_bin_dir();
        }
        match ebpf.start_with(observer_probes(&ebpf)) {
            Ok(s) => s,
            Err(code) => return code,
        }
    };
    let sources = sources(&runtime, started.is_some(), runtime_otlp.is_some());
    let anchor = ClockAnchor {
        wall_ns: wall_now(),
        mono_ns: now_ktime_ns(),
    };
    let header = observed_header(
        &args,
        &runtime.version,
        &sources,
        runtime.stream.is_err(),
        (anchor.wall_ns, anchor.mono_ns),
    );
    let (writer, out) = match open_trace(&args, header) {
        Ok(w) => w,
        Err(code) => return code,
    };
    let store = Arc::new(StatusStore::default());
    let server = match serve_api(&args, &store, &out, runtime.shape.as_ref()) {
        Ok(s) => s,
        Err(code) => return code,
    };
    let spans = Arc::new(ObservedSpans::new());
    let span_stats = ReceiverStats::default();
    let receiver = match runtime_otlp {
        Some(listen) => {
            match receive_runtime_spans(listen, &out, &spans, anchor, &span_stats).await {
                Ok(r) => Some(r),
                Err(code) => return code,
            }
        }
        None => None,
    };
    let (probes, forwarder) = match started {
        Some((probes, events)) => (Some(probes), Some(forward_kernel_events(events, &out))),
        None => (None, None),
    };
    let api_note = if args.no_api {
        String::new()
    } else {
        format!(", API on {}", args.api_socket.display())
    };
    eprintln!(
        "podtrace: observing {} {} ({}) into {}{api_note}",
        runtime.version.runtime_name,
        runtime.version.runtime_version,
        sources.join(", "),
        args.trace.display()
    );
    let deadline = args.duration.map(|s| Duration::from_secs_f64(s.max(0.0)));
    let stop = async move {
        let timer = async {
            match deadline {
                Some(d) => tokio::time::sleep(d).await,
                None => std::future::pending().await,
            }
        };
        tokio::select! {
            () = timer => {},
            _ = sigint.recv() => {},
            _ = sigterm.recv() => {},
        }
    };
    let mut watcher = Watcher::new(anchor.wall_ns, anchor.mono_ns);
    let config = ObserveConfig {
        poll: Duration::from_millis(args.poll_ms),
        relist: RELIST,
    };
    let observed = out.clone();
    let mut pods = ObservedPods::new(store, anchor.wall_ns, anchor.mono_ns);
    let learner = spans.clone();
    let summary = observe(
        &runtime.view,
        runtime.stream.is_ok(),
        config,
        &mut watcher,
        now_ktime_ns,
        move |r| {
            pods.apply(&r);
            learner.learn(&r);
            observed.send(TraceRecord::Observed(r));
        },
        stop,
    )
    .await;
    if let Some(server) = server {
        server.abort();
        let _ = server.await;
    }
    // The runtime's last batch may still be on its way (containerd sends every few
    // seconds); what comes after this is not taken.
    if let Some(r) = receiver {
        r.stop(RECEIVER_CLOSE).await;
        spans.drop_held(&span_stats);
        eprintln!(
            "podtrace: the runtime sent {} spans; {} were of no pod observed, {} malformed",
            span_stats.received(),
            span_stats.dropped("unknown_pod"),
            span_stats.dropped("malformed")
        );
    }
    let mut footer = Footer {
        ebpf: probes.is_some(),
        observed: Some(observed_footer(
            &summary,
            runtime.stream.is_ok(),
            &span_stats,
        )),
        ..Footer::default()
    };
    if let Some(probes) = probes
        && let Some(note) = crate::agent::recorder::stop_probes(probes, &mut footer).await
    {
        eprintln!("podtrace: {note}");
    }
    if let Some(f) = forwarder {
        let _ = f.await;
    }
    finish(&args, writer, footer, &summary).await
}

/// The runtime as the observer sees it, and how it learns of its changes.
struct Runtime {
    view: RuntimeView,
    version: crate::cri::api::VersionResponse,
    shape: Option<crate::cri::NodeShape>,
    /// The event stream, or why the runtime is polled instead.
    stream: Result<(), String>,
}

impl Runtime {
    /// Connects, asks the runtime what it is, and decides between its event stream and
    /// polling (said once when polling).
    async fn connect(args: &ObserveArgs) -> Result<Runtime, ExitCode> {
        let client = args.cri.connect().await.map_err(|e| {
            eprintln!("podtrace: {e}");
            ExitCode::FAILURE
        })?;
        let shape = crate::cri::NodeShape::detect(&client, None, false)
            .await
            .ok();
        let view = RuntimeView::new(client);
        let version = view.version().await.map_err(|e| {
            eprintln!("podtrace: {e}");
            ExitCode::FAILURE
        })?;
        let stream = use_stream(
            args.cri_events,
            &version.runtime_name,
            &version.runtime_version,
        );
        if let Err(why) = &stream {
            eprintln!(
                "podtrace: polling the runtime every {} ms: {why}",
                args.poll_ms
            );
        }
        Ok(Runtime {
            view,
            version,
            shape,
            stream,
        })
    }

    /// Where the runtime runs its CNI plugins, as it says.
    fn cni_bin_dir(&self) -> Option<String> {
        self.shape
            .as_ref()
            .and_then(|s| s.cni_bin_dirs.first().cloned())
    }
}

/// What the trace is observed from, for its header.
fn sources(runtime: &Runtime, kernel: bool, runtime_spans: bool) -> Vec<String> {
    let mut sources = Vec::new();
    if kernel {
        sources.push("kernel".to_string());
    }
    sources.push(
        match runtime.stream {
            Ok(()) => "cri:events",
            Err(_) => "cri:polling",
        }
        .to_string(),
    );
    if runtime_spans {
        sources.push("runtime_spans".to_string());
    }
    sources
}

/// The trace file, with `header` written, and where every record goes from here on.
fn open_trace(args: &ObserveArgs, header: Header) -> Result<(TraceWriter, Outputs), ExitCode> {
    let header_copy = header.clone();
    let writer = TraceWriter::create(&args.trace, header).map_err(|e| {
        eprintln!("podtrace: --trace {}: {e}", args.trace.display());
        ExitCode::from(super::EXIT_BAD_INPUT)
    })?;
    let collector = Arc::new(Collector::new());
    collector.push(&TraceRecord::Header(header_copy));
    let out = Outputs {
        sink: writer.sink(),
        collector,
    };
    Ok((writer, out))
}

/// The observer's API on `--api-socket`, unless `--no-api`.
fn serve_api(
    args: &ObserveArgs,
    store: &Arc<StatusStore>,
    out: &Outputs,
    shape: Option<&crate::cri::NodeShape>,
) -> Result<Option<tokio::task::JoinHandle<()>>, ExitCode> {
    if args.no_api {
        return Ok(None);
    }
    let state = api_state(store.clone(), out.collector.clone(), shape);
    match api::serve(&args.api_socket, state) {
        Ok(server) => Ok(Some(server)),
        Err(e) => {
            eprintln!("podtrace: {e} (--api-socket, or --no-api)");
            Err(ExitCode::from(super::EXIT_BAD_INPUT))
        }
    }
}

/// The receiver of the runtime's own spans: those of an observed pod go to the trace.
async fn receive_runtime_spans(
    listen: crate::otel::Listen,
    out: &Outputs,
    spans: &Arc<ObservedSpans>,
    anchor: ClockAnchor,
    stats: &ReceiverStats,
) -> Result<RuntimeReceiver, ExitCode> {
    let out = out.clone();
    let deliver = Arc::new(move |kept: Vec<crate::otel::RuntimeSpan>| {
        for s in kept {
            out.send(TraceRecord::RuntimeSpan(Box::new(s)));
        }
    });
    RuntimeReceiver::start(listen, spans.clone(), anchor, stats.clone(), deliver)
        .await
        .map_err(|e| {
            eprintln!("podtrace: {e}");
            ExitCode::from(super::EXIT_BAD_INPUT)
        })
}

/// Hands the probes' events to the trace, past the filter `run` uses, on the event
/// thread; ends when the probes stop.
fn forward_kernel_events(
    mut events: crate::ebpf::EventReceiver,
    out: &Outputs,
) -> tokio::task::JoinHandle<()> {
    let out = out.clone();
    crate::event_thread::spawn(async move {
        let mut filter = KernelFilter::new();
        let mut keep = Vec::new();
        while let Some(e) = events.recv().await {
            filter.offer(e, &mut keep);
            for e in keep.drain(..) {
                out.send(TraceRecord::Kernel(e));
            }
        }
    })
}

/// Writes the footer and says what was observed; a trace that lost records fails.
async fn finish(
    args: &ObserveArgs,
    writer: TraceWriter,
    mut footer: Footer,
    summary: &crate::observe::ObserveSummary,
) -> ExitCode {
    footer.ended_ns = now_ktime_ns();
    let stats = writer.stats();
    if let Err(e) = writer.finish(footer).await {
        eprintln!("podtrace: writing {}: {e}", args.trace.display());
        return ExitCode::FAILURE;
    }
    for (error, count) in &summary.runtime_errors {
        eprintln!("podtrace: the runtime failed {count} look(s): {error}");
    }
    eprintln!(
        "podtrace: observed {} pods ({} changes) into {}",
        summary.pods.len(),
        summary.records,
        args.trace.display()
    );
    if stats.dropped() > 0 || stats.unwritten() > 0 {
        eprintln!(
            "podtrace: trace {}: {} records dropped, {} unwritten ({})",
            args.trace.display(),
            stats.dropped(),
            stats.unwritten(),
            stats.failure().unwrap_or("the writer fell behind")
        );
        return ExitCode::FAILURE;
    }
    ExitCode::SUCCESS
}

/// The probes as the observer runs them: every program attached all the time, the pods'
/// processes only (the node's own execs and exits are dropped in the kernel: an observer
/// times pods, and the agent's context around its own pod work means nothing here), and
/// no wakeup for any event.
fn observer_probes(ebpf: &EbpfArgs) -> crate::ebpf::ProbeConfig {
    let mut config = ebpf.probe_config();
    config.node_processes = false;
    config.wake_for_pod_work = false;
    config.read_period = READ_PERIOD;
    config
}

/// The trace's header: the node, the runtime, and what the trace was observed from.
fn observed_header(
    args: &ObserveArgs,
    version: &crate::cri::api::VersionResponse,
    sources: &[String],
    polling: bool,
    (started_wall_ns, started_ns): (i64, u64),
) -> Header {
    let node = args.node_name.clone().unwrap_or_else(|| {
        nix::unistd::gethostname()
            .ok()
            .and_then(|h| h.into_string().ok())
            .unwrap_or_else(|| "localhost".into())
            .to_lowercase()
    });
    Header {
        schema_version: SCHEMA_VERSION,
        podtrace_version: env!("CARGO_PKG_VERSION").to_string(),
        node,
        kernel: nix::sys::utsname::uname()
            .map(|u| u.release().to_string_lossy().into_owned())
            .unwrap_or_default(),
        runtime_name: version.runtime_name.clone(),
        runtime_version: version.runtime_version.clone(),
        config: TraceConfig::Observe(ObservedConfig {
            cri_events: !polling,
            mode: ObserveMode::Observe,
            poll_ms: args.poll_ms,
        }),
        started_wall_ns,
        started_ns,
        observed: Some(ObservedHeader {
            sources: sources.to_vec(),
            poll_ms: polling.then_some(args.poll_ms),
        }),
    }
}

/// What the API answers from, with the node's IPAM state read for each diagnosis asked
/// for: the store of the network the runtime's CNI configuration names.
fn api_state(
    store: Arc<StatusStore>,
    collector: Arc<Collector>,
    shape: Option<&crate::cri::NodeShape>,
) -> api::ApiState {
    let mut state = api::ApiState::new(store, collector.clone());
    let ipam = shape
        .and_then(|s| s.cni_conf_dir.as_deref())
        .and_then(|d| IpamStore::of_conf_dir(std::path::Path::new(d)));
    if let Some(ipam) = ipam {
        state.enrich = Some(Arc::new(move |d| {
            let Ok(held) = ipam.held() else {
                return;
            };
            let timeline = collector.timeline();
            let attempts = |uid: &str| {
                timeline
                    .pods
                    .iter()
                    .find(|p| p.uid == uid)
                    .map(|p| p.sandbox_ids.clone())
                    .unwrap_or_default()
            };
            add_evidence(d, &ipam, &held, &attempts);
        }));
    }
    state
}

/// What the observer missed on the runtime's side, for the footer.
fn observed_footer(
    summary: &crate::observe::ObserveSummary,
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

/// Where every record goes: the trace, and the collector the API answers from.
#[derive(Clone)]
struct Outputs {
    sink: crate::trace::TraceSink,
    collector: Arc<Collector>,
}

impl Outputs {
    fn send(&self, record: TraceRecord) {
        self.collector.push(&record);
        self.sink.send(record);
    }
}
