//! QoS classes and the pod-level cgroup resources kubelet derives from a pod's spec:
//! `GetPodQOS` (pkg/apis/core/v1/helper/qos) and `ResourceConfigForPod`
//! (pkg/kubelet/cm/helpers_linux.go).
//!
//! Only `cpu` and `memory` count. A request the container leaves out defaults to its
//! limit, as API defaulting does before kubelet ever sees a pod; static manifests skip
//! the API server, so the defaulting happens here. Pod-level `spec.resources` is not
//! modelled (see ARCHITECTURE.md's deliberate differences).
//! Quantities that do not parse count as absent; manifest validation rejects them first.

use std::fmt;

use k8s_openapi::api::core::v1::{Container, Pod};
use k8s_openapi::apimachinery::pkg::api::resource::Quantity;
use serde::Serialize;

use super::quantity;

/// cpu.shares kubelet gives zero requests: the kernel's minimum, not its 1024 default.
pub const MIN_SHARES: u64 = 2;
/// The kernel's ceiling for cpu.shares.
pub const MAX_SHARES: u64 = 262_144;
const SHARES_PER_CPU: i64 = 1024;
const MILLI_CPU_TO_CPU: i64 = 1000;
/// kubelet's default `cpuCFSQuotaPeriod`: 100 ms.
pub const QUOTA_PERIOD_US: u64 = 100_000;
/// The smallest quota the kernel accepts: 1 ms.
pub const MIN_QUOTA_US: i64 = 1000;

/// A pod's quality-of-service class, spelled as the API spells it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize)]
pub enum QosClass {
    Guaranteed,
    Burstable,
    BestEffort,
}

impl QosClass {
    pub fn as_str(self) -> &'static str {
        match self {
            QosClass::Guaranteed => "Guaranteed",
            QosClass::Burstable => "Burstable",
            QosClass::BestEffort => "BestEffort",
        }
    }
}

impl fmt::Display for QosClass {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// The pod cgroup's settings; `None` leaves the kernel's value (no limit) in place.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize)]
pub struct PodResourceConfig {
    pub cpu_shares: Option<u64>,
    pub cpu_quota: Option<i64>,
    pub cpu_period: Option<u64>,
    pub memory_limit: Option<i64>,
}

/// kubelet's ComputePodQOS over init and regular containers alike.
///
/// kubelet's GetPodQOS first returns `status.qosClass` when set, because in-place resize
/// must not move a running pod between classes. podlapse refuses such a resize at
/// allocation (`resize.rs`, kubelet's Infeasible), so the class computed from the
/// allocated spec is the one recorded at admission.
pub fn pod_qos(pod: &Pod) -> QosClass {
    let Some(spec) = pod.spec.as_ref() else {
        return QosClass::BestEffort;
    };
    let mut requests = Compute::default();
    let mut limits = Compute::default();
    let mut guaranteed = true;
    for c in spec
        .containers
        .iter()
        .chain(spec.init_containers.iter().flatten())
    {
        let (req, lim) = (
            container_requests(c).positive(),
            container_limits(c).positive(),
        );
        requests = requests.add(req);
        limits = limits.add(lim);
        if lim.cpu.is_none() || lim.memory.is_none() {
            guaranteed = false;
        }
    }
    if requests.is_empty() && limits.is_empty() {
        return QosClass::BestEffort;
    }
    // Every container limited both resources, so `limits` holds both: equal Options
    // means the same resources requested and the same amounts.
    if guaranteed && requests == limits {
        QosClass::Guaranteed
    } else {
        QosClass::Burstable
    }
}

/// kubelet's ResourceConfigForPod with CFS quota enforced and the default period.
pub fn pod_resource_config(pod: &Pod) -> PodResourceConfig {
    let mut cpu_limits_declared = true;
    let mut memory_limits_declared = true;
    let limits = pod_total(pod, container_limits, Overhead::OnNonZero, |each| {
        if each.cpu.unwrap_or(0) == 0 {
            cpu_limits_declared = false;
        }
        if each.memory.unwrap_or(0) == 0 {
            memory_limits_declared = false;
        }
    });
    let requests = pod_requests(pod);
    let shares = milli_cpu_to_shares(requests.cpu.unwrap_or(0));
    let quota = milli_cpu_to_quota(limits.cpu.unwrap_or(0), QUOTA_PERIOD_US);
    let memory = limits.memory.unwrap_or(0);
    match pod_qos(pod) {
        QosClass::Guaranteed => PodResourceConfig {
            cpu_shares: Some(shares),
            cpu_quota: Some(quota),
            cpu_period: Some(QUOTA_PERIOD_US),
            memory_limit: Some(memory),
        },
        QosClass::Burstable => PodResourceConfig {
            cpu_shares: Some(shares),
            cpu_quota: cpu_limits_declared.then_some(quota),
            cpu_period: cpu_limits_declared.then_some(QUOTA_PERIOD_US),
            memory_limit: memory_limits_declared.then_some(memory),
        },
        QosClass::BestEffort => PodResourceConfig {
            cpu_shares: Some(MIN_SHARES),
            ..PodResourceConfig::default()
        },
    }
}

/// cpu.shares of the `burstable` QoS cgroup: the Burstable pods' CPU requests summed, as
/// kubelet's qosContainerManager sets them on every update so that tier competes with
/// Guaranteed pods in proportion to what it asked for.
pub fn burstable_cpu_shares<'a>(pods: impl IntoIterator<Item = &'a Pod>) -> u64 {
    let milli = pods
        .into_iter()
        .filter(|p| pod_qos(p) == QosClass::Burstable)
        .map(|p| pod_requests(p).cpu.unwrap_or(0))
        .sum();
    milli_cpu_to_shares(milli)
}

