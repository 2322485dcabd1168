//! The receiver: what it listens on, what it keeps, what it counts and drops, over a
//! real gRPC connection.

use std::sync::{Arc, Mutex};
use std::time::Duration;

use bytes::{Buf, BufMut};
use opentelemetry_proto::tonic::collector::trace::v1::trace_service_client::TraceServiceClient;
use opentelemetry_proto::tonic::common::v1::{AnyValue, KeyValue, any_value};
use opentelemetry_proto::tonic::resource::v1::Resource;
use opentelemetry_proto::tonic::trace::v1::{ResourceSpans, ScopeSpans, Span};
use tonic::codec::{Codec, DecodeBuf, Decoder, EncodeBuf, Encoder};

use super::*;
use crate::otel::ids;
use crate::trace::{PodOp, PodOpRecord, TraceRecord};

#[test]
fn only_loopback_addresses_and_unix_sockets_are_listened_on() {
    for (flag, want) in [
        (
            "127.0.0.1:14317",
            Listen::Tcp("127.0.0.1:14317".parse().unwrap()),
        ),
        ("[::1]:4317", Listen::Tcp("[::1]:4317".parse().unwrap())),
        ("localhost:9", Listen::Tcp("127.0.0.1:9".parse().unwrap())),
        (
            "/run/podlapse/otlp.sock",
            Listen::Unix("/run/podlapse/otlp.sock".into()),
        ),
        ("unix:/run/x.sock", Listen::Unix("/run/x.sock".into())),
        ("unix:///run/x.sock", Listen::Unix("/run/x.sock".into())),
    ] {
        assert_eq!(parse_listen(flag).unwrap(), want, "{flag}");
    }
    for flag in [
        "0.0.0.0:14317",
        "10.0.0.1:14317",
        "[::]:14317",
        "collector:4317",
        "14317",
        "unix:relative.sock",
        "",
    ] {
        let e = parse_listen(flag).unwrap_err().to_string();
        assert!(e.starts_with("--runtime-otlp-listen "), "{e}");
        assert!(e.contains(&format!("{flag:?}")), "{e}");
        assert_eq!(e.lines().count(), 1, "{e}");
    }
}

#[test]
fn a_peer_is_local_only_on_loopback() {
    for peer in [
        "127.0.0.1:1",
        "127.5.0.1:1",
        "[::1]:1",
        "[::ffff:127.0.0.1]:1",
    ] {
        assert!(is_local(&peer.parse().unwrap()), "{peer}");
    }
    for peer in [
        "10.1.2.3:1",
        "[fe80::1]:1",
        "[::ffff:10.0.0.1]:1",
        "0.0.0.0:1",
    ] {
        assert!(!is_local(&peer.parse().unwrap()), "{peer}");
    }
    assert_eq!(rejection("0"), None);
    assert_eq!(rejection("11"), Some("oversized"));
    assert_eq!(rejection("8"), Some("oversized"));
    assert_eq!(rejection("13"), Some("malformed"));
}

const ANCHOR: ClockAnchor = ClockAnchor {
    wall_ns: 1_000_000_000_000,
    mono_ns: 0,
};

fn gate_knowing(uid: &str) -> Arc<TraceGate> {
    let gate = Arc::new(TraceGate::new());
    gate.enable();
    let pod = k8s_openapi::api::core::v1::Pod {
        metadata: k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta {
            uid: Some(uid.into()),
            ..Default::default()
        },
        ..Default::default()
    };
    gate.observe(&TraceRecord::Pod(PodOpRecord {
        at_ns: 1,
        op: PodOp::Add,
        pod: std::sync::Arc::new(pod),
    }));
    gate
}

fn span(trace: [u8; 16], id: u8, name: &str) -> Span {
    Span {
        trace_id: trace.to_vec(),
        span_id: vec![id; 8],
        parent_span_id: vec![9; 8],
        name: name.into(),
        kind: 2,
        start_time_unix_nano: 1_000_000_000_100,
        end_time_unix_nano: 1_000_000_000_200,
        ..Span::default()
    }
}

fn request(spans: Vec<Span>) -> ExportTraceServiceRequest {
    ExportTraceServiceRequest {
        resource_spans: vec![ResourceSpans {
            resource: Some(Resource {
                attributes: vec![KeyValue {
                    key: "service.name".into(),
                    value: Some(AnyValue {
                        value: Some(any_value::Value::StringValue("containerd".into())),
                    }),
                    ..KeyValue::default()
                }],
                ..Resource::default()
            }),
            scope_spans: vec![ScopeSpans {
                spans,
                ..ScopeSpans::default()
            }],
            ..ResourceSpans::default()
        }],
    }
}

#[test]
fn spans_of_known_pods_are_kept_and_the_rest_counted() {
    let gate = gate_knowing("uid-1");
    let stats = ReceiverStats::default();
    let mine = ids::trace_id("uid-1");
    let mut bad = span(mine, 3, "bad");
    bad.span_id = vec![1; 4];
    let mut short = span(mine, 4, "short");
    short.trace_id = vec![1; 3];
    let req = request(vec![
        span(mine, 1, "runtime.v1.RuntimeService/RunPodSandbox"),
        span(ids::trace_id("someone-else"), 2, "x"),
        bad,
        short,
    ]);
    let kept = take(&req, &gate, ANCHOR, &stats);
    assert_eq!(kept.len(), 1);
    assert_eq!(kept[0].pod_uid, "uid-1");
    assert_eq!(kept[0].name, "runtime.v1.RuntimeService/RunPodSandbox");
    assert_eq!(kept[0].service(), "containerd");
    assert_eq!((kept[0].start_ns, kept[0].end_ns), (100, 200));
    assert_eq!(stats.received(), 4);
    assert_eq!(stats.dropped("unknown_pod"), 1);
    assert_eq!(stats.dropped("malformed"), 2);
}

