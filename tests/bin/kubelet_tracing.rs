//! The spans a kubelet with tracing on exports, for `cri-pod-client --kubelet-spans URL`:
//! what `podlapse observe` receives from a real kubelet, made by the suite's own client.
//! Every name and attribute is the kubelet's:
//!
//! - `pkg/kubelet/kubelet.go`, `SyncPod`: a span `syncPod` per sync of the pod, from the
//!   tracer of scope `k8s.io/kubernetes/pkg/kubelet`, with `k8s.pod.uid`, `k8s.pod`
//!   (`namespace/name`), `k8s.pod.name`, `k8s.pod.update_type` (`create` on the first,
//!   `sync` after) and `k8s.namespace.name`; a sync that fails records the error as the
//!   span's status;
//! - `staging/src/k8s.io/cri-client/pkg/remote_runtime.go`: the CRI client's connection
//!   has otelgrpc's client stats handler, so each call is a client span under the sync,
//!   named `runtime.v1.RuntimeService/<Method>` (`runtime.v1.ImageService/<Method>`), with
//!   `rpc.system`, `rpc.service`, `rpc.method`, `rpc.grpc.status_code`, and the call's
//!   W3C `traceparent` naming that span, so the runtime's server span is its child;
//! - the resource's `service.name` is `kubelet` (component-base's tracing).
//!
//! The spans of a sync are exported when it ends (OTLP/gRPC, the official protos), as
//! the kubelet's batch processor sends them soon after.

use std::sync::{Arc, Mutex};
use std::time::{SystemTime, UNIX_EPOCH};

use anyhow::Context;
use opentelemetry_proto::tonic::collector::trace::v1::ExportTraceServiceRequest;
use opentelemetry_proto::tonic::collector::trace::v1::trace_service_client::TraceServiceClient;
use opentelemetry_proto::tonic::common::v1::{AnyValue, InstrumentationScope, KeyValue, any_value};
use opentelemetry_proto::tonic::resource::v1::Resource;
use opentelemetry_proto::tonic::trace::v1::span::SpanKind;
use opentelemetry_proto::tonic::trace::v1::status::StatusCode;
use opentelemetry_proto::tonic::trace::v1::{ResourceSpans, ScopeSpans, Span, Status};

const KUBELET_SCOPE: &str = "k8s.io/kubernetes/pkg/kubelet";
const OTELGRPC_SCOPE: &str =
    "go.opentelemetry.io/contrib/instrumentation/google.golang.org/grpc/otelgrpc";

pub fn now_ns() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_nanos() as u64)
}

fn random_bytes<const N: usize>() -> anyhow::Result<[u8; N]> {
    let uuid = std::fs::read_to_string("/proc/sys/kernel/random/uuid")
        .context("reading /proc/sys/kernel/random/uuid")?;
    let hex: String = uuid.trim().chars().filter(|c| *c != '-').collect();
    let mut out = [0u8; N];
    for (i, b) in out.iter_mut().enumerate() {
        *b = u8::from_str_radix(&hex[2 * i..2 * i + 2], 16)?;
    }
    Ok(out)
}

fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

fn text(key: &str, value: &str) -> KeyValue {
    KeyValue {
        key: key.into(),
        value: Some(AnyValue {
            value: Some(any_value::Value::StringValue(value.into())),
        }),
        ..Default::default()
    }
}

fn int(key: &str, value: i64) -> KeyValue {
    KeyValue {
        key: key.into(),
        value: Some(AnyValue {
            value: Some(any_value::Value::IntValue(value)),
        }),
        ..Default::default()
    }
}

/// A sync's span and its calls' spans so far.
type OpenSync = (Span, Vec<Span>);

/// Where the kubelet's spans go, and the pod they are about.
#[derive(Clone)]
pub struct KubeletTracer {
    endpoint: String,
    pod_uid: String,
    namespace: String,
    name: String,
    trace_id: [u8; 16],
    syncs: u32,
    /// The sync under way: its span and its calls' spans so far.
    open: Arc<Mutex<Option<OpenSync>>>,
}

