//! canAdmitPod: whether a new pod may run on the node next to the pods already admitted,
//! with kubelet's admit handlers in their order (the predicate handler's OS checks and
//! supplemental-groups policy, then its general filter: room for the pod's requests and
//! the pod count, node affinity, free host ports; then AppArmor). The first check that
//! fails decides, with kubelet's reason and message.

use std::collections::BTreeSet;

use k8s_openapi::api::core::v1::{Container, Pod};
use serde::{Deserialize, Serialize};

use super::node_admission::{self, NodeFacts};
use super::quantity;

/// What the node offers to pods.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct NodeAllocatable {
    pub milli_cpu: i64,
    pub memory_bytes: i64,
    pub max_pods: usize,
}

/// A refused pod: it ends Failed with this reason and message.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Rejection {
    pub reason: String,
    pub message: String,
}

/// The pod's effective requests (kubelet's PodRequests): the sum over app containers,
/// or the largest init container if that is bigger. A limit without a request counts
/// as the request.
pub fn pod_requests(pod: &Pod) -> (i64, i64) {
    let Some(spec) = pod.spec.as_ref() else {
        return (0, 0);
    };
    let request = |c: &Container, name: &str, milli: bool| -> i64 {
        let res = c.resources.as_ref();
        let q = res
            .and_then(|r| r.requests.as_ref())
            .and_then(|m| m.get(name))
            .or_else(|| {
                res.and_then(|r| r.limits.as_ref())
                    .and_then(|m| m.get(name))
            });
        q.and_then(|q| {
            if milli {
                quantity::milli_value(q)
            } else {
                quantity::value(q)
            }
        })
        .unwrap_or(0)
    };
    let sum = |milli: bool, name: &str| -> i64 {
        let app: i64 = spec
            .containers
            .iter()
            .map(|c| request(c, name, milli))
            .sum();
        let init = spec
            .init_containers
            .iter()
            .flatten()
            .map(|c| request(c, name, milli))
            .max()
            .unwrap_or(0);
        app.max(init)
    };
    (sum(true, "cpu"), sum(false, "memory"))
}

type HostPort = (String, String, i32);

fn host_ports(pod: &Pod) -> BTreeSet<HostPort> {
    pod.spec
        .iter()
        .flat_map(|s| {
            s.containers
                .iter()
                .chain(s.init_containers.iter().flatten())
        })
        .flat_map(|c| c.ports.iter().flatten())
        .filter(|p| p.host_port.unwrap_or(0) > 0)
        .map(|p| {
            let ip = p
                .host_ip
                .clone()
                .filter(|ip| !ip.is_empty())
                .unwrap_or_else(|| "0.0.0.0".into());
            let proto = p.protocol.clone().unwrap_or_else(|| "TCP".into());
            (ip, proto, p.host_port.unwrap_or(0))
        })
        .collect()
}

fn ports_conflict(a: &HostPort, b: &HostPort) -> bool {
    a.1 == b.1 && a.2 == b.2 && (a.0 == b.0 || a.0 == "0.0.0.0" || b.0 == "0.0.0.0")
}

fn insufficient(resource: &str, requested: i64, used: i64, capacity: i64) -> Rejection {
    Rejection {
        reason: format!("OutOf{resource}"),
        message: format!(
            "Node didn't have enough resource: {resource}, requested: {requested}, used: {used}, capacity: {capacity}"
        ),
    }
}

/// Admits `pod` beside `admitted` on a node with `allocatable` and, when known, the
/// node's `facts` (labels, what the host and runtime enforce), in kubelet's order.
pub fn can_admit_pod(
    pod: &Pod,
    admitted: &[&Pod],
    allocatable: &NodeAllocatable,
    facts: Option<&NodeFacts>,
) -> Result<(), Rejection> {
    // The predicate handler: first what preemption could not help.
    node_admission::os_matches(pod)?;
    if let Some(facts) = facts {
        node_admission::supplemental_groups_policy(pod, facts)?;
    }
    // Its general filter (the scheduler's AdmissionCheck), first failure first.
    fits_resources(pod, admitted, allocatable)?;
    if let Some(facts) = facts {
        node_admission::node_affinity(pod, facts)?;
    }
    host_ports_free(pod, admitted)?;
    // The AppArmor admit handler comes after the predicate handler.
    if let Some(facts) = facts {
        node_admission::apparmor(pod, facts)?;
    }
    Ok(())
}

