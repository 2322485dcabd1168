//! The receiver of the container runtime's own spans: an OTLP/gRPC trace service (the
//! OpenTelemetry project's generated server, `opentelemetry-proto`) on a loopback address
//! or a unix socket, off unless `podlapse run --runtime-otlp-listen ADDR` asks for it.
//!
//! containerd exports its spans to `OTEL_EXPORTER_OTLP_ENDPOINT`; pointed here, each span
//! whose trace is a pod's the agent runs (podlapse's trace IDs are derived from pod UIDs)
//! is kept as a `runtime_span` record: in the trace, in the timeline (the runtime's
//! stages inside each CRI call) and, when podlapse exports, forwarded with the pod's own
//! spans. Everything else is counted and dropped, and the agent runs on:
//!
//! - a connection from a peer that is not local (`non_local`), a request larger than
//!   [`MAX_REQUEST_BYTES`] (`oversized`) or that does not decode (`malformed`):
//!   `podlapse_runtime_otlp_requests_rejected_total{reason}`;
//! - a span with bad IDs or times (`malformed`) or in the trace of no pod the agent
//!   knows (`unknown_pod`): `podlapse_runtime_spans_dropped_total{reason}`, beside
//!   `podlapse_runtime_spans_received_total`.
//!
//! The exporter is always answered with success: what podlapse drops is its own choice,
//! and a rejection would only make the runtime log and retry.

use std::future::Future;
use std::net::SocketAddr;
use std::path::PathBuf;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};

use opentelemetry_proto::tonic::collector::trace::v1::trace_service_server::{
    TraceService, TraceServiceServer,
};
use opentelemetry_proto::tonic::collector::trace::v1::{
    ExportTraceServiceRequest, ExportTraceServiceResponse,
};
use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;

use super::error::OtelError;
use super::gate::TraceGate;
use super::runtime_span::{self, Malformed, RuntimeSpan};
use super::sdk::ClockAnchor;

/// The largest export request taken (containerd's batches are a few hundred KiB at most).
pub const MAX_REQUEST_BYTES: usize = 4 * 1024 * 1024;

/// Where the receiver listens.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Listen {
    /// A loopback address (`127.0.0.1:14317`, `[::1]:14317`).
    Tcp(SocketAddr),
    /// A unix socket, created with mode 0600.
    Unix(PathBuf),
}

impl std::fmt::Display for Listen {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Listen::Tcp(a) => write!(f, "{a}"),
            Listen::Unix(p) => write!(f, "unix:{}", p.display()),
        }
    }
}

/// Reads `--runtime-otlp-listen`: a loopback `IP:PORT` (`localhost:PORT` is
/// 127.0.0.1), or a unix socket as an absolute path or `unix:PATH`. Anything else is
/// refused: the receiver takes spans from this node's runtime only.
pub fn parse_listen(flag: &str) -> Result<Listen, OtelError> {
    let bad = |problem: &str| OtelError::Listen {
        addr: flag.to_string(),
        problem: problem.to_string(),
    };
    let path = flag
        .strip_prefix("unix://")
        .or_else(|| flag.strip_prefix("unix:"))
        .or_else(|| flag.starts_with('/').then_some(flag));
    if let Some(path) = path {
        if !path.starts_with('/') {
            return Err(bad("a unix socket needs an absolute path"));
        }
        return Ok(Listen::Unix(PathBuf::from(path)));
    }
    let addr: SocketAddr = match flag.strip_prefix("localhost:") {
        Some(port) => format!("127.0.0.1:{port}").parse(),
        None => flag.parse(),
    }
    .map_err(|_| bad("give 127.0.0.1:PORT, [::1]:PORT or a unix socket path (unix:/run/x.sock)"))?;
    if !addr.ip().is_loopback() {
        return Err(bad(
            "not a loopback address: the receiver takes spans from this node's runtime only \
             (127.0.0.1:PORT, [::1]:PORT or a unix socket path)",
        ));
    }
    Ok(Listen::Tcp(addr))
}

