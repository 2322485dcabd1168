//! kubelet's pipeline on real containerd, one `podlapse run --until-ready` per case: init
//! containers in order, a failing init container, pull policy Never, admission, and
//! hostNetwork.

use podlapse_tests::{Scratch, pod, require_lab, runtime_objects, stderr};

use xtask::lab::IMAGE_APP as APP;
use xtask::lab::REGISTRY_ADDR;

#[test]
fn init_containers_run_one_at_a_time_in_order() {
    require_lab();
    let scratch = Scratch::new();
    let manifest = scratch.manifest(
        "init.yaml",
        &format!(
            r#"apiVersion: v1
kind: Pod
metadata: {{name: init-order}}
spec:
  terminationGracePeriodSeconds: 2
  volumes: [{{name: marks, emptyDir: {{}}}}]
  initContainers:
  - name: first
    image: {APP}
    command: ["/bin/sh", "-c", "read up _ < /proc/uptime; echo $up > /marks/first; sleep 0.3; read up _ < /proc/uptime; echo $up > /marks/first-done"]
    volumeMounts: [{{name: marks, mountPath: /marks}}]
  - name: second
    image: {APP}
    command: ["/bin/sh", "-c", "read up _ < /proc/uptime; echo $up > /marks/second"]
    volumeMounts: [{{name: marks, mountPath: /marks}}]
  containers:
  - name: app
    image: {APP}
    command: ["/bin/sh", "-c", "read up _ < /proc/uptime; echo $up > /marks/app; exec sleep 3600"]
    volumeMounts: [{{name: marks, mountPath: /marks}}]
"#
        ),
    );
    let (out, doc) = scratch.run(&[&manifest], &[]);
    assert!(out.status.success(), "{doc:#}\n{}", stderr(&out));
    let p = pod(&doc, "init-order");
    assert_eq!(p["phase"], "Running");
    let dir = scratch
        .root_dir()
        .join("pods")
        .join(p["uid"].as_str().unwrap())
        .join("volumes/kubernetes.io~empty-dir/marks");
    // Marks are the kernel's uptime (10 ms resolution), the one clock every container sees.
    let read = |f: &str| -> f64 {
        wait_for_file(&dir.join(f))
            .trim()
            .parse()
            .unwrap_or_else(|e| panic!("{f}: {e}"))
    };
    let (first_done, second, app) = (read("first-done"), read("second"), read("app"));
    assert!(read("first") < first_done);
    assert!(first_done <= second, "second started before first finished");
    assert!(
        second <= app,
        "the app started before the last init container ran"
    );
    // The events show the same order.
    let started: Vec<&str> = p["events"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|e| e["reason"] == "Started")
        .map(|e| e["container"].as_str().unwrap())
        .collect();
    assert_eq!(started, ["first", "second", "app"]);
    let (out, doc) = scratch.run(&[&manifest], &["--cleanup"]);
    assert!(out.status.success(), "{doc:#}");
}

fn wait_for_file(path: &std::path::Path) -> String {
    // A shell in the container writes it soon after it starts; the bound is for a broken
    // run, not a guess of how soon (an emulated guest is many times slower).
    podlapse_tests::eventually(
        &format!("{} to be written", path.display()),
        std::time::Duration::from_secs(120),
        std::time::Duration::from_millis(50),
        || match std::fs::read_to_string(path) {
            Ok(t) if !t.trim().is_empty() => Ok(t),
            Ok(_) => Err("empty".to_string()),
            Err(e) => Err(e.to_string()),
        },
    )
}

#[test]
fn a_failing_init_container_with_restart_policy_never_fails_the_pod() {
    require_lab();
    let scratch = Scratch::new();
    let manifest = scratch.manifest(
        "fail.yaml",
        &format!(
            r#"apiVersion: v1
kind: Pod
metadata: {{name: init-fails}}
spec:
  terminationGracePeriodSeconds: 2
  restartPolicy: Never
  initContainers:
  - {{name: setup, image: {APP}, command: ["/bin/sh", "-c", "exit 3"]}}
  containers:
  - {{name: app, image: {APP}, command: ["sleep", "3600"]}}
"#
        ),
    );
    let (out, doc) = scratch.run(&[&manifest], &["--cleanup"]);
    assert_eq!(out.status.code(), Some(1), "{doc:#}");
    let p = pod(&doc, "init-fails");
    assert_eq!(p["phase"], "Failed", "{p:#}");
    // The app container never ran.
    assert!(
        !p["events"]
            .as_array()
            .unwrap()
            .iter()
            .any(|e| e["container"] == "app"),
        "{p:#}"
    );
    let (sandboxes, containers) = runtime_objects(p["uid"].as_str().unwrap());
    assert!(sandboxes.is_empty() && containers.is_empty());
}

