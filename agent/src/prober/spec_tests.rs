//! Probe validation and defaults as the API server applies them.

use k8s_openapi::api::core::v1::{ExecAction, GRPCAction, HTTPGetAction, Probe, TCPSocketAction};
use k8s_openapi::apimachinery::pkg::util::intstr::IntOrString;

use super::spec::{ProbeAction, ProbeError, ProbeKind, ProbeSpec};

use ProbeKind::{Liveness, Readiness, Startup};

fn exec_probe() -> Probe {
    Probe {
        exec: Some(ExecAction {
            command: Some(vec!["cat".into(), "/tmp/healthy".into()]),
        }),
        ..Default::default()
    }
}

fn http_probe(scheme: Option<&str>) -> Probe {
    Probe {
        http_get: Some(HTTPGetAction {
            port: IntOrString::String("http".into()),
            scheme: scheme.map(str::to_string),
            ..Default::default()
        }),
        ..Default::default()
    }
}

#[test]
fn defaults_fill_missing_and_zero_fields() {
    for probe in [
        exec_probe(),
        Probe {
            initial_delay_seconds: Some(0),
            timeout_seconds: Some(0),
            period_seconds: Some(0),
            success_threshold: Some(0),
            failure_threshold: Some(0),
            ..exec_probe()
        },
    ] {
        let spec = ProbeSpec::from_probe(Liveness, &probe).unwrap();
        assert_eq!(
            spec,
            ProbeSpec {
                action: ProbeAction::Exec {
                    command: vec!["cat".into(), "/tmp/healthy".into()]
                },
                initial_delay_seconds: 0,
                timeout_seconds: 1,
                period_seconds: 10,
                success_threshold: 1,
                failure_threshold: 3,
                termination_grace_period_seconds: None,
            }
        );
    }
}

#[test]
fn given_values_are_kept() {
    let probe = Probe {
        initial_delay_seconds: Some(5),
        timeout_seconds: Some(2),
        period_seconds: Some(3),
        success_threshold: Some(4),
        failure_threshold: Some(6),
        ..exec_probe()
    };
    let spec = ProbeSpec::from_probe(Readiness, &probe).unwrap();
    assert_eq!(
        (
            spec.initial_delay_seconds,
            spec.timeout_seconds,
            spec.period_seconds,
            spec.success_threshold,
            spec.failure_threshold
        ),
        (5, 2, 3, 4, 6)
    );
    let tcp = Probe {
        tcp_socket: Some(TCPSocketAction {
            host: None,
            port: IntOrString::Int(80),
        }),
        ..Default::default()
    };
    assert!(matches!(
        ProbeSpec::from_probe(Startup, &tcp).unwrap().action,
        ProbeAction::TcpSocket(_)
    ));
    for scheme in ["HTTP", "HTTPS"] {
        assert!(matches!(
            ProbeSpec::from_probe(Readiness, &http_probe(Some(scheme)))
                .unwrap()
                .action,
            ProbeAction::HttpGet(_)
        ));
    }
    let grpc = |service: Option<&str>| Probe {
        grpc: Some(GRPCAction {
            port: 9000,
            service: service.map(Into::into),
            ..Default::default()
        }),
        ..Default::default()
    };
    for (service, want) in [(None, ""), (Some("db"), "db")] {
        assert_eq!(
            ProbeSpec::from_probe(Liveness, &grpc(service))
                .unwrap()
                .action,
            ProbeAction::Grpc {
                port: 9000,
                service: want.into()
            }
        );
    }
}

#[test]
fn invalid_probes_are_named() {
    let cases: Vec<(ProbeKind, Probe, ProbeError, &str)> = vec![
        (
            Liveness,
            Probe::default(),
            ProbeError::NoHandler { kind: Liveness },
            "livenessProbe: must specify a handler type",
        ),
        (
            Readiness,
            Probe {
                tcp_socket: Some(TCPSocketAction::default()),
                ..exec_probe()
            },
            ProbeError::MultipleHandlers {
                kind: Readiness,
                handlers: vec!["exec", "tcpSocket"],
            },
            "readinessProbe: may not specify more than 1 handler type (has exec, tcpSocket)",
        ),
        (
            Startup,
            Probe {
                exec: Some(ExecAction { command: None }),
                ..Default::default()
            },
            ProbeError::EmptyCommand { kind: Startup },
            "startupProbe.exec.command: Required value",
        ),
        (
            Readiness,
            Probe {
                period_seconds: Some(-1),
                ..exec_probe()
            },
            ProbeError::Negative {
                kind: Readiness,
                field: "periodSeconds",
                value: -1,
            },
            "readinessProbe.periodSeconds: Invalid value: -1: must be greater than or equal to 0",
        ),
        (
            Liveness,
            Probe {
                success_threshold: Some(2),
                ..exec_probe()
            },
            ProbeError::SuccessThresholdNotOne {
                kind: Liveness,
                value: 2,
            },
            "livenessProbe.successThreshold: Invalid value: 2: must be 1",
        ),
        (
            Startup,
            Probe {
                success_threshold: Some(3),
                ..exec_probe()
            },
            ProbeError::SuccessThresholdNotOne {
                kind: Startup,
                value: 3,
            },
            "startupProbe.successThreshold: Invalid value: 3: must be 1",
        ),
        (
            Readiness,
            Probe {
                termination_grace_period_seconds: Some(10),
                ..exec_probe()
            },
            ProbeError::GracePeriodOnReadiness {
                kind: Readiness,
                value: 10,
            },
            "readinessProbe.terminationGracePeriodSeconds: Invalid value: 10: must not be set for readinessProbes",
        ),
        (
            Liveness,
            Probe {
                termination_grace_period_seconds: Some(0),
                ..exec_probe()
            },
            ProbeError::GracePeriodNotPositive {
                kind: Liveness,
                value: 0,
            },
            "livenessProbe.terminationGracePeriodSeconds: Invalid value: 0: must be greater than 0",
        ),
        (
            Readiness,
            http_probe(Some("FTP")),
            ProbeError::BadScheme {
                kind: Readiness,
                scheme: "FTP".into(),
            },
            r#"readinessProbe.httpGet.scheme: Unsupported value: "FTP": supported values: "HTTP", "HTTPS""#,
        ),
        (
            Liveness,
            Probe {
                grpc: Some(GRPCAction {
                    port: 70000,
                    ..Default::default()
                }),
                ..Default::default()
            },
            ProbeError::BadGrpcPort {
                kind: Liveness,
                port: 70000,
            },
            "livenessProbe.grpc.port: Invalid value: 70000: must be between 1 and 65535, inclusive",
        ),
    ];
    for (kind, probe, want, text) in cases {
        let got = ProbeSpec::from_probe(kind, &probe).unwrap_err();
        assert_eq!(got, want, "{text}");
        assert_eq!(got.to_string(), text);
    }
    // The probe-level grace period is for the kill a failed liveness probe causes.
    let ok = Probe {
        termination_grace_period_seconds: Some(5),
        ..exec_probe()
    };
    assert!(ProbeSpec::from_probe(Liveness, &ok).is_ok());
}
