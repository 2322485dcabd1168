//! generateAPIPodStatus: the pod's API status (phase, IPs, conditions, container
//! statuses) derived from the spec and the runtime's view. Pure.

use std::collections::BTreeMap;

use k8s_openapi::api::core::v1::{
    Container, ContainerState as ApiState, ContainerStateRunning, ContainerStateTerminated,
    ContainerStateWaiting, ContainerStatus as ApiContainerStatus, Pod, PodCondition, PodIP,
    PodStatus, ResourceRequirements,
};
use k8s_openapi::apimachinery::pkg::api::resource::Quantity;

use super::pod_actions::{is_restartable_init_container, should_container_be_restarted};
use super::probe_results::{ProbeResult, ProbeResults};
use super::resize_actions::desired_resources;
use super::runtime_pod::{
    ContainerResources, ContainerState, ContainerStatus, RuntimePodStatus, SandboxState,
};

/// Pod phases, as the API spells them.
pub mod phase {
    pub const PENDING: &str = "Pending";
    pub const RUNNING: &str = "Running";
    pub const SUCCEEDED: &str = "Succeeded";
    pub const FAILED: &str = "Failed";
}

/// Why a container is waiting, when the runtime alone cannot say (image pull failures,
/// back-off): filled in by the pipeline, keyed by container name.
pub type WaitingReasons = std::collections::BTreeMap<String, (String, String)>;

pub fn generate_api_pod_status(
    pod: &Pod,
    runtime: &RuntimePodStatus,
    waiting: &WaitingReasons,
    probes: &ProbeResults,
    host_ip: &str,
    resize_pending: Option<&(String, String)>,
) -> PodStatus {
    let spec = pod.spec.as_ref();
    let init: &[Container] = spec
        .and_then(|s| s.init_containers.as_deref())
        .unwrap_or_default();
    let regular: &[Container] = spec.map(|s| &s.containers[..]).unwrap_or_default();

    let init_statuses: Vec<_> = init
        .iter()
        .map(|c| container_status(pod, c, true, runtime, waiting, probes))
        .collect();
    let statuses: Vec<_> = regular
        .iter()
        .map(|c| container_status(pod, c, false, runtime, waiting, probes))
        .collect();

    let sandbox_ready = runtime
        .newest_sandbox()
        .is_some_and(|s| s.state == SandboxState::Ready);
    let has_initialized = any_regular_container_started(&statuses);
    let initialized = pod_initialized(init, &init_statuses, has_initialized);
    // Sidecars count towards readiness beside the regular containers.
    let containers_ready = !statuses.is_empty()
        && statuses.iter().all(|s| s.ready)
        && init
            .iter()
            .zip(&init_statuses)
            .filter(|(c, _)| is_restartable_init_container(c))
            .all(|(_, s)| s.ready);
    let phase = pod_phase(pod, &init_statuses, &statuses, has_initialized);

    let sandbox = runtime
        .newest_sandbox()
        .filter(|s| s.state == SandboxState::Ready);
    let mut pod_ips: Vec<PodIP> = Vec::new();
    let host_network = spec.and_then(|s| s.host_network).unwrap_or(false);
    if host_network && sandbox.is_some() && !host_ip.is_empty() {
        // A hostNetwork pod's IP is the node's, as kubelet reports it.
        pod_ips.push(PodIP {
            ip: host_ip.to_string(),
        });
    } else if let Some(s) = sandbox.filter(|s| !s.ip.is_empty()) {
        pod_ips.push(PodIP { ip: s.ip.clone() });
        pod_ips.extend(s.additional_ips.iter().map(|ip| PodIP { ip: ip.clone() }));
    }
    let mut conditions = vec![
        condition("PodReadyToStartContainers", sandbox_ready),
        condition("Initialized", initialized),
        condition("ContainersReady", containers_ready),
        condition("Ready", containers_ready),
    ];
    if let Some((reason, message)) = resize_pending {
        conditions.push(PodCondition {
            reason: Some(reason.clone()),
            message: Some(message.clone()),
            ..condition("PodResizePending", true)
        });
    }
    if resize_in_progress(init.iter().chain(regular), runtime) {
        conditions.push(condition("PodResizeInProgress", true));
    }
    PodStatus {
        phase: Some(phase.to_string()),
        pod_ip: pod_ips.first().map(|p| p.ip.clone()),
        pod_ips: (!pod_ips.is_empty()).then_some(pod_ips),
        conditions: Some(conditions),
        init_container_statuses: (!init_statuses.is_empty()).then_some(init_statuses),
        container_statuses: Some(statuses),
        host_ip: (!host_ip.is_empty()).then(|| host_ip.to_string()),
        qos_class: None,
        ..PodStatus::default()
    }
}

