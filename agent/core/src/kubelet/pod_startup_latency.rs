//! kubelet's pod startup latency tracker: what its two pod-start histograms observe.
//!
//! Per pod, from creation (here: when the agent first saw it) until every container of
//! its status was running, once:
//! - `kubelet_pod_start_total_duration_seconds`: the whole time;
//! - `kubelet_pod_start_sli_duration_seconds`: the same less the time spent pulling
//!   images and running init containers, and only for stateless pods (volumes of no
//!   kind but secret, configMap, downwardAPI, emptyDir or projected);
//! - `kubelet_first_network_pod_start_sli_duration_seconds`: the SLI of the first such
//!   pod not on the host's network.
//!
//! Image pulling is counted as kubelet counts it: a pull starts when the image manager
//! asks for it (so a wait behind the image puller is pulling time) and a finished pull
//! closes the oldest open start; overlapping pulls are counted once, walking the pulls in
//! the order they finished. A failed pull never finishes, so its start is closed by the
//! next pull that succeeds.
//!
//! Deterministic: times come in as arguments (CLOCK_MONOTONIC ns for pulls; any one
//! clock per pair for the rest).

use std::collections::{BTreeMap, VecDeque};

use k8s_openapi::api::core::v1::{PodSpec, PodStatus};

use super::pod_actions::is_restartable_init_container;
use super::runtime_pod::{ContainerState, RuntimePodStatus};

/// What one pod's start came to, once.
#[derive(Debug, Clone, PartialEq)]
pub struct PodStartLatency {
    pub total_s: f64,
    /// Absent for a stateful pod.
    pub sli_s: Option<f64>,
    /// Set for the first stateless pod not on the host's network.
    pub first_network_sli_s: Option<f64>,
}

#[derive(Debug, Default)]
struct PerPodState {
    /// Pulls asked for and not finished yet, oldest first.
    pull_starts: VecDeque<u64>,
    /// (start, end) of finished pulls, in the order they finished.
    pull_sessions: Vec<(u64, u64)>,
    /// Run time of each init container run, by container ID.
    init_runs: BTreeMap<String, u64>,
    recorded: bool,
}

#[derive(Debug, Default)]
pub struct PodStartupLatencyTracker {
    pods: BTreeMap<String, PerPodState>,
    first_network_pod_seen: bool,
}

impl PodStartupLatencyTracker {
    pub fn new() -> PodStartupLatencyTracker {
        PodStartupLatencyTracker::default()
    }

    fn pod(&mut self, uid: &str) -> &mut PerPodState {
        self.pods.entry(uid.to_string()).or_default()
    }

    /// The image manager asked for a pull of one of the pod's images at `at_ns`.
    pub fn image_started_pulling(&mut self, uid: &str, at_ns: u64) {
        self.pod(uid).pull_starts.push_back(at_ns);
    }

    /// A pull of one of the pod's images succeeded at `at_ns`.
    pub fn image_finished_pulling(&mut self, uid: &str, at_ns: u64) {
        let pod = self.pod(uid);
        if let Some(start) = pod.pull_starts.pop_front() {
            pod.pull_sessions.push((start, at_ns));
        }
    }

    /// A (run-to-completion) init container ran from `started` to `finished` (the
    /// runtime's ns); the same run told again counts once.
    pub fn init_container_ran(
        &mut self,
        uid: &str,
        container_id: &str,
        started: i64,
        finished: i64,
    ) {
        if finished > started {
            self.pod(uid)
                .init_runs
                .insert(container_id.to_string(), (finished - started) as u64);
        }
    }