/// True for a peer on this host.
pub fn is_local(peer: &SocketAddr) -> bool {
    peer.ip().to_canonical().is_loopback()
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct Reason {
    reason: String,
}

/// What the receiver counts (clones share their values).
#[derive(Debug, Clone, Default)]
pub struct ReceiverStats {
    /// Spans in requests that decoded.
    pub received: Counter,
    /// Spans not kept, by reason (`unknown_pod`, `malformed`).
    pub dropped: Family<Reason, Counter>,
    /// Connections and requests refused before any span was read, by reason
    /// (`non_local`, `oversized`, `malformed`).
    pub rejected: Family<Reason, Counter>,
}

impl ReceiverStats {
    pub fn received(&self) -> u64 {
        self.received.get()
    }
    pub fn dropped(&self, reason: &str) -> u64 {
        self.dropped
            .get_or_create(&Reason {
                reason: reason.into(),
            })
            .get()
    }
    pub fn rejected(&self, reason: &str) -> u64 {
        self.rejected
            .get_or_create(&Reason {
                reason: reason.into(),
            })
            .get()
    }
    pub fn drop_span(&self, reason: &str) {
        self.dropped
            .get_or_create(&Reason {
                reason: reason.into(),
            })
            .inc();
    }
    fn reject(&self, reason: &str) {
        self.rejected
            .get_or_create(&Reason {
                reason: reason.into(),
            })
            .inc();
    }
}

/// Where kept spans go: one call per request that held any span, with the spans of it
/// kept (none, when every one was dropped: the call still says a batch came).
pub type Deliver = Arc<dyn Fn(Vec<RuntimeSpan>) + Send + Sync>;

/// Which pod each received span belongs to, and so which spans are kept: `run` ties a
/// span to a pod by its trace ID ([`TraceGate`]: podlapse derives its pods' trace IDs);
/// `observe` by what the runtime's spans say of the pod (`observe::runtime_spans`).
pub trait KeepSpans: Send + Sync + 'static {
    /// The spans of `request` to keep, read onto the trace's clock; the rest counted in
    /// `stats`. A keeper may hold spans back and hand them out with a later request's.
    fn keep(
        &self,
        request: &ExportTraceServiceRequest,
        anchor: ClockAnchor,
        stats: &ReceiverStats,
    ) -> Vec<RuntimeSpan>;
}

impl KeepSpans for TraceGate {
    fn keep(
        &self,
        request: &ExportTraceServiceRequest,
        anchor: ClockAnchor,
        stats: &ReceiverStats,
    ) -> Vec<RuntimeSpan> {
        take(request, self, anchor, stats)
    }
}

/// The spans of one request the agent keeps: those in a known pod's trace, read onto
/// the trace's clock. The rest are counted.
pub fn take(
    request: &ExportTraceServiceRequest,
    gate: &TraceGate,
    anchor: ClockAnchor,
    stats: &ReceiverStats,
) -> Vec<RuntimeSpan> {
    let mut out = Vec::new();
    each_span(request, stats, |span, scope, resource| {
        let pod = <[u8; 16]>::try_from(span.trace_id.as_slice())
            .ok()
            .and_then(|t| gate.pod_of_trace(&t));
        let Some(pod) = pod else {
            stats.drop_span(if span.trace_id.len() == 16 {
                "unknown_pod"
            } else {
                "malformed"
            });
            return;
        };
        match runtime_span::from_otlp(span, scope, resource, &pod, anchor) {
            Ok(s) => out.push(s),
            Err(Malformed::Ids | Malformed::Times) => stats.drop_span("malformed"),
        }
    });
    out
}

