//! kubelet's TestComputePodActionsForPodResize, ported case by case with kubelet's case
//! names. kubelet's base pod (foo1..foo3 running) with every container's resize policy
//! NotRequired for CPU and memory unless a case says otherwise; a case sets one
//! container's desired resources in its spec and what the runtime last applied
//! (podlapse's actuated resources) in its status.

use std::collections::BTreeMap;

use k8s_openapi::api::core::v1::{ContainerResizePolicy, Pod, ResourceRequirements};
use k8s_openapi::apimachinery::pkg::api::resource::Quantity;

use super::pod_actions::{ContainerUpdate, KillReason, PodActions, compute_pod_actions};
use super::pod_actions_tests::{base_pod, base_status, keep};
use super::probe_results::ProbeResults;
use super::resize_actions::ResourceName;
use super::runtime_pod::{ContainerResources, RuntimePodStatus};

const MI: i64 = 1 << 20;

/// (cpu request m, cpu limit m, memory request, memory limit); 0 is unset.
type Res = (i64, i64, i64, i64);

fn resources(r: Res) -> ContainerResources {
    ContainerResources {
        cpu_request_milli: r.0,
        cpu_limit_milli: r.1,
        memory_request: r.2,
        memory_limit: r.3,
    }
}

fn requirements(r: Res) -> ResourceRequirements {
    let list = |cpu: i64, mem: i64| {
        let mut m = BTreeMap::new();
        if cpu != 0 {
            m.insert("cpu".to_string(), Quantity(format!("{cpu}m")));
        }
        if mem != 0 {
            m.insert("memory".to_string(), Quantity(format!("{}Mi", mem / MI)));
        }
        (!m.is_empty()).then_some(m)
    };
    ResourceRequirements {
        requests: list(r.0, r.2),
        limits: list(r.1, r.3),
        ..ResourceRequirements::default()
    }
}

fn policy(resource: &str, restart: bool) -> ContainerResizePolicy {
    ContainerResizePolicy {
        resource_name: resource.into(),
        restart_policy: if restart {
            "RestartContainer"
        } else {
            "NotRequired"
        }
        .into(),
    }
}

/// One case: which container, its restart-required resources, spec and status.
struct Setup {
    index: usize,
    restart: &'static [&'static str],
    desired: Res,
    actual: Res,
}

fn prepare(s: &Setup) -> (Pod, RuntimePodStatus) {
    let mut pod = base_pod();
    for c in &mut pod.spec.as_mut().unwrap().containers {
        c.resize_policy = Some(vec![policy("cpu", false), policy("memory", false)]);
    }
    let c = &mut pod.spec.as_mut().unwrap().containers[s.index];
    c.resize_policy = Some(vec![
        policy("cpu", s.restart.contains(&"cpu")),
        policy("memory", s.restart.contains(&"memory")),
    ]);
    c.resources = Some(requirements(s.desired));
    let name = c.name.clone();
    let mut st = base_status(&pod);
    let cs = st.containers.iter_mut().find(|c| c.name == name).unwrap();
    cs.resources = Some(resources(s.actual));
    (pod, st)
}

fn update(index: usize, desired: Res, current: Res) -> ContainerUpdate {
    let name = format!("foo{}", index + 1);
    ContainerUpdate {
        container_id: format!("id-{name}-200"),
        name,
        init: false,
        index,
        desired: resources(desired),
        current: resources(current),
    }
}

fn updates(list: &[(ResourceName, ContainerUpdate)]) -> PodActions {
    let mut a = keep("sb1");
    for (r, u) in list {
        a.containers_to_update
            .entry(*r)
            .or_default()
            .push(u.clone());
    }
    a
}

fn restart(index: usize) -> PodActions {
    let name = format!("foo{}", index + 1);
    PodActions {
        containers_to_start: vec![index],
        containers_to_kill: BTreeMap::from([(
            format!("id-{name}-200"),
            KillReason {
                name,
                message: String::new(),
            },
        )]),
        update_pod_resources: true,
        ..keep("sb1")
    }
}

