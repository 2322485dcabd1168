//! kubelet's gRPC prober (pkg/probe/grpc): the standard health-checking protocol
//! (`grpc.health.v1.Health/Check`) over plaintext HTTP/2 to the pod IP, with the probe's
//! `service`. The connection is retried until the probe's timeout, as grpc-go's blocking
//! dial does, and the messages are kubelet's, word for word, so the `Unhealthy` events read
//! the same as on a kubelet node.

use std::time::Duration;

use hyper_util::rt::TokioIo;
use tokio::time::Instant;
use tonic::Code;
use tonic::transport::{Channel, Endpoint, Uri};
use tonic_health::pb::HealthCheckRequest;
use tonic_health::pb::health_check_response::ServingStatus;
use tonic_health::pb::health_client::HealthClient;

use super::action::{ProbeOutcome, join_host_port};
use super::dialer;
use super::http::KUBE_VERSION;
use super::state::ProbeResult;

/// grpc-go's first reconnect delay; later ones grow by 1.6 (its default backoff).
const FIRST_RETRY: Duration = Duration::from_secs(1);
const RETRY_FACTOR: f64 = 1.6;

/// Runs one gRPC health check against `host:port` for `service` within `timeout`.
pub async fn probe(host: &str, port: u16, service: &str, timeout: Duration) -> ProbeOutcome {
    let addr = join_host_port(host, port);
    let deadline = Instant::now() + timeout;
    let channel = match tokio::time::timeout_at(deadline, connect(&addr)).await {
        Ok(Ok(channel)) => channel,
        Ok(Err(e)) => {
            return failure(format!("error: failed to connect service at {addr:?}: {e}"));
        }
        Err(_) => {
            return failure(format!(
                "timeout: failed to connect service {addr:?} within {}: context deadline exceeded",
                go_seconds(timeout)
            ));
        }
    };
    let mut client = HealthClient::new(channel);
    let request = HealthCheckRequest {
        service: service.to_string(),
    };
    let response = tokio::time::timeout_at(deadline, client.check(request)).await;
    match response {
        Err(_) => failure(format!(
            "timeout: health rpc did not complete within {}",
            go_seconds(timeout)
        )),
        Ok(Err(status)) => match status.code() {
            Code::Unimplemented => failure(format!(
                "error: this server does not implement the grpc health protocol (grpc.health.v1.Health): {}",
                status.message()
            )),
            Code::DeadlineExceeded => failure(format!(
                "timeout: health rpc did not complete within {}",
                go_seconds(timeout)
            )),
            code => failure(format!(
                "error: health rpc probe failed: rpc error: code = {} desc = {}",
                go_code(code),
                status.message()
            )),
        },
        Ok(Ok(resp)) => {
            let status = resp.into_inner().status();
            if status == ServingStatus::Serving {
                ProbeOutcome::new(ProbeResult::Success, "service healthy")
            } else {
                failure(format!(
                    "service unhealthy (responded with {:?})",
                    status.as_str_name()
                ))
            }
        }
    }
}

fn failure(output: String) -> ProbeOutcome {
    ProbeOutcome::new(ProbeResult::Failure, output)
}

/// Opens the HTTP/2 connection through the probe dialer, retrying a refused or failed
/// connection with grpc-go's backoff until the caller's deadline ends it.
async fn connect(addr: &str) -> Result<Channel, tonic::transport::Error> {
    let endpoint = Endpoint::from_shared(format!("http://{addr}"))?
        .user_agent(format!("kube-probe/{KUBE_VERSION}"))?;
    let mut delay = FIRST_RETRY;
    loop {
        let target = addr.to_string();
        let connector = tower::service_fn(move |_: Uri| {
            let target = target.clone();
            async move { dialer::dial(&target).await.map(TokioIo::new) }
        });
        match endpoint.connect_with_connector(connector).await {
            Ok(channel) => return Ok(channel),
            Err(e) => tracing::debug!(addr, error = %e, "gRPC probe connection failed; retrying"),
        }
        tokio::time::sleep(delay).await;
        delay = delay.mul_f64(RETRY_FACTOR);
    }
}

/// Go's `time.Duration` text for the whole seconds a probe timeout is.
fn go_seconds(d: Duration) -> String {
    format!("{}s", d.as_secs())
}

/// grpc-go's name of a status code (`codes.Code.String()`).
fn go_code(code: Code) -> &'static str {
    match code {
        Code::Ok => "OK",
        Code::Cancelled => "Canceled",
        Code::Unknown => "Unknown",
        Code::InvalidArgument => "InvalidArgument",
        Code::DeadlineExceeded => "DeadlineExceeded",
        Code::NotFound => "NotFound",
        Code::AlreadyExists => "AlreadyExists",
        Code::PermissionDenied => "PermissionDenied",
        Code::ResourceExhausted => "ResourceExhausted",
        Code::FailedPrecondition => "FailedPrecondition",
        Code::Aborted => "Aborted",
        Code::OutOfRange => "OutOfRange",
        Code::Unimplemented => "Unimplemented",
        Code::Internal => "Internal",
        Code::Unavailable => "Unavailable",
        Code::DataLoss => "DataLoss",
        Code::Unauthenticated => "Unauthenticated",
    }
}

#[cfg(test)]
#[path = "grpc_tests.rs"]
mod tests;
