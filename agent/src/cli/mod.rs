//! The `podlapse` command line.

mod bench_direct;
mod bench_seeing;
mod cri_info;
mod diagnose;
mod export;
pub mod kernel_events;
mod kubelet_args;
mod node;
mod observe;
mod outcome_lines;
mod output;
mod pod_printer;
mod pods;
mod progress;
mod replay;
mod report;
mod run;
pub mod sched;
mod timeline;
mod trace_file;
mod trace_or_agent;
mod trace_rotation;

use std::path::PathBuf;
use std::process::ExitCode;
use std::time::Duration;

use clap::{Parser, Subcommand};

use crate::cri::{CriClient, CriError, Endpoint, Timeouts};

/// Exit code for bad input: an unusable endpoint, unreadable manifests.
pub const EXIT_BAD_INPUT: u8 = 2;

/// SIGINT and SIGTERM, which end a command that runs until stopped; a one-line error
/// and the exit code when they cannot be handled.
fn stop_signals() -> Result<(tokio::signal::unix::Signal, tokio::signal::unix::Signal), ExitCode> {
    use tokio::signal::unix::{SignalKind, signal};
    match (
        signal(SignalKind::interrupt()),
        signal(SignalKind::terminate()),
    ) {
        (Ok(i), Ok(t)) => Ok((i, t)),
        (Err(e), _) | (_, Err(e)) => {
            eprintln!("podlapse: cannot handle signals: {e}");
            Err(ExitCode::FAILURE)
        }
    }
}

/// `--runtime-otlp-listen`, read; a one-line error and exit code 2 when it is not an
/// address the receiver may listen on.
fn runtime_otlp_listen(flag: Option<&str>) -> Result<Option<crate::otel::Listen>, ExitCode> {
    flag.map(crate::otel::parse_listen)
        .transpose()
        .map_err(|e| {
            eprintln!("podlapse: {e}");
            ExitCode::from(EXIT_BAD_INPUT)
        })
}

/// Says why the agent stopped (with the cause underneath, when the probes failed) and
/// gives the exit code for it.
fn agent_failed(e: &crate::agent::AgentError) -> ExitCode {
    eprintln!("podlapse: {e}");
    if let crate::agent::AgentError::Probes(p) = e
        && let Some(source) = std::error::Error::source(p)
    {
        eprintln!("podlapse: caused by: {source:#}");
    }
    if e.is_bad_input() {
        ExitCode::from(EXIT_BAD_INPUT)
    } else {
        ExitCode::FAILURE
    }
}

/// The error for a `--pod`/POD argument that names no pod: it lists the pods there are,
/// since a static pod runs under its node's name (`web` in a manifest is `web-<node>`).
fn no_such_pod(query: &str, place: &str, pods: impl IntoIterator<Item = String>) -> String {
    const SHOWN: usize = 10;
    let pods: Vec<String> = pods.into_iter().collect();
    let listed = match pods.len() {
        0 => format!("there is no pod {place}"),
        n if n <= SHOWN => format!("the pods are {}", pods.join(", ")),
        n => format!(
            "the pods include {} and {} more",
            pods[..SHOWN].join(", "),
            n - SHOWN
        ),
    };
    format!(
        "no pod {query:?} {place} ({listed}; a static pod is named <name>-<node name>); \
         name a pod as NAME, NAMESPACE/NAME or UID"
    )
}

#[derive(Debug, Parser)]
#[command(
    name = "podlapse",
    version,
    about = "kubelet's pod pipeline over CRI, timed stage by stage"
)]
pub struct Cli {
    #[command(subcommand)]
    pub command: Command,
}

impl Cli {
    /// The agent itself, which runs until stopped: its memory must stay flat.
    pub fn is_long_running(&self) -> bool {
        matches!(self.command, Command::Run(_) | Command::Observe(_))
    }

    /// Whether glibc malloc is tuned to hand memory back ([`crate::agent::malloc::tune`]). A replay is a
    /// batch job that builds and frees millions of small objects and then exits: what
    /// it holds meanwhile matters less than how fast it allocates, and the tuned
    /// thresholds (heap pages handed back and soon taken again) cost the 10,000-pod
    /// trace of benchmark 5 about a tenth of its wall time. Its process allocates with
    /// mimalloc rather than glibc malloc ([`crate::allocator`]).
    pub fn keeps_memory_low(&self) -> bool {
        !matches!(self.command, Command::Replay(_))
    }

    /// Commands that drive pods and time them: their threads ask for a short scheduler
    /// slice ([`sched`]), the benchmark's direct driver as much as the agent.
    pub fn wants_short_slice(&self) -> bool {
        matches!(self.command, Command::Run(_) | Command::BenchDirect(_))
    }

    /// How the agent's event thread is scheduled; the direct driver has none of its own
    /// work there and keeps the fair class.
    pub fn event_thread_policy(&self) -> sched::EventThreadPolicy {
        match &self.command {
            Command::Run(args) => args.event_thread_policy,
            _ => sched::EventThreadPolicy::Nice,
        }
    }
}