    /// Every container of the pod was seen running, `total_ns` after it was created; the
    /// latency the first time, None after.
    pub fn observed_started(
        &mut self,
        uid: &str,
        total_ns: u64,
        spec: Option<&PodSpec>,
    ) -> Option<PodStartLatency> {
        let pod = self.pods.entry(uid.to_string()).or_default();
        if pod.recorded {
            return None;
        }
        pod.recorded = true;
        let excluded = pulling_time_ns(&pod.pull_sessions) + pod.init_runs.values().sum::<u64>();
        let total_s = total_ns as f64 / 1e9;
        let sli_s = total_ns.saturating_sub(excluded) as f64 / 1e9;
        if spec.is_some_and(is_stateful_pod) {
            return Some(PodStartLatency {
                total_s,
                sli_s: None,
                first_network_sli_s: None,
            });
        }
        let host_network = spec.and_then(|s| s.host_network).unwrap_or(false);
        let first_network = !host_network && !self.first_network_pod_seen;
        self.first_network_pod_seen |= first_network;
        Some(PodStartLatency {
            total_s,
            sli_s: Some(sli_s),
            first_network_sli_s: first_network.then_some(sli_s),
        })
    }

    /// The pod is gone: what was kept for it goes too.
    pub fn delete(&mut self, uid: &str) {
        self.pods.remove(uid);
    }

    /// Pods with state kept.
    pub fn len(&self) -> usize {
        self.pods.len()
    }

    pub fn is_empty(&self) -> bool {
        self.pods.is_empty()
    }
}

/// Time covered by the pull sessions, each overlap counted once, walking them in the
/// order they finished.
fn pulling_time_ns(sessions: &[(u64, u64)]) -> u64 {
    let mut total = 0;
    let mut covered_to: Option<u64> = None;
    for &(start, end) in sessions {
        match covered_to {
            Some(to) if start <= to => {
                if end > to {
                    total += end - to;
                    covered_to = Some(end);
                }
            }
            _ => {
                total += end.saturating_sub(start);
                covered_to = Some(end);
            }
        }
    }
    total
}

/// Whether the pod has started as the SLI means it: every container in its status is
/// running (a pod with no container status yet has not).
pub fn has_pod_started(status: &PodStatus) -> bool {
    let statuses = status.container_statuses.as_deref().unwrap_or_default();
    !statuses.is_empty()
        && statuses
            .iter()
            .all(|c| c.state.as_ref().is_some_and(|s| s.running.is_some()))
}

/// The runs of the pod's run-to-completion init containers that the runtime reports
/// finished: (container ID, started, finished), every attempt the runtime still holds.
pub fn init_container_runs(spec: &PodSpec, runtime: &RuntimePodStatus) -> Vec<(String, i64, i64)> {
    let run_to_completion: Vec<&str> = spec
        .init_containers
        .iter()
        .flatten()
        .filter(|c| !is_restartable_init_container(c))
        .map(|c| c.name.as_str())
        .collect();
    runtime
        .containers
        .iter()
        .filter(|c| {
            run_to_completion.contains(&c.name.as_str())
                && c.state == ContainerState::Exited
                && c.started_at > 0
                && c.finished_at > c.started_at
        })
        .map(|c| (c.id.clone(), c.started_at, c.finished_at))
        .collect()
}

