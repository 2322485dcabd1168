//! A container's probe as the prober runs it: the API object with the API server's defaults
//! applied and its validation done, so the worker never sees a zero period or two handlers.

use k8s_openapi::api::core::v1::{HTTPGetAction, Probe, TCPSocketAction};

pub use podlapse_core::kubelet::probe_results::ProbeKind;

/// What a probe does each period. Exactly one handler, as the API server enforces.
#[derive(Debug, Clone, PartialEq)]
pub enum ProbeAction {
    Exec {
        command: Vec<String>,
    },
    HttpGet(HTTPGetAction),
    TcpSocket(TCPSocketAction),
    /// The gRPC health-checking protocol on the pod IP's `port`, for `service` ("" when
    /// the probe names none).
    Grpc {
        port: u16,
        service: String,
    },
}

/// A validated probe with kubelet's defaults filled in. Durations are whole seconds, as in
/// the API; the worker converts them to nanoseconds.
#[derive(Debug, Clone, PartialEq)]
pub struct ProbeSpec {
    pub action: ProbeAction,
    pub initial_delay_seconds: u32,
    pub timeout_seconds: u32,
    pub period_seconds: u32,
    pub success_threshold: u32,
    pub failure_threshold: u32,
    /// Overrides the pod's grace period when a failed liveness or startup probe kills the
    /// container.
    pub termination_grace_period_seconds: Option<i64>,
}

/// Defaults the API server applies to a probe (`SetDefaults_Probe`).
pub const DEFAULT_PERIOD_SECONDS: u32 = 10;
pub const DEFAULT_TIMEOUT_SECONDS: u32 = 1;
pub const DEFAULT_SUCCESS_THRESHOLD: u32 = 1;
pub const DEFAULT_FAILURE_THRESHOLD: u32 = 3;

/// Why a container's probe cannot be run. Each names the probe field at fault, the way API
/// validation would have rejected the pod.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ProbeError {
    /// The probe has no exec, httpGet, tcpSocket or grpc handler.
    #[error("{}: must specify a handler type", kind.field())]
    NoHandler { kind: ProbeKind },

    /// The probe has more than one handler.
    #[error("{}: may not specify more than 1 handler type (has {})", kind.field(), handlers.join(", "))]
    MultipleHandlers {
        kind: ProbeKind,
        handlers: Vec<&'static str>,
    },

    /// An exec handler without a command.
    #[error("{}.exec.command: Required value", kind.field())]
    EmptyCommand { kind: ProbeKind },

    /// A count or duration below zero.
    #[error("{}.{field}: Invalid value: {value}: must be greater than or equal to 0", kind.field())]
    Negative {
        kind: ProbeKind,
        field: &'static str,
        value: i64,
    },

    /// Liveness and startup probes report one success, so the threshold must be 1.
    #[error("{}.successThreshold: Invalid value: {value}: must be 1", kind.field())]
    SuccessThresholdNotOne { kind: ProbeKind, value: u32 },

    /// terminationGracePeriodSeconds on a readiness probe, which never kills a container.
    #[error("{}.terminationGracePeriodSeconds: Invalid value: {value}: must not be set for readinessProbes", kind.field())]
    GracePeriodOnReadiness { kind: ProbeKind, value: i64 },

    /// terminationGracePeriodSeconds that is not positive.
    #[error("{}.terminationGracePeriodSeconds: Invalid value: {value}: must be greater than 0", kind.field())]
    GracePeriodNotPositive { kind: ProbeKind, value: i64 },

    /// An httpGet scheme that is neither HTTP nor HTTPS.
    #[error("{}.httpGet.scheme: Unsupported value: {scheme:?}: supported values: \"HTTP\", \"HTTPS\"", kind.field())]
    BadScheme { kind: ProbeKind, scheme: String },

    /// A grpc port outside 1..=65535.
    #[error("{}.grpc.port: Invalid value: {port}: must be between 1 and 65535, inclusive", kind.field())]
    BadGrpcPort { kind: ProbeKind, port: i32 },

    /// The pod has no container of that name.
    #[error("no container {container:?} in the pod spec")]
    NoContainer { container: String },
}

