//! A span the container runtime exported to podlapse (containerd's own, under a CRI
//! call's span), as the trace keeps it: its IDs, name, kind, times on the trace's clock,
//! attributes, events, status, instrumentation scope and resource. Kept whole, so the
//! export can forward it to the collector as the runtime sent it, and the timeline can
//! make stages of it.

use std::time::UNIX_EPOCH;

use opentelemetry::trace::{
    SpanContext, SpanId, SpanKind, Status, TraceFlags, TraceId, TraceState,
};
use opentelemetry::{Array, InstrumentationScope, KeyValue, StringValue};
use opentelemetry_proto::tonic::common::v1::{AnyValue, KeyValue as ProtoKeyValue, any_value};
use opentelemetry_proto::tonic::trace::v1::Span as ProtoSpan;
use opentelemetry_sdk::Resource;
use opentelemetry_sdk::trace::{SpanData, SpanEvents, SpanLinks};

use super::sdk::ClockAnchor;
pub use podlapse_core::record::{Attributes, RuntimeSpan, RuntimeSpanEvent};

/// Why a received span cannot be kept.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Malformed {
    /// A trace ID of other than 16 bytes or all zero, a span ID of other than 8 bytes
    /// or all zero, a parent ID of other than 0 or 8 bytes.
    Ids,
    /// An end before its start.
    Times,
}

use podlapse_core::record::ids::hex;

/// Bytes from lower-case or upper-case hex, exactly `N` of them.
pub fn unhex<const N: usize>(s: &str) -> Option<[u8; N]> {
    if s.len() != 2 * N {
        return None;
    }
    let mut out = [0u8; N];
    for (i, byte) in out.iter_mut().enumerate() {
        *byte = u8::from_str_radix(s.get(2 * i..2 * i + 2)?, 16).ok()?;
    }
    Some(out)
}

fn json(v: &Option<AnyValue>) -> serde_json::Value {
    use serde_json::Value as J;
    let Some(v) = v.as_ref().and_then(|v| v.value.as_ref()) else {
        return J::Null;
    };
    match v {
        any_value::Value::StringValue(s) => J::String(s.clone()),
        any_value::Value::BoolValue(b) => J::Bool(*b),
        any_value::Value::IntValue(i) => J::from(*i),
        any_value::Value::DoubleValue(d) => serde_json::Number::from_f64(*d)
            .map(J::Number)
            .unwrap_or_else(|| J::String(d.to_string())),
        any_value::Value::ArrayValue(a) => {
            J::Array(a.values.iter().map(|v| json(&Some(v.clone()))).collect())
        }
        any_value::Value::KvlistValue(kv) => J::Object(
            kv.values
                .iter()
                .map(|kv| (kv.key.clone(), json(&kv.value)))
                .collect(),
        ),
        any_value::Value::BytesValue(b) => J::String(hex(b)),
        // A reference into a dictionary this exporter does not send, or a kind newer
        // than this reader.
        _ => J::Null,
    }
}

/// OTLP attributes as [`Attributes`].
pub fn attributes(kvs: &[ProtoKeyValue]) -> Attributes {
    kvs.iter()
        .map(|kv| (kv.key.clone(), json(&kv.value)))
        .collect()
}

fn kind_name(kind: i32) -> &'static str {
    match kind {
        1 => "internal",
        2 => "server",
        3 => "client",
        4 => "producer",
        5 => "consumer",
        _ => "unspecified",
    }
}

/// CLOCK_MONOTONIC for a Unix time in ns, by `anchor`; 0 for a time before the clock's
/// start.
pub fn mono_of(anchor: ClockAnchor, unix_ns: u64) -> u64 {
    let mono = i128::from(unix_ns) - i128::from(anchor.wall_ns) + i128::from(anchor.mono_ns);
    u64::try_from(mono.max(0)).unwrap_or(u64::MAX)
}

/// A received span as the trace keeps it.
pub fn from_otlp(
    span: &ProtoSpan,
    scope: Option<&opentelemetry_proto::tonic::common::v1::InstrumentationScope>,
    resource: &Attributes,
    pod_uid: &str,
    anchor: ClockAnchor,
) -> Result<RuntimeSpan, Malformed> {
    let nonzero = |b: &[u8]| b.iter().any(|x| *x != 0);
    if span.trace_id.len() != 16
        || !nonzero(&span.trace_id)
        || span.span_id.len() != 8
        || !nonzero(&span.span_id)
        || !matches!(span.parent_span_id.len(), 0 | 8)
    {
        return Err(Malformed::Ids);
    }
    if span.end_time_unix_nano < span.start_time_unix_nano {
        return Err(Malformed::Times);
    }
    let parent = if nonzero(&span.parent_span_id) {
        hex(&span.parent_span_id)
    } else {
        String::new()
    };
    let (status, status_message) = match &span.status {
        Some(s) if s.code == 2 => ("error", s.message.clone()),
        Some(s) if s.code == 1 => ("ok", s.message.clone()),
        _ => ("unset", String::new()),
    };
    Ok(RuntimeSpan {
        pod_uid: pod_uid.to_string(),
        trace_id: hex(&span.trace_id),
        span_id: hex(&span.span_id),
        parent_span_id: parent,
        name: span.name.clone(),
        kind: kind_name(span.kind).into(),
        start_ns: mono_of(anchor, span.start_time_unix_nano),
        end_ns: mono_of(anchor, span.end_time_unix_nano),
        attributes: attributes(&span.attributes),
        events: span
            .events
            .iter()
            .map(|e| RuntimeSpanEvent {
                name: e.name.clone(),
                at_ns: mono_of(anchor, e.time_unix_nano),
                attributes: attributes(&e.attributes),
            })
            .collect(),
        status: status.into(),
        status_message,
        scope: scope.map(|s| s.name.clone()).unwrap_or_default(),
        scope_version: scope.map(|s| s.version.clone()).unwrap_or_default(),
        resource: resource.clone(),
    })
}

