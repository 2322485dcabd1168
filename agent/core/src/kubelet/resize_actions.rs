//! kubelet's computePodResizeAction: a running container whose allocated resources differ
//! from the ones the runtime applied is resized in place (resizePolicy NotRequired, the
//! default) or restarted (RestartContainer). Pure.

use k8s_openapi::api::core::v1::{Container, Pod};
use serde::Serialize;

use super::pod_actions::{ContainerUpdate, PodActions, containers, init_containers};
use super::quantity::{milli_value, value};
use super::runtime_pod::{ContainerResources, ContainerState, ContainerStatus};

/// The resources an in-place resize changes, in the order kubelet applies them.
/// kubelet's cm.MinShares, compared with a CPU request in milli-CPU as kubelet does.
const MIN_SHARES_MILLI: i64 = 2;
/// kubelet's cm.MinMilliCPULimit: the smallest CPU limit a CFS quota expresses (1 ms per
/// 100 ms period).
const MIN_MILLI_CPU_LIMIT: i64 = 10;

#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Serialize)]
pub enum ResourceName {
    #[serde(rename = "memory")]
    Memory,
    #[serde(rename = "cpu")]
    Cpu,
}

impl ResourceName {
    pub fn as_str(self) -> &'static str {
        match self {
            ResourceName::Memory => "memory",
            ResourceName::Cpu => "cpu",
        }
    }
}

/// A container's resources as its spec (the pod's allocation) asks for them.
pub fn desired_resources(c: &Container) -> ContainerResources {
    let r = c.resources.as_ref();
    let get = |from: Option<&std::collections::BTreeMap<String, _>>, key: &str, milli: bool| {
        from.and_then(|m| m.get(key))
            .and_then(|q| if milli { milli_value(q) } else { value(q) })
            .unwrap_or(0)
    };
    let requests = r.and_then(|r| r.requests.as_ref());
    let limits = r.and_then(|r| r.limits.as_ref());
    ContainerResources {
        cpu_request_milli: get(requests, "cpu", true),
        cpu_limit_milli: get(limits, "cpu", true),
        memory_request: get(requests, "memory", false),
        memory_limit: get(limits, "memory", false),
    }
}

/// What the container's resizePolicy says for a resource: true when a change to it
/// restarts the container. Without a policy the default is NotRequired.
fn restart_required(c: &Container, resource: ResourceName) -> bool {
    c.resize_policy
        .iter()
        .flatten()
        .any(|p| p.resource_name == resource.as_str() && p.restart_policy == "RestartContainer")
}

/// Returns false when the container must be restarted for its resize (the kill is
/// recorded in `actions`; the caller schedules the start), true when it is kept, with
/// any in-place update recorded in `actions.containers_to_update`.
pub fn compute_pod_resize_action(
    pod: &Pod,
    index: usize,
    restartable_init: bool,
    st: &ContainerStatus,
    actions: &mut PodActions,
) -> bool {
    let list = if restartable_init {
        init_containers(pod)
    } else {
        containers(pod)
    };
    let Some(c) = list.get(index) else {
        return true;
    };
    if st.state != ContainerState::Running {
        return true;
    }
    // A missing record counts as nothing applied, as in kubelet: the update that follows
    // is idempotent.
    let current = st.resources.unwrap_or_default();
    let mut desired = desired_resources(c);
    // As kubelet: CPU requests both at or below the minimum shares, or CPU limits both at
    // or below the smallest quota the kernel enforces, are the same cgroup setting.
    if desired.cpu_request_milli <= MIN_SHARES_MILLI
        && current.cpu_request_milli <= MIN_SHARES_MILLI
    {
        desired.cpu_request_milli = current.cpu_request_milli;
    }
    if desired.cpu_limit_milli <= MIN_MILLI_CPU_LIMIT
        && current.cpu_limit_milli <= MIN_MILLI_CPU_LIMIT
    {
        desired.cpu_limit_milli = current.cpu_limit_milli;
    }
    if desired == current {
        return true;
    }

    let changes = [
        (
            ResourceName::Memory,
            desired.memory_limit,
            current.memory_limit,
        ),
        (
            ResourceName::Memory,
            desired.memory_request,
            current.memory_request,
        ),
        (
            ResourceName::Cpu,
            desired.cpu_limit_milli,
            current.cpu_limit_milli,
        ),
        (
            ResourceName::Cpu,
            desired.cpu_request_milli,
            current.cpu_request_milli,
        ),
    ];
    let restart = changes
        .iter()
        .any(|&(name, want, have)| want != have && restart_required(c, name));
    if restart {
        actions.kill(st, format!("Container {} resize requires restart", c.name));
        actions.update_pod_resources = true;
        return false;
    }

    let update = ContainerUpdate {
        name: c.name.clone(),
        container_id: st.id.clone(),
        init: restartable_init,
        index,
        desired,
        current,
    };
    // One update per resource: the limit's change decides the direction, else the
    // request's.
    for resource in [ResourceName::Memory, ResourceName::Cpu] {
        let Some(&(_, want, have)) = changes
            .iter()
            .find(|&&(name, want, have)| name == resource && want != have)
        else {
            continue;
        };
        let queue = actions.containers_to_update.entry(resource).or_default();
        // Decreases go first, so the pod never holds more than it is allowed meanwhile.
        if want < have {
            queue.insert(0, update.clone());
        } else {
            queue.push(update.clone());
        }
    }
    true
}