type Got = Arc<Mutex<Vec<RuntimeSpan>>>;

async fn receiver(listen: Listen) -> (RuntimeReceiver, ReceiverStats, Got) {
    let got: Got = Arc::default();
    let sink = got.clone();
    let stats = ReceiverStats::default();
    let r = RuntimeReceiver::start(
        listen,
        gate_knowing("uid-1"),
        ANCHOR,
        stats.clone(),
        Arc::new(move |spans| sink.lock().unwrap().extend(spans)),
    )
    .await
    .unwrap();
    (r, stats, got)
}

/// Sends bytes as they are: a request body no OTLP encoder would make.
#[derive(Default)]
struct Raw;

impl Codec for Raw {
    type Encode = Vec<u8>;
    type Decode = Vec<u8>;
    type Encoder = Raw;
    type Decoder = Raw;
    fn encoder(&mut self) -> Raw {
        Raw
    }
    fn decoder(&mut self) -> Raw {
        Raw
    }
}

impl Encoder for Raw {
    type Item = Vec<u8>;
    type Error = tonic::Status;
    fn encode(&mut self, item: Vec<u8>, dst: &mut EncodeBuf<'_>) -> Result<(), tonic::Status> {
        dst.put_slice(&item);
        Ok(())
    }
}

impl Decoder for Raw {
    type Item = Vec<u8>;
    type Error = tonic::Status;
    fn decode(&mut self, src: &mut DecodeBuf<'_>) -> Result<Option<Vec<u8>>, tonic::Status> {
        let n = src.remaining();
        Ok(Some(src.copy_to_bytes(n).to_vec()))
    }
}

#[tokio::test]
async fn the_receiver_keeps_a_known_pods_spans_and_counts_oversized_and_malformed_requests() {
    let (r, stats, got) = receiver(parse_listen("127.0.0.1:0").unwrap()).await;
    let addr = r.local_addr().unwrap();
    let channel = tonic::transport::Endpoint::from_shared(format!("http://{addr}"))
        .unwrap()
        .connect()
        .await
        .unwrap();
    let mut client = TraceServiceClient::new(channel.clone());
    let mine = ids::trace_id("uid-1");
    client
        .export(request(vec![
            span(mine, 1, "container.NewTask"),
            span(ids::trace_id("other"), 2, "x"),
        ]))
        .await
        .unwrap();
    assert_eq!(got.lock().unwrap().len(), 1);
    assert_eq!(stats.received(), 2);
    assert_eq!(stats.dropped("unknown_pod"), 1);
    // Larger than the limit: refused, counted, nothing read.
    let mut big = span(mine, 5, "big");
    big.name = "x".repeat(MAX_REQUEST_BYTES + 1);
    let status = client.export(request(vec![big])).await.unwrap_err();
    assert_eq!(status.code(), tonic::Code::OutOfRange, "{status}");
    assert_eq!(stats.rejected("oversized"), 1);
    // Bytes that are no request: refused, counted.
    let mut grpc = tonic::client::Grpc::new(channel.clone());
    grpc.ready().await.unwrap();
    let path = hyper::http::uri::PathAndQuery::from_static(
        "/opentelemetry.proto.collector.trace.v1.TraceService/Export",
    );
    let status = grpc
        .unary(tonic::Request::new(vec![0x0a, 0x05, 0x01]), path, Raw)
        .await
        .unwrap_err();
    assert_eq!(status.code(), tonic::Code::Internal, "{status}");
    assert_eq!(stats.rejected("malformed"), 1);
    // And it goes on taking spans.
    client
        .export(request(vec![span(mine, 6, "task.Start")]))
        .await
        .unwrap();
    assert_eq!(got.lock().unwrap().len(), 2);
    assert_eq!(stats.received(), 3);
    r.stop(Duration::from_secs(5)).await;
}

#[tokio::test]
async fn a_unix_socket_receiver_is_private_to_its_owner_and_removed_when_stopped() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("otlp.sock");
    let (r, stats, got) = receiver(Listen::Unix(path.clone())).await;
    let mode =
        std::os::unix::fs::PermissionsExt::mode(&std::fs::metadata(&path).unwrap().permissions());
    assert_eq!(mode & 0o777, 0o600);
    let at = path.clone();
    let channel = tonic::transport::Endpoint::from_static("http://localhost")
        .connect_with_connector(tower::service_fn(move |_| {
            let at = at.clone();
            async move {
                let s = tokio::net::UnixStream::connect(at).await?;
                Ok::<_, std::io::Error>(hyper_util::rt::TokioIo::new(s))
            }
        }))
        .await
        .unwrap();
    TraceServiceClient::new(channel)
        .export(request(vec![span(ids::trace_id("uid-1"), 1, "task.Start")]))
        .await
        .unwrap();
    assert_eq!(got.lock().unwrap().len(), 1);
    assert_eq!(stats.received(), 1);
    r.stop(Duration::from_secs(5)).await;
    assert!(!path.exists());
}