/// A running container whose applied resources are not yet its allocation.
fn resize_in_progress<'a>(
    containers: impl Iterator<Item = &'a Container>,
    runtime: &RuntimePodStatus,
) -> bool {
    containers
        .filter_map(|c| Some((c, runtime.container(&c.name)?)))
        .filter(|(_, st)| st.state == ContainerState::Running)
        .any(|(c, st)| st.resources.is_some_and(|r| r != desired_resources(c)))
}

/// Resources as the API shows them: the non-zero ones, CPU in millicores.
fn api_resources(r: &ContainerResources) -> ResourceRequirements {
    let list = |cpu: i64, mem: i64| {
        let mut m = BTreeMap::new();
        if cpu > 0 {
            m.insert("cpu".to_string(), Quantity(format!("{cpu}m")));
        }
        if mem > 0 {
            m.insert("memory".to_string(), Quantity(mem.to_string()));
        }
        (!m.is_empty()).then_some(m)
    };
    ResourceRequirements {
        requests: list(r.cpu_request_milli, r.memory_request),
        limits: list(r.cpu_limit_milli, r.memory_limit),
        ..ResourceRequirements::default()
    }
}

fn condition(kind: &str, ok: bool) -> PodCondition {
    PodCondition {
        type_: kind.to_string(),
        status: if ok { "True" } else { "False" }.to_string(),
        ..PodCondition::default()
    }
}

fn terminated_with(s: &ApiContainerStatus, f: impl Fn(i32) -> bool) -> bool {
    s.state
        .as_ref()
        .and_then(|st| st.terminated.as_ref())
        .is_some_and(|t| f(t.exit_code))
}

fn container_status(
    pod: &Pod,
    c: &Container,
    is_init: bool,
    runtime: &RuntimePodStatus,
    waiting: &WaitingReasons,
    probes: &ProbeResults,
) -> ApiContainerStatus {
    let current = runtime.container(&c.name);
    let previous = runtime
        .containers
        .iter()
        .filter(|s| s.name == c.name)
        .nth(1);
    let waiting_state = |reason: &str, message: &str| ApiState {
        waiting: Some(ContainerStateWaiting {
            reason: Some(reason.to_string()),
            message: (!message.is_empty()).then(|| message.to_string()),
        }),
        ..ApiState::default()
    };
    let mut last_state = previous.map(terminated_state);
    let is_running = current.is_some_and(|s| s.state == ContainerState::Running);
    let reason = waiting.get(&c.name).filter(|_| !is_running);
    let state = match (current, reason) {
        (_, Some((reason, message))) => {
            if let Some(cur) = current.filter(|s| s.state == ContainerState::Exited) {
                last_state = Some(terminated_state(cur));
            }
            waiting_state(reason, message)
        }
        (None, None) => waiting_state("ContainerCreating", ""),
        (Some(st), None) => match st.state {
            ContainerState::Running => ApiState {
                running: Some(ContainerStateRunning { started_at: None }),
                ..ApiState::default()
            },
            ContainerState::Exited if will_restart(pod, c, is_init, st, runtime) => {
                last_state = Some(terminated_state(st));
                waiting_state("ContainerCreating", "")
            }
            ContainerState::Exited => terminated_state(st),
            ContainerState::Created | ContainerState::Unknown => {
                waiting_state("ContainerCreating", "")
            }
        },
    };
    let running = state.running.is_some();
    let id = current.map(|s| s.id.as_str()).unwrap_or_default();
    ApiContainerStatus {
        name: c.name.clone(),
        image: c.image.clone().unwrap_or_default(),
        image_id: current.map(|s| s.image_ref.clone()).unwrap_or_default(),
        container_id: current.map(|s| api_container_id(&s.id)),
        ready: running && probes.is_ready(id),
        // With a startup probe, started once the probe succeeded; without, once running.
        started: Some(
            running
                && if c.startup_probe.is_some() {
                    probes.startup(id) == Some(ProbeResult::Success)
                } else {
                    !probes.not_started.contains(id)
                },
        ),
        restart_count: current.map(|s| s.restart_count as i32).unwrap_or(0),
        state: Some(state),
        last_state,
        // The allocation (requests, as kubelet shows it) and what the runtime applied.
        allocated_resources: c
            .resources
            .as_ref()
            .and_then(|r| r.requests.clone())
            .filter(|r| !r.is_empty()),
        resources: current
            .filter(|s| s.state == ContainerState::Running)
            .and_then(|s| s.resources.as_ref())
            .map(api_resources),
        ..ApiContainerStatus::default()
    }
}

