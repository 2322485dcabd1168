//! The harness of SyncPod's table tests, after kubelet's TestSyncPod*: a pod, the fake
//! runtime brought to a starting state (images on the node, earlier syncs, exits, a dead
//! sandbox), faults injected, then one sync read as the fake's call log and the outcome
//! per container. Each sync reads the pod's status from the fake first, as the agent
//! does, with the resources the shell applied filled in.

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::sync::Mutex;

use k8s_openapi::api::core::v1::Pod;

use super::{ContainerOutcome, PodSyncResult, SyncContext, sync_pod};
use crate::cri::fake::{FakeCall, FakeRuntime, Fault};
use crate::kubelet::backoff::Backoff;
use crate::kubelet::probe_results::ProbeResults;
use crate::kubelet::runtime_pod::{ContainerResources, Nanos, RuntimePodStatus};
use crate::kuberuntime::{
    EventLog, HostDns, PullLimiter, RuntimeConfig, SyncReason, get_pod_status,
};

pub(super) const UID: &str = "5e1f3c2a-7d4b-4e8a-9c6f-0a1b2c3d4e5f";
const SECOND: Nanos = 1_000_000_000;
/// The grace period of a pod that sets none.
pub(super) const GRACE: i64 = 30;

/// The pod `web` in `default` with this spec (YAML, unindented).
pub(super) fn pod(spec: &str) -> Pod {
    let spec: String = spec.lines().map(|l| format!("  {l}\n")).collect();
    serde_yaml::from_str(&format!(
        "metadata:\n  name: web\n  namespace: default\n  uid: {UID}\nspec:\n{spec}"
    ))
    .expect("a case's pod parses")
}

