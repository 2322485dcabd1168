//! Runs one probe action against a container: kubelet's `prober.runProbe` with the exec,
//! HTTP and TCP probers behind it. The exec and HTTP pieces also serve lifecycle hooks.

use std::time::Duration;

use k8s_openapi::api::core::v1::{Container, TCPSocketAction};
use k8s_openapi::apimachinery::pkg::util::intstr::IntOrString;

use super::gofmt;
use super::http;
use super::spec::{ProbeAction, ProbeSpec};
use super::state::ProbeResult;
use crate::cri::{CriError, RuntimeService};
use crate::kubelet::expansion::expand_env_refs;

/// How much of a probe's output is kept: kubelet reads at most 10 KiB of exec output and of
/// an HTTP body, so a chatty probe cannot grow memory.
pub const MAX_OUTPUT_BYTES: usize = 10 * 1024;

/// kubelet runs a probe up to this many times while the prober itself errs.
pub const MAX_PROBE_RETRIES: usize = 3;

/// One run of a probe action: the raw result and what the probe said (the text of
/// kubelet's `Unhealthy` event).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ProbeOutcome {
    pub result: ProbeResult,
    pub output: String,
}

impl ProbeOutcome {
    pub(crate) fn new(result: ProbeResult, output: impl Into<String>) -> ProbeOutcome {
        ProbeOutcome {
            result,
            output: output.into(),
        }
    }
}

/// Why a probe action could not be run at all; kubelet throws the result of such a run
/// away instead of counting it as a failure.
#[derive(Debug, thiserror::Error)]
pub enum ActionError {
    /// A named port that the container does not declare (and that is not a number).
    #[error("port {port:?} not found in container {container:?}")]
    PortNotFound { port: String, container: String },

    /// A port outside 1..=65535.
    #[error("invalid port number: {port}")]
    InvalidPort { port: i64 },

    /// No host in the action and no pod IP to default to.
    #[error("no host given and the pod has no IP")]
    NoHost,

    /// An httpGet scheme podlapse cannot speak.
    #[error("httpGet scheme {scheme:?} is not supported by podlapse")]
    UnsupportedScheme { scheme: String },

    /// An httpHeaders entry that is not a valid HTTP header.
    #[error("invalid HTTP header {name:?}: {reason}")]
    BadHeader { name: String, reason: String },

    /// The runtime failed to run the exec command (not the command failing).
    #[error("exec {} in container {container_id}: {source}", gofmt::list(command))]
    Exec {
        container_id: String,
        command: Vec<String>,
        #[source]
        source: CriError,
    },
}

/// Runs `spec`'s action once against the container.
pub async fn run_probe<R: RuntimeService>(
    cri: &R,
    spec: &ProbeSpec,
    container: &Container,
    container_id: &str,
    pod_ip: &str,
) -> Result<ProbeOutcome, ActionError> {
    let timeout = Duration::from_secs(spec.timeout_seconds.into());
    match &spec.action {
        ProbeAction::Exec { command } => {
            // Probes see only the container's literal env values: the downward API and
            // secrets are not reconstructed here, as in kubelet.
            let env: Vec<(String, String)> = container
                .env
                .iter()
                .flatten()
                .map(|e| (e.name.clone(), e.value.clone().unwrap_or_default()))
                .collect();
            let command = command.iter().map(|a| expand_env_refs(a, &env)).collect();
            probe_exec(cri, container_id, command, timeout).await
        }
        ProbeAction::HttpGet(action) => {
            let req = http::HttpRequest::new(action, container, pod_ip, http::PROBE_PURPOSE)?;
            Ok(http::probe(&req, timeout).await)
        }
        ProbeAction::TcpSocket(action) => probe_tcp(action, container, pod_ip, timeout).await,
        // kubelet probes gRPC on the pod IP only: the action has no host.
        ProbeAction::Grpc { port, service } => {
            let host = host_or_pod_ip(None, pod_ip)?;
            Ok(super::grpc::probe(host, *port, service, timeout).await)
        }
    }
}

/// [`run_probe`] retried while the prober itself errs, as kubelet's `runProbeWithRetries`.
pub async fn run_probe_with_retries<R: RuntimeService>(
    cri: &R,
    spec: &ProbeSpec,
    container: &Container,
    container_id: &str,
    pod_ip: &str,
) -> Result<ProbeOutcome, ActionError> {
    let mut last = run_probe(cri, spec, container, container_id, pod_ip).await;
    for _ in 1..MAX_PROBE_RETRIES {
        if last.is_ok() {
            break;
        }
        last = run_probe(cri, spec, container, container_id, pod_ip).await;
    }
    last
}

/// How a command run through ExecSync went, beyond its output.
#[derive(Debug, thiserror::Error)]
pub enum ExecError {
    /// The command ran and exited non-zero.
    #[error("command '{}' exited with {code}: {}", command.join(" "), String::from_utf8_lossy(stderr))]
    Exited {
        command: Vec<String>,
        code: i32,
        stderr: Vec<u8>,
    },