#[test]
fn kubelets_test_compute_pod_actions_for_pod_resize() {
    use ResourceName::{Cpu, Memory};
    let cases: Vec<(&str, Setup, PodActions)> = vec![
        (
            "Update container CPU and memory resources",
            Setup {
                index: 1,
                restart: &[],
                desired: (0, 100, 0, 100 * MI),
                actual: (0, 200, 0, 200 * MI),
            },
            updates(&[
                (
                    Memory,
                    update(1, (0, 100, 0, 100 * MI), (0, 200, 0, 200 * MI)),
                ),
                (Cpu, update(1, (0, 100, 0, 100 * MI), (0, 200, 0, 200 * MI))),
            ]),
        ),
        (
            "Update container CPU resources",
            Setup {
                index: 1,
                restart: &[],
                desired: (0, 100, 0, 100 * MI),
                actual: (0, 200, 0, 100 * MI),
            },
            updates(&[(Cpu, update(1, (0, 100, 0, 100 * MI), (0, 200, 0, 100 * MI)))]),
        ),
        (
            "Update container memory resources",
            Setup {
                index: 2,
                restart: &[],
                desired: (0, 200, 0, 200 * MI),
                actual: (0, 200, 0, 100 * MI),
            },
            updates(&[(
                Memory,
                update(2, (0, 200, 0, 200 * MI), (0, 200, 0, 100 * MI)),
            )]),
        ),
        (
            "Nothing when spec.Resources and status.Resources are equal",
            Setup {
                index: 1,
                restart: &[],
                desired: (0, 200, 0, 0),
                actual: (0, 200, 0, 0),
            },
            keep("sb1"),
        ),
        (
            "Nothing when spec.Resources and status.Resources are equivalent",
            Setup {
                index: 1,
                restart: &[],
                desired: (0, 0, 0, 0),
                actual: (2, 0, 0, 0),
            },
            keep("sb1"),
        ),
        (
            "Update container CPU resources to equivalent value",
            Setup {
                index: 1,
                restart: &[],
                desired: (1, 1, 0, 0),
                actual: (2, 10, 0, 0),
            },
            keep("sb1"),
        ),
        (
            "Update container CPU and memory resources with Restart policy for CPU",
            Setup {
                index: 0,
                restart: &["cpu"],
                desired: (0, 200, 0, 200 * MI),
                actual: (0, 100, 0, 100 * MI),
            },
            restart(0),
        ),
        (
            "Update container CPU and memory resources with Restart policy for memory",
            Setup {
                index: 2,
                restart: &["memory"],
                desired: (0, 200, 0, 200 * MI),
                actual: (0, 100, 0, 100 * MI),
            },
            restart(2),
        ),
        (
            "Update container memory resources with Restart policy for CPU",
            Setup {
                index: 1,
                restart: &["cpu"],
                desired: (0, 100, 0, 200 * MI),
                actual: (0, 100, 0, 100 * MI),
            },
            updates(&[(
                Memory,
                update(1, (0, 100, 0, 200 * MI), (0, 100, 0, 100 * MI)),
            )]),
        ),
        (
            "Update container CPU resources with Restart policy for memory",
            Setup {
                index: 2,
                restart: &["memory"],
                desired: (0, 200, 0, 100 * MI),
                actual: (0, 100, 0, 100 * MI),
            },
            updates(&[(Cpu, update(2, (0, 200, 0, 100 * MI), (0, 100, 0, 100 * MI)))]),
        ),
    ];
    assert_eq!(cases.len(), 10, "every case of kubelet's table");
    let mut failures = Vec::new();
    for (name, setup, want) in cases {
        let (pod, st) = prepare(&setup);
        let mut got = compute_pod_actions(&pod, &st, &ProbeResults::default());
        for reason in got.containers_to_kill.values_mut() {
            reason.message.clear();
        }
        if got != want {
            failures.push(format!("{name}:\n  want {want:?}\n  got  {got:?}"));
        }
    }
    assert!(failures.is_empty(), "{}", failures.join("\n"));
}