/// A step that brings the fake to a case's starting state.
pub(super) enum Given {
    /// The image is on the node (its user root).
    Image(&'static str),
    /// The image is on the node and runs as this user ID.
    ImageAsUser(&'static str, i64),
    /// A sync of the case's pod (one second after the step before).
    Sync,
    /// A sync of another version of the pod (YAML spec), as `pod` builds it.
    SyncAs(&'static str),
    /// The running container of this name exits with this code.
    Exit(&'static str, i32),
    /// The ready sandbox's pause container dies: the sandbox is not ready.
    SandboxNotReady,
    /// The running container of this name fails its liveness probe.
    LivenessFailed(&'static str),
    /// A fault injected from this step on.
    Fault(Fault),
}

/// How one container came out of the sync, as a case expects it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(super) enum Outcome {
    Started(String),
    BackOff(SyncReason),
    Failed(SyncReason),
}

pub(super) fn started(id: &str) -> Outcome {
    Outcome::Started(id.to_string())
}

/// A check of the fake's state (or the result) after the sync; `Ok` when it holds.
pub(super) type Check = fn(&FakeRuntime, &PodSyncResult) -> Result<(), String>;

/// One table case.
pub(super) struct Case {
    pub name: &'static str,
    /// The pod's spec, YAML.
    pub pod: &'static str,
    pub given: Vec<Given>,
    /// Injected after the starting state is read, for the sync under test.
    pub faults: Vec<Fault>,
    /// Every call the sync makes, in order.
    pub calls: Vec<FakeCall>,
    /// The pod-level step that failed, if one did.
    pub pod_error: Option<SyncReason>,
    /// The containers the sync tried to start, by name.
    pub containers: Vec<(&'static str, Outcome)>,
    pub then: Check,
}

impl Default for Case {
    fn default() -> Self {
        Case {
            name: "",
            pod: "",
            given: Vec::new(),
            faults: Vec::new(),
            calls: Vec::new(),
            pod_error: None,
            containers: Vec::new(),
            then: |_, _| Ok(()),
        }
    }
}

/// A node: the fake runtime and what the agent keeps across syncs.
struct Node {
    fake: FakeRuntime,
    cfg: RuntimeConfig,
    events: EventLog,
    probes: ProbeResults,
    backoff: Mutex<Backoff>,
    limiter: PullLimiter,
    /// The resources the shell applied, by container name: (container ID, resources).
    actuated: Mutex<BTreeMap<String, (String, ContainerResources)>>,
}

impl Node {
    fn new() -> Node {
        Node {
            fake: FakeRuntime::new(),
            cfg: RuntimeConfig {
                node_name: "node-1".into(),
                node_ip: "192.0.2.10".into(),
                root_dir: PathBuf::from("/nonexistent/podlapse-tests"),
                pod_logs_dir: PathBuf::from("/nonexistent/podlapse-tests/logs"),
                host_dns: HostDns::default(),
                runtime_handlers: BTreeMap::new(),
                touch_host: false,
                user_namespace_handlers: None,
                allocatable: None,
            },
            events: EventLog::default(),
            probes: ProbeResults::default(),
            backoff: Mutex::new(Backoff::default()),
            limiter: PullLimiter::serialized(),
            actuated: Mutex::new(BTreeMap::new()),
        }
    }

    /// The pod's status as the agent reads it before a sync, one second on.
    async fn status(&self) -> RuntimePodStatus {
        self.fake.set_time(self.fake.now() + SECOND);
        let mut status = get_pod_status(&self.fake, UID, "web", "default")
            .await
            .expect("the fake lists the pod");
        let actuated = self.actuated.lock().unwrap();
        for c in &mut status.containers {
            c.resources = actuated
                .get(&c.name)
                .filter(|(id, _)| *id == c.id)
                .map(|(_, r)| *r);
        }
        status
    }

    async fn sync(&self, pod: &Pod, status: &RuntimePodStatus) -> PodSyncResult {
        let fake = self.fake.clone();
        let now = move || fake.now();
        let actuated = |name: &str, id: &str, r: ContainerResources| {
            self.actuated
                .lock()
                .unwrap()
                .insert(name.to_string(), (id.to_string(), r));
        };
        let ctx = SyncContext {
            cfg: &self.cfg,
            events: &self.events,
            probes: &self.probes,
            backoff: &self.backoff,
            limiter: &self.limiter,
            now: &now,
            cgroup_parent: "",
            auth: &|_: &str| None,
            actuated: &actuated,
        };
        sync_pod(&self.fake, &ctx, pod, status).await
    }

    /// The ID of the running container of this name.
    fn running(&self, name: &str) -> String {
        self.fake
            .containers()
            .into_iter()
            .find(|c| {
                c.name == name && c.state == crate::cri::api::ContainerState::ContainerRunning
            })
            .unwrap_or_else(|| panic!("no running container {name}"))
            .id
    }

    async fn apply(&mut self, step: Given, case_pod: &Pod) {
        match step {
            Given::Image(image) => self.fake.add_image(image),
            Given::ImageAsUser(image, uid) => self.fake.add_image_as_user(image, uid),
            Given::Sync => {
                let status = self.status().await;
                self.sync(case_pod, &status).await;
            }
            Given::SyncAs(spec) => {
                let status = self.status().await;
                self.sync(&pod(spec), &status).await;
            }
            Given::Exit(name, code) => {
                let id = self.running(name);
                self.fake.exit_container(&id, code);
            }
            Given::SandboxNotReady => {
                for sb in self.fake.sandboxes().into_iter().filter(|s| s.ready) {
                    self.fake.set_sandbox_ready(&sb.id, false);
                }
            }
            Given::LivenessFailed(name) => {
                let id = self.running(name);
                self.probes.liveness_failed.insert(id);
            }
            Given::Fault(fault) => self.fake.inject(fault),
        }
    }
}

fn outcome(o: &ContainerOutcome) -> Outcome {
    match o {
        ContainerOutcome::Started { container_id } => Outcome::Started(container_id.clone()),
        ContainerOutcome::BackOff { reason, .. } => Outcome::BackOff(*reason),
        ContainerOutcome::Failed { reason, .. } => Outcome::Failed(*reason),
    }
}

/// Runs one case; what did not come out as expected, if anything.
async fn run_case(case: Case) -> Result<(), String> {
    let pod = pod(case.pod);
    let mut node = Node::new();
    for step in case.given {
        node.apply(step, &pod).await;
    }
    let status = node.status().await;
    node.fake.take_calls();
    node.events.take();
    for fault in case.faults {
        node.fake.inject(fault);
    }
    let result = node.sync(&pod, &status).await;
    let mut wrong = Vec::new();
    let calls = node.fake.take_calls();
    if calls != case.calls {
        wrong.push(format!(
            "calls:\n    got  {calls:?}\n    want {:?}",
            case.calls
        ));
    }
    let reason = result.pod_error.as_ref().map(|e| e.reason);
    if reason != case.pod_error {
        wrong.push(format!(
            "pod error: got {:?}, want {:?}",
            result.pod_error, case.pod_error
        ));
    }
    let got: BTreeMap<&str, Outcome> = result
        .containers
        .iter()
        .map(|(name, o)| (name.as_str(), outcome(o)))
        .collect();
    let want: BTreeMap<&str, Outcome> = case.containers.into_iter().collect();
    if got != want {
        wrong.push(format!("containers: got {got:?}, want {want:?}"));
    }
    if let Err(e) = (case.then)(&node.fake, &result) {
        wrong.push(e);
    }
    if wrong.is_empty() {
        Ok(())
    } else {
        Err(format!("{}:\n  {}", case.name, wrong.join("\n  ")))
    }
}

/// Runs every case (each on a node of its own) and fails naming every case that did not
/// come out as expected.
pub(super) async fn run_cases(cases: Vec<Case>) {
    let count = cases.len();
    let mut failed = Vec::new();
    for case in cases {
        if let Err(e) = run_case(case).await {
            failed.push(e);
        }
    }
    assert!(
        failed.is_empty(),
        "{} of {count} cases failed:\n{}",
        failed.len(),
        failed.join("\n")
    );
}

// The calls a case expects, by what they are for.

pub(super) fn run_sandbox(attempt: u32) -> FakeCall {
    FakeCall::RunPodSandbox {
        pod_uid: UID.into(),
        attempt,
    }
}

pub(super) fn sandbox_status(id: &str) -> FakeCall {
    FakeCall::PodSandboxStatus {
        sandbox_id: id.into(),
    }
}

pub(super) fn stop_sandbox(id: &str) -> FakeCall {
    FakeCall::StopPodSandbox {
        sandbox_id: id.into(),
    }
}

pub(super) fn image_status(image: &str) -> FakeCall {
    FakeCall::ImageStatus {
        image: image.into(),
    }
}

pub(super) fn pull(image: &str) -> FakeCall {
    FakeCall::PullImage {
        image: image.into(),
    }
}

pub(super) fn create(sandbox_id: &str, name: &str, attempt: u32) -> FakeCall {
    FakeCall::CreateContainer {
        sandbox_id: sandbox_id.into(),
        name: name.into(),
        attempt,
    }
}

pub(super) fn start(id: &str) -> FakeCall {
    FakeCall::StartContainer {
        container_id: id.into(),
    }
}

/// StopContainer with the pod's whole grace period.
pub(super) fn stop(id: &str) -> FakeCall {
    FakeCall::StopContainer {
        container_id: id.into(),
        timeout: GRACE,
    }
}

pub(super) fn remove(id: &str) -> FakeCall {
    FakeCall::RemoveContainer {
        container_id: id.into(),
    }
}

pub(super) fn update(id: &str) -> FakeCall {
    FakeCall::UpdateContainerResources {
        container_id: id.into(),
    }
}