/// kubelet's MilliCPUToShares.
pub fn milli_cpu_to_shares(milli: i64) -> u64 {
    if milli <= 0 {
        return MIN_SHARES;
    }
    let shares = milli.saturating_mul(SHARES_PER_CPU) / MILLI_CPU_TO_CPU;
    (shares.max(0) as u64).clamp(MIN_SHARES, MAX_SHARES)
}

/// kubelet's MilliCPUToQuota: 0 (no quota) for no limit, never below 1 ms otherwise.
pub fn milli_cpu_to_quota(milli: i64, period_us: u64) -> i64 {
    if milli <= 0 {
        return 0;
    }
    let period = i64::try_from(period_us).unwrap_or(i64::MAX);
    (milli.saturating_mul(period) / MILLI_CPU_TO_CPU).max(MIN_QUOTA_US)
}

/// CPU in milli-CPU and memory in bytes; `None` where no container names the resource.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
struct Compute {
    cpu: Option<i64>,
    memory: Option<i64>,
}

impl Compute {
    fn of(list: Option<&std::collections::BTreeMap<String, Quantity>>) -> Compute {
        let get = |key: &str| list.and_then(|m| m.get(key));
        Compute {
            cpu: get("cpu").and_then(quantity::milli_value),
            memory: get("memory").and_then(quantity::value),
        }
    }

    fn add(self, other: Compute) -> Compute {
        let sum = |a: Option<i64>, b: Option<i64>| match (a, b) {
            (Some(a), Some(b)) => Some(a.saturating_add(b)),
            (a, b) => a.or(b),
        };
        Compute {
            cpu: sum(self.cpu, other.cpu),
            memory: sum(self.memory, other.memory),
        }
    }

    fn max(self, other: Compute) -> Compute {
        Compute {
            cpu: self.cpu.max(other.cpu),
            memory: self.memory.max(other.memory),
        }
    }

    /// Only amounts above zero, as ComputePodQOS counts them.
    fn positive(self) -> Compute {
        Compute {
            cpu: self.cpu.filter(|v| *v > 0),
            memory: self.memory.filter(|v| *v > 0),
        }
    }

    fn is_empty(self) -> bool {
        self.cpu.is_none() && self.memory.is_none()
    }
}

fn container_limits(c: &Container) -> Compute {
    Compute::of(c.resources.as_ref().and_then(|r| r.limits.as_ref()))
}

