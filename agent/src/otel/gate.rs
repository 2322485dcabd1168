//! Which CRI calls go to the runtime with a sampled trace context.
//!
//! A call carries a sampled `traceparent` only when podlapse will export its span: the
//! agent exports or receives the runtime's spans (the gate is on), the call is for a pod,
//! and that pod's startup is not over. Every other call carries an unsampled context
//! (`ids::traceparent`), so a runtime whose sampler follows its parent starts no trace for
//! it: neither under a span no one exports nor as a root of its own.
//!
//! A pod's startup is over, for this purpose, at the first of:
//!
//! - every regular container of its spec had a successful StartContainer and no
//!   container has a readiness or startup probe (the timeline's `running`, which is then
//!   also `ready`: the end of the exported startup);
//! - its published status says Ready, Succeeded or Failed;
//! - it was removed from the config;
//! - its spans were exported (`LiveExport`: a pod that ran or failed and went quiet, one
//!   forgotten, or the agent stopping).
//!
//! Each comes at or after the end the export gives the startup, so a call made between
//! the two is sampled though after the startup's end; the call records that it was
//! (`CriCall::traced`) and the export includes every such call, so no runtime span hangs
//! under a span no one exports. The gate is read once per call: one lock and a lookup.

use std::collections::{BTreeSet, HashMap};
use std::sync::Mutex;
use std::sync::atomic::{AtomicBool, Ordering};

use k8s_openapi::api::core::v1::{Pod, PodStatus};

use podlapse_core::record::CriMethod;

use super::ids;
use crate::cri::CriCall;
use crate::trace::{PodOp, TraceRecord};

/// The decision itself: a sampled context only for a call of a pod, whose startup is not
/// over, while spans are exported or received.
pub fn sampled(tracing: bool, pod_uid: &str, startup_over: bool) -> bool {
    tracing && !pod_uid.is_empty() && !startup_over
}

/// What the gate knows of one pod.
#[derive(Debug, Default)]
struct PodState {
    /// The spec's regular containers, once a spec was seen.
    regular: Option<Vec<String>>,
    /// A container has a readiness or startup probe: Ready comes later than running.
    probed: bool,
    /// Regular containers that had a successful StartContainer.
    started: BTreeSet<String>,
    over: bool,
}

impl PodState {
    fn running(&self) -> bool {
        self.regular
            .as_ref()
            .is_some_and(|r| !r.is_empty() && r.iter().all(|c| self.started.contains(c)))
    }
}

#[derive(Debug, Default)]
struct Pods {
    by_uid: HashMap<String, PodState>,
    /// Each known pod's trace ID, for the runtime's spans to name their pod by.
    by_trace: HashMap<[u8; 16], String>,
}

/// The agent's gate; cheap to share.
#[derive(Debug, Default)]
pub struct TraceGate {
    on: AtomicBool,
    pods: Mutex<Pods>,
}

impl TraceGate {
    pub fn new() -> TraceGate {
        TraceGate::default()
    }

    /// Spans are exported or received from now on.
    pub fn enable(&self) {
        self.on.store(true, Ordering::Relaxed);
    }

    pub fn is_on(&self) -> bool {
        self.on.load(Ordering::Relaxed)
    }

    fn pods(&self) -> std::sync::MutexGuard<'_, Pods> {
        self.pods.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Whether `call` goes out sampled.
    pub fn sampled(&self, call: &CriCall) -> bool {
        if !self.is_on() || call.pod_uid.is_empty() {
            return false;
        }
        // A pod the agent does not know (never added, or forgotten) has no startup to
        // export.
        let over = self.pods().by_uid.get(&call.pod_uid).is_none_or(|p| p.over);
        sampled(true, &call.pod_uid, over)
    }