/// Calls `f` with every span of `request`, its scope and its resource's attributes,
/// counting each as received.
pub fn each_span(
    request: &ExportTraceServiceRequest,
    stats: &ReceiverStats,
    mut f: impl FnMut(
        &opentelemetry_proto::tonic::trace::v1::Span,
        Option<&opentelemetry_proto::tonic::common::v1::InstrumentationScope>,
        &runtime_span::Attributes,
    ),
) {
    for rs in &request.resource_spans {
        let resource =
            runtime_span::attributes(rs.resource.as_ref().map_or(&[][..], |r| &r.attributes));
        for ss in &rs.scope_spans {
            for span in &ss.spans {
                stats.received.inc();
                f(span, ss.scope.as_ref(), &resource);
            }
        }
    }
}

struct Intake {
    keeper: Arc<dyn KeepSpans>,
    anchor: ClockAnchor,
    stats: ReceiverStats,
    deliver: Deliver,
}

#[tonic::async_trait]
impl TraceService for Intake {
    async fn export(
        &self,
        request: tonic::Request<ExportTraceServiceRequest>,
    ) -> Result<tonic::Response<ExportTraceServiceResponse>, tonic::Status> {
        let held = request
            .get_ref()
            .resource_spans
            .iter()
            .flat_map(|rs| &rs.scope_spans)
            .any(|ss| !ss.spans.is_empty());
        let spans = self
            .keeper
            .keep(request.get_ref(), self.anchor, &self.stats);
        if held {
            (self.deliver)(spans);
        }
        Ok(tonic::Response::new(ExportTraceServiceResponse {
            partial_success: None,
        }))
    }
}

/// Counts the requests tonic refused before the service saw them: its answer then
/// carries the gRPC status in its headers (a trailers-only response). The service itself
/// always answers OK, in trailers.
#[derive(Clone)]
struct CountRejects<S> {
    inner: S,
    stats: ReceiverStats,
}

/// The reason a refused request is counted under, by its gRPC status code.
fn rejection(code: &str) -> Option<&'static str> {
    match code {
        "0" => None,
        // OUT_OF_RANGE: larger than the limit; RESOURCE_EXHAUSTED: larger once
        // decompressed.
        "11" | "8" => Some("oversized"),
        _ => Some("malformed"),
    }
}

impl<S, ReqBody, ResBody> tower::Service<hyper::http::Request<ReqBody>> for CountRejects<S>
where
    S: tower::Service<hyper::http::Request<ReqBody>, Response = hyper::http::Response<ResBody>>,
    S::Future: Send + 'static,
{
    type Response = S::Response;
    type Error = S::Error;
    type Future = Pin<Box<dyn Future<Output = Result<S::Response, S::Error>> + Send>>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        self.inner.poll_ready(cx)
    }

    fn call(&mut self, request: hyper::http::Request<ReqBody>) -> Self::Future {
        let stats = self.stats.clone();
        let answer = self.inner.call(request);
        Box::pin(async move {
            let response = answer.await?;
            if let Some(reason) = response
                .headers()
                .get("grpc-status")
                .and_then(|v| v.to_str().ok())
                .and_then(rejection)
            {
                stats.reject(reason);
            }
            Ok(response)
        })
    }
}

/// The running receiver.
pub struct RuntimeReceiver {
    listen: Listen,
    /// The bound address of a TCP receiver (the port, when 0 was asked for).
    local: Option<SocketAddr>,
    stop: Option<tokio::sync::oneshot::Sender<()>>,
    task: tokio::task::JoinHandle<()>,
}

