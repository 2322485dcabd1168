//! In-place pod resize, allocation side (kubelet's allocation manager): a pod update that
//! changes container resources is allocated only if the node can hold it; otherwise the
//! pod keeps its current allocation and shows PodResizePending with kubelet's reason.
//! Pure: the caller keeps the allocations.

use k8s_openapi::api::core::v1::{Container, Pod};
use serde::Serialize;

use super::admission::{NodeAllocatable, pod_requests};
use super::qos::pod_qos;

/// kubelet's PodResizePending reasons.
pub const REASON_INFEASIBLE: &str = "Infeasible";
pub const REASON_DEFERRED: &str = "Deferred";

/// What to do with a pod update's resources.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub enum ResizeVerdict {
    /// The resources did not change.
    Unchanged,
    /// Allocated: the update goes through as it is.
    Accepted,
    /// Not allocated now: the pod keeps its allocation and shows PodResizePending with
    /// this reason (Infeasible: never fits the node; Deferred: may fit later).
    Pending { reason: String, message: String },
}

fn all_containers(pod: &Pod) -> impl Iterator<Item = &Container> {
    pod.spec.iter().flat_map(|s| {
        s.init_containers
            .iter()
            .flatten()
            .chain(s.containers.iter())
    })
}

/// True when some container's resources differ between the two pods.
pub fn resources_changed(a: &Pod, b: &Pod) -> bool {
    all_containers(a)
        .map(|c| (&c.name, &c.resources))
        .ne(all_containers(b).map(|c| (&c.name, &c.resources)))
}

/// `desired` with the container resources of `allocated`: an update whose resize is
/// pending still carries its other changes.
pub fn with_allocated_resources(desired: &Pod, allocated: &Pod) -> Pod {
    let mut pod = desired.clone();
    if let Some(spec) = pod.spec.as_mut() {
        let spec_containers = spec
            .init_containers
            .iter_mut()
            .flatten()
            .chain(spec.containers.iter_mut());
        for c in spec_containers {
            if let Some(old) = all_containers(allocated).find(|o| o.name == c.name) {
                c.resources = old.resources.clone();
            }
        }
    }
    pod
}

/// kubelet's handlePodResourcesResize decision for `desired` (an update of a pod now
/// allocated as `allocated`) beside the other pods' allocations.
pub fn admit_resize(
    desired: &Pod,
    allocated: &Pod,
    others: &[&Pod],
    node: &NodeAllocatable,
) -> ResizeVerdict {
    if !resources_changed(desired, allocated) {
        return ResizeVerdict::Unchanged;
    }
    let (from, to) = (pod_qos(allocated), pod_qos(desired));
    if from != to {
        return ResizeVerdict::Pending {
            reason: REASON_INFEASIBLE.into(),
            message: format!(
                "Pod QoS class may not change as a result of resizing: {} to {}",
                from.as_str(),
                to.as_str()
            ),
        };
    }
    let (cpu, mem) = pod_requests(desired);
    if cpu > node.milli_cpu {
        return pending_capacity(REASON_INFEASIBLE, "cpu", cpu, None, node.milli_cpu);
    }
    if mem > node.memory_bytes {
        return pending_capacity(REASON_INFEASIBLE, "memory", mem, None, node.memory_bytes);
    }
    let (used_cpu, used_mem) = others
        .iter()
        .map(|p| pod_requests(p))
        .fold((0, 0), |(c, m), (pc, pm)| (c + pc, m + pm));
    if cpu > 0 && used_cpu + cpu > node.milli_cpu {
        return pending_capacity(REASON_DEFERRED, "cpu", cpu, Some(used_cpu), node.milli_cpu);
    }
    if mem > 0 && used_mem + mem > node.memory_bytes {
        return pending_capacity(
            REASON_DEFERRED,
            "memory",
            mem,
            Some(used_mem),
            node.memory_bytes,
        );
    }
    ResizeVerdict::Accepted
}

fn pending_capacity(
    reason: &str,
    resource: &str,
    requested: i64,
    used: Option<i64>,
    capacity: i64,
) -> ResizeVerdict {
    let message = match used {
        None => format!(
            "Node didn't have enough capacity: {resource}, requested: {requested}, capacity: {capacity}"
        ),
        Some(used) => format!(
            "Node didn't have enough resource: {resource}, requested: {requested}, used: {used}, capacity: {capacity}"
        ),
    };
    ResizeVerdict::Pending {
        reason: reason.into(),
        message,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn pod(cpu_request: &str, cpu_limit: &str) -> Pod {
        serde_json::from_value(serde_json::json!({
            "metadata": {"name": "p"},
            "spec": {"containers": [{
                "name": "app",
                "image": "app:1",
                "resources": {
                    "requests": {"cpu": cpu_request, "memory": "64Mi"},
                    "limits": {"cpu": cpu_limit, "memory": "128Mi"},
                },
            }]},
        }))
        .unwrap()
    }

    fn node() -> NodeAllocatable {
        NodeAllocatable {
            milli_cpu: 2000,
            memory_bytes: 1 << 30,
            max_pods: 110,
        }
    }

    #[test]
    fn a_resize_that_fits_is_accepted() {
        let (old, new) = (pod("100m", "200m"), pod("100m", "500m"));
        assert_eq!(
            admit_resize(&old, &old, &[], &node()),
            ResizeVerdict::Unchanged
        );
        assert_eq!(
            admit_resize(&new, &old, &[], &node()),
            ResizeVerdict::Accepted
        );
    }

    #[test]
    fn beyond_the_node_is_infeasible_beside_others_deferred() {
        let old = pod("100m", "200m");
        let huge = pod("3", "3");
        assert_eq!(
            admit_resize(&huge, &old, &[], &node()),
            ResizeVerdict::Pending {
                reason: "Infeasible".into(),
                message: "Node didn't have enough capacity: cpu, requested: 3000, capacity: 2000"
                    .into()
            }
        );
        let big = pod("1500m", "1500m");
        let other = pod("1", "1");
        assert_eq!(
            admit_resize(&big, &old, &[&other], &node()),
            ResizeVerdict::Pending {
                reason: "Deferred".into(),
                message: "Node didn't have enough resource: cpu, requested: 1500, used: 1000, capacity: 2000".into()
            }
        );
    }

    #[test]
    fn a_pending_update_keeps_the_old_resources_and_its_other_changes() {
        let old = pod("100m", "200m");
        let mut new = pod("3", "3");
        new.spec.as_mut().unwrap().containers[0].image = Some("app:2".into());
        let merged = with_allocated_resources(&new, &old);
        assert_eq!(
            merged.spec.as_ref().unwrap().containers[0].image.as_deref(),
            Some("app:2")
        );
        assert!(!resources_changed(&merged, &old));
    }
}