#[test]
fn pull_policy_never_with_a_missing_image_is_err_image_never_pull() {
    require_lab();
    let scratch = Scratch::new();
    let manifest = scratch.manifest(
        "never.yaml",
        &format!("apiVersion: v1\nkind: Pod\nmetadata: {{name: never-pull}}\nspec:\n  terminationGracePeriodSeconds: 2\n  containers:\n  - {{name: c, image: {REGISTRY_ADDR}/podlapse/not-pulled:1.0, imagePullPolicy: Never}}\n"),
    );
    let (out, doc) = scratch.run(&[&manifest], &["--cleanup"]);
    assert_eq!(out.status.code(), Some(1), "{doc:#}");
    let p = pod(&doc, "never-pull");
    assert_eq!(p["reason"], "ErrImageNeverPull", "{p:#}");
    assert_eq!(
        p["message"],
        format!(
            "Container image \"{REGISTRY_ADDR}/podlapse/not-pulled:1.0\" is not present with pull policy of Never"
        )
    );
    // Nothing was pulled.
    assert!(
        !p["events"]
            .as_array()
            .unwrap()
            .iter()
            .any(|e| e["reason"] == "Pulling")
    );
}

#[test]
fn too_much_cpu_is_rejected_at_admission() {
    require_lab();
    let scratch = Scratch::new();
    let manifest = scratch.manifest(
        "big.yaml",
        &format!(
            "apiVersion: v1\nkind: Pod\nmetadata: {{name: fits}}\nspec:\n  terminationGracePeriodSeconds: 2\n  containers:\n  - {{name: c, image: {APP}, command: [sleep, '3600'], resources: {{requests: {{cpu: 600m}}}}}}\n---\napiVersion: v1\nkind: Pod\nmetadata: {{name: too-big}}\nspec:\n  terminationGracePeriodSeconds: 2\n  containers:\n  - {{name: c, image: {APP}, command: [sleep, '3600'], resources: {{requests: {{cpu: '2'}}}}}}\n"
        ),
    );
    let (out, doc) = scratch.run(&[&manifest], &["--cleanup", "--node-cpu", "1000"]);
    assert_eq!(out.status.code(), Some(1), "{doc:#}");
    assert_eq!(pod(&doc, "fits")["phase"], "Running");
    let p = pod(&doc, "too-big");
    assert_eq!(p["phase"], "Failed");
    assert_eq!(p["reason"], "OutOfcpu");
    assert_eq!(
        p["message"],
        "Pod was rejected: Node didn't have enough resource: cpu, requested: 2000, used: 600, capacity: 1000"
    );
    let (sandboxes, _) = runtime_objects(p["uid"].as_str().unwrap());
    assert!(sandboxes.is_empty(), "a rejected pod got a sandbox");
}

#[test]
fn a_host_network_pod_runs_with_the_node_ip() {
    require_lab();
    let scratch = Scratch::new();
    let manifest = scratch.manifest(
        "host.yaml",
        &format!(
            "apiVersion: v1\nkind: Pod\nmetadata: {{name: on-host}}\nspec:\n  terminationGracePeriodSeconds: 2\n  hostNetwork: true\n  containers:\n  - {{name: c, image: {APP}, command: [sleep, '3600']}}\n"
        ),
    );
    let (out, doc) = scratch.run(&[&manifest], &["--cleanup"]);
    assert!(out.status.success(), "{doc:#}\n{}", stderr(&out));
    let p = pod(&doc, "on-host");
    assert_eq!(p["phase"], "Running");
    let ip = p["ip"].as_str().unwrap();
    assert!(
        !ip.starts_with("10.244.77."),
        "a hostNetwork pod got a pod-network IP {ip}"
    );
    // It is one of the node's own addresses.
    let addrs = String::from_utf8(
        std::process::Command::new("ip")
            .args(["-4", "-o", "addr"])
            .output()
            .unwrap()
            .stdout,
    )
    .unwrap();
    assert!(
        addrs.contains(&format!("inet {ip}/")),
        "{ip} is not a node address:\n{addrs}"
    );
    // No CNI ran for it: the host-local IPAM never saw it.
    assert!(
        !p["events"]
            .as_array()
            .unwrap()
            .iter()
            .any(|e| e["reason"] == "FailedCreatePodSandBox")
    );
}