    /// The command did not finish within its timeout; the runtime killed it.
    #[error("command {} timed out", gofmt::quote(command.join(" ").as_bytes()))]
    TimedOut { command: Vec<String> },

    /// The runtime could not run the command.
    #[error("{source}")]
    Runtime {
        #[source]
        source: CriError,
    },
}

/// A command's combined output (stdout then stderr, at most [`MAX_OUTPUT_BYTES`]) and
/// whether it succeeded: kubelet's `RunInContainer`.
#[derive(Debug)]
pub struct ExecOutcome {
    pub output: Vec<u8>,
    pub error: Option<ExecError>,
}

/// Runs `command` in the container through CRI ExecSync with the runtime enforcing
/// `timeout` (rounded up to whole seconds, ExecSync's unit).
pub async fn exec_in_container<R: RuntimeService>(
    cri: &R,
    container_id: &str,
    command: Vec<String>,
    timeout: Duration,
) -> ExecOutcome {
    let seconds = timeout.as_secs() + u64::from(timeout.subsec_nanos() > 0);
    let seconds = i64::try_from(seconds.max(1)).unwrap_or(i64::MAX);
    match cri.exec_sync(container_id, command.clone(), seconds).await {
        Ok(resp) => {
            let mut output = resp.stdout;
            output.extend_from_slice(&resp.stderr);
            output.truncate(MAX_OUTPUT_BYTES);
            let error = (resp.exit_code != 0).then(|| {
                let mut stderr = resp.stderr;
                stderr.truncate(MAX_OUTPUT_BYTES);
                ExecError::Exited {
                    command,
                    code: resp.exit_code,
                    stderr,
                }
            });
            ExecOutcome { output, error }
        }
        Err(e) if is_deadline(&e) => ExecOutcome {
            output: Vec::new(),
            error: Some(ExecError::TimedOut { command }),
        },
        Err(source) => ExecOutcome {
            output: Vec::new(),
            error: Some(ExecError::Runtime { source }),
        },
    }
}

/// kubelet reads a gRPC DeadlineExceeded from ExecSync as the command timing out; podlapse's
/// own deadline on the call means the same.
fn is_deadline(e: &CriError) -> bool {
    matches!(e, CriError::Timeout { .. }) || e.code() == Some(tonic::Code::DeadlineExceeded)
}

/// An exec probe: exit 0 is Success, any other exit or a timeout is Failure.
pub async fn probe_exec<R: RuntimeService>(
    cri: &R,
    container_id: &str,
    command: Vec<String>,
    timeout: Duration,
) -> Result<ProbeOutcome, ActionError> {
    let run = exec_in_container(cri, container_id, command.clone(), timeout).await;
    let output = String::from_utf8_lossy(&run.output).into_owned();
    match run.error {
        None => Ok(ProbeOutcome::new(ProbeResult::Success, output)),
        Some(ExecError::Exited { .. }) => Ok(ProbeOutcome::new(ProbeResult::Failure, output)),
        // The output of a command that timed out is empty; the error says what happened.
        Some(e @ ExecError::TimedOut { .. }) => {
            Ok(ProbeOutcome::new(ProbeResult::Failure, e.to_string()))
        }
        Some(ExecError::Runtime { source }) => Err(ActionError::Exec {
            container_id: container_id.to_string(),
            command,
            source,
        }),
    }
}

/// A tcpSocket probe: Success when a connection opens within the timeout.
pub async fn probe_tcp(
    action: &TCPSocketAction,
    container: &Container,
    pod_ip: &str,
    timeout: Duration,
) -> Result<ProbeOutcome, ActionError> {
    let port = resolve_port(&action.port, container)?;
    let host = host_or_pod_ip(action.host.as_deref(), pod_ip)?;
    Ok(tcp_connect(host, port, timeout).await)
}

/// Opens and closes one TCP connection, with Go's dial messages on failure.
pub async fn tcp_connect(host: &str, port: u16, timeout: Duration) -> ProbeOutcome {
    let addr = join_host_port(host, port);
    match tokio::time::timeout(timeout, super::dialer::dial(&addr)).await {
        Err(_) => ProbeOutcome::new(
            ProbeResult::Failure,
            format!("dial tcp {addr}: i/o timeout"),
        ),
        Ok(Err(e)) => ProbeOutcome::new(ProbeResult::Failure, format!("dial tcp {addr}: {e}")),
        Ok(Ok(_stream)) => ProbeOutcome::new(ProbeResult::Success, ""),
    }
}

