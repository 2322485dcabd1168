//! In-place pod resize on real containerd: a manifest's resources change follows each
//! container's resizePolicy. NotRequired updates the running container (same container,
//! new cgroup limit); RestartContainer restarts it with the new limit; a size the node
//! cannot hold stays pending with kubelet's reason and disturbs nothing.

use std::time::Duration;

use podlapse_tests::agent::{Agent, condition, container, container_pids, phase};
use podlapse_tests::require_lab;
use serde_json::{Value, json};

use xtask::lab::IMAGE_APP as APP;
const MINUTE: Duration = Duration::from_secs(60);

fn pod(web_cpu_limit: &str, web_cpu_request: &str, worker_memory_limit: &str) -> String {
    json!({
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": "sized"},
        "spec": {
            "terminationGracePeriodSeconds": 2,
            "containers": [
                {
                    "name": "web",
                    "image": APP,
                    "command": ["sleep", "3600"],
                    "resizePolicy": [{"resourceName": "cpu", "restartPolicy": "NotRequired"}],
                    "resources": {
                        "requests": {"cpu": web_cpu_request, "memory": "32Mi"},
                        "limits": {"cpu": web_cpu_limit, "memory": "64Mi"},
                    },
                },
                {
                    "name": "worker",
                    "image": APP,
                    "command": ["sleep", "3600"],
                    "resizePolicy": [{"resourceName": "memory", "restartPolicy": "RestartContainer"}],
                    "resources": {
                        "requests": {"cpu": "50m", "memory": "32Mi"},
                        "limits": {"cpu": "100m", "memory": worker_memory_limit},
                    },
                },
            ],
        },
    })
    .to_string()
}

/// The cgroup directory of a process for a controller (cgroup v1), or its unified
/// cgroup (v2), from /proc/<pid>/cgroup.
fn cgroup_file(pid: i32, v1_controller: &str, v1_file: &str, v2_file: &str) -> String {
    let text = std::fs::read_to_string(format!("/proc/{pid}/cgroup")).unwrap();
    for line in text.lines() {
        let mut parts = line.splitn(3, ':');
        let (_, controllers, path) = (parts.next(), parts.next().unwrap(), parts.next().unwrap());
        if controllers.split(',').any(|c| c == v1_controller) {
            let path = format!("/sys/fs/cgroup/{v1_controller}{path}/{v1_file}");
            return std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("{path}: {e}"));
        }
    }
    let path = text
        .lines()
        .find_map(|l| l.strip_prefix("0::"))
        .expect("a unified cgroup");
    let file = format!("/sys/fs/cgroup{path}/{v2_file}");
    std::fs::read_to_string(&file).unwrap_or_else(|e| panic!("{file}: {e}"))
}

fn main_pid(c: &Value) -> i32 {
    let pids = container_pids(c["containerID"].as_str().unwrap());
    *pids.iter().min().expect("the container has a process")
}

/// CPU quota in microseconds per 100 ms period.
fn cpu_quota(pid: i32) -> i64 {
    let v1 = cgroup_file(pid, "cpu", "cpu.cfs_quota_us", "cpu.max");
    v1.split_whitespace().next().unwrap().parse().unwrap()
}

fn memory_limit(pid: i32) -> i64 {
    cgroup_file(pid, "memory", "memory.limit_in_bytes", "memory.max")
        .trim()
        .parse()
        .unwrap()
}

fn resized(p: &Value) -> bool {
    condition(p, "PodResizeInProgress").is_none() && condition(p, "PodResizePending").is_none()
}

#[test]
fn resources_follow_each_containers_resize_policy() {
    require_lab();
    let agent = Agent::start("resize", &[]);
    agent.write("sized.yaml", &pod("200m", "100m", "64Mi"));
    let before = agent.wait_pod("sized", "Running", MINUTE, |p| {
        phase(p) == "Running" && container(p, "worker")["ready"] == true
    });
    let (web, worker) = (
        container(&before, "web").clone(),
        container(&before, "worker").clone(),
    );
    assert_eq!(cpu_quota(main_pid(&web)), 20_000);
    assert_eq!(web["resources"]["limits"]["cpu"], "200m", "{web:#}");

    // NotRequired: the CPU limit changes in place.
    agent.write("sized.yaml", &pod("400m", "100m", "64Mi"));
    let after = agent.wait_pod("sized", "web resized", MINUTE, |p| {
        container(p, "web")["resources"]["limits"]["cpu"] == "400m" && resized(p)
    });
    let web_after = container(&after, "web");
    assert_eq!(
        web_after["containerID"], web["containerID"],
        "web was restarted"
    );
    assert_eq!(web_after["restartCount"], 0);
    assert_eq!(
        cpu_quota(main_pid(web_after)),
        40_000,
        "the cgroup's new quota"
    );
    assert_eq!(
        container(&after, "worker")["containerID"],
        worker["containerID"]
    );
    let events = agent.events("sized");
    assert!(
        events.iter().all(|e| e["reason"] != "Killing"),
        "nothing was stopped for an in-place resize"
    );
    for reason in ["ResizeStarted", "ResizeCompleted"] {
        assert!(
            events.iter().any(|e| e["reason"] == reason),
            "no {reason} event: {events:#?}"
        );
    }

    // RestartContainer: the worker restarts with its new memory limit.
    agent.write("sized.yaml", &pod("400m", "100m", "96Mi"));
    let restarted = agent.wait_pod("sized", "worker restarted", MINUTE, |p| {
        container(p, "worker")["restartCount"] == 1
            && container(p, "worker")["state"]["running"].is_object()
            && resized(p)
    });
    let worker_after = container(&restarted, "worker");
    assert_ne!(worker_after["containerID"], worker["containerID"]);
    assert_eq!(memory_limit(main_pid(worker_after)), 96 << 20);
    assert_eq!(
        container(&restarted, "web")["containerID"],
        web["containerID"]
    );

    // More CPU than the node has: pending as Infeasible, nothing restarted.
    agent.write("sized.yaml", &pod("500", "500", "96Mi"));
    let pending = agent.wait_pod("sized", "resize pending", MINUTE, |p| {
        condition(p, "PodResizePending") == Some("True")
    });
    let cond = pending["status"]["conditions"]
        .as_array()
        .unwrap()
        .iter()
        .find(|c| c["type"] == "PodResizePending")
        .unwrap();
    assert_eq!(cond["reason"], "Infeasible", "{cond:#}");
    assert!(
        cond["message"]
            .as_str()
            .unwrap()
            .starts_with("Node didn't have enough capacity: cpu, requested: 500050, capacity: "),
        "{cond:#}"
    );
    assert_eq!(phase(&pending), "Running");
    let web_pending = container(&pending, "web");
    assert_eq!(web_pending["containerID"], web["containerID"]);
    assert_eq!(
        web_pending["allocatedResources"]["cpu"], "100m",
        "{web_pending:#}"
    );
    assert!(
        agent
            .events("sized")
            .iter()
            .any(|e| e["reason"] == "ResizeInfeasible"),
        "no ResizeInfeasible event"
    );
}