impl ProbeSpec {
    /// Validates `probe` as the container's `kind` probe and applies the API defaults: a
    /// missing or zero field takes its default, as the API server would have stored it.
    pub fn from_probe(kind: ProbeKind, probe: &Probe) -> Result<ProbeSpec, ProbeError> {
        let action = action(kind, probe)?;
        let field = |name: &'static str, value: Option<i32>, default: u32| match value {
            None | Some(0) => Ok(default),
            Some(v) if v < 0 => Err(ProbeError::Negative {
                kind,
                field: name,
                value: v.into(),
            }),
            Some(v) => Ok(v.unsigned_abs()),
        };
        let spec = ProbeSpec {
            action,
            initial_delay_seconds: field("initialDelaySeconds", probe.initial_delay_seconds, 0)?,
            timeout_seconds: field(
                "timeoutSeconds",
                probe.timeout_seconds,
                DEFAULT_TIMEOUT_SECONDS,
            )?,
            period_seconds: field(
                "periodSeconds",
                probe.period_seconds,
                DEFAULT_PERIOD_SECONDS,
            )?,
            success_threshold: field(
                "successThreshold",
                probe.success_threshold,
                DEFAULT_SUCCESS_THRESHOLD,
            )?,
            failure_threshold: field(
                "failureThreshold",
                probe.failure_threshold,
                DEFAULT_FAILURE_THRESHOLD,
            )?,
            termination_grace_period_seconds: probe.termination_grace_period_seconds,
        };
        if kind != ProbeKind::Readiness && spec.success_threshold != 1 {
            return Err(ProbeError::SuccessThresholdNotOne {
                kind,
                value: spec.success_threshold,
            });
        }
        if let Some(value) = spec.termination_grace_period_seconds {
            if kind == ProbeKind::Readiness {
                return Err(ProbeError::GracePeriodOnReadiness { kind, value });
            }
            if value <= 0 {
                return Err(ProbeError::GracePeriodNotPositive { kind, value });
            }
        }
        Ok(spec)
    }
}

fn action(kind: ProbeKind, probe: &Probe) -> Result<ProbeAction, ProbeError> {
    let mut handlers = Vec::new();
    if probe.exec.is_some() {
        handlers.push("exec");
    }
    if probe.http_get.is_some() {
        handlers.push("httpGet");
    }
    if probe.tcp_socket.is_some() {
        handlers.push("tcpSocket");
    }
    if probe.grpc.is_some() {
        handlers.push("grpc");
    }
    match handlers.len() {
        0 => return Err(ProbeError::NoHandler { kind }),
        1 => {}
        _ => return Err(ProbeError::MultipleHandlers { kind, handlers }),
    }
    if let Some(exec) = &probe.exec {
        let command = exec.command.clone().unwrap_or_default();
        if command.is_empty() {
            return Err(ProbeError::EmptyCommand { kind });
        }
        return Ok(ProbeAction::Exec { command });
    }
    if let Some(http) = &probe.http_get {
        match http.scheme.as_deref().unwrap_or("HTTP") {
            "HTTP" | "HTTPS" => {}
            other => {
                return Err(ProbeError::BadScheme {
                    kind,
                    scheme: other.to_string(),
                });
            }
        }
        return Ok(ProbeAction::HttpGet(http.clone()));
    }
    if let Some(tcp) = &probe.tcp_socket {
        return Ok(ProbeAction::TcpSocket(tcp.clone()));
    }
    let grpc = probe.grpc.as_ref().ok_or(ProbeError::NoHandler { kind })?;
    let port = u16::try_from(grpc.port)
        .ok()
        .filter(|p| *p > 0)
        .ok_or(ProbeError::BadGrpcPort {
            kind,
            port: grpc.port,
        })?;
    Ok(ProbeAction::Grpc {
        port,
        service: grpc.service.clone().unwrap_or_default(),
    })
}