#[derive(Debug, Subcommand)]
pub enum Command {
    /// Talk to the container runtime directly.
    Cri {
        #[command(subcommand)]
        command: CriCommand,
    },
    /// Create the pods in the given manifests over CRI, as kubelet would.
    Run(Box<RunArgs>),
    /// Record the pods another CRI client (a kubelet) runs, changing nothing: the probes
    /// and the runtime's read-only view, into a trace the other commands read.
    Observe(Box<observe::ObserveArgs>),
    /// Replay recorded traces through the reconciler in virtual time and compare.
    Replay(replay::ReplayArgs),
    /// The running agent's pods, like `kubectl get pods`.
    Pods(pods::ApiArgs),
    /// The pod events the running agent recorded.
    Events(pods::EventsArgs),
    /// Load the eBPF probes and print the kernel events they report.
    KernelEvents(kernel_events::KernelEventsArgs),
    /// Each pod's startup stage by stage, from a trace file or the running agent.
    Timeline(timeline::TimelineArgs),
    /// Stage latency statistics and each pod's startup breakdown from traces.
    Report(report::ReportArgs),
    /// Why each pod has no IP or is not Running, with the evidence.
    Diagnose(diagnose::DiagnoseArgs),
    /// Send recorded traces' pod startups to an OpenTelemetry collector (OTLP/gRPC).
    Export(export::ExportArgs),
    /// The runtime's own limit for the benchmarks: the pipeline's CRI calls, nothing else.
    #[command(hide = true)]
    BenchDirect(bench_direct::BenchDirectArgs),
    /// Each container state change in a trace, from the kernel event to the status
    /// showing it: the benchmarks' measure of how fast the agent sees state.
    #[command(hide = true)]
    BenchSeeing(bench_seeing::BenchSeeingArgs),
}

#[derive(Debug, Subcommand)]
pub enum CriCommand {
    /// Runtime name and version, CRI API version, and the runtime's status conditions.
    Info {
        #[command(flatten)]
        cri: CriArgs,
    },
}

#[derive(Debug, Clone, clap::Args)]
pub struct CriArgs {
    /// CRI endpoint (unix:///path or /path). Default: $PODLAPSE_CRI, else the node lab's
    /// socket when the lab is up, else /run/containerd/containerd.sock.
    #[arg(long = "cri", value_name = "ENDPOINT")]
    pub endpoint: Option<String>,
    /// Deadline for each CRI call, in seconds.
    #[arg(long, default_value_t = 120, value_name = "SECONDS")]
    pub request_timeout: u64,
    /// Deadline for each image pull, in seconds.
    #[arg(long, default_value_t = 300, value_name = "SECONDS")]
    pub pull_timeout: u64,
}

impl CriArgs {
    pub async fn connect(&self) -> Result<CriClient, CriError> {
        let endpoint = Endpoint::from_env(self.endpoint.as_deref())?;
        let timeouts = Timeouts {
            request: Duration::from_secs(self.request_timeout),
            pull: Duration::from_secs(self.pull_timeout),
        };
        CriClient::connect(endpoint, timeouts).await
    }
}