/// Whether an exited container is going to run again. An init container that succeeded is
/// done; one that failed reruns unless the policy is Never.
fn will_restart(
    pod: &Pod,
    c: &Container,
    is_init: bool,
    st: &ContainerStatus,
    runtime: &RuntimePodStatus,
) -> bool {
    if !is_init {
        return should_container_be_restarted(pod, c, runtime);
    }
    if is_restartable_init_container(c) {
        return pod.metadata.deletion_timestamp.is_none();
    }
    let policy = pod
        .spec
        .as_ref()
        .and_then(|s| s.restart_policy.as_deref())
        .unwrap_or("Always");
    st.exit_code != 0 && policy != "Never" && pod.metadata.deletion_timestamp.is_none()
}

fn terminated_state(st: &ContainerStatus) -> ApiState {
    ApiState {
        terminated: Some(ContainerStateTerminated {
            exit_code: st.exit_code,
            reason: Some(if st.reason.is_empty() {
                if st.exit_code == 0 {
                    "Completed"
                } else {
                    "Error"
                }
                .to_string()
            } else {
                st.reason.clone()
            }),
            message: (!st.message.is_empty()).then(|| st.message.clone()),
            container_id: Some(api_container_id(&st.id)),
            ..ContainerStateTerminated::default()
        }),
        ..ApiState::default()
    }
}

/// True when a regular container has run (is running, or has terminated once): the pod
/// initialized at some point, even if a sidecar is restarting now.
fn any_regular_container_started(regular: &[ApiContainerStatus]) -> bool {
    regular.iter().any(|s| {
        s.state
            .as_ref()
            .is_some_and(|st| st.running.is_some() || st.terminated.is_some())
            || s.last_state
                .as_ref()
                .is_some_and(|l| l.terminated.is_some())
    })
}

/// kubelet's Initialized condition: every ordinary init container succeeded and every
/// sidecar has started (its startup probe, if any, succeeded), or a regular container
/// already ran.
fn pod_initialized(
    init: &[Container],
    statuses: &[ApiContainerStatus],
    has_initialized: bool,
) -> bool {
    let incomplete = init.iter().zip(statuses).any(|(c, s)| {
        if is_restartable_init_container(c) {
            s.started != Some(true)
        } else {
            !terminated_with(s, |code| code == 0)
        }
    });
    !incomplete || has_initialized
}

fn is_waiting_after_exit(s: &ApiContainerStatus) -> bool {
    s.state.as_ref().is_some_and(|st| st.waiting.is_some())
        && s.last_state
            .as_ref()
            .is_some_and(|l| l.terminated.is_some())
}