impl RuntimeReceiver {
    /// Binds `listen` and serves until [`RuntimeReceiver::stop`]. The spans `keeper`
    /// keeps go to `deliver`.
    pub async fn start(
        listen: Listen,
        keeper: Arc<dyn KeepSpans>,
        anchor: ClockAnchor,
        stats: ReceiverStats,
        deliver: Deliver,
    ) -> Result<RuntimeReceiver, OtelError> {
        let failed = |e: std::io::Error| OtelError::Listen {
            addr: listen.to_string(),
            problem: e.to_string(),
        };
        let intake = Intake {
            keeper,
            anchor,
            stats: stats.clone(),
            deliver,
        };
        let service = TraceServiceServer::new(intake).max_decoding_message_size(MAX_REQUEST_BYTES);
        let counting = stats.clone();
        let server = tonic::transport::Server::builder()
            .layer(tower::layer::layer_fn(move |inner| CountRejects {
                inner,
                stats: counting.clone(),
            }))
            .add_service(service);
        let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
        let shutdown = async {
            let _ = stopped.await;
        };
        let (local, task) = match &listen {
            Listen::Tcp(addr) => {
                let listener = tokio::net::TcpListener::bind(addr).await.map_err(failed)?;
                let local = listener.local_addr().map_err(failed)?;
                let incoming = futures::stream::unfold(listener, move |l| {
                    let stats = stats.clone();
                    async move {
                        loop {
                            match l.accept().await {
                                Ok((s, peer)) if is_local(&peer) => return Some((Ok(s), l)),
                                Ok(_) => stats.reject("non_local"),
                                Err(e) => return Some((Err(e), l)),
                            }
                        }
                    }
                });
                let task = tokio::spawn(async move {
                    if let Err(e) = server
                        .serve_with_incoming_shutdown(incoming, shutdown)
                        .await
                    {
                        eprintln!("podlapse: the runtime's OTLP receiver stopped: {e}");
                    }
                });
                (Some(local), task)
            }
            Listen::Unix(path) => {
                if std::fs::symlink_metadata(path)
                    .is_ok_and(|m| std::os::unix::fs::FileTypeExt::is_socket(&m.file_type()))
                {
                    // A socket left by an earlier run: nothing listens on it any more
                    // if the bind below succeeds.
                    let _ = std::fs::remove_file(path);
                }
                let listener = tokio::net::UnixListener::bind(path).map_err(failed)?;
                std::fs::set_permissions(path, std::os::unix::fs::PermissionsExt::from_mode(0o600))
                    .map_err(failed)?;
                let incoming = futures::stream::unfold(listener, |l| async move {
                    Some((l.accept().await.map(|(s, _)| s), l))
                });
                let task = tokio::spawn(async move {
                    if let Err(e) = server
                        .serve_with_incoming_shutdown(incoming, shutdown)
                        .await
                    {
                        eprintln!("podlapse: the runtime's OTLP receiver stopped: {e}");
                    }
                });
                (None, task)
            }
        };
        Ok(RuntimeReceiver {
            listen,
            local,
            stop: Some(stop),
            task,
        })
    }

    pub fn local_addr(&self) -> Option<SocketAddr> {
        self.local
    }

    /// Where it listens, as asked (`127.0.0.1:0` stays so: see [`Self::local_addr`]).
    pub fn listen(&self) -> &Listen {
        &self.listen
    }

    /// The runtime's spans as a recording's `sources` record says them: received where
    /// this listens (the bound port, when 0 was asked for).
    pub fn span_source(receiver: Option<&RuntimeReceiver>) -> crate::trace::RuntimeSpanSource {
        match receiver {
            Some(r) => crate::trace::RuntimeSpanSource::Listening {
                listen: r
                    .local_addr()
                    .map_or_else(|| r.listen().to_string(), |a| a.to_string()),
            },
            None => crate::trace::RuntimeSpanSource::Off,
        }
    }

    /// Stops listening and waits for the server to end (for at most `deadline`); a
    /// unix socket is removed.
    pub async fn stop(mut self, deadline: std::time::Duration) {
        if let Some(stop) = self.stop.take() {
            let _ = stop.send(());
        }
        let abort = self.task.abort_handle();
        if tokio::time::timeout(deadline, &mut self.task)
            .await
            .is_err()
        {
            abort.abort();
        }
        if let Listen::Unix(path) = &self.listen {
            let _ = std::fs::remove_file(path);
        }
    }
}

#[cfg(test)]
#[path = "receiver_tests.rs"]
mod tests;