fn value(v: &serde_json::Value) -> opentelemetry::Value {
    use serde_json::Value as J;
    match v {
        J::String(s) => s.clone().into(),
        J::Bool(b) => (*b).into(),
        J::Number(n) => match n.as_i64() {
            Some(i) => i.into(),
            None => n.as_f64().unwrap_or_default().into(),
        },
        J::Array(items) => {
            if let Some(b) = items.iter().map(J::as_bool).collect::<Option<Vec<_>>>() {
                opentelemetry::Value::Array(Array::Bool(b))
            } else if let Some(i) = items.iter().map(J::as_i64).collect::<Option<Vec<_>>>() {
                opentelemetry::Value::Array(Array::I64(i))
            } else if let Some(f) = items.iter().map(J::as_f64).collect::<Option<Vec<_>>>() {
                opentelemetry::Value::Array(Array::F64(f))
            } else {
                opentelemetry::Value::Array(Array::String(
                    items
                        .iter()
                        .map(|i| match i {
                            J::String(s) => StringValue::from(s.clone()),
                            other => StringValue::from(other.to_string()),
                        })
                        .collect(),
                ))
            }
        }
        other => other.to_string().into(),
    }
}

fn key_values(attrs: &Attributes) -> Vec<KeyValue> {
    attrs
        .iter()
        .map(|(k, v)| KeyValue::new(k.clone(), value(v)))
        .collect()
}

/// The resource a span's batch is sent with: the runtime's own.
pub fn resource(span: &RuntimeSpan) -> Resource {
    Resource::builder_empty()
        .with_attributes(key_values(&span.resource))
        .build()
}

/// The span for the exporter, in wall time by `anchor` (the inverse of the anchor that
/// placed it on the trace's clock, so its times are the runtime's own). None for IDs that
/// do not read back.
pub fn span_data(span: &RuntimeSpan, anchor: ClockAnchor) -> Option<SpanData> {
    let trace_id = unhex::<16>(&span.trace_id)?;
    let span_id = unhex::<8>(&span.span_id)?;
    let parent = if span.parent_span_id.is_empty() {
        SpanId::INVALID
    } else {
        SpanId::from_bytes(unhex::<8>(&span.parent_span_id)?)
    };
    let wall = |ns: u64| {
        if ns == 0 { UNIX_EPOCH } else { anchor.wall(ns) }
    };
    let mut scope = InstrumentationScope::builder(span.scope.clone());
    if !span.scope_version.is_empty() {
        scope = scope.with_version(span.scope_version.clone());
    }
    let mut events = SpanEvents::default();
    events.events = span
        .events
        .iter()
        .map(|e| {
            opentelemetry::trace::Event::new(
                e.name.clone(),
                wall(e.at_ns),
                key_values(&e.attributes),
                0,
            )
        })
        .collect();
    Some(SpanData {
        span_context: SpanContext::new(
            TraceId::from_bytes(trace_id),
            SpanId::from_bytes(span_id),
            TraceFlags::SAMPLED,
            false,
            TraceState::NONE,
        ),
        parent_span_id: parent,
        parent_span_is_remote: false,
        span_kind: match span.kind.as_str() {
            "server" => SpanKind::Server,
            "client" => SpanKind::Client,
            "producer" => SpanKind::Producer,
            "consumer" => SpanKind::Consumer,
            _ => SpanKind::Internal,
        },
        name: span.name.clone().into(),
        start_time: wall(span.start_ns),
        end_time: wall(span.end_ns),
        attributes: key_values(&span.attributes),
        dropped_attributes_count: 0,
        events,
        links: SpanLinks::default(),
        status: match span.status.as_str() {
            "error" => Status::error(span.status_message.clone()),
            "ok" => Status::Ok,
            _ => Status::Unset,
        },
        instrumentation_scope: scope.build(),
    })
}

/// A batch of one resource's spans: the key that tells resources apart, the resource,
/// the spans.
pub type Batch = (String, Resource, Vec<SpanData>);