    /// Learns from a record the agent made: a pod's spec, a call's outcome, a status.
    pub fn observe(&self, record: &TraceRecord) {
        match record {
            TraceRecord::Pod(p) if p.op != PodOp::Remove => self.observe_pod(&p.pod),
            // A deleted pod's startup is over: what follows is its teardown.
            TraceRecord::Pod(p) => self.mark_over(p.pod.metadata.uid.as_deref().unwrap_or("")),
            TraceRecord::Cri(c) if c.method == CriMethod::StartContainer && c.ok() => {
                if c.pod_uid.is_empty() || c.container.is_empty() {
                    return;
                }
                let mut pods = self.pods();
                let Some(p) = pods.by_uid.get_mut(&c.pod_uid) else {
                    return;
                };
                p.started.insert(c.container.clone());
                if p.running() && !p.probed {
                    p.over = true;
                }
            }
            TraceRecord::Status(s) if startup_over_says(&s.status) => self.mark_over(&s.pod_uid),
            _ => {}
        }
    }

    fn observe_pod(&self, pod: &Pod) {
        let Some(uid) = pod.metadata.uid.as_deref() else {
            return;
        };
        let spec = pod.spec.as_ref();
        let regular: Vec<String> = spec
            .map(|s| s.containers.iter().map(|c| c.name.clone()).collect())
            .unwrap_or_default();
        let probed = spec.is_some_and(|s| {
            s.containers
                .iter()
                .any(|c| c.readiness_probe.is_some() || c.startup_probe.is_some())
        });
        let mut pods = self.pods();
        pods.by_trace.insert(ids::trace_id(uid), uid.to_string());
        let p = pods.by_uid.entry(uid.to_string()).or_default();
        p.regular = Some(regular);
        p.probed = probed;
    }

    /// The pod's startup is over: its later calls go out unsampled.
    pub fn mark_over(&self, uid: &str) {
        if let Some(p) = self.pods().by_uid.get_mut(uid) {
            p.over = true;
        }
    }

    /// The pod whose trace `trace_id` is, among the pods the agent knows.
    pub fn pod_of_trace(&self, trace_id: &[u8; 16]) -> Option<String> {
        self.pods().by_trace.get(trace_id).cloned()
    }

    /// The agent let go of these pods.
    pub fn forget(&self, uids: &[String]) {
        let mut pods = self.pods();
        for uid in uids {
            pods.by_uid.remove(uid);
            pods.by_trace.remove(&ids::trace_id(uid));
        }
        pods.by_uid.shrink_to_fit();
        pods.by_trace.shrink_to_fit();
    }
}

/// A published status that puts the startup behind the pod: Ready, or the pod ended.
fn startup_over_says(status: &PodStatus) -> bool {
    let ready = status
        .conditions
        .iter()
        .flatten()
        .any(|c| c.type_ == "Ready" && c.status == "True");
    ready || matches!(status.phase.as_deref(), Some("Succeeded" | "Failed"))
}

#[cfg(test)]
mod tests {
    use k8s_openapi::api::core::v1::{Container, PodCondition, PodSpec, Probe, TCPSocketAction};
    use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;

    use super::*;
    use crate::trace::{PodOpRecord, PodStatusRecord};

    fn pod(uid: &str, containers: &[&str], probed: bool) -> TraceRecord {
        let probe = Probe {
            tcp_socket: Some(TCPSocketAction::default()),
            ..Probe::default()
        };
        TraceRecord::Pod(PodOpRecord {
            at_ns: 1,
            op: PodOp::Add,
            pod: std::sync::Arc::new(Pod {
                metadata: ObjectMeta {
                    uid: Some(uid.into()),
                    name: Some("p".into()),
                    ..ObjectMeta::default()
                },
                spec: Some(PodSpec {
                    containers: containers
                        .iter()
                        .map(|c| Container {
                            name: (*c).into(),
                            readiness_probe: probed.then(|| probe.clone()),
                            ..Container::default()
                        })
                        .collect(),
                    ..PodSpec::default()
                }),
                ..Pod::default()
            }),
        })
    }

    fn call(uid: &str, method: &str, container: &str, code: &str) -> CriCall {
        CriCall::new(method.parse().expect("a CRI method"))
            .with_pod_uid(uid)
            .with_container(container)
            .with_times(10, 20)
            .with_code(code.parse().expect("a gRPC code"))
    }