/// A pod that mounts a volume of any kind but secret, configMap, downwardAPI, emptyDir
/// or projected (the service account token's kind) is stateful: its start is not the
/// SLI's.
pub fn is_stateful_pod(spec: &PodSpec) -> bool {
    spec.volumes.iter().flatten().any(|v| {
        v.secret.is_none()
            && v.config_map.is_none()
            && v.downward_api.is_none()
            && v.empty_dir.is_none()
            && v.projected.is_none()
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use k8s_openapi::api::core::v1::{EmptyDirVolumeSource, HostPathVolumeSource, Volume};

    const S: u64 = 1_000_000_000;
    const MS: u64 = 1_000_000;

    fn close(a: f64, b: f64) -> bool {
        (a - b).abs() < 1e-9
    }

    // The cases of kubelet's own tracker tests: a 100 ms pull observed at 3 s; three
    // overlapping pulls (10–16, 11–18, 14–20 s) observed at 30 s; init containers and
    // pulls both taken out.
    #[test]
    fn one_pull_is_taken_out_of_the_sli_and_not_the_total() {
        let mut t = PodStartupLatencyTracker::new();
        t.image_started_pulling("p", 0);
        t.image_finished_pulling("p", 100 * MS);
        let got = t.observed_started("p", 3 * S, None).unwrap();
        assert!(close(got.total_s, 3.0));
        assert!(close(got.sli_s.unwrap(), 2.9), "{got:?}");
        // Once per pod.
        assert_eq!(t.observed_started("p", 5 * S, None), None);
    }

    #[test]
    fn overlapping_pulls_count_once() {
        let mut t = PodStartupLatencyTracker::new();
        for at in [10, 11, 14] {
            t.image_started_pulling("p", at * S);
        }
        for at in [16, 18, 20] {
            t.image_finished_pulling("p", at * S);
        }
        let got = t.observed_started("p", 30 * S, None).unwrap();
        assert!(close(got.sli_s.unwrap(), 20.0), "{got:?}");
    }

    #[test]
    fn init_container_runs_are_taken_out_too() {
        let mut t = PodStartupLatencyTracker::new();
        // Pulls 0.5–1.5 and 4.2–5.2 s, then two that overlap, 7.2–8.2 and 7.3–8.5 s
        // (1.3 s together): 3.3 s of pulling.
        t.image_started_pulling("p", 500 * MS);
        t.image_finished_pulling("p", 1500 * MS);
        t.image_started_pulling("p", 4200 * MS);
        t.image_finished_pulling("p", 5200 * MS);
        t.image_started_pulling("p", 7200 * MS);
        t.image_started_pulling("p", 7300 * MS);
        t.image_finished_pulling("p", 8200 * MS);
        t.image_finished_pulling("p", 8500 * MS);
        // Init containers 2–4 s and 5.5–7 s; the same run told twice counts once.
        let s = S as i64;
        t.init_container_ran("p", "i1", 2 * s, 4 * s);
        t.init_container_ran("p", "i1", 2 * s, 4 * s);
        t.init_container_ran("p", "i2", 5 * s + s / 2, 7 * s);
        let got = t.observed_started("p", 11 * S, None).unwrap();
        assert!(close(got.sli_s.unwrap(), 4.2), "{got:?}");
        assert!(close(got.total_s, 11.0));
    }

    #[test]
    fn a_failed_pull_stays_open_until_the_next_one_finishes() {
        let mut t = PodStartupLatencyTracker::new();
        t.image_started_pulling("p", S); // fails: never finished
        t.image_started_pulling("p", 4 * S);
        t.image_finished_pulling("p", 5 * S); // closes the start at 1 s
        let got = t.observed_started("p", 10 * S, None).unwrap();
        assert!(close(got.sli_s.unwrap(), 6.0), "{got:?}");
    }

    #[test]
    fn stateful_pods_have_no_sli_and_the_first_network_pod_is_named_once() {
        let volume = |v: Volume| PodSpec {
            volumes: Some(vec![v]),
            ..PodSpec::default()
        };
        let stateful = volume(Volume {
            name: "data".into(),
            host_path: Some(HostPathVolumeSource {
                path: "/data".into(),
                ..Default::default()
            }),
            ..Default::default()
        });
        let stateless = volume(Volume {
            name: "scratch".into(),
            empty_dir: Some(EmptyDirVolumeSource::default()),
            ..Default::default()
        });
        let host = PodSpec {
            host_network: Some(true),
            ..PodSpec::default()
        };
        let mut t = PodStartupLatencyTracker::new();
        let a = t.observed_started("a", 2 * S, Some(&stateful)).unwrap();
        assert_eq!((a.sli_s, a.first_network_sli_s), (None, None));
        assert!(close(a.total_s, 2.0));
        let b = t.observed_started("b", 3 * S, Some(&host)).unwrap();
        assert_eq!(b.first_network_sli_s, None);
        let c = t.observed_started("c", 4 * S, Some(&stateless)).unwrap();
        assert!(close(c.first_network_sli_s.unwrap(), 4.0));
        let d = t.observed_started("d", 5 * S, Some(&stateless)).unwrap();
        assert_eq!(d.first_network_sli_s, None);
        t.delete("a");
        assert_eq!(t.len(), 3);
    }
}