/// Requests after API defaulting: a resource with a limit and no request requests its
/// limit.
fn container_requests(c: &Container) -> Compute {
    let requests = Compute::of(c.resources.as_ref().and_then(|r| r.requests.as_ref()));
    let limits = container_limits(c);
    Compute {
        cpu: requests.cpu.or(limits.cpu),
        memory: requests.memory.or(limits.memory),
    }
}

fn pod_requests(pod: &Pod) -> Compute {
    pod_total(pod, container_requests, Overhead::Always, |_| {})
}

/// How `spec.overhead` joins a total: requests always carry it, limits only where some
/// container set a non-zero limit (an unlimited resource stays unlimited).
#[derive(Clone, Copy)]
enum Overhead {
    Always,
    OnNonZero,
}

/// kubelet's PodRequests / PodLimits without pod-level resources: regular containers and
/// restartable (sidecar) init containers run together and add up; each ordinary init
/// container runs beside the sidecars started before it, and the pod needs the larger of
/// the steady state and the largest init step. `each` sees every container's contribution
/// as kubelet's ContainerFn does, init containers with their sidecars included.
fn pod_total(
    pod: &Pod,
    of: fn(&Container) -> Compute,
    overhead: Overhead,
    mut each: impl FnMut(Compute),
) -> Compute {
    let Some(spec) = pod.spec.as_ref() else {
        return Compute::default();
    };
    let mut total = Compute::default();
    for c in &spec.containers {
        let v = of(c);
        each(v);
        total = total.add(v);
    }
    let mut sidecars = Compute::default();
    let mut init_peak = Compute::default();
    for c in spec.init_containers.iter().flatten() {
        let v = of(c);
        let step = if c.restart_policy.as_deref() == Some("Always") {
            total = total.add(v);
            sidecars = sidecars.add(v);
            sidecars
        } else {
            v.add(sidecars)
        };
        each(step);
        init_peak = init_peak.max(step);
    }
    total = total.max(init_peak);
    let extra = Compute::of(spec.overhead.as_ref());
    match overhead {
        Overhead::Always => total.add(extra),
        Overhead::OnNonZero => Compute {
            cpu: total.cpu.map(|v| {
                if v == 0 {
                    v
                } else {
                    v.saturating_add(extra.cpu.unwrap_or(0))
                }
            }),
            memory: total.memory.map(|v| {
                if v == 0 {
                    v
                } else {
                    v.saturating_add(extra.memory.unwrap_or(0))
                }
            }),
        },
    }
}

#[cfg(test)]
mod tests {
    use std::collections::BTreeMap;

    use k8s_openapi::api::core::v1::{PodSpec, ResourceRequirements};

    use super::*;

    /// `"cpu=100m,memory=1Gi"` as a resource list; `""` for none at all.
    fn list(s: &str) -> Option<BTreeMap<String, Quantity>> {
        if s.is_empty() {
            return None;
        }
        Some(
            s.split(',')
                .map(|kv| {
                    let (k, v) = kv.split_once('=').expect("name=quantity");
                    (k.to_string(), Quantity(v.to_string()))
                })
                .collect(),
        )
    }

    fn c(name: &str, requests: &str, limits: &str) -> Container {
        Container {
            name: name.into(),
            resources: Some(ResourceRequirements {
                requests: list(requests),
                limits: list(limits),
                ..Default::default()
            }),
            ..Default::default()
        }
    }

    fn sidecar(name: &str, requests: &str, limits: &str) -> Container {
        Container {
            restart_policy: Some("Always".into()),
            ..c(name, requests, limits)
        }
    }

    fn pod(containers: Vec<Container>, init: Vec<Container>) -> Pod {
        Pod {
            spec: Some(PodSpec {
                containers,
                init_containers: (!init.is_empty()).then_some(init),
                ..Default::default()
            }),
            ..Default::default()
        }
    }

