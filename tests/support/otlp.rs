//! An OTLP/gRPC trace receiver for the tests: the collector's `TraceService` as the
//! OpenTelemetry project's own generated server (opentelemetry-proto), on a runtime of
//! its own, keeping every span it is sent.

use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use opentelemetry_proto::tonic::collector::trace::v1::trace_service_server::{
    TraceService, TraceServiceServer,
};
use opentelemetry_proto::tonic::collector::trace::v1::{
    ExportTraceServiceRequest, ExportTraceServiceResponse,
};
use opentelemetry_proto::tonic::common::v1::any_value::Value;
use opentelemetry_proto::tonic::common::v1::{AnyValue, KeyValue};

/// One span as received, with its resource's service name.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord)]
pub struct ReceivedSpan {
    pub service: String,
    pub trace_id: String,
    pub span_id: String,
    pub parent_span_id: String,
    pub name: String,
    pub kind: i32,
    pub start_ns: u64,
    pub end_ns: u64,
    pub attributes: BTreeMap<String, String>,
    /// 0 unset, 1 ok, 2 error.
    pub status_code: i32,
    pub status_message: String,
    pub resource: BTreeMap<String, String>,
}

impl ReceivedSpan {
    pub fn attr(&self, key: &str) -> Option<&str> {
        self.attributes.get(key).map(String::as_str)
    }
}

type Spans = Arc<Mutex<Vec<ReceivedSpan>>>;

struct Collect(Spans);

fn text(v: &Option<AnyValue>) -> String {
    match v.as_ref().and_then(|v| v.value.as_ref()) {
        Some(Value::StringValue(s)) => s.clone(),
        Some(Value::IntValue(i)) => i.to_string(),
        Some(Value::BoolValue(b)) => b.to_string(),
        Some(Value::DoubleValue(d)) => d.to_string(),
        Some(other) => format!("{other:?}"),
        None => String::new(),
    }
}

fn map(kvs: &[KeyValue]) -> BTreeMap<String, String> {
    kvs.iter()
        .map(|kv| (kv.key.clone(), text(&kv.value)))
        .collect()
}

fn hex(b: &[u8]) -> String {
    b.iter().map(|b| format!("{b:02x}")).collect()
}

#[tonic::async_trait]
impl TraceService for Collect {
    async fn export(
        &self,
        request: tonic::Request<ExportTraceServiceRequest>,
    ) -> Result<tonic::Response<ExportTraceServiceResponse>, tonic::Status> {
        let mut got = Vec::new();
        for rs in request.into_inner().resource_spans {
            let resource = map(rs.resource.as_ref().map_or(&[][..], |r| &r.attributes));
            let service = resource.get("service.name").cloned().unwrap_or_default();
            for ss in rs.scope_spans {
                for s in ss.spans {
                    got.push(ReceivedSpan {
                        service: service.clone(),
                        trace_id: hex(&s.trace_id),
                        span_id: hex(&s.span_id),
                        parent_span_id: hex(&s.parent_span_id),
                        name: s.name,
                        kind: s.kind,
                        start_ns: s.start_time_unix_nano,
                        end_ns: s.end_time_unix_nano,
                        attributes: map(&s.attributes),
                        status_code: s.status.as_ref().map_or(0, |st| st.code),
                        status_message: s.status.map(|st| st.message).unwrap_or_default(),
                        resource: resource.clone(),
                    });
                }
            }
        }
        self.0.lock().unwrap().extend(got);
        Ok(tonic::Response::new(ExportTraceServiceResponse::default()))
    }
}

pub struct Receiver {
    pub addr: SocketAddr,
    spans: Spans,
    stop: Option<tokio::sync::oneshot::Sender<()>>,
    thread: Option<std::thread::JoinHandle<()>>,
}

