use std::time::Duration;

use tokio::net::TcpListener;
use tokio_stream::wrappers::TcpListenerStream;
use tonic_health::ServingStatus;
use tonic_health::server::HealthReporter;

use super::probe;
use crate::prober::ProbeResult;

const SECOND: Duration = Duration::from_secs(1);

/// A health server on a free loopback port: its port and the reporter that sets statuses.
async fn health_server() -> (u16, HealthReporter) {
    let (reporter, service) = tonic_health::server::health_reporter();
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let port = listener.local_addr().unwrap().port();
    tokio::spawn(
        tonic::transport::Server::builder()
            .add_service(service)
            .serve_with_incoming(TcpListenerStream::new(listener)),
    );
    (port, reporter)
}

#[tokio::test]
async fn serving_passes_and_not_serving_fails_with_kubelets_message() {
    let (port, reporter) = health_server().await;
    let ok = probe("127.0.0.1", port, "", SECOND).await;
    assert_eq!(
        (ok.result, ok.output.as_str()),
        (ProbeResult::Success, "service healthy")
    );

    reporter
        .set_service_status("db", ServingStatus::NotServing)
        .await;
    let bad = probe("127.0.0.1", port, "db", SECOND).await;
    assert_eq!(bad.result, ProbeResult::Failure);
    assert_eq!(
        bad.output,
        r#"service unhealthy (responded with "NOT_SERVING")"#
    );

    reporter
        .set_service_status("db", ServingStatus::Serving)
        .await;
    assert_eq!(
        probe("127.0.0.1", port, "db", SECOND).await.result,
        ProbeResult::Success
    );
}

#[tokio::test]
async fn an_unknown_service_is_the_servers_error() {
    let (port, _reporter) = health_server().await;
    let out = probe("127.0.0.1", port, "nope", SECOND).await;
    assert_eq!(out.result, ProbeResult::Failure);
    assert!(
        out.output
            .starts_with("error: health rpc probe failed: rpc error: code = NotFound desc = "),
        "{}",
        out.output
    );
}

#[tokio::test]
async fn a_server_without_the_health_service_is_named_so() {
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let port = listener.local_addr().unwrap().port();
    // A gRPC server with only the reflection-free router: every method is Unimplemented.
    let (_reporter, _unused) = tonic_health::server::health_reporter();
    tokio::spawn(
        tonic::transport::Server::builder()
            .add_routes(tonic::service::Routes::default())
            .serve_with_incoming(TcpListenerStream::new(listener)),
    );
    let out = probe("127.0.0.1", port, "", SECOND).await;
    assert_eq!(out.result, ProbeResult::Failure);
    assert!(
        out.output.starts_with(
            "error: this server does not implement the grpc health protocol (grpc.health.v1.Health)"
        ),
        "{}",
        out.output
    );
}

#[tokio::test]
async fn nothing_listening_times_out_as_kubelets_blocking_dial_does() {
    let port = {
        let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        l.local_addr().unwrap().port()
    };
    let out = probe("127.0.0.1", port, "", SECOND).await;
    assert_eq!(out.result, ProbeResult::Failure);
    assert_eq!(
        out.output,
        format!(
            "timeout: failed to connect service \"127.0.0.1:{port}\" within 1s: context deadline exceeded"
        )
    );
}