    #[test]
    fn qos_class_table() {
        use QosClass::*;
        let cases: Vec<(&str, Pod, QosClass)> = vec![
            (
                "no resources",
                pod(vec![c("a", "", "")], vec![]),
                BestEffort,
            ),
            (
                "only other resources",
                pod(vec![c("a", "nvidia.com/gpu=1", "nvidia.com/gpu=1")], vec![]),
                BestEffort,
            ),
            (
                "zero requests count as none",
                pod(vec![c("a", "cpu=0,memory=0", "")], vec![]),
                BestEffort,
            ),
            (
                "limits only: requests default to them",
                pod(vec![c("a", "", "cpu=100m,memory=100Mi")], vec![]),
                Guaranteed,
            ),
            (
                "requests equal limits",
                pod(
                    vec![
                        c("a", "cpu=100m,memory=100Mi", "cpu=100m,memory=100Mi"),
                        c("b", "cpu=1,memory=1Gi", "cpu=1,memory=1Gi"),
                    ],
                    vec![],
                ),
                Guaranteed,
            ),
            (
                "equal quantities spelled differently",
                pod(
                    vec![c("a", "cpu=0.5,memory=1Gi", "cpu=500m,memory=1024Mi")],
                    vec![],
                ),
                Guaranteed,
            ),
            (
                "cpu limit only",
                pod(vec![c("a", "", "cpu=100m")], vec![]),
                Burstable,
            ),
            (
                "request below limit",
                pod(
                    vec![c("a", "cpu=50m,memory=100Mi", "cpu=100m,memory=100Mi")],
                    vec![],
                ),
                Burstable,
            ),
            (
                "one container without limits",
                pod(
                    vec![c("a", "", "cpu=100m,memory=100Mi"), c("b", "", "")],
                    vec![],
                ),
                Burstable,
            ),
            (
                "requests only",
                pod(vec![c("a", "memory=10Mi", "")], vec![]),
                Burstable,
            ),
            (
                "init container without limits spoils Guaranteed",
                pod(
                    vec![c("a", "", "cpu=100m,memory=100Mi")],
                    vec![c("init", "", "")],
                ),
                Burstable,
            ),
            (
                "init container with requests makes BestEffort Burstable",
                pod(vec![c("a", "", "")], vec![c("init", "cpu=10m", "")]),
                Burstable,
            ),
            (
                "init containers limited too",
                pod(
                    vec![c("a", "", "cpu=100m,memory=100Mi")],
                    vec![c("init", "", "cpu=1,memory=1Gi")],
                ),
                Guaranteed,
            ),
            ("no spec", Pod::default(), BestEffort),
        ];
        for (name, pod, want) in cases {
            assert_eq!(pod_qos(&pod), want, "{name}");
        }
    }

    #[test]
    fn qos_class_spelling() {
        assert_eq!(QosClass::BestEffort.to_string(), "BestEffort");
        assert_eq!(
            serde_json::to_string(&QosClass::Guaranteed).unwrap(),
            "\"Guaranteed\""
        );
    }

