//! Sidecars (restartable init containers) on real containerd, as kubelet 1.37 runs them:
//! the app starts only once the sidecar's startup probe succeeded, a killed sidecar is
//! restarted while the app keeps running, whatever the pod's restartPolicy, and deleting
//! the pod stops the app before the sidecar.

use std::time::Duration;

use podlapse_tests::agent::{Agent, condition, container, container_pids, init_container, phase};
use podlapse_tests::require_lab;

use xtask::lab::IMAGE_APP as APP;
/// Each wait ends as soon as the pod gets there; the bound only keeps a hung agent from
/// hanging the suite. In the emulated guest on a busy machine a pod's start takes many
/// times a quiet host's (a minute was too little there), so it is a hung bound, not a
/// guess of speed.
const HUNG: Duration = Duration::from_secs(300);

fn id(c: &serde_json::Value) -> String {
    c["containerID"].as_str().unwrap_or_default().to_string()
}

/// The sidecar writes the app's config after 2 s and only then passes its startup probe;
/// the app reads that config and fails without it. Both note their SIGTERM in `/out/order`
/// (a hostPath, so the file outlives the pod).
fn sidecar_pod(out: &std::path::Path) -> String {
    serde_json::json!({
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": "meshed"},
        "spec": {
            "terminationGracePeriodSeconds": 10,
            "volumes": [
                {"name": "shared", "emptyDir": {}},
                {"name": "out", "hostPath": {"path": out, "type": "Directory"}},
            ],
            "initContainers": [{
                "name": "config",
                "image": APP,
                "restartPolicy": "Always",
                "command": ["/bin/sh", "-c",
                    "trap 'echo sidecar >> /out/order; exit 0' TERM; \
                     sleep 2; echo 'greeting=hello' > /shared/config; touch /shared/ready; \
                     while true; do sleep 0.2; done"],
                "startupProbe": {
                    "exec": {"command": ["test", "-f", "/shared/ready"]},
                    "periodSeconds": 1,
                    "failureThreshold": 60,
                },
                "volumeMounts": [
                    {"name": "shared", "mountPath": "/shared"},
                    {"name": "out", "mountPath": "/out"},
                ],
            }],
            "containers": [{
                "name": "app",
                "image": APP,
                "command": ["/bin/sh", "-c",
                    "cat /shared/config > /out/app-read || exit 1; \
                     trap 'echo app >> /out/order; exit 0' TERM; \
                     while true; do sleep 0.2; done"],
                "volumeMounts": [
                    {"name": "shared", "mountPath": "/shared"},
                    {"name": "out", "mountPath": "/out"},
                ],
            }],
        },
    })
    .to_string()
}

#[test]
fn a_sidecar_with_a_startup_probe_gates_the_app_restarts_and_stops_last() {
    require_lab();
    let agent = Agent::start(
        "sidecar",
        &["--backoff-initial", "1s", "--backoff-max", "2s"],
    );
    let out = agent.scratch.path().join("out");
    std::fs::create_dir_all(&out).unwrap();
    agent.write("meshed.yaml", &sidecar_pod(&out));

    let ready = agent.wait_pod("meshed", "Ready", HUNG, |p| {
        condition(p, "Ready") == Some("True")
    });
    assert_eq!(phase(&ready), "Running");
    assert_eq!(condition(&ready, "Initialized"), Some("True"));
    let app = container(&ready, "app");
    let sidecar = init_container(&ready, "config");
    assert_eq!(sidecar["started"], true, "{sidecar:#}");
    assert_eq!(sidecar["ready"], true, "{sidecar:#}");
    assert_eq!(app["restartCount"], 0, "the app found its config at once");
    // kubectl's READY counts the started, ready sidecar with the app container.
    let row = agent.table_row("meshed");
    assert_eq!(row[1..3], ["2/2", "Running"], "podlapse pods row: {row:?}");
    assert_eq!(
        std::fs::read_to_string(out.join("app-read")).unwrap(),
        "greeting=hello\n",
        "the app read what the sidecar wrote"
    );

    // The order, from the agent's events: the app was created only after the sidecar's
    // startup probe could have passed (the sidecar writes its file 2 s after it starts).
    let events = agent.events("meshed");
    let at = |reason: &str, container: &str| {
        events
            .iter()
            .find(|e| e["reason"] == reason && e["container"] == container)
            .and_then(|e| e["at"].as_i64())
            .unwrap_or_else(|| panic!("no {reason} event for {container}: {events:#?}"))
    };
    let sidecar_started = at("Started", "config");
    let app_created = at("Created", "app");
    assert!(
        app_created - sidecar_started >= 2_000_000_000,
        "the app was created {} ms after the sidecar started, before its startup probe could pass",
        (app_created - sidecar_started) / 1_000_000
    );

    // The timeline names the wait: the sidecar's startup probe (at least the 2 s before
    // its file appears), then the time until a sync saw it pass; the app's work after.
    let timeline = agent.timeline();
    let stages = timeline["pods"]
        .as_array()
        .unwrap()
        .iter()
        .find(|p| p["name"] == agent.name("meshed").as_str())
        .expect("meshed's timeline")["stages"]
        .as_array()
        .unwrap()
        .clone();
    let first = |name: &str| {
        stages
            .iter()
            .find(|s| s["stage"] == name)
            .unwrap_or_else(|| panic!("no {name} stage: {stages:#?}"))
    };
    let ns = |s: &serde_json::Value, k: &str| s[k].as_u64().unwrap();
    let probe = first("startup_probe_wait:config");
    assert!(ns(probe, "duration_ns") >= 2_000_000_000, "{probe:#}");
    let sidecar_wait = first("sidecar_wait:app");
    assert_eq!(
        ns(sidecar_wait, "start_ns"),
        ns(probe, "end_ns"),
        "{sidecar_wait:#}"
    );
    assert!(
        ns(first("container_create:app"), "start_ns") >= ns(sidecar_wait, "end_ns"),
        "{stages:#?}"
    );

    // A killed sidecar is restarted; the app keeps running in the same container.
    let (app_id, sidecar_id) = (id(app), id(sidecar));
    let pids = container_pids(&sidecar_id);
    assert!(!pids.is_empty(), "no process of {sidecar_id}");
    for pid in pids {
        // SAFETY: kill(2) on a process of the sidecar container.
        unsafe { libc::kill(pid, libc::SIGKILL) };
    }
    let restarted = agent.wait_pod("meshed", "the sidecar restarted", HUNG, |p| {
        let s = init_container(p, "config");
        s["restartCount"] == 1 && s["state"]["running"].is_object() && s["started"] == true
    });
    let app = container(&restarted, "app");
    assert_eq!(id(app), app_id, "the app was restarted with its sidecar");
    assert_eq!(app["restartCount"], 0);
    assert!(app["state"]["running"].is_object(), "{app:#}");
    assert_ne!(id(init_container(&restarted, "config")), sidecar_id);

    // Deleting the pod stops the app first, then the sidecar.
    agent.remove("meshed.yaml");
    agent.wait_for("meshed to be gone", HUNG, |pods| pods.is_empty());
    assert_eq!(
        std::fs::read_to_string(out.join("order")).unwrap(),
        "app\nsidecar\n",
        "termination order"
    );
}