/// kubelet's `ResolveContainerPort`: a number, a named port of the container, or a name
/// that is really a number.
pub fn resolve_port(port: &IntOrString, container: &Container) -> Result<u16, ActionError> {
    let number: i64 = match port {
        IntOrString::Int(n) => (*n).into(),
        IntOrString::String(name) => {
            let named = container
                .ports
                .iter()
                .flatten()
                .find(|p| p.name.as_deref() == Some(name.as_str()));
            match (named, name.parse::<i64>()) {
                (Some(p), _) => p.container_port.into(),
                (None, Ok(n)) => n,
                (None, Err(_)) => {
                    return Err(ActionError::PortNotFound {
                        port: name.clone(),
                        container: container.name.clone(),
                    });
                }
            }
        }
    };
    match u16::try_from(number) {
        Ok(p) if p > 0 => Ok(p),
        _ => Err(ActionError::InvalidPort { port: number }),
    }
}

/// The action's host, or the pod IP when it names none.
pub fn host_or_pod_ip<'a>(host: Option<&'a str>, pod_ip: &'a str) -> Result<&'a str, ActionError> {
    match host.filter(|h| !h.is_empty()) {
        Some(h) => Ok(h),
        None if !pod_ip.is_empty() => Ok(pod_ip),
        None => Err(ActionError::NoHost),
    }
}

/// Go's `net.JoinHostPort`: IPv6 literals in brackets.
pub fn join_host_port(host: &str, port: u16) -> String {
    if host.contains(':') {
        format!("[{host}]:{port}")
    } else {
        format!("{host}:{port}")
    }
}

#[cfg(test)]
mod tests {
    use k8s_openapi::api::core::v1::ContainerPort;

    use super::*;

    fn container_with_ports() -> Container {
        Container {
            name: "web".into(),
            ports: Some(vec![
                ContainerPort {
                    name: Some("http".into()),
                    container_port: 8080,
                    ..Default::default()
                },
                ContainerPort {
                    name: Some("metrics".into()),
                    container_port: 9090,
                    ..Default::default()
                },
            ]),
            ..Default::default()
        }
    }

    #[test]
    fn ports_resolve_by_number_name_and_numeric_string() {
        let c = container_with_ports();
        let ok = |p: IntOrString| resolve_port(&p, &c).unwrap();
        assert_eq!(ok(IntOrString::Int(80)), 80);
        assert_eq!(ok(IntOrString::String("http".into())), 8080);
        assert_eq!(ok(IntOrString::String("metrics".into())), 9090);
        assert_eq!(ok(IntOrString::String("8081".into())), 8081);
        let err = |p: IntOrString| resolve_port(&p, &c).unwrap_err().to_string();
        assert_eq!(
            err(IntOrString::String("admin".into())),
            r#"port "admin" not found in container "web""#
        );
        assert_eq!(err(IntOrString::Int(0)), "invalid port number: 0");
        assert_eq!(err(IntOrString::Int(70000)), "invalid port number: 70000");
        assert_eq!(
            err(IntOrString::String("-1".into())),
            "invalid port number: -1"
        );
    }

    #[test]
    fn hosts_default_to_the_pod_ip() {
        assert_eq!(host_or_pod_ip(None, "10.0.0.5").unwrap(), "10.0.0.5");
        assert_eq!(host_or_pod_ip(Some(""), "10.0.0.5").unwrap(), "10.0.0.5");
        assert_eq!(host_or_pod_ip(Some("db"), "10.0.0.5").unwrap(), "db");
        assert!(matches!(host_or_pod_ip(None, ""), Err(ActionError::NoHost)));
        assert_eq!(join_host_port("fd00::1", 80), "[fd00::1]:80");
    }

    #[tokio::test]
    async fn tcp_probe_succeeds_on_an_open_port_and_fails_on_a_closed_one() {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let open = listener.local_addr().unwrap().port();
        // A port that was just free: bind, note it, close.
        let closed = {
            let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
            l.local_addr().unwrap().port()
        };
        let c = container_with_ports();
        let action = |port: u16| TCPSocketAction {
            host: None,
            port: IntOrString::Int(port.into()),
        };
        let t = Duration::from_secs(1);
        let ok = probe_tcp(&action(open), &c, "127.0.0.1", t).await.unwrap();
        assert_eq!(ok, ProbeOutcome::new(ProbeResult::Success, ""));
        let bad = probe_tcp(&action(closed), &c, "127.0.0.1", t)
            .await
            .unwrap();
        assert_eq!(bad.result, ProbeResult::Failure);
        assert!(
            bad.output
                .starts_with(&format!("dial tcp 127.0.0.1:{closed}: ")),
            "{}",
            bad.output
        );
        // A named port resolves through the container's ports.
        let named = TCPSocketAction {
            host: Some("127.0.0.1".into()),
            port: IntOrString::String("nope".into()),
        };
        assert!(matches!(
            probe_tcp(&named, &c, "", t).await,
            Err(ActionError::PortNotFound { .. })
        ));
        drop(listener);
    }
}