    #[test]
    fn resource_config_table() {
        let cfg = |shares, quota: Option<i64>, memory: Option<i64>| PodResourceConfig {
            cpu_shares: Some(shares),
            cpu_quota: quota,
            cpu_period: quota.map(|_| QUOTA_PERIOD_US),
            memory_limit: memory,
        };
        let mi = 1024 * 1024;
        let cases: Vec<(&str, Pod, PodResourceConfig)> = vec![
            (
                "best effort gets the minimum shares and nothing else",
                pod(vec![c("a", "", ""), c("b", "", "")], vec![]),
                cfg(2, None, None),
            ),
            (
                "guaranteed sums both containers",
                pod(
                    vec![
                        c("a", "", "cpu=100m,memory=100Mi"),
                        c("b", "", "cpu=200m,memory=50Mi"),
                    ],
                    vec![],
                ),
                cfg(307, Some(30_000), Some(150 * mi)),
            ),
            (
                "burstable with every limit declared",
                pod(
                    vec![c("a", "cpu=100m,memory=10Mi", "cpu=1,memory=100Mi")],
                    vec![],
                ),
                cfg(102, Some(100_000), Some(100 * mi)),
            ),
            (
                "burstable: one container without a cpu limit drops the quota",
                pod(
                    vec![
                        c("a", "cpu=100m", "cpu=1,memory=100Mi"),
                        c("b", "cpu=100m", "memory=20Mi"),
                    ],
                    vec![],
                ),
                cfg(204, None, Some(120 * mi)),
            ),
            (
                "burstable: one container without a memory limit drops the limit",
                pod(
                    vec![
                        c("a", "cpu=250m", "cpu=500m,memory=100Mi"),
                        c("b", "cpu=250m", "cpu=500m"),
                    ],
                    vec![],
                ),
                cfg(512, Some(100_000), None),
            ),
            (
                "requests only",
                pod(vec![c("a", "cpu=1500m,memory=10Mi", "")], vec![]),
                cfg(1536, None, None),
            ),
            (
                "tiny limit: quota never below 1 ms",
                pod(vec![c("a", "", "cpu=1m,memory=4Mi")], vec![]),
                cfg(2, Some(1000), Some(4 * mi)),
            ),
            (
                "init container larger than the app sets the pod's needs",
                pod(
                    vec![c("a", "", "cpu=100m,memory=100Mi")],
                    vec![c("init", "", "cpu=2,memory=1Gi")],
                ),
                cfg(2048, Some(200_000), Some(1024 * mi)),
            ),
            (
                "init container smaller than the app does not matter",
                pod(
                    vec![c("a", "", "cpu=1,memory=1Gi")],
                    vec![c("init", "", "cpu=100m,memory=10Mi")],
                ),
                cfg(1024, Some(100_000), Some(1024 * mi)),
            ),
            (
                "init container without limits drops the pod's limits",
                pod(
                    vec![c("a", "", "cpu=1,memory=1Gi")],
                    vec![c("init", "cpu=10m", "")],
                ),
                cfg(1024, None, None),
            ),
            (
                "sidecar adds to the app and to later init containers",
                pod(
                    vec![c("a", "", "cpu=500m,memory=100Mi")],
                    vec![
                        sidecar("proxy", "", "cpu=250m,memory=50Mi"),
                        c("init", "", "cpu=1,memory=100Mi"),
                    ],
                ),
                // steady state 750m/150Mi; init step 1250m/150Mi
                cfg(1280, Some(125_000), Some(150 * mi)),
            ),
        ];
        for (name, pod, want) in cases {
            assert_eq!(pod_resource_config(&pod), want, "{name}");
        }
    }

    #[test]
    fn overhead_joins_requests_and_nonzero_limits() {
        let mut p = pod(vec![c("a", "cpu=100m", "memory=100Mi")], vec![]);
        p.spec.as_mut().unwrap().overhead = list("cpu=50m,memory=10Mi");
        let got = pod_resource_config(&p);
        assert_eq!(got.cpu_shares, Some(milli_cpu_to_shares(100 + 50)));
        // No cpu limit anywhere: overhead must not invent one.
        assert_eq!(got.cpu_quota, None);
        assert_eq!(got.memory_limit, Some(110 * 1024 * 1024));
    }

    #[test]
    fn burstable_tier_shares() {
        let pods = [
            pod(vec![c("a", "cpu=100m", "")], vec![]),
            pod(vec![c("b", "cpu=400m,memory=1Mi", "")], vec![]),
            pod(vec![c("g", "", "cpu=1,memory=1Gi")], vec![]),
            pod(vec![c("be", "", "")], vec![]),
        ];
        assert_eq!(burstable_cpu_shares(&pods), 512);
        assert_eq!(burstable_cpu_shares(&pods[2..]), MIN_SHARES);
    }

    #[test]
    fn conversions() {
        assert_eq!(milli_cpu_to_shares(0), 2);
        assert_eq!(milli_cpu_to_shares(1), 2);
        assert_eq!(milli_cpu_to_shares(1000), 1024);
        assert_eq!(milli_cpu_to_shares(1_000_000), MAX_SHARES);
        assert_eq!(milli_cpu_to_quota(0, QUOTA_PERIOD_US), 0);
        assert_eq!(milli_cpu_to_quota(5, QUOTA_PERIOD_US), 1000);
        assert_eq!(milli_cpu_to_quota(1500, QUOTA_PERIOD_US), 150_000);
    }
}