impl KubeletTracer {
    /// One trace per pod, as the kubelet's syncs of a pod run under one root each.
    pub fn new(endpoint: &str, pod_uid: &str, namespace: &str, name: &str) -> anyhow::Result<Self> {
        Ok(KubeletTracer {
            endpoint: endpoint.to_string(),
            pod_uid: pod_uid.into(),
            namespace: namespace.into(),
            name: name.into(),
            trace_id: random_bytes()?,
            syncs: 0,
            open: Arc::new(Mutex::new(None)),
        })
    }

    /// A `syncPod` begins: `create` the first time, `sync` after.
    pub fn begin_sync(&mut self) -> anyhow::Result<()> {
        let update_type = if self.syncs == 0 { "create" } else { "sync" };
        self.syncs += 1;
        let span = Span {
            trace_id: self.trace_id.to_vec(),
            span_id: random_bytes::<8>()?.to_vec(),
            name: "syncPod".into(),
            kind: SpanKind::Internal as i32,
            start_time_unix_nano: now_ns(),
            attributes: vec![
                text("k8s.pod.uid", &self.pod_uid),
                text("k8s.pod", &format!("{}/{}", self.namespace, self.name)),
                text("k8s.pod.name", &self.name),
                text("k8s.pod.update_type", update_type),
                text("k8s.namespace.name", &self.namespace),
            ],
            ..Default::default()
        };
        *self.open.lock().unwrap() = Some((span, Vec::new()));
        Ok(())
    }

    /// A call's span under the sync under way: its ID and the `traceparent` the call
    /// carries. None outside a sync.
    pub fn call_context(&self) -> anyhow::Result<Option<([u8; 8], String)>> {
        if self.open.lock().unwrap().is_none() {
            return Ok(None);
        }
        let id = random_bytes::<8>()?;
        let tp = format!("00-{}-{}-01", hex(&self.trace_id), hex(&id));
        Ok(Some((id, tp)))
    }

    /// A call ended: its client span, as otelgrpc's handler makes it.
    pub fn called(
        &self,
        id: [u8; 8],
        service: &str,
        method: &str,
        start_ns: u64,
        code: tonic::Code,
        message: &str,
    ) {
        let mut open = self.open.lock().unwrap();
        let Some((sync, calls)) = open.as_mut() else {
            return;
        };
        let failed = code != tonic::Code::Ok;
        calls.push(Span {
            trace_id: self.trace_id.to_vec(),
            span_id: id.to_vec(),
            parent_span_id: sync.span_id.clone(),
            name: format!("{service}/{method}"),
            kind: SpanKind::Client as i32,
            start_time_unix_nano: start_ns,
            end_time_unix_nano: now_ns(),
            attributes: vec![
                text("rpc.system", "grpc"),
                text("rpc.service", service),
                text("rpc.method", method),
                int("rpc.grpc.status_code", code as i64),
            ],
            status: failed.then(|| Status {
                message: message.into(),
                code: StatusCode::Error as i32,
            }),
            ..Default::default()
        });
    }

    /// The sync ended (with the error it returned, if any): its spans are exported.
    pub async fn end_sync(&self, error: Option<&str>) -> anyhow::Result<()> {
        let Some((mut sync, calls)) = self.open.lock().unwrap().take() else {
            return Ok(());
        };
        sync.end_time_unix_nano = now_ns();
        if let Some(e) = error {
            sync.status = Some(Status {
                message: e.into(),
                code: StatusCode::Error as i32,
            });
        }
        let scope = |name: &str, spans: Vec<Span>| ScopeSpans {
            scope: Some(InstrumentationScope {
                name: name.into(),
                ..Default::default()
            }),
            spans,
            ..Default::default()
        };
        let request = ExportTraceServiceRequest {
            resource_spans: vec![ResourceSpans {
                resource: Some(Resource {
                    attributes: vec![text("service.name", "kubelet")],
                    ..Default::default()
                }),
                scope_spans: vec![
                    scope(KUBELET_SCOPE, vec![sync]),
                    scope(OTELGRPC_SCOPE, calls),
                ],
                ..Default::default()
            }],
        };
        let mut client = TraceServiceClient::connect(self.endpoint.clone())
            .await
            .with_context(|| format!("the kubelet's spans: connecting to {}", self.endpoint))?;
        client
            .export(request)
            .await
            .with_context(|| format!("the kubelet's spans: exporting to {}", self.endpoint))?;
        Ok(())
    }
}