/// `spans` as batches for the exporter, one per distinct resource, in the order the
/// resources first appear.
pub fn batches<'a>(
    spans: impl IntoIterator<Item = &'a RuntimeSpan>,
    anchor: ClockAnchor,
) -> Vec<Batch> {
    let mut out: Vec<(&'a Attributes, Resource, Vec<SpanData>)> = Vec::new();
    for s in spans {
        let Some(data) = span_data(s, anchor) else {
            continue;
        };
        match out.iter_mut().find(|(r, _, _)| **r == s.resource) {
            Some((_, _, batch)) => batch.push(data),
            None => out.push((&s.resource, resource(s), vec![data])),
        }
    }
    out.into_iter()
        .map(|(attrs, r, b)| {
            let key = serde_json::to_string(attrs).unwrap_or_default();
            (key, r, b)
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use opentelemetry_proto::tonic::trace::v1::span::Event as ProtoEvent;
    use opentelemetry_proto::tonic::trace::v1::status::StatusCode;

    use super::*;

    pub(crate) fn proto_span(trace: [u8; 16], span: [u8; 8], parent: [u8; 8]) -> ProtoSpan {
        ProtoSpan {
            trace_id: trace.to_vec(),
            span_id: span.to_vec(),
            parent_span_id: parent.to_vec(),
            name: "container.NewTask".into(),
            kind: 1,
            start_time_unix_nano: 1_700_000_000_000_000_100,
            end_time_unix_nano: 1_700_000_000_000_000_900,
            attributes: vec![ProtoKeyValue {
                key: "task.process.id".into(),
                value: Some(AnyValue {
                    value: Some(any_value::Value::IntValue(42)),
                }),
                ..ProtoKeyValue::default()
            }],
            events: vec![ProtoEvent {
                time_unix_nano: 1_700_000_000_000_000_500,
                name: "setup pod network".into(),
                ..ProtoEvent::default()
            }],
            status: Some(opentelemetry_proto::tonic::trace::v1::Status {
                message: "boom".into(),
                code: StatusCode::Error as i32,
            }),
            ..ProtoSpan::default()
        }
    }

    const ANCHOR: ClockAnchor = ClockAnchor {
        wall_ns: 1_700_000_000_000_000_000,
        mono_ns: 5_000,
    };

    #[test]
    fn a_received_span_is_kept_on_the_traces_clock_and_forwarded_as_it_came() {
        let resource: Attributes = [(
            "service.name".to_string(),
            serde_json::Value::String("containerd".into()),
        )]
        .into();
        let p = proto_span([1; 16], [2; 8], [3; 8]);
        let s = from_otlp(&p, None, &resource, "uid", ANCHOR).unwrap();
        assert_eq!(s.start_ns, 5_100);
        assert_eq!(s.end_ns, 5_900);
        assert_eq!(s.events[0].at_ns, 5_500);
        assert_eq!(s.parent_span_id, "0303030303030303");
        assert_eq!(s.service(), "containerd");
        assert!(!s.ok());
        assert_eq!(s.attributes["task.process.id"], serde_json::json!(42));
        // Through the trace file and back.
        let line = serde_json::to_string(&s).unwrap();
        let again: RuntimeSpan = serde_json::from_str(&line).unwrap();
        assert_eq!(again, s);
        // Forwarded: the runtime's own times, IDs and parent.
        let d = span_data(&s, ANCHOR).unwrap();
        let unix = |t: std::time::SystemTime| t.duration_since(UNIX_EPOCH).unwrap().as_nanos();
        assert_eq!(unix(d.start_time), 1_700_000_000_000_000_100);
        assert_eq!(unix(d.end_time), 1_700_000_000_000_000_900);
        assert_eq!(d.parent_span_id, SpanId::from_bytes([3; 8]));
        assert_eq!(d.span_context.trace_id(), TraceId::from_bytes([1; 16]));
        assert_eq!(d.events.events[0].name, "setup pod network");
        assert_eq!(d.status, Status::error("boom"));
        let b = batches([&s, &s], ANCHOR);
        assert_eq!(b.len(), 1);
        assert_eq!(b[0].2.len(), 2);
    }

    #[test]
    fn spans_with_bad_ids_or_times_are_malformed() {
        let r = Attributes::new();
        let mut p = proto_span([1; 16], [2; 8], [3; 8]);
        p.trace_id = vec![1; 15];
        assert_eq!(from_otlp(&p, None, &r, "u", ANCHOR), Err(Malformed::Ids));
        let mut p = proto_span([1; 16], [0; 8], [3; 8]);
        assert_eq!(from_otlp(&p, None, &r, "u", ANCHOR), Err(Malformed::Ids));
        p.span_id = vec![2; 8];
        p.parent_span_id = vec![1; 3];
        assert_eq!(from_otlp(&p, None, &r, "u", ANCHOR), Err(Malformed::Ids));
        let mut p = proto_span([1; 16], [2; 8], [0; 8]);
        p.parent_span_id.clear();
        assert_eq!(
            from_otlp(&p, None, &r, "u", ANCHOR).unwrap().parent_span_id,
            ""
        );
        p.end_time_unix_nano = 1;
        assert_eq!(from_otlp(&p, None, &r, "u", ANCHOR), Err(Malformed::Times));
        assert_eq!(unhex::<2>("0aFf"), Some([0x0a, 0xff]));
        assert_eq!(unhex::<2>("0a"), None);
        assert_eq!(unhex::<1>("zz"), None);
    }
}
