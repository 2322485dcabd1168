//! Where each pod of a one-shot run (`podlapse run --until-ready`) ended up: settled when every container
//! runs, when the pod ended, or when something stands in the way that will not pass by
//! itself; and, for every container that is not running, what it is waiting on.

use k8s_openapi::api::core::v1::{ContainerStatus, PodSpec};

use crate::kubelet::status::phase;
use crate::syncloop::PodRecord;

/// Waiting reasons that mean the pod will not get to Running without a change.
const FAILED_WAITING: &[&str] = &[
    "ErrImagePull",
    "ImagePullBackOff",
    "ErrImageNeverPull",
    "InvalidImageName",
    "CrashLoopBackOff",
    "CreateContainerConfigError",
    "CreateContainerError",
    "RunContainerError",
];
/// Pod events that mean the same at the pod level, once kubelet's retry failed too.
const FAILED_EVENTS: &[&str] = &["FailedCreatePodSandBox", "NetworkNotReady", "FailedSync"];
/// How many sync attempts must fail at the pod level before the pod counts as stuck: the
/// first and the pod worker's retry after its back-off. One failure is not enough: kubelet
/// retries it, and some pass by themselves (a CNI plugin's netlink call interrupted by a
/// signal, seen on a 5.10 node, succeeds on the retry).
const POD_LEVEL_ATTEMPTS: usize = 2;

/// A waiting reason that will not pass without a change.
fn blocks(reason: Option<&str>) -> bool {
    reason.is_some_and(|r| FAILED_WAITING.contains(&r))
}

/// A container of the pod that is not running, and why.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize)]
pub struct NotRunning {
    pub container: String,
    /// `waiting`, `terminated`, or `not started` (the runtime has no status for it yet).
    pub state: String,
    pub reason: Option<String>,
    pub message: Option<String>,
}

/// Where one pod ended up.
#[derive(Debug, Clone, serde::Serialize)]
pub struct PodOutcome {
    pub namespace: String,
    pub name: String,
    pub uid: String,
    pub phase: String,
    pub ip: Option<String>,
    pub reason: Option<String>,
    pub message: Option<String>,
    /// Every container (sidecars included) that is not running, in spec order.
    pub not_running: Vec<NotRunning>,
    pub seconds: f64,
    pub events: Vec<crate::kuberuntime::PodEvent>,
}

impl PodOutcome {
    /// Running with every container running: what the summary and exit code count.
    pub fn all_running(&self) -> bool {
        self.phase == phase::RUNNING && self.not_running.is_empty()
    }
}

/// The order outcomes are printed in: by namespace, then name.
pub fn by_name(a: &PodOutcome, b: &PodOutcome) -> std::cmp::Ordering {
    (&a.namespace, &a.name).cmp(&(&b.namespace, &b.name))
}

/// The pod's outcome once it has settled: every container running, the pod ended, or a
/// container or the pod stopped by something that will not pass by itself.
pub fn settled(rec: &PodRecord) -> Option<PodOutcome> {
    let o = outcome_of(rec);
    let ended = matches!(o.phase.as_str(), phase::FAILED | phase::SUCCEEDED);
    let pod_level = o
        .reason
        .as_deref()
        .is_some_and(|r| FAILED_EVENTS.contains(&r));
    let pod_level_failures = rec
        .events
        .iter()
        .filter(|e| FAILED_EVENTS.contains(&e.event.reason.as_str()))
        .count();
    let stuck = (o.reason.is_some() && (!pod_level || pod_level_failures >= POD_LEVEL_ATTEMPTS))
        || o.not_running.iter().any(|c| blocks(c.reason.as_deref()));
    // A regular container that finished for good (restartPolicy Never, or OnFailure
    // after a success) will not run again: waiting for it is pointless.
    let policy = rec
        .pod
        .spec()
        .and_then(|s| s.restart_policy.as_deref())
        .unwrap_or("Always");
    let finished = !o.not_running.is_empty()
        && o.not_running.iter().all(|c| {
            c.state == "terminated"
                && (policy == "Never"
                    || (policy == "OnFailure" && c.reason.as_deref() == Some("Completed")))
        });
    (ended || o.all_running() || stuck || finished).then_some(o)
}

