//! From the span model to the OpenTelemetry SDK's span data, and the OTLP/gRPC exporter
//! (opentelemetry-otlp over tonic) that sends it.
//!
//! The endpoint is `--otlp-endpoint`, else `OTEL_EXPORTER_OTLP_TRACES_ENDPOINT`, else
//! `OTEL_EXPORTER_OTLP_ENDPOINT`; headers, timeout, compression and `..._INSECURE` come from
//! the standard `OTEL_EXPORTER_OTLP_*` variables as the exporter reads them, and an
//! `https` endpoint is verified against the web's roots or, when set,
//! `OTEL_EXPORTER_OTLP_CERTIFICATE` (`..._TRACES_CERTIFICATE`), a PEM file.

use std::time::{Duration, SystemTime, UNIX_EPOCH};

use opentelemetry::trace::{
    SpanContext, SpanId, SpanKind, Status, TraceFlags, TraceId, TraceState,
};
use opentelemetry::{InstrumentationScope, KeyValue};
use opentelemetry_otlp::{SpanExporter, WithExportConfig, WithTonicConfig};
use opentelemetry_sdk::Resource;
use opentelemetry_sdk::trace::{SpanData, SpanEvents, SpanLinks};

use super::error::OtelError;
use super::spans::{Kind, PodSpan, Value};

/// Places CLOCK_MONOTONIC times in wall time: the two clocks read at one instant (a
/// trace header's `started_wall_ns` and `started_ns`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ClockAnchor {
    pub wall_ns: i64,
    pub mono_ns: u64,
}

impl ClockAnchor {
    pub fn wall(&self, mono_ns: u64) -> SystemTime {
        let wall = i128::from(self.wall_ns) + i128::from(mono_ns) - i128::from(self.mono_ns);
        let wall = u64::try_from(wall.max(0)).unwrap_or(u64::MAX);
        UNIX_EPOCH + Duration::from_nanos(wall)
    }
}

/// The exported form of one span.
pub fn span_data(s: &PodSpan, anchor: ClockAnchor) -> SpanData {
    let context = SpanContext::new(
        TraceId::from_bytes(s.trace_id),
        SpanId::from_bytes(s.span_id),
        TraceFlags::SAMPLED,
        false,
        TraceState::NONE,
    );
    SpanData {
        span_context: context,
        parent_span_id: s.parent.map_or(SpanId::INVALID, SpanId::from_bytes),
        parent_span_is_remote: false,
        span_kind: match s.kind {
            Kind::Internal => SpanKind::Internal,
            Kind::Client => SpanKind::Client,
        },
        name: s.name.clone().into(),
        start_time: anchor.wall(s.start_ns),
        end_time: anchor.wall(s.end_ns),
        attributes: s
            .attributes
            .iter()
            .map(|(k, v)| match v {
                Value::Str(v) => KeyValue::new(*k, v.clone()),
                Value::Int(v) => KeyValue::new(*k, *v),
            })
            .collect(),
        dropped_attributes_count: 0,
        events: SpanEvents::default(),
        links: SpanLinks::default(),
        status: match &s.error {
            Some(e) => Status::error(e.clone()),
            None => Status::Unset,
        },
        instrumentation_scope: scope(),
    }
}

fn scope() -> InstrumentationScope {
    InstrumentationScope::builder("podlapse")
        .with_version(env!("CARGO_PKG_VERSION"))
        .build()
}

/// The resource every span carries: the service and the node.
pub fn resource(node: &str) -> Resource {
    Resource::builder_empty()
        .with_service_name("podlapse")
        .with_attributes([
            KeyValue::new("k8s.node.name", node.to_string()),
            KeyValue::new("service.version", env!("CARGO_PKG_VERSION")),
        ])
        .build()
}

/// Where spans go: `endpoint` if given, else the standard variables'. Checked here, so
/// a malformed endpoint is an error at start, not a silent loss later.
pub fn endpoint(flag: Option<&str>) -> Result<Option<String>, OtelError> {
    let from_env = || {
        [
            "OTEL_EXPORTER_OTLP_TRACES_ENDPOINT",
            "OTEL_EXPORTER_OTLP_ENDPOINT",
        ]
        .iter()
        .find_map(|v| std::env::var(v).ok().filter(|s| !s.is_empty()))
    };
    let Some(endpoint) = flag.map(str::to_string).or_else(from_env) else {
        return Ok(None);
    };
    let bad = |problem: &str| OtelError::Endpoint {
        endpoint: endpoint.clone(),
        problem: problem.to_string(),
    };
    let uri: hyper::Uri = endpoint
        .parse()
        .map_err(|e: hyper::http::uri::InvalidUri| bad(&format!("not a URL ({e})")))?;
    match uri.scheme_str() {
        Some("http" | "https") => {}
        Some(other) => return Err(bad(&format!("scheme {other:?} is not http or https"))),
        None => return Err(bad("no scheme: give http://HOST:PORT or https://HOST:PORT")),
    }
    if uri.host().is_none_or(str::is_empty) {
        return Err(bad("no host"));
    }
    Ok(Some(endpoint))
}

/// The OTLP/gRPC span exporter for `endpoint`, with the node's resource.
pub fn exporter(endpoint: &str, node: &str) -> Result<SpanExporter, OtelError> {
    let mut builder = SpanExporter::builder()
        .with_tonic()
        .with_endpoint(endpoint.to_string());
    if let Some(path) = [
        "OTEL_EXPORTER_OTLP_TRACES_CERTIFICATE",
        "OTEL_EXPORTER_OTLP_CERTIFICATE",
    ]
    .iter()
    .find_map(|v| std::env::var(v).ok().filter(|s| !s.is_empty()))
    {
        let pem = std::fs::read(&path).map_err(|e| OtelError::Certificate {
            path: path.clone(),
            problem: e.to_string(),
        })?;
        let tls = tonic::transport::ClientTlsConfig::new()
            .ca_certificate(tonic::transport::Certificate::from_pem(pem));
        builder = builder.with_tls_config(tls);
    }
    let mut exporter = builder.build().map_err(|source| OtelError::Build {
        endpoint: endpoint.to_string(),
        source,
    })?;
    use opentelemetry_sdk::trace::SpanExporter as _;
    exporter.set_resource(&resource(node));
    Ok(exporter)
}
