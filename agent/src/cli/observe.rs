//! `podlapse observe`: record the pods another CRI client runs, with the probes, as a
//! trace in `run`'s format marked as observed. It calls no mutating CRI method and
//! touches no cgroup; its only outputs are the trace, what it prints, and its API
//! (`podlapse pods`, `timeline` and `diagnose --live` read it while it runs). The work is
//! `observe::session`'s; this parses the flags and prints.

use std::path::PathBuf;
use std::process::ExitCode;
use std::time::Duration;

use super::kernel_events::EbpfArgs;
use super::{CriArgs, agent_failed};
use crate::agent::ProbeRequest;
use crate::observe::EventsMode;
use crate::observe::session::{Options, connect};
use crate::syncloop::api;

#[derive(Debug, Clone, clap::Args)]
pub struct ObserveArgs {
    /// Where to write the trace (JSON Lines, docs/trace-format.md).
    #[arg(long, value_name = "FILE")]
    pub trace: PathBuf,
    #[command(flatten)]
    pub trace_rotation: super::trace_rotation::TraceRotationArgs,
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
    /// their timelines and diagnoses so far (`podlapse pods`, `podlapse timeline`,
    /// `podlapse diagnose --live`).
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
    /// Serve Prometheus metrics on http://ADDR/metrics (off by default): IP:PORT, or
    /// localhost:PORT. The stages and CNI plugin runs of the pods observed, the observed
    /// pod-start duration, the live diagnosis's pods by cause and the node's network,
    /// what the probes, the event stream and the trace lost, the runtime's spans. Bind
    /// 127.0.0.1 unless a scraper off the node must reach it.
    #[arg(long, value_name = "ADDR")]
    pub metrics_addr: Option<String>,
    /// Export over OTLP/gRPC to this collector (http://HOST:4317 or https://...): every
    /// span received on --runtime-otlp-listen (the kubelet's, the runtime's) forwarded
    /// once as it came, and each observed pod's startup (the kernel's stages and what
    /// the runtime showed) as spans under the kubelet's CRI call each happened in, or
    /// in a trace of the pod's own without the kubelet's spans. Without it, the standard
    /// OTEL_EXPORTER_OTLP_TRACES_ENDPOINT or OTEL_EXPORTER_OTLP_ENDPOINT turns the export
    /// on; headers, timeout and TLS follow the OTEL_EXPORTER_OTLP_* variables.
    #[arg(long, value_name = "URL")]
    pub otlp_endpoint: Option<String>,
    /// How long the API, the metrics and the export keep a pod after the runtime removed
    /// its last sandbox (the trace keeps it for good). The observer then forgets it, as
    /// kubelet forgets a terminated pod, so its memory does not grow with every pod the
    /// node ever ran; at most 512 removed pods are kept whatever this says.
    #[arg(long, default_value = "5m", value_parser = humantime::parse_duration, value_name = "DURATION")]
    pub deleted_pod_retention: Duration,
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
    let trace_rotation = match args.trace_rotation.rotation() {
        Ok(r) => r,
        Err(e) => {
            eprintln!("podlapse: {e}");
            return ExitCode::from(super::EXIT_BAD_INPUT);
        }
    };
    let runtime_otlp = match super::runtime_otlp_listen(args.runtime_otlp_listen.as_deref()) {
        Ok(l) => l,
        Err(code) => return code,
    };
    let otlp_endpoint = match crate::otel::endpoint(args.otlp_endpoint.as_deref()) {
        Ok(e) => e,
        Err(e) => {
            eprintln!("podlapse: {e}");
            return ExitCode::from(super::EXIT_BAD_INPUT);
        }
    };
    // Bound before anything starts: a port in use stops the observer with nothing begun.
    let metrics = match &args.metrics_addr {
        None => None,
        Some(addr) => match bind_metrics(addr).await {
            Ok(l) => Some(l),
            Err(e) => return agent_failed(&e.into()),
        },
    };
    let client = match args.cri.connect().await {
        Ok(c) => c,
        Err(e) => {
            eprintln!("podlapse: {e}");
            return ExitCode::FAILURE;
        }
    };
    let connected = match connect(client, args.cri_events).await {
        Ok(c) => c,
        Err(e) => return agent_failed(&e),
    };
    if let Some(why) = connected.polling_because() {
        eprintln!(
            "podlapse: polling the runtime every {} ms: {why}",
            args.poll_ms
        );
    }
    let opts = Options {
        trace: args.trace.clone(),
        trace_rotation,
        poll: Duration::from_millis(args.poll_ms),
        node_name: args.node_name.clone(),
        api_socket: (!args.no_api).then(|| args.api_socket.clone()),
        runtime_otlp,
        probes: (!args.no_ebpf).then(|| ProbeRequest {
            config: args.ebpf.probe_config(),
            require: args.ebpf.require_ebpf,
        }),
        cni_bin_dir: args.ebpf.cni_bin_dir.clone(),
        metrics,
        otlp_endpoint: otlp_endpoint.clone(),
        deleted_pod_retention: args.deleted_pod_retention,
    };
    let mut running = match connected.start(opts).await {
        Ok(r) => r,
        Err(e) => return agent_failed(&e),
    };
    for note in running.take_notes() {
        eprintln!("podlapse: {note}");
    }
    let api_note = if args.no_api {
        String::new()
    } else {
        format!(", API on {}", args.api_socket.display())
    };
    if let Some(addr) = running.metrics_addr() {
        eprintln!("podlapse: metrics on http://{addr}/metrics");
    }
    if let Some(endpoint) = &otlp_endpoint {
        eprintln!("podlapse: exporting over OTLP to {endpoint}");
    }
    let (name, version, sources) = running.describe();
    eprintln!(
        "podlapse: observing {name} {version} ({}) into {}{api_note}",
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
    let finished = running.observe(stop).await;
    for note in &finished.notes {
        eprintln!("podlapse: {note}");
    }
    for loss in &finished.failures {
        eprintln!("podlapse: {loss}");
    }
    let summary = &finished.summary;
    for (error, count) in &summary.runtime_errors {
        eprintln!("podlapse: the runtime failed {count} look(s): {error}");
    }
    eprintln!(
        "podlapse: observed {} pods ({} changes) into {}",
        summary.pods.len(),
        summary.records,
        args.trace.display()
    );
    if finished.failures.is_empty() {
        ExitCode::SUCCESS
    } else {
        ExitCode::FAILURE
    }
}

async fn bind_metrics(addr: &str) -> Result<tokio::net::TcpListener, crate::metrics::MetricsError> {
    crate::metrics::bind(crate::metrics::parse_addr(addr)?).await
}