/// The containers that must run for the pod to count as running, with their statuses:
/// sidecars (restartable init containers) and regular containers, in spec order.
fn long_running<'a>(
    spec: Option<&'a PodSpec>,
    init: &'a [ContainerStatus],
    regular: &'a [ContainerStatus],
) -> Vec<(&'a str, Option<&'a ContainerStatus>)> {
    let Some(spec) = spec else {
        return Vec::new();
    };
    let find =
        |statuses: &'a [ContainerStatus], name: &str| statuses.iter().find(|s| s.name == name);
    spec.init_containers
        .iter()
        .flatten()
        .filter(|c| c.restart_policy.as_deref() == Some("Always"))
        .map(|c| (c.name.as_str(), find(init, &c.name)))
        .chain(
            spec.containers
                .iter()
                .map(|c| (c.name.as_str(), find(regular, &c.name))),
        )
        .collect()
}

fn not_running(name: &str, status: Option<&ContainerStatus>) -> Option<NotRunning> {
    let state = status.and_then(|s| s.state.as_ref());
    if state.is_some_and(|s| s.running.is_some()) {
        return None;
    }
    let (kind, reason, message) = match state {
        Some(s) if s.waiting.is_some() => {
            let w = s.waiting.as_ref().unwrap();
            ("waiting", w.reason.clone(), w.message.clone())
        }
        Some(s) if s.terminated.is_some() => {
            let t = s.terminated.as_ref().unwrap();
            ("terminated", t.reason.clone(), t.message.clone())
        }
        _ => ("not started", None, None),
    };
    Some(NotRunning {
        container: name.to_string(),
        state: kind.to_string(),
        reason,
        message,
    })
}

pub fn outcome_of(rec: &PodRecord) -> PodOutcome {
    let st = &rec.status;
    let init = st.init_container_statuses.as_deref().unwrap_or_default();
    let regular = st.container_statuses.as_deref().unwrap_or_default();
    let not_running: Vec<NotRunning> = long_running(rec.pod.spec(), init, regular)
        .into_iter()
        .filter_map(|(name, status)| not_running(name, status))
        .collect();
    let waiting = init
        .iter()
        .chain(regular)
        .filter_map(|c| c.state.as_ref()?.waiting.as_ref())
        .find(|w| blocks(w.reason.as_deref()));
    let event = rec
        .events
        .iter()
        .rev()
        .find(|e| FAILED_EVENTS.contains(&e.event.reason.as_str()));
    let phase = st.phase.clone().unwrap_or_default();
    let (reason, message) = if let Some(w) = waiting {
        (w.reason.clone(), w.message.clone())
    } else if phase != phase::RUNNING
        && let Some(e) = event
    {
        (Some(e.event.reason.clone()), Some(e.event.message.clone()))
    } else {
        (st.reason.clone(), st.message.clone())
    };
    let end = rec.running_at.unwrap_or_else(crate::clock::wall_now);
    PodOutcome {
        namespace: rec.namespace.clone(),
        name: rec.name.clone(),
        uid: rec.uid.clone(),
        phase,
        ip: st.pod_ip.clone(),
        reason,
        message,
        not_running,
        seconds: (end - rec.first_seen) as f64 / 1e9,
        events: rec.events.iter().map(|e| e.event.clone()).collect(),
    }
}

#[cfg(test)]
mod tests {
    use std::collections::BTreeMap;

    use k8s_openapi::api::core::v1::Pod;
    use k8s_openapi::api::core::v1::{
        Container, ContainerState, ContainerStateRunning, ContainerStateTerminated,
        ContainerStateWaiting, PodStatus,
    };

    use super::*;
    use crate::syncloop::status_store::{ManifestPod, StampedEvent};

    fn running() -> ContainerState {
        ContainerState {
            running: Some(ContainerStateRunning::default()),
            ..ContainerState::default()
        }
    }

    fn waiting(reason: &str, message: &str) -> ContainerState {
        ContainerState {
            waiting: Some(ContainerStateWaiting {
                reason: Some(reason.into()),
                message: Some(message.into()),
            }),
            ..ContainerState::default()
        }
    }

    fn status(name: &str, state: ContainerState) -> ContainerStatus {
        ContainerStatus {
            name: name.into(),
            state: Some(state),
            ..ContainerStatus::default()
        }
    }

