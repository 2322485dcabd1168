//! Table tests for the probe worker in the shape of kubelet's worker_test.go: one base probe
//! per case, a list of steps at times relative to the container's start, and what the
//! worker publishes and schedules after each.

use k8s_openapi::api::core::v1::{ExecAction, Probe};

use super::spec::{ProbeKind, ProbeSpec};
use super::state::{ProbeResult, ProbeWorker, container_started, initial_result, probe_allowed};

use ProbeKind::{Liveness, Readiness, Startup};
use ProbeResult::{Failure, Success, Unknown};

/// An arbitrary non-zero start, so arithmetic that forgets it shows.
const START_NS: u64 = 5_000 * 1_000_000_000;

fn at(ms: u64) -> u64 {
    START_NS + ms * 1_000_000
}

#[derive(Debug, Clone, Copy)]
enum Step {
    Observe(u64, ProbeResult),
    Skip(u64),
    Expedite(u64),
}
use Step::{Expedite, Observe, Skip};

/// After one step: what `observe` returned, the published result, the next due time (ms
/// after start).
type After = (Option<ProbeResult>, ProbeResult, Option<u64>);

struct Case {
    name: &'static str,
    kind: ProbeKind,
    delay: i32,
    period: i32,
    success: i32,
    failure: i32,
    steps: Vec<Step>,
    want: Vec<After>,
}

fn spec(kind: ProbeKind, delay: i32, period: i32, success: i32, failure: i32) -> ProbeSpec {
    let probe = Probe {
        exec: Some(ExecAction {
            command: Some(vec!["true".into()]),
        }),
        initial_delay_seconds: Some(delay),
        period_seconds: Some(period),
        success_threshold: Some(success),
        failure_threshold: Some(failure),
        ..Default::default()
    };
    ProbeSpec::from_probe(kind, &probe).expect("valid probe")
}

fn case(name: &'static str, kind: ProbeKind, steps: Vec<Step>, want: Vec<After>) -> Case {
    Case {
        name,
        kind,
        delay: 0,
        period: 10,
        success: 1,
        failure: 3,
        steps,
        want,
    }
}

#[expect(clippy::too_many_lines, reason = "a table: one entry per case")]
fn cases() -> Vec<Case> {
    vec![
        case(
            "readiness: one success makes it ready",
            Readiness,
            vec![Observe(0, Success)],
            vec![(Some(Success), Success, Some(10_000))],
        ),
        Case {
            success: 3,
            ..case(
                "readiness: successThreshold 3 needs three in a row",
                Readiness,
                vec![
                    Observe(0, Success),
                    Observe(10_000, Success),
                    Observe(20_000, Success),
                    Observe(30_000, Success),
                ],
                vec![
                    (None, Failure, Some(10_000)),
                    (None, Failure, Some(20_000)),
                    (Some(Success), Success, Some(30_000)),
                    (None, Success, Some(40_000)),
                ],
            )
        },
        Case {
            success: 2,
            ..case(
                "readiness: a failure restarts the success run",
                Readiness,
                vec![
                    Observe(0, Success),
                    Observe(10_000, Failure),
                    Observe(20_000, Success),
                    Observe(30_000, Success),
                ],
                vec![
                    (None, Failure, Some(10_000)),
                    (None, Failure, Some(20_000)),
                    (None, Failure, Some(30_000)),
                    (Some(Success), Success, Some(40_000)),
                ],
            )
        },
        case(
            "readiness: three failures unready it, and it keeps probing",
            Readiness,
            vec![
                Observe(0, Success),
                Observe(10_000, Failure),
                Observe(20_000, Failure),
                Observe(30_000, Failure),
                Observe(40_000, Success),
            ],
            vec![
                (Some(Success), Success, Some(10_000)),
                (None, Success, Some(20_000)),
                (None, Success, Some(30_000)),
                (Some(Failure), Failure, Some(40_000)),
                (Some(Success), Success, Some(50_000)),
            ],
        ),
        case(
            "readiness: failures while already unready publish nothing",
            Readiness,
            vec![
                Observe(0, Failure),
                Observe(10_000, Failure),
                Observe(20_000, Failure),
            ],
            vec![
                (None, Failure, Some(10_000)),
                (None, Failure, Some(20_000)),
                (None, Failure, Some(30_000)),
            ],
        ),
        case(
            "liveness: a success in between resets the failure run",
            Liveness,
            vec![
                Observe(0, Failure),
                Observe(10_000, Failure),
                Observe(20_000, Success),
                Observe(30_000, Failure),
                Observe(40_000, Failure),
                Observe(50_000, Failure),
            ],
            vec![
                (None, Success, Some(10_000)),
                (None, Success, Some(20_000)),
                (None, Success, Some(30_000)),
                (None, Success, Some(40_000)),
                (None, Success, Some(50_000)),
                (Some(Failure), Failure, None),
            ],
        ),
        Case {
            failure: 1,
            ..case(
                "liveness: failure puts the worker on hold; later results are ignored",
                Liveness,
                vec![Observe(0, Failure), Observe(10_000, Success), Skip(20_000)],
                vec![
                    (Some(Failure), Failure, None),
                    (None, Failure, None),
                    (None, Failure, None),
                ],
            )
        },
        case(
            "startup: success ends the worker",
            Startup,
            vec![Observe(0, Failure), Observe(10_000, Success)],
            vec![
                (None, Unknown, Some(10_000)),
                (Some(Success), Success, None),
            ],
        ),
        case(
            "startup: failureThreshold failures fail it and hold",
            Startup,
            vec![
                Observe(0, Failure),
                Observe(10_000, Failure),
                Observe(20_000, Failure),
            ],
            vec![
                (None, Unknown, Some(10_000)),
                (None, Unknown, Some(20_000)),
                (Some(Failure), Failure, None),
            ],
        ),
        Case {
            delay: 5,
            ..case(
                "initialDelaySeconds: results before it are thrown away",
                Readiness,
                vec![
                    Observe(2_000, Success),
                    Observe(4_999, Success),
                    Observe(5_000, Success),
                ],
                vec![
                    (None, Failure, Some(5_000)),
                    (None, Failure, Some(5_000)),
                    (Some(Success), Success, Some(15_000)),
                ],
            )
        },
        Case {
            success: 2,
            ..case(
                "a prober error (Unknown) is thrown away without breaking the run",
                Readiness,
                vec![
                    Observe(0, Success),
                    Observe(10_000, Unknown),
                    Observe(20_000, Success),
                ],
                vec![
                    (None, Failure, Some(10_000)),
                    (None, Failure, Some(20_000)),
                    (Some(Success), Success, Some(30_000)),
                ],
            )
        },
        case(
            "a probe that overruns its period is followed right away, then the period resumes",
            Liveness,
            vec![
                Observe(2_000, Success),
                Observe(31_000, Success),
                Observe(41_000, Success),
            ],
            vec![
                (None, Success, Some(10_000)),
                (None, Success, Some(31_000)),
                (None, Success, Some(41_000)),
            ],
        ),
        case(
            "gated: skipped ticks keep the period",
            Liveness,
            vec![Skip(0), Skip(10_000), Skip(25_000)],
            vec![
                (None, Success, Some(10_000)),
                (None, Success, Some(20_000)),
                (None, Success, Some(30_000)),
            ],
        ),
        case(
            "readiness expedited when the container starts probes at once",
            Readiness,
            vec![Skip(0), Expedite(3_000), Observe(3_000, Success)],
            vec![
                (None, Failure, Some(10_000)),
                (None, Failure, Some(3_000)),
                (Some(Success), Success, Some(13_000)),
            ],
        ),
        Case {
            delay: 5,
            ..case(
                "expediting never probes before initialDelaySeconds",
                Readiness,
                vec![Expedite(1_000)],
                vec![(None, Failure, Some(5_000))],
            )
        },
        Case {
            failure: 1,
            ..case(
                "expediting a worker on hold leaves it on hold",
                Startup,
                vec![Observe(0, Failure), Expedite(1_000)],
                vec![(Some(Failure), Failure, None), (None, Failure, None)],
            )
        },
    ]
}