#[derive(Debug, Clone, clap::Args)]
pub struct RunArgs {
    /// Pod manifests: YAML or JSON files, one pod each (the first document, as kubelet
    /// reads a static pod), or directories of them.
    #[arg(long, required = true, num_args = 1.., value_name = "PATH")]
    pub manifests: Vec<PathBuf>,
    /// Exit once every pod is Running (or has failed). Without it, podlapse runs as an
    /// agent: it watches the manifests and keeps their pods until SIGINT or SIGTERM.
    #[arg(long)]
    pub until_ready: bool,
    /// With --until-ready: stop and remove the pods before exiting.
    #[arg(long, requires = "until_ready")]
    pub cleanup: bool,
    /// With --until-ready: once every pod has settled, keep running this long before
    /// cleaning up, so restarts and back-offs play out (recording scenarios).
    #[arg(long, value_parser = humantime::parse_duration, value_name = "DURATION")]
    pub hold: Option<std::time::Duration>,
    /// With --until-ready: give up on a pod not Running after this many seconds.
    #[arg(long, default_value_t = 120, value_name = "SECONDS")]
    pub ready_timeout: u64,
    /// Without --until-ready: where to serve Prometheus metrics (`off` to not serve them).
    #[arg(long, default_value = crate::metrics::DEFAULT_METRICS_ADDR, value_name = "ADDR")]
    pub metrics_addr: String,
    /// Without --until-ready: the socket the agent serves its API on.
    #[arg(long, default_value = crate::syncloop::api::DEFAULT_API_SOCKET, value_name = "PATH")]
    pub api_socket: PathBuf,
    /// With --until-ready: print the result as JSON instead of a table.
    #[arg(long)]
    pub json: bool,
    #[command(flatten)]
    pub node: node::NodeArgs,
    #[command(flatten)]
    pub kubelet: kubelet_args::KubeletArgs,
    /// Record the run as a trace (JSON Lines, docs/trace-format.md).
    #[arg(long, value_name = "FILE")]
    pub trace: Option<PathBuf>,
    #[command(flatten)]
    pub trace_rotation: trace_rotation::TraceRotationArgs,
    /// Export each pod's startup as an OpenTelemetry trace over OTLP/gRPC to this
    /// collector (http://HOST:4317 or https://...). Without it, the standard
    /// OTEL_EXPORTER_OTLP_TRACES_ENDPOINT or OTEL_EXPORTER_OTLP_ENDPOINT turns the export
    /// on; headers, timeout and TLS follow the OTEL_EXPORTER_OTLP_* variables.
    #[arg(long, value_name = "URL")]
    pub otlp_endpoint: Option<String>,
    /// Receive the container runtime's own spans over OTLP/gRPC here (off by default):
    /// 127.0.0.1:PORT, [::1]:PORT or a unix socket path. Point the runtime's
    /// OTEL_EXPORTER_OTLP_ENDPOINT at it; its spans under each pod's CRI calls become the
    /// pod's `runtime:*` stages, go to the trace, and with --otlp-endpoint are forwarded
    /// with the pod's export.
    #[arg(long, value_name = "ADDR")]
    pub runtime_otlp_listen: Option<String>,
    /// With --runtime-otlp-listen: how long the run's end waits for the runtime's spans
    /// of the CRI calls it made (the runtime sends them in batches, every 5 s by
    /// default). The wait ends sooner once every call has its span, or once a batch
    /// sent after the last call shows the rest will not come; what did not come is said
    /// on each pod.
    #[arg(long, default_value = "8s", value_parser = humantime::parse_duration, value_name = "DURATION")]
    pub runtime_span_wait: std::time::Duration,
    /// Without --until-ready: how long `GET /timeline` and `podlapse timeline` keep showing
    /// a pod after its manifest is gone (the trace keeps it for good). The agent then
    /// forgets it, as kubelet forgets a terminated pod, so its memory does not grow with
    /// every pod it ever ran; at most 512 deleted pods are kept whatever this says.
    #[arg(long, default_value = "10s", value_parser = humantime::parse_duration, value_name = "DURATION")]
    pub deleted_pod_retention: std::time::Duration,
    /// Do not load the kernel probes at all.
    #[arg(long, conflicts_with = "require_ebpf")]
    pub no_ebpf: bool,
    #[command(flatten)]
    pub ebpf: kernel_events::EbpfArgs,
    #[command(flatten)]
    pub cri: CriArgs,
    /// How the thread that reads kernel events and waits on container exits is
    /// scheduled: `fifo` is SCHED_FIFO at priority 1, the lowest real-time priority (it
    /// runs for microseconds per event, and the kernel's real-time throttling bounds it
    /// regardless), falling back to `nice` where the kernel refuses it; `nice` is nice
    /// -10 with a short slice, which a burst of pod work can still hold off for a few
    /// milliseconds.
    #[arg(long, value_enum, default_value_t = sched::EventThreadPolicy::Fifo)]
    pub event_thread_policy: sched::EventThreadPolicy,
}

pub async fn main(cli: Cli) -> ExitCode {
    match cli.command {
        Command::Cri {
            command: CriCommand::Info { cri },
        } => cri_info::run(&cri).await,
        Command::Run(args) => run::run(*args).await,
        Command::Pods(args) => pods::pods(&args).await,
        Command::Replay(args) => replay::run(&args),
        Command::Observe(args) => observe::run(*args).await,
        Command::Events(args) => pods::events(&args).await,
        Command::KernelEvents(args) => kernel_events::run(args).await,
        Command::Timeline(args) => timeline::run(&args).await,
        Command::Report(args) => report::run(&args),
        Command::Diagnose(args) => diagnose::run(&args).await,
        Command::Export(args) => export::run(&args).await,
        Command::BenchDirect(args) => bench_direct::run(&args).await,
        Command::BenchSeeing(args) => bench_seeing::run(&args),
    }
}

#[cfg(test)]
mod tests {
    use super::no_such_pod;

    #[test]
    fn an_unknown_pod_is_answered_with_the_pods_there_are() {
        let pods = [
            "default/web-node-a".to_string(),
            "kube-system/dns-node-a".into(),
        ];
        assert_eq!(
            no_such_pod("web", "in the timeline", pods),
            "no pod \"web\" in the timeline (the pods are default/web-node-a, \
             kube-system/dns-node-a; a static pod is named <name>-<node name>); name a pod \
             as NAME, NAMESPACE/NAME or UID"
        );
        let many = (0..12).map(|i| format!("default/p{i}-n"));
        let text = no_such_pod("x", "to diagnose", many);
        assert!(text.contains("default/p9-n and 2 more"), "{text}");
        assert!(no_such_pod("x", "in the traces", []).contains("there is no pod in the traces"));
    }
}