    /// A pod with a sidecar `proxy` and containers `app`, `worker`, in `phase`.
    fn record(
        phase: &str,
        policy: &str,
        init: Vec<ContainerStatus>,
        regular: Vec<ContainerStatus>,
    ) -> PodRecord {
        let c = |name: &str, sidecar: bool| Container {
            name: name.into(),
            restart_policy: sidecar.then(|| "Always".to_string()),
            ..Container::default()
        };
        PodRecord {
            uid: "u".into(),
            namespace: "default".into(),
            name: "p".into(),
            pod: ManifestPod(std::sync::Arc::new(Pod {
                spec: Some(PodSpec {
                    restart_policy: Some(policy.into()),
                    init_containers: Some(vec![c("proxy", true)]),
                    containers: vec![c("app", false), c("worker", false)],
                    ..PodSpec::default()
                }),
                ..Pod::default()
            })),
            status: PodStatus {
                phase: Some(phase.into()),
                init_container_statuses: Some(init),
                container_statuses: Some(regular),
                ..PodStatus::default()
            },
            first_seen: 0,
            running_at: Some(1),
            all_started_at: None,
            init_runs: BTreeMap::new(),
            events: Vec::new(),
        }
    }

    #[test]
    fn a_running_pod_with_a_crashing_container_is_settled_but_not_counted() {
        let rec = record(
            "Running",
            "Always",
            vec![status("proxy", running())],
            vec![
                status("app", running()),
                status("worker", waiting("CrashLoopBackOff", "back-off 10s")),
            ],
        );
        let o = settled(&rec).expect("settled");
        assert!(!o.all_running());
        assert_eq!(
            o.not_running,
            [NotRunning {
                container: "worker".into(),
                state: "waiting".into(),
                reason: Some("CrashLoopBackOff".into()),
                message: Some("back-off 10s".into()),
            }]
        );
    }

    #[test]
    fn a_container_still_being_created_keeps_the_pod_unsettled() {
        let rec = record(
            "Running",
            "Always",
            vec![status("proxy", running())],
            vec![
                status("app", running()),
                status("worker", waiting("ContainerCreating", "")),
            ],
        );
        assert!(settled(&rec).is_none());
        // A sidecar with no status yet is not running either.
        let rec = record(
            "Pending",
            "Always",
            vec![],
            vec![status("app", running()), status("worker", running())],
        );
        assert!(settled(&rec).is_none());
        assert_eq!(outcome_of(&rec).not_running[0].state, "not started");
    }

    fn failed_sandbox(message: &str) -> StampedEvent {
        StampedEvent {
            at: 0,
            at_ns: 0,
            event: crate::kuberuntime::PodEvent::warning(
                "FailedCreatePodSandBox",
                message.to_string(),
                None,
            ),
        }
    }

    #[test]
    fn a_sandbox_failure_settles_the_pod_only_once_the_retry_failed_too() {
        let mut rec = record("Pending", "Always", vec![], vec![]);
        rec.running_at = None;
        rec.events.push(failed_sandbox(
            "plugin type=\"loopback\" failed (add): interrupted system call",
        ));
        assert!(
            settled(&rec).is_none(),
            "one failure is kubelet's to retry, not a verdict"
        );
        rec.events.push(failed_sandbox(
            "plugin type=\"bridge\" failed (add): no IP addresses available",
        ));
        let o = settled(&rec).expect("the retry failed too: stuck");
        assert_eq!(o.reason.as_deref(), Some("FailedCreatePodSandBox"));
        assert!(o.message.unwrap().contains("no IP addresses available"));
        assert_eq!(o.events.len(), 2, "both attempts stay in the outcome");
    }

    #[test]
    fn a_sandbox_failure_followed_by_a_running_pod_is_counted() {
        let mut rec = record(
            "Running",
            "Always",
            vec![status("proxy", running())],
            vec![status("app", running()), status("worker", running())],
        );
        rec.events.push(failed_sandbox(
            "plugin type=\"loopback\" failed (add): interrupted system call",
        ));
        let o = settled(&rec).expect("running");
        assert!(o.all_running());
        assert_eq!(o.reason, None);
    }

    #[test]
    fn every_container_running_is_settled_and_counted() {
        let rec = record(
            "Running",
            "Always",
            vec![status("proxy", running())],
            vec![status("app", running()), status("worker", running())],
        );
        assert!(settled(&rec).unwrap().all_running());
    }

    #[test]
    fn a_container_done_for_good_settles_the_pod() {
        let done = ContainerState {
            terminated: Some(ContainerStateTerminated {
                reason: Some("Completed".into()),
                ..ContainerStateTerminated::default()
            }),
            ..ContainerState::default()
        };
        let rec = record(
            "Running",
            "OnFailure",
            vec![status("proxy", running())],
            vec![status("app", running()), status("worker", done.clone())],
        );
        let o = settled(&rec).expect("settled");
        assert!(!o.all_running());
        let rec = record(
            "Running",
            "Always",
            vec![status("proxy", running())],
            vec![status("app", running()), status("worker", done)],
        );
        assert!(settled(&rec).is_none(), "Always restarts it");
    }
}