    fn status(uid: &str, phase: &str, ready: bool) -> TraceRecord {
        TraceRecord::Status(PodStatusRecord {
            at_ns: 30,
            pod_uid: uid.into(),
            namespace: "default".into(),
            name: "p".into(),
            status: Box::new(PodStatus {
                phase: Some(phase.into()),
                conditions: Some(vec![PodCondition {
                    type_: "Ready".into(),
                    status: if ready { "True" } else { "False" }.into(),
                    ..PodCondition::default()
                }]),
                ..PodStatus::default()
            }),
        })
    }

    #[test]
    fn the_decision_is_sampled_only_for_a_pods_call_during_its_startup_while_tracing() {
        assert!(sampled(true, "uid", false));
        assert!(!sampled(false, "uid", false), "tracing off");
        assert!(!sampled(true, "", false), "a call of no pod");
        assert!(!sampled(true, "uid", true), "the startup is over");
        assert!(!sampled(false, "", true));
    }

    #[test]
    fn a_pods_calls_are_sampled_until_its_last_container_started() {
        let gate = TraceGate::new();
        let run = call("u", "RunPodSandbox", "", "OK");
        assert!(!gate.sampled(&run), "off until enabled");
        gate.enable();
        gate.observe(&pod("u", &["a", "b"], false));
        assert!(gate.sampled(&run));
        assert!(!gate.sampled(&call("", "ListContainers", "", "OK")));
        gate.observe(&TraceRecord::Cri(call("u", "StartContainer", "a", "OK")));
        assert!(gate.sampled(&run), "b has not started");
        // A failed start starts nothing.
        gate.observe(&TraceRecord::Cri(call(
            "u",
            "StartContainer",
            "b",
            "Unknown",
        )));
        assert!(gate.sampled(&run));
        gate.observe(&TraceRecord::Cri(call("u", "StartContainer", "b", "OK")));
        assert!(!gate.sampled(&call("u", "ContainerStatus", "b", "OK")));
        // Other pods are untouched; a pod the agent never added is not traced.
        gate.observe(&pod("v", &["a"], false));
        assert!(gate.sampled(&call("v", "RunPodSandbox", "", "OK")));
        assert!(!gate.sampled(&call("w", "RunPodSandbox", "", "OK")));
    }

    #[test]
    fn a_probed_pods_startup_ends_when_its_status_says_ready_or_it_ended() {
        let gate = TraceGate::new();
        gate.enable();
        gate.observe(&pod("u", &["a"], true));
        gate.observe(&TraceRecord::Cri(call("u", "StartContainer", "a", "OK")));
        let exec = call("u", "ExecSync", "a", "OK");
        assert!(gate.sampled(&exec), "Ready comes with the probe");
        gate.observe(&status("u", "Running", false));
        assert!(gate.sampled(&exec));
        gate.observe(&status("u", "Running", true));
        assert!(!gate.sampled(&exec));
        // A pod that failed before it ran.
        gate.observe(&pod("f", &["a"], false));
        gate.observe(&status("f", "Failed", false));
        assert!(!gate.sampled(&call("f", "StopPodSandbox", "", "OK")));
    }

    #[test]
    fn an_exported_pod_is_over_and_a_forgotten_pod_is_unknown() {
        let gate = TraceGate::new();
        gate.enable();
        gate.observe(&pod("u", &["a"], false));
        assert_eq!(gate.pod_of_trace(&ids::trace_id("u")).as_deref(), Some("u"));
        assert_eq!(gate.pod_of_trace(&ids::trace_id("other")), None);
        gate.mark_over("u");
        assert!(!gate.sampled(&call("u", "PullImage", "", "OK")));
        gate.forget(&["u".to_string()]);
        assert_eq!(gate.pod_of_trace(&ids::trace_id("u")), None);
        // Removed from the config: its teardown is not its startup.
        gate.observe(&pod("r", &["a"], false));
        let TraceRecord::Pod(mut removed) = pod("r", &["a"], false) else {
            unreachable!()
        };
        removed.op = PodOp::Remove;
        gate.observe(&TraceRecord::Pod(removed));
        assert!(!gate.sampled(&call("r", "StopPodSandbox", "", "OK")));
    }
}