/// noderesources' Fits: the pod count, then CPU and memory by requests.
fn fits_resources(pod: &Pod, admitted: &[&Pod], node: &NodeAllocatable) -> Result<(), Rejection> {
    if admitted.len() + 1 > node.max_pods {
        return Err(insufficient(
            "pods",
            1,
            admitted.len() as i64,
            node.max_pods as i64,
        ));
    }
    let (cpu, mem) = pod_requests(pod);
    // A pod that requests nothing fits whatever the others use.
    if cpu <= 0 && mem <= 0 {
        return Ok(());
    }
    let (used_cpu, used_mem) = admitted
        .iter()
        .map(|p| pod_requests(p))
        .fold((0, 0), |(c, m), (pc, pm)| (c + pc, m + pm));
    if cpu > 0 && used_cpu + cpu > node.milli_cpu {
        return Err(insufficient("cpu", cpu, used_cpu, node.milli_cpu));
    }
    if mem > 0 && used_mem + mem > node.memory_bytes {
        return Err(insufficient("memory", mem, used_mem, node.memory_bytes));
    }
    Ok(())
}

/// nodeports' Fits: no host port the pod asks for is taken.
fn host_ports_free(pod: &Pod, admitted: &[&Pod]) -> Result<(), Rejection> {
    let wanted = host_ports(pod);
    // A pod that wants no host port conflicts with none.
    if wanted.is_empty() {
        return Ok(());
    }
    let taken: Vec<HostPort> = admitted.iter().flat_map(|p| host_ports(p)).collect();
    if let Some(p) = wanted
        .iter()
        .find(|w| taken.iter().any(|t| ports_conflict(w, t)))
    {
        return Err(Rejection {
            reason: "NodePorts".into(),
            message: format!(
                "node(s) didn't have free ports for the requested pod ports ({}/{} on {})",
                p.2, p.1, p.0
            ),
        });
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn pod(yaml: &str) -> Pod {
        serde_yaml::from_str(yaml).unwrap()
    }

    fn node() -> NodeAllocatable {
        NodeAllocatable {
            milli_cpu: 2000,
            memory_bytes: 1 << 30,
            max_pods: 3,
        }
    }

    const SMALL: &str = "metadata: {name: s}\nspec: {containers: [{name: a, resources: {requests: {cpu: 500m, memory: 100Mi}}}]}";

    #[test]
    fn admits_what_fits() {
        let a = pod(SMALL);
        assert_eq!(can_admit_pod(&pod(SMALL), &[&a, &a], &node(), None), Ok(()));
    }

    #[test]
    fn rejects_too_much_cpu_with_kubelets_reason() {
        let big = pod(
            "metadata: {name: b}\nspec: {containers: [{name: a, resources: {requests: {cpu: '3'}}}]}",
        );
        let r = can_admit_pod(&big, &[], &node(), None).unwrap_err();
        assert_eq!(r.reason, "OutOfcpu");
        assert_eq!(
            r.message,
            "Node didn't have enough resource: cpu, requested: 3000, used: 0, capacity: 2000"
        );
    }

    #[test]
    fn counts_used_resources_and_limits_as_requests() {
        let a = pod(SMALL);
        let m = pod(
            "metadata: {name: m}\nspec: {containers: [{name: a, resources: {limits: {memory: 900Mi}}}]}",
        );
        let r = can_admit_pod(&m, &[&a, &a], &node(), None).unwrap_err();
        assert_eq!(r.reason, "OutOfmemory");
    }

    #[test]
    fn init_containers_count_as_their_maximum() {
        let p = pod(
            "metadata: {name: i}\nspec: {initContainers: [{name: i, resources: {requests: {cpu: 1500m}}}], containers: [{name: a, resources: {requests: {cpu: 100m}}}]}",
        );
        assert_eq!(pod_requests(&p).0, 1500);
    }

    #[test]
    fn max_pods() {
        let a = pod(SMALL);
        let r = can_admit_pod(&pod(SMALL), &[&a, &a, &a], &node(), None).unwrap_err();
        assert_eq!(r.reason, "OutOfpods");
    }

    #[test]
    fn host_port_conflicts() {
        let a = pod(
            "metadata: {name: a}\nspec: {containers: [{name: a, ports: [{containerPort: 80, hostPort: 8080}]}]}",
        );
        let b = pod(
            "metadata: {name: b}\nspec: {containers: [{name: a, ports: [{containerPort: 81, hostPort: 8080}]}]}",
        );
        let udp = pod(
            "metadata: {name: c}\nspec: {containers: [{name: a, ports: [{containerPort: 81, hostPort: 8080, protocol: UDP}]}]}",
        );
        assert_eq!(
            can_admit_pod(&b, &[&a], &node(), None).unwrap_err().reason,
            "NodePorts"
        );
        assert_eq!(can_admit_pod(&udp, &[&a], &node(), None), Ok(()));
    }

    /// A pod failing several checks gets the reason of the first in kubelet's order:
    /// OS, supplemental groups, resources, node affinity, host ports, AppArmor.
    #[test]
    fn the_first_failing_check_in_kubelets_order_decides() {
        let facts = NodeFacts::new("node-a", "x86_64", &Default::default());
        let holder = pod(
            "metadata: {name: h}\nspec: {containers: [{name: a, ports: [{containerPort: 80, hostPort: 8080}]}]}",
        );
        // Each pod fails its own check and every later one.
        let apparmor = "{appArmorProfile: {type: RuntimeDefault}}";
        let port = "[{containerPort: 81, hostPort: 8080}]";
        let cases = [
            (
                "metadata: {name: p, labels: {kubernetes.io/os: windows}}\nspec: {securityContext: {supplementalGroupsPolicy: Strict}, nodeSelector: {disktype: hdd}, containers: [{name: a, resources: {requests: {cpu: '3'}}, ports: PORT, securityContext: AA}]}",
                "PodOSSelectorNodeLabelDoesNotMatch",
            ),
            (
                "metadata: {name: p}\nspec: {securityContext: {supplementalGroupsPolicy: Strict}, nodeSelector: {disktype: hdd}, containers: [{name: a, resources: {requests: {cpu: '3'}}, ports: PORT, securityContext: AA}]}",
                "SupplementalGroupsPolicyNotSupported",
            ),
            (
                "metadata: {name: p}\nspec: {nodeSelector: {disktype: hdd}, containers: [{name: a, resources: {requests: {cpu: '3'}}, ports: PORT, securityContext: AA}]}",
                "OutOfcpu",
            ),
            (
                "metadata: {name: p}\nspec: {nodeSelector: {disktype: hdd}, containers: [{name: a, ports: PORT, securityContext: AA}]}",
                "NodeAffinity",
            ),
            (
                "metadata: {name: p}\nspec: {containers: [{name: a, ports: PORT, securityContext: AA}]}",
                "NodePorts",
            ),
            (
                "metadata: {name: p}\nspec: {containers: [{name: a, securityContext: AA}]}",
                "AppArmor",
            ),
        ];
        for (yaml, reason) in cases {
            let p = pod(&yaml.replace("PORT", port).replace("AA", apparmor));
            let r = can_admit_pod(&p, &[&holder], &node(), Some(&facts)).expect_err(reason);
            assert_eq!(r.reason, reason, "{yaml}: {r:?}");
        }
    }
}