#[test]
fn a_crashing_sidecar_is_restarted_under_restart_policy_never() {
    require_lab();
    let agent = Agent::start(
        "sidecar-never",
        &["--backoff-initial", "1s", "--backoff-max", "2s"],
    );
    let pod = serde_json::json!({
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": "flaky"},
        "spec": {
            "restartPolicy": "Never",
            "terminationGracePeriodSeconds": 2,
            "initContainers": [{
                "name": "shipper",
                "image": APP,
                "restartPolicy": "Always",
                "command": ["/bin/sh", "-c", "sleep 1; exit 3"],
            }],
            "containers": [{"name": "app", "image": APP, "command": ["sleep", "3600"]}],
        },
    });
    agent.write("flaky.yaml", &pod.to_string());
    let p = agent.wait_pod("flaky", "the sidecar restarted twice", HUNG, |p| {
        init_container(p, "shipper")["restartCount"].as_i64() >= Some(2)
    });
    assert_eq!(phase(&p), "Running", "{p:#}");
    let app = container(&p, "app");
    assert_eq!(app["restartCount"], 0);
    assert!(app["state"]["running"].is_object(), "{app:#}");
    let last = &init_container(&p, "shipper")["lastState"]["terminated"];
    assert_eq!(last["exitCode"], 3, "{p:#}");
}

#[test]
fn a_sidecar_whose_startup_probe_never_passes_is_restarted_and_holds_the_pod() {
    require_lab();
    let agent = Agent::start(
        "sidecar-stuck",
        &["--backoff-initial", "1s", "--backoff-max", "2s"],
    );
    let pod = serde_json::json!({
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": "stuck"},
        "spec": {
            "terminationGracePeriodSeconds": 2,
            "initContainers": [{
                "name": "proxy",
                "image": APP,
                "restartPolicy": "Always",
                "command": ["sleep", "3600"],
                "startupProbe": {
                    "exec": {"command": ["false"]},
                    "periodSeconds": 1,
                    "failureThreshold": 2,
                },
            }],
            "containers": [{"name": "app", "image": APP, "command": ["sleep", "3600"]}],
        },
    });
    agent.write("stuck.yaml", &pod.to_string());
    let p = agent.wait_pod("stuck", "the sidecar restarted", HUNG, |p| {
        init_container(p, "proxy")["restartCount"].as_i64() >= Some(1)
    });
    assert_eq!(phase(&p), "Pending", "{p:#}");
    assert_eq!(condition(&p, "Initialized"), Some("False"));
    assert!(
        container(&p, "app")["containerID"].is_null(),
        "the app started before its sidecar: {p:#}"
    );
    // kubectl shows the pod in Init (0/1 or the sidecar's back-off), nothing ready of two.
    let row = agent.table_row("stuck");
    assert_eq!(row[1], "0/2", "podlapse pods row: {row:?}");
    assert!(row[2].starts_with("Init:"), "podlapse pods row: {row:?}");
    let events = agent.events("stuck");
    assert!(
        events.iter().any(|e| e["reason"] == "Killing"
            && e["message"]
                .as_str()
                .unwrap()
                .contains("Init container proxy failed startup probe")),
        "{events:#?}"
    );
    assert!(
        events
            .iter()
            .any(|e| e["reason"] == "Unhealthy" && e["container"] == "proxy"),
        "{events:#?}"
    );
}