/// kubelet's getPhase over the init and regular container statuses. Sidecars keep a pod
/// Pending until they have started, unless it initialized before; an exited sidecar does
/// not count.
fn pod_phase(
    pod: &Pod,
    init: &[ApiContainerStatus],
    regular: &[ApiContainerStatus],
    has_initialized: bool,
) -> &'static str {
    let spec = pod.spec.as_ref();
    let policy = spec
        .and_then(|s| s.restart_policy.as_deref())
        .unwrap_or("Always");
    let init_specs: &[Container] = spec
        .and_then(|s| s.init_containers.as_deref())
        .unwrap_or_default();

    let (mut pending_init, mut pending_sidecars, mut failed_init) = (0, 0, 0);
    let (mut unknown, mut running, mut waiting, mut stopped, mut succeeded) = (0, 0, 0, 0, 0);
    for (c, s) in init_specs.iter().zip(init) {
        let st = s.state.as_ref();
        if is_restartable_init_container(c) {
            if st.is_some_and(|st| st.running.is_some()) {
                if s.started != Some(true) {
                    pending_sidecars += 1;
                }
                running += 1;
            } else if st.is_some_and(|st| st.terminated.is_some()) || is_waiting_after_exit(s) {
                // An exited sidecar does not change the phase.
            } else if st.is_some_and(|st| st.waiting.is_some()) {
                pending_sidecars += 1;
                waiting += 1;
            } else {
                pending_sidecars += 1;
                unknown += 1;
            }
            continue;
        }
        if let Some(t) = st.and_then(|st| st.terminated.as_ref()) {
            if t.exit_code != 0 {
                failed_init += 1;
            }
        } else if let Some(t) = s
            .last_state
            .as_ref()
            .and_then(|l| l.terminated.as_ref())
            .filter(|_| st.is_some_and(|st| st.waiting.is_some()))
        {
            if t.exit_code != 0 {
                failed_init += 1;
            }
        } else {
            pending_init += 1;
        }
    }
    for s in regular {
        let st = s.state.as_ref();
        if st.is_some_and(|st| st.running.is_some()) {
            running += 1;
        } else if let Some(t) = st.and_then(|st| st.terminated.as_ref()) {
            stopped += 1;
            if t.exit_code == 0 {
                succeeded += 1;
            }
        } else if is_waiting_after_exit(s) {
            stopped += 1;
        } else if st.is_some_and(|st| st.waiting.is_some()) {
            waiting += 1;
        } else {
            unknown += 1;
        }
    }

    if failed_init > 0 && policy == "Never" {
        return phase::FAILED;
    }
    if pending_init > 0 || (pending_sidecars > 0 && !has_initialized) || waiting > 0 {
        return phase::PENDING;
    }
    if running > 0 && unknown == 0 {
        return phase::RUNNING;
    }
    if running == 0 && stopped > 0 && unknown == 0 {
        return match policy {
            "Always" => phase::RUNNING,
            _ if stopped == succeeded => phase::SUCCEEDED,
            "Never" => phase::FAILED,
            _ => phase::RUNNING,
        };
    }
    phase::PENDING
}

/// A runtime container ID as the API shows it: `containerd://<id>`.
pub fn api_container_id(id: &str) -> String {
    format!("containerd://{id}")
}

/// Every container status of a pod status, regular and init, for changing in place.
pub fn container_statuses_mut(
    status: &mut PodStatus,
) -> impl Iterator<Item = &mut ApiContainerStatus> {
    status
        .container_statuses
        .iter_mut()
        .flatten()
        .chain(status.init_container_statuses.iter_mut().flatten())
}

/// The runtime's container ID in an API `containerID` (`<runtime>://<id>`).
pub fn runtime_container_id(api_id: &str) -> &str {
    api_id.split_once("://").map_or(api_id, |(_, id)| id)
}