impl Receiver {
    /// Listens on `addr` (`127.0.0.1:0` for any free port).
    pub fn start(addr: &str) -> Receiver {
        let listener = std::net::TcpListener::bind(addr)
            .unwrap_or_else(|e| panic!("the test OTLP receiver cannot listen on {addr}: {e}"));
        listener.set_nonblocking(true).unwrap();
        let addr = listener.local_addr().unwrap();
        let spans: Spans = Arc::default();
        let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
        let collect = Collect(spans.clone());
        let thread = std::thread::spawn(move || {
            let rt = tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build()
                .unwrap();
            rt.block_on(async move {
                let listener = tokio::net::TcpListener::from_std(listener).unwrap();
                let incoming = tokio_stream::wrappers::TcpListenerStream::new(listener);
                tonic::transport::Server::builder()
                    .add_service(TraceServiceServer::new(collect))
                    .serve_with_incoming_shutdown(incoming, async {
                        let _ = stopped.await;
                    })
                    .await
                    .unwrap();
            });
        });
        Receiver {
            addr,
            spans,
            stop: Some(stop),
            thread: Some(thread),
        }
    }

    pub fn endpoint(&self) -> String {
        format!("http://{}", self.addr)
    }

    pub fn spans(&self) -> Vec<ReceivedSpan> {
        self.spans.lock().unwrap().clone()
    }

    /// Polls (every 100 ms: spans arrive on the sender's schedule) until `done` holds.
    pub fn wait_for(
        &self,
        what: &str,
        timeout: Duration,
        done: impl Fn(&[ReceivedSpan]) -> bool,
    ) -> Vec<ReceivedSpan> {
        super::eventually(what, timeout, Duration::from_millis(100), || {
            let spans = self.spans();
            if done(&spans) {
                return Ok(spans);
            }
            let seen: Vec<_> = spans.iter().map(|s| (&s.service, &s.name)).collect();
            Err(format!("{} spans: {seen:?}", spans.len()))
        })
    }

    /// Stops listening; later exports to it fail.
    pub fn stop(&mut self) {
        if let Some(stop) = self.stop.take() {
            let _ = stop.send(());
        }
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

impl Drop for Receiver {
    fn drop(&mut self) {
        self.stop();
    }
}

/// On the modern node (containerd a systemd unit), restarts containerd now that a
/// receiver listens on the lab's OTLP address; elsewhere (the host lab's containerd is
/// the lab's own process, which other tests use at the same time) does nothing.
///
/// The modern node's containerd exporter's gRPC connection has been failing since boot
/// (nothing listened on the lab's OTLP address during the tests before), and gRPC waits
/// up to 120 s between reconnection attempts by then, longer than the exporter keeps a
/// batch: the test's spans would be dropped. A restarted containerd connects on its first
/// export.
/// Its containers and shims keep running; systemd's restart returns once it is ready
/// (`Type=notify`), and the CRI socket is checked besides.
pub fn reconnect_runtime_exporter() {
    let systemd_node = std::fs::read_to_string("/proc/1/comm").is_ok_and(|c| c.trim() == "systemd");
    if !systemd_node {
        return;
    }
    // The unit serving the node's socket: the compatibility suite runs containerd 1.7 as
    // a unit of its own, which `containerd.service` conflicts with.
    let unit = match std::env::var("PODLAPSE_NODE_RUNTIME").as_deref() {
        Ok("1.7") => "containerd-1.7",
        _ => "containerd",
    };
    let out = std::process::Command::new("systemctl")
        .args(["restart", unit])
        .output()
        .expect("systemctl");
    assert!(
        out.status.success(),
        "systemctl restart {unit}: {}",
        crate::stderr(&out)
    );
    // Ready for systemd is ready for CRI too; checked rather than assumed.
    crate::eventually(
        &format!("{unit} to answer CRI after its restart"),
        Duration::from_secs(30),
        Duration::from_millis(100),
        || {
            let out = crate::podlapse(&["cri", "info"]);
            if out.status.success() {
                Ok(())
            } else {
                Err(crate::stderr(&out))
            }
        },
    );
}