#[test]
fn probe_worker_table() {
    for c in cases() {
        assert_eq!(
            c.steps.len(),
            c.want.len(),
            "{}: steps and wants differ",
            c.name
        );
        let spec = spec(c.kind, c.delay, c.period, c.success, c.failure);
        let mut w = ProbeWorker::new(c.kind, &spec, START_NS);
        for (i, (step, want)) in c.steps.iter().zip(&c.want).enumerate() {
            let returned = match *step {
                Observe(t, raw) => w.observe(at(t), raw),
                Skip(t) => {
                    w.skip(at(t));
                    None
                }
                Expedite(t) => {
                    w.expedite(at(t));
                    None
                }
            };
            let got = (
                returned,
                w.result(),
                w.next_due().map(|d| (d - START_NS) / 1_000_000),
            );
            assert_eq!(&got, want, "{}: step {i} {step:?}", c.name);
        }
    }
}

#[test]
fn initial_results_and_first_due_time() {
    for (kind, delay, want_result, want_due_ms) in [
        (Readiness, 0, Failure, 0),
        (Liveness, 0, Success, 0),
        (Startup, 0, Unknown, 0),
        (Readiness, 7, Failure, 7_000),
        (Liveness, 30, Success, 30_000),
    ] {
        let w = ProbeWorker::new(kind, &spec(kind, delay, 10, 1, 3), START_NS);
        assert_eq!(w.result(), want_result, "{kind}");
        assert_eq!(w.result(), initial_result(kind), "{kind}");
        assert_eq!(w.next_due(), Some(at(want_due_ms)), "{kind} delay {delay}");
    }
}

#[test]
fn a_restarted_container_gets_a_fresh_worker() {
    let spec = spec(Liveness, 0, 10, 1, 1);
    let mut old = ProbeWorker::new(Liveness, &spec, START_NS);
    assert_eq!(old.observe(at(0), Failure), Some(Failure));
    assert_eq!(old.next_due(), None);
    let restarted_at = at(60_000);
    let new = ProbeWorker::new(Liveness, &spec, restarted_at);
    assert_eq!(new.result(), Success);
    assert_eq!(new.next_due(), Some(restarted_at));
}

#[test]
fn startup_gate() {
    // (startup probe result or None without one, kind) -> started, allowed
    for (startup, kind, started, allowed) in [
        (None, Liveness, true, true),
        (None, Readiness, true, true),
        (Some(Unknown), Liveness, false, false),
        (Some(Unknown), Readiness, false, false),
        (Some(Unknown), Startup, false, true),
        (Some(Failure), Readiness, false, false),
        (Some(Failure), Startup, false, true),
        (Some(Success), Liveness, true, true),
        (Some(Success), Readiness, true, true),
        (Some(Success), Startup, true, false),
    ] {
        assert_eq!(container_started(startup), started, "{startup:?}");
        assert_eq!(
            probe_allowed(kind, container_started(startup)),
            allowed,
            "{startup:?} {kind}"
        );
    }
}
