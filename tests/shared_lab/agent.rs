//! The long-running agent (`podlapse run` without --until-ready) on real containerd:
//! crash-loop back-off, image-pull back-off that recovers, manifest updates, deletion,
//! a SIGKILLed agent adopting its pods, and housekeeping of orphans.

use std::process::Command;
use std::time::Duration;

use podlapse_tests::agent::{
    Agent, container, metric, phase, promtool_check_metrics, waiting_reason,
};
use podlapse_tests::{Scratch, require_lab, runtime_objects};

use xtask::lab::IMAGE_APP as APP;
use xtask::lab::IMAGE_BIG10 as BIG10;
use xtask::lab::IMAGE_BIG50 as BIG50;
use xtask::lab::REGISTRY_ADDR;
const MINUTE: Duration = Duration::from_secs(60);

fn pod_yaml(name: &str, containers: &str) -> String {
    format!(
        "apiVersion: v1\nkind: Pod\nmetadata: {{name: {name}}}\nspec:\n  terminationGracePeriodSeconds: 2\n  containers:\n{containers}"
    )
}

#[test]
fn crash_loop_back_off_grows_and_counts_restarts() {
    require_lab();
    // The cap is 8 s so that the CrashLoopBackOff waits are long enough to be seen by
    // polling on the emulated modern node, where each look at the API takes seconds and
    // a 4 s wait could fall between two looks every time.
    let agent = Agent::start(
        "crashloop",
        &["--backoff-initial", "1s", "--backoff-max", "8s"],
    );
    agent.write(
        "crash.yaml",
        &pod_yaml(
            "crasher",
            &format!("  - {{name: c, image: {APP}, command: [/bin/sh, -c, 'exit 1']}}\n"),
        ),
    );
    let p = agent.wait_pod("crasher", "restarted 4 times", MINUTE, |p| {
        container(p, "c")["restartCount"].as_i64() >= Some(4)
    });
    assert_eq!(
        phase(&p),
        "Running",
        "restartPolicy Always keeps the pod Running"
    );
    assert_eq!(container(&p, "c")["lastState"]["terminated"]["exitCode"], 1);
    let starts: Vec<i64> = agent
        .events("crasher")
        .iter()
        .filter(|e| e["reason"] == "Started")
        .map(|e| e["at"].as_i64().unwrap())
        .collect();
    assert!(starts.len() >= 5, "{starts:?}");
    let gaps: Vec<f64> = starts
        .windows(2)
        .map(|w| (w[1] - w[0]) as f64 / 1e9)
        .collect();
    // kubelet's timing: the first restart is immediate, then the delay doubles (1 s, 2 s,
    // 4 s, 8 s here with the test's shortened back-off). Each gap is the back-off plus the time
    // to create and start the container again, which on a slow node (the emulated modern
    // node) is seconds: the gaps are held to the back-off from below, and the growth is
    // read from kubelet's own BackOff messages.
    assert!(
        gaps[1] >= 0.9,
        "second restart came after {:.2}s: {gaps:?}",
        gaps[1]
    );
    assert!(gaps[2] >= 1.8, "{gaps:?}");
    assert!(gaps[3] >= 3.6, "{gaps:?}");
    let mut delays: Vec<String> = Vec::new();
    for e in agent.events("crasher") {
        if e["reason"] == "BackOff"
            && let Some(d) = e["message"]
                .as_str()
                .and_then(|m| m.strip_prefix("back-off "))
                .and_then(|m| m.split_whitespace().next())
            && delays.last().map(String::as_str) != Some(d)
        {
            delays.push(d.to_string());
        }
    }
    // A BackOff event is recorded by a sync that finds the container still backing off;
    // on a slow node the 1 s and 2 s ones can pass before any sync sees them. What is
    // recorded grows by doubling, up to the 8 s cap once it is reached.
    let secs: Vec<u64> = delays
        .iter()
        .map(|d| d.trim_end_matches('s').parse().unwrap_or(0))
        .collect();
    assert!(
        secs.len() >= 2
            && secs.windows(2).all(|w| w[1] == w[0] * 2)
            && secs.first().is_some_and(|&s| matches!(s, 1 | 2 | 4))
            && secs.last().is_some_and(|&s| s == 4 || s == 8),
        "the back-off doubles towards its cap: {delays:?}"
    );
    assert!(
        agent
            .events("crasher")
            .iter()
            .any(|e| e["reason"] == "BackOff"
                && e["message"].as_str().unwrap().starts_with("back-off ")
                && e["message"]
                    .as_str()
                    .unwrap()
                    .contains("restarting failed container=c pod=crasher")),
        "no BackOff event"
    );
    // While it waits, the container shows CrashLoopBackOff.
    agent.wait_pod("crasher", "CrashLoopBackOff", 2 * MINUTE, |p| {
        waiting_reason(p, "c") == Some("CrashLoopBackOff")
    });
    // Each back-off is a stage of the pod's timeline, naming the container and why.
    let timeline = agent.timeline();
    let pod = timeline["pods"]
        .as_array()
        .unwrap()
        .iter()
        .find(|p| p["name"] == agent.name("crasher").as_str())
        .expect("crasher's timeline");
    let waits: Vec<(f64, &str)> = pod["stages"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|s| s["stage"] == "back_off_wait:c")
        .map(|s| {
            (
                s["duration_ns"].as_f64().unwrap() / 1e9,
                s["detail"].as_str().unwrap(),
            )
        })
        .collect();
    assert!(waits.len() >= 2, "{waits:?}");
    assert!(
        waits
            .iter()
            .all(|(_, d)| d.starts_with("c: CrashLoopBackOff")),
        "{waits:?}"
    );
    // A back-off runs from the container's finish, so a wait lasts what is left of it when
    // the sync decides it: on a slow node (the emulated one, where StartContainer alone
    // takes seconds) little or nothing. It never outlasts the back-off it names, give or
    // take the sync loop's next look (2 s of slack for a busy machine).
    for (secs, detail) in &waits {
        let delay: f64 = detail
            .split("back-off ")
            .nth(1)
            .and_then(|m| m.split_whitespace().next())
            .and_then(|d| d.trim_end_matches('s').parse().ok())
            .unwrap_or_else(|| panic!("no back-off delay in {detail:?}"));
        assert!(*secs <= delay + 2.0, "{secs:.2}s in {detail:?}: {waits:?}");
    }
}

#[test]
fn image_pull_back_off_recovers_once_the_image_is_pushed() {
    require_lab();
    let image = format!("{REGISTRY_ADDR}/podlapse/late-{}:1.0", std::process::id());
    let agent = Agent::start(
        "latepush",
        &["--backoff-initial", "1s", "--backoff-max", "2s"],
    );
    agent.write(
        "late.yaml",
        &pod_yaml(
            "late",
            &format!("  - {{name: c, image: {image}, command: [sleep, '3600']}}\n"),
        ),
    );
    // ErrImagePull is the container's reason only until the next sync turns it into
    // ImagePullBackOff (milliseconds later with a 1 s back-off), so the failed pull is
    // asserted through its event, which stays.
    agent.wait_for("late: a Failed event with ErrImagePull", MINUTE, |_| {
        agent.events("late").iter().any(|e| {
            e["reason"] == "Failed"
                && e["message"]
                    .as_str()
                    .is_some_and(|m| m.starts_with("Error: ErrImagePull"))
        })
    });
    agent.wait_pod("late", "ImagePullBackOff", MINUTE, |p| {
        waiting_reason(p, "c") == Some("ImagePullBackOff")
    });
    let pushed = Command::new("skopeo")
        .args(["copy", "--src-tls-verify=false", "--dest-tls-verify=false"])
        .arg(format!("docker://{APP}"))
        .arg(format!("docker://{image}"))
        .output()
        .unwrap();
    assert!(
        pushed.status.success(),
        "{}",
        String::from_utf8_lossy(&pushed.stderr)
    );
    let p = agent.wait_pod("late", "Running after the push", MINUTE, |p| {
        phase(p) == "Running"
    });
    assert_eq!(container(&p, "c")["ready"], true);
}

#[test]
fn an_image_update_restarts_only_that_container_other_edits_replace_the_pod() {
    require_lab();
    let agent = Agent::start("update", &[]);
    let two = |b_image: &str, b_cmd: &str| {
        pod_yaml(
            "two",
            &format!(
                "  - {{name: a, image: {APP}, command: [sleep, '3600']}}\n  - {{name: b, image: {b_image}, command: [sleep, '{b_cmd}']}}\n"
            ),
        )
    };
    agent.write("two.yaml", &two(APP, "3600"));
    let before = agent.wait_pod("two", "Running", MINUTE, |p| phase(p) == "Running");
    let id = |p: &serde_json::Value, c: &str| {
        container(p, c)["containerID"]
            .as_str()
            .unwrap_or("")
            .to_string()
    };
    let (a0, b0) = (id(&before, "a"), id(&before, "b"));
    let uid = before["uid"].as_str().unwrap().to_string();

    // An image is one of the fields a pod update may change: kubelet restarts just that
    // container (its hash covers the name and the image).
    agent.write("two.yaml", &two(BIG10, "3600"));
    let after = agent.wait_pod("two", "b replaced", MINUTE, |p| {
        let b = id(p, "b");
        !b.is_empty() && b != b0 && container(p, "b")["ready"] == true
    });
    assert_eq!(
        after["uid"],
        uid.as_str(),
        "an image edit is an update of the same pod"
    );
    assert_eq!(id(&after, "a"), a0, "the unchanged container was restarted");
    let killing: Vec<String> = agent
        .events("two")
        .iter()
        .filter(|e| e["reason"] == "Killing")
        .map(|e| e["message"].as_str().unwrap().to_string())
        .collect();
    assert_eq!(
        killing,
        ["Stopping container b: Container b definition changed, will be restarted"]
    );

    // A command cannot change in a pod update: as for a static pod, the edit is a new pod
    // and the old one goes.
    agent.write("two.yaml", &two(BIG10, "7200"));
    let replaced = agent.wait_for("the pod replaced", MINUTE, |pods| {
        pods.len() == 1 && pods[0]["uid"] != uid.as_str() && phase(&pods[0]) == "Running"
    });
    assert_ne!(id(&replaced[0], "a"), a0, "a new pod runs new containers");
}

#[test]
fn a_deleted_manifest_leaves_no_runtime_object_within_the_grace_period() {
    require_lab();
    let agent = Agent::start("delete", &[]);
    agent.write(
        "gone.yaml",
        &pod_yaml(
            "gone",
            &format!("  - {{name: c, image: {APP}, command: [sleep, '3600']}}\n"),
        ),
    );
    let p = agent.wait_pod("gone", "Running", MINUTE, |p| phase(p) == "Running");
    let uid = p["uid"].as_str().unwrap().to_string();
    let pod_dir = agent.scratch.root_dir().join("pods").join(&uid);
    assert!(pod_dir.exists());
    agent.remove("gone.yaml");
    // terminationGracePeriodSeconds is 2; `sleep` ignores SIGTERM as PID 1, so it is
    // killed when the grace period ends. On a loaded node containerd 2.x can finish
    // handling the container's exit just after the grace period, and then fails the
    // StopContainer that waited for it ("failed to kill container ...: ttrpc: closed");
    // like kubelet's pod worker, the agent retries 10 s later. So: the grace period, one
    // retry, and time for the runtime's teardown.
    agent.wait_for("the pod to be gone", Duration::from_secs(25), |pods| {
        pods.is_empty()
    });
    let (sandboxes, containers) = runtime_objects(&uid);
    assert!(
        sandboxes.is_empty() && containers.is_empty(),
        "{sandboxes:?} {containers:?}"
    );
    assert!(!pod_dir.exists(), "the pod directory is still there");
    let killing = agent.events("gone");
    assert!(
        killing.is_empty(),
        "events of a removed pod are dropped with it"
    );
}

#[test]
fn an_agent_killed_mid_creation_adopts_its_pod_without_a_second_sandbox() {
    require_lab();
    let mut agent = Agent::start("adopt", &[]);
    // A 50 MiB pull keeps the pod in creation long enough to kill the agent after its
    // sandbox exists and before its container runs.
    agent.write(
        "slow.yaml",
        &pod_yaml(
            "adoptee",
            &format!("  - {{name: c, image: {BIG50}, imagePullPolicy: Always, command: [sleep, '3600']}}\n"),
        ),
    );
    let p = agent.wait_pod("adoptee", "sandbox created", MINUTE, |p| {
        p["status"]["conditions"].as_array().is_some_and(|cs| {
            cs.iter()
                .any(|c| c["type"] == "PodReadyToStartContainers" && c["status"] == "True")
        }) || phase(p) == "Running"
    });
    let uid = p["uid"].as_str().unwrap().to_string();
    agent.kill9();
    let (sandboxes, _) = runtime_objects(&uid);
    assert_eq!(sandboxes.len(), 1);
    let first = sandboxes[0].clone();

    agent.spawn();
    let p = agent.wait_pod("adoptee", "Running", MINUTE, |p| phase(p) == "Running");
    assert_eq!(p["uid"], uid.as_str());
    let (sandboxes, containers) = runtime_objects(&uid);
    assert_eq!(
        sandboxes,
        [first],
        "the restarted agent made another sandbox"
    );
    assert_eq!(containers.len(), 1, "{containers:?}");
}

#[test]
fn housekeeping_removes_an_orphaned_sandbox_with_podlapses_labels() {
    require_lab();
    // A pod of node "orphans" that no manifest of that node's agent describes.
    let scratch = Scratch::new();
    let manifest = scratch.manifest(
        "orphan.yaml",
        &pod_yaml(
            "orphan",
            &format!("  - {{name: c, image: {APP}, command: [sleep, '3600']}}\n"),
        ),
    );
    let (out, doc) = scratch.run(&[&manifest], &["--node-name", "orphans"]);
    assert!(out.status.success(), "{doc:#}");
    let uid = doc["pods"][0]["uid"].as_str().unwrap().to_string();
    // Another node's pod on the same runtime, which housekeeping must not touch.
    let bystander = Scratch::new();
    let other = bystander.manifest(
        "other.yaml",
        &pod_yaml(
            "bystander",
            &format!("  - {{name: c, image: {APP}, command: [sleep, '3600']}}\n"),
        ),
    );
    let (_, other_doc) = bystander.run(&[&other], &["--node-name", "someone-else"]);
    let other_uid = other_doc["pods"][0]["uid"].as_str().unwrap().to_string();
    assert_eq!(runtime_objects(&uid).0.len(), 1);

    let _agent = Agent::start("orphans", &["--housekeeping-interval", "200ms"]);
    // Housekeeping runs every 200 ms; each look is one list of the runtime.
    podlapse_tests::eventually(
        "housekeeping to remove the orphan",
        Duration::from_secs(60),
        Duration::from_millis(100),
        || {
            let (sandboxes, containers) = runtime_objects(&uid);
            if sandboxes.is_empty() && containers.is_empty() {
                Ok(())
            } else {
                Err(format!("still there: {sandboxes:?} {containers:?}"))
            }
        },
    );
    assert_eq!(
        runtime_objects(&other_uid).0.len(),
        1,
        "another node's pod was removed"
    );
    let (out, _) = bystander.run(&[&other], &["--node-name", "someone-else", "--cleanup"]);
    assert!(out.status.success());
}

/// Where an emptyDir volume of an agent's pod lives on the host.
fn empty_dir(agent: &Agent, pod: &serde_json::Value, volume: &str) -> std::path::PathBuf {
    agent
        .scratch
        .root_dir()
        .join("pods")
        .join(pod["uid"].as_str().unwrap())
        .join("volumes/kubernetes.io~empty-dir")
        .join(volume)
}

fn pod_condition(p: &serde_json::Value, kind: &str) -> Option<String> {
    p["status"]["conditions"]
        .as_array()?
        .iter()
        .find(|c| c["type"] == kind)
        .and_then(|c| c["status"].as_str().map(str::to_string))
}

#[test]
fn post_start_exec_hook_runs_and_a_failing_one_kills_the_container() {
    require_lab();
    let agent = Agent::start("hooks", &["--backoff-initial", "1s", "--backoff-max", "2s"]);
    agent.write(
        "hooks.yaml",
        &format!(
            r#"apiVersion: v1
kind: Pod
metadata: {{name: hooked}}
spec:
  terminationGracePeriodSeconds: 2
  volumes: [{{name: out, emptyDir: {{}}}}]
  containers:
  - name: good
    image: {APP}
    command: [sleep, "3600"]
    volumeMounts: [{{name: out, mountPath: /out}}]
    lifecycle:
      postStart:
        exec: {{command: [/bin/sh, -c, "echo started-by-hook > /out/hook"]}}
  - name: bad
    image: {APP}
    command: [sleep, "3600"]
    lifecycle:
      postStart:
        exec: {{command: [/bin/sh, -c, "echo no >&2; exit 7"]}}
"#
        ),
    );
    let p = agent.wait_pod("hooked", "good running", MINUTE, |p| {
        container(p, "good")["ready"] == true
    });
    let hook_file = empty_dir(&agent, &p, "out").join("hook");
    assert_eq!(
        std::fs::read_to_string(&hook_file).unwrap().trim(),
        "started-by-hook"
    );
    // The failing hook's container is killed and restarted by its policy.
    agent.wait_pod("hooked", "bad restarted", MINUTE, |p| {
        container(p, "bad")["restartCount"].as_i64() >= Some(1)
    });
    let events = agent.events("hooked");
    let failed: Vec<&serde_json::Value> = events
        .iter()
        .filter(|e| e["reason"] == "FailedPostStartHook")
        .collect();
    assert!(!failed.is_empty(), "{events:#?}");
    assert_eq!(failed[0]["container"], "bad");
    let msg = failed[0]["message"].as_str().unwrap();
    assert!(
        msg.contains("Exec lifecycle hook") && msg.contains("for Container \"bad\""),
        "{msg}"
    );
    assert!(
        !events
            .iter()
            .any(|e| e["reason"] == "FailedPostStartHook" && e["container"] == "good"),
        "the good hook was reported as failed"
    );
}

#[test]
fn readiness_probe_gates_ready() {
    require_lab();
    let agent = Agent::start("readiness", &[]);
    agent.write(
        "ready.yaml",
        &format!(
            r#"apiVersion: v1
kind: Pod
metadata: {{name: gated}}
spec:
  terminationGracePeriodSeconds: 2
  volumes: [{{name: flags, emptyDir: {{}}}}]
  containers:
  - name: app
    image: {APP}
    command: [sleep, "3600"]
    volumeMounts: [{{name: flags, mountPath: /flags}}]
    readinessProbe:
      exec: {{command: [test, -f, /flags/ready]}}
      periodSeconds: 1
      failureThreshold: 1
"#
        ),
    );
    let p = agent.wait_pod("gated", "Running", MINUTE, |p| phase(p) == "Running");
    // Running but not ready: the probe has not succeeded.
    std::thread::sleep(Duration::from_millis(1500)); // at least one probe period passes
    let p2 = agent.pod("gated").unwrap();
    assert_eq!(container(&p2, "app")["ready"], false, "{p2:#}");
    assert_eq!(pod_condition(&p2, "Ready").as_deref(), Some("False"));
    std::fs::write(empty_dir(&agent, &p, "flags").join("ready"), "").unwrap();
    let p3 = agent.wait_pod("gated", "Ready", MINUTE, |p| {
        pod_condition(p, "Ready").as_deref() == Some("True")
    });
    assert_eq!(container(&p3, "app")["ready"], true);
    std::fs::remove_file(empty_dir(&agent, &p, "flags").join("ready")).unwrap();
    agent.wait_pod("gated", "not Ready again", MINUTE, |p| {
        pod_condition(p, "Ready").as_deref() == Some("False")
    });
    assert_eq!(
        container(&agent.pod("gated").unwrap(), "app")["restartCount"],
        0,
        "readiness never restarts"
    );
}

#[test]
fn a_liveness_failure_restarts_the_container() {
    require_lab();
    let agent = Agent::start(
        "liveness",
        &["--backoff-initial", "1s", "--backoff-max", "2s"],
    );
    agent.write(
        "live.yaml",
        &format!(
            r#"apiVersion: v1
kind: Pod
metadata: {{name: lively}}
spec:
  terminationGracePeriodSeconds: 1
  volumes: [{{name: flags, emptyDir: {{}}}}]
  containers:
  - name: app
    image: {APP}
    command: [/bin/sh, -c, "touch /flags/alive; exec sleep 3600"]
    volumeMounts: [{{name: flags, mountPath: /flags}}]
    livenessProbe:
      exec: {{command: [test, -f, /flags/alive]}}
      periodSeconds: 1
      failureThreshold: 2
"#
        ),
    );
    let p = agent.wait_pod("lively", "Running", MINUTE, |p| phase(p) == "Running");
    let first = container(&p, "app")["containerID"]
        .as_str()
        .unwrap()
        .to_string();
    std::fs::remove_file(empty_dir(&agent, &p, "flags").join("alive")).unwrap_or(());
    let p = agent.wait_pod("lively", "restarted after liveness failure", MINUTE, |p| {
        container(p, "app")["restartCount"].as_i64() >= Some(1)
            && container(p, "app")["state"]["running"].is_object()
    });
    assert_ne!(container(&p, "app")["containerID"].as_str().unwrap(), first);
    let events = agent.events("lively");
    assert!(
        events.iter().any(|e| e["reason"] == "Unhealthy"
            && e["message"]
                .as_str()
                .unwrap()
                .starts_with("Liveness probe failed")),
        "{events:#?}"
    );
    assert!(
        events.iter().any(|e| e["reason"] == "Killing"
            && e["message"]
                .as_str()
                .unwrap()
                .contains("Container app failed liveness probe, will be restarted")),
        "{events:#?}"
    );
}

#[test]
fn an_invalid_manifest_shows_on_its_pod_and_disturbs_nothing_else() {
    require_lab();
    let agent = Agent::start("invalid", &[]);
    agent.write(
        "good.yaml",
        &pod_yaml(
            "fine",
            &format!("  - {{name: c, image: {APP}, command: [sleep, '3600']}}\n"),
        ),
    );
    // A static pod that references an API object: refused with kubelet's reason, and the
    // error says which field.
    let unsupported = format!(
        "apiVersion: v1\nkind: Pod\nmetadata: {{name: broken}}\nspec:\n  volumes: [{{name: cfg, configMap: {{name: settings}}}}]\n  containers:\n  - {{name: c, image: {APP}, command: [sleep, '3600']}}\n"
    );
    agent.write("broken.yaml", &unsupported);
    let broken = agent.wait_pod("broken", "reported invalid", MINUTE, |p| {
        phase(p) == "Failed"
    });
    assert_eq!(broken["status"]["reason"], "InvalidManifest");
    let msg = broken["status"]["message"].as_str().unwrap();
    assert!(
        msg.contains(
            "broken.yaml (document 0): field spec.volumes[0].configMap: static pods may not reference configmaps"
        ),
        "{msg}"
    );
    assert!(
        agent
            .events("broken")
            .iter()
            .any(|e| e["reason"] == "FailedValidation")
    );
    agent.wait_pod("fine", "Running beside the invalid one", MINUTE, |p| {
        phase(p) == "Running"
    });
    // Fixing the manifest turns the record into a real pod.
    agent.write(
        "broken.yaml",
        &pod_yaml(
            "broken",
            &format!("  - {{name: c, image: {APP}, command: [sleep, '3600']}}\n"),
        ),
    );
    let fixed = agent.wait_pod("broken", "Running once fixed", MINUTE, |p| {
        phase(p) == "Running"
    });
    assert!(!fixed["uid"].as_str().unwrap().starts_with("invalid:"));
    assert_eq!(
        agent
            .pods()
            .iter()
            .filter(|p| p["name"] == agent.name("broken").as_str())
            .count(),
        1
    );
}

#[test]
fn metrics_use_kubelets_names_and_pass_promtool() {
    require_lab();
    let agent = Agent::start("metrics", &[]);
    agent.write(
        "m.yaml",
        &pod_yaml(
            "measured",
            &format!("  - {{name: c, image: {APP}, command: [sleep, '3600']}}\n"),
        ),
    );
    agent.wait_pod("measured", "Running", MINUTE, |p| phase(p) == "Running");
    let text = agent.metrics();
    for want in [
        "kubelet_runtime_operations_duration_seconds_count{operation_type=\"run_podsandbox\"} 1",
        "kubelet_run_podsandbox_duration_seconds_count{runtime_handler=\"\"} 1",
        "kubelet_pod_worker_duration_seconds_count{operation_type=\"create\"} 1",
        "kubelet_pod_start_sli_duration_seconds_count 1",
        "kubelet_runtime_operations_total{operation_type=\"start_container\"} 1",
        "podlapse_stage_duration_seconds_count{stage=\"cni_plugin\"}",
        "podlapse_cni_plugin_duration_seconds_count{plugin=\"bridge\",exit_code=\"0\"} 1",
        // The namespace probes saw the pod's netns created ...
        "podlapse_stage_duration_seconds_count{stage=\"netns_created\"} 1",
    ] {
        assert!(text.contains(want), "missing {want:?} in:\n{text}");
    }
    if podlapse::ebpf::kprobes_present().is_ok() {
        // ... from kernel-function hooks, attached throughout and never gated.
        for want in [
            "podlapse_ebpf_netns_probe_attaches_total 0",
            "podlapse_ebpf_netns_probes_attached 1",
        ] {
            assert!(text.contains(want), "missing {want:?} in:\n{text}");
        }
    } else {
        // ... from syscall tracepoints attached for the pod's creation, and detached
        // once the agent has been idle for a second, so the node's syscalls stop paying
        // for them. Polled: the agent checks every 250 ms.
        let attached = "podlapse_ebpf_netns_probe_attaches_total 1";
        assert!(text.contains(attached), "missing {attached:?} in:\n{text}");
        let detached = "podlapse_ebpf_netns_probes_attached 0";
        let text = agent.metrics_when(Duration::from_secs(10), |t| t.contains(detached));
        assert!(
            text.contains(detached),
            "still attached after 10 s idle:\n{text}"
        );
    }
    promtool_check_metrics(&text);
}

/// kubelet's pod-start histograms: the total from first seen until every container ran,
/// and the SLI less the image pull (from when it was asked for: a wait behind the image
/// puller is pulling time too). `imagePullPolicy: Always` makes the pod pull.
#[test]
fn the_pod_start_sli_leaves_out_the_image_pull() {
    require_lab();
    let agent = Agent::start("podstart", &[]);
    agent.write(
        "pulled.yaml",
        &pod_yaml(
            "pulled",
            &format!(
                "  - {{name: c, image: {APP}, imagePullPolicy: Always, command: [sleep, '3600']}}\n"
            ),
        ),
    );
    agent.wait_pod("pulled", "Running", MINUTE, |p| phase(p) == "Running");
    let timeline = agent.timeline();
    let pod = timeline["pods"]
        .as_array()
        .unwrap()
        .iter()
        .find(|p| p["name"] == agent.name("pulled").as_str())
        .expect("the pod's timeline");
    let stage = |name: &str| {
        pod["stages"]
            .as_array()
            .unwrap()
            .iter()
            .find(|s| s["stage"] == name)
            .cloned()
    };
    let pull = stage("image_pull:c").expect("an image_pull stage");
    assert_eq!(pull["source"], "cri", "{pull}");
    let pull_end = pull["end_ns"].as_u64().unwrap();
    // A pull is asked for when the wait behind the puller starts, if it waited.
    let asked = stage("image_puller_wait:c").map_or(pull["start_ns"].as_u64().unwrap(), |w| {
        w["start_ns"].as_u64().unwrap()
    });
    let pulling_s = (pull_end - asked) as f64 / 1e9;
    assert!(pulling_s > 0.0);
    // The histograms are observed once the worker finishes the sync that saw the pod
    // started; polled, as the scrape may come first.
    let text = agent.metrics_when(Duration::from_secs(10), |t| {
        metric(t, "kubelet_pod_start_total_duration_seconds_count") == Some(1.0)
    });
    let value = |name: &str| metric(&text, name).unwrap_or_else(|| panic!("no {name}:\n{text}"));
    assert_eq!(value("kubelet_pod_start_total_duration_seconds_count"), 1.0);
    assert_eq!(value("kubelet_pod_start_sli_duration_seconds_count"), 1.0);
    let total = value("kubelet_pod_start_total_duration_seconds_sum");
    let sli = value("kubelet_pod_start_sli_duration_seconds_sum");
    // Exactly the pull is left out (no init containers here), to the microsecond.
    assert!(
        ((total - sli) - pulling_s).abs() < 1e-6,
        "total {total} s, SLI {sli} s, pulling {pulling_s} s"
    );
    assert!(sli > 0.0 && total > pulling_s, "total {total}, SLI {sli}");
    // The pod is not on the host's network: the first such pod's SLI is its own.
    assert_eq!(
        value("kubelet_first_network_pod_start_sli_duration_seconds"),
        sli
    );
    // kubelet's buckets, to an hour.
    for le in ["0.5", "240.0", "3600.0", "+Inf"] {
        let bucket = format!("kubelet_pod_start_sli_duration_seconds_bucket{{le=\"{le}\"}}");
        assert!(text.contains(&bucket), "missing {bucket}");
    }
}

/// kubelet's file source: a manifest directory that disappears is an empty set of pods
/// (they are removed), and when it comes back its pods come back, each with one sandbox
/// and nothing of the old ones left.
#[test]
fn a_manifest_directory_removed_and_recreated_removes_then_restores_its_pods() {
    require_lab();
    let agent = Agent::start("mandir", &[]);
    let names = ["dir-a", "dir-b"];
    let yaml = |name: &str| {
        pod_yaml(
            name,
            &format!("  - {{name: c, image: {APP}, command: [sleep, '3600']}}\n"),
        )
    };
    for n in names {
        agent.write(&format!("{n}.yaml"), &yaml(n));
    }
    let running = |pods: &[serde_json::Value]| {
        names.iter().all(|n| {
            pods.iter()
                .any(|p| p["name"] == agent.name(n).as_str() && phase(p) == "Running")
        })
    };
    agent.wait_for("both pods Running", MINUTE, |pods| running(pods));
    let uids: Vec<String> = agent
        .pods()
        .iter()
        .map(|p| p["uid"].as_str().unwrap().to_string())
        .collect();

    std::fs::remove_dir_all(agent.manifests()).unwrap();
    agent.wait_for("the pods removed", MINUTE, |pods| pods.is_empty());
    for uid in &uids {
        let (sandboxes, containers) = runtime_objects(uid);
        assert!(
            sandboxes.is_empty() && containers.is_empty(),
            "{uid}: {sandboxes:?} {containers:?}"
        );
    }

    std::fs::create_dir_all(agent.manifests()).unwrap();
    for n in names {
        agent.write(&format!("{n}.yaml"), &yaml(n));
    }
    agent.wait_for("both pods Running again", MINUTE, |pods| running(pods));
    for uid in &uids {
        let (sandboxes, _) = runtime_objects(uid);
        assert_eq!(sandboxes.len(), 1, "{uid}: {sandboxes:?}");
    }
    assert_eq!(agent.pods().len(), 2, "no pod duplicated");
}

/// The port of a registry that accepts and holds every connection, never writing a
/// byte: a pull from it hangs until the agent's deadline.
fn silent_registry() -> u16 {
    let silent = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let port = silent.local_addr().unwrap().port();
    std::thread::spawn(move || {
        let mut held = Vec::new();
        for conn in silent.incoming().flatten() {
            held.push(conn);
        }
    });
    port
}

/// A runtime call that hangs: a pull from a registry that accepts connections and never
/// answers. The pull fails at the agent's deadline, that pod shows the error and is
/// retried, and the other pod and the agent's API go on as usual.
#[test]
fn a_pull_that_hangs_past_its_deadline_fails_that_pod_only_and_is_retried() {
    require_lab();
    let port = silent_registry();
    let agent = Agent::start(
        "hungpull",
        &[
            "--pull-timeout",
            "3",
            "--backoff-initial",
            "1s",
            "--backoff-max",
            "2s",
        ],
    );
    agent.write(
        "hung.yaml",
        &pod_yaml(
            "hung",
            &format!(
                "  - {{name: c, image: '127.0.0.1:{port}/podlapse/silent:1.0', command: [sleep, '3600']}}\n"
            ),
        ),
    );
    agent.write(
        "fine.yaml",
        &pod_yaml(
            "fine",
            &format!("  - {{name: c, image: {APP}, command: [sleep, '3600']}}\n"),
        ),
    );
    // The other pod runs, and the API answers, while a pull hangs.
    agent.wait_pod("fine", "Running beside a hung pull", MINUTE, |p| {
        phase(p) == "Running"
    });
    // The hung pull ends at the deadline, named as such, and is tried again.
    agent.wait_for("hung: two pulls failed at the deadline", MINUTE, |_| {
        let failed = agent
            .events("hung")
            .iter()
            .filter(|e| {
                e["reason"] == "Failed"
                    && e["message"].as_str().is_some_and(|m| {
                        m.contains("ErrImagePull") || m.contains("DeadlineExceeded")
                    })
            })
            .map(|e| e["count"].as_u64().unwrap_or(1))
            .sum::<u64>();
        let pulls = agent
            .events("hung")
            .iter()
            .filter(|e| e["reason"] == "Pulling")
            .map(|e| e["count"].as_u64().unwrap_or(1))
            .sum::<u64>();
        failed >= 1 && pulls >= 2
    });
    let messages: Vec<String> = agent
        .events("hung")
        .iter()
        .filter(|e| e["reason"] == "Failed")
        .filter_map(|e| e["message"].as_str().map(str::to_string))
        .collect();
    assert!(
        messages
            .iter()
            .any(|m| m.to_lowercase().contains("deadline")),
        "the failure names the deadline: {messages:?}"
    );
    let p = agent.pod("hung").unwrap();
    assert_ne!(phase(&p), "Running");
    assert!(
        matches!(
            waiting_reason(&p, "c"),
            Some("ErrImagePull") | Some("ImagePullBackOff")
        ),
        "{p:#}"
    );
    let fine = agent.pod("fine").unwrap();
    assert_eq!(phase(&fine), "Running", "{fine:#}");
}

/// kubelet's serialized image puller: a pod whose pull queues behind another pod's shows
/// the wait as a stage naming that pod, in the live timeline and in the report's parts.
/// The first pull hangs (a registry that never answers) until its deadline, so the second
/// pod surely queues behind it.
#[test]
fn a_pull_queued_behind_another_pods_pull_is_a_stage_naming_that_pod() {
    require_lab();
    let port = silent_registry();
    let agent = Agent::start(
        "queuedpull",
        &["--pull-timeout", "3", "--backoff-initial", "30s"],
    );
    agent.write(
        "first.yaml",
        &pod_yaml(
            "first",
            &format!(
                "  - {{name: c, image: '127.0.0.1:{port}/podlapse/silent:1.0', command: [sleep, '3600']}}\n"
            ),
        ),
    );
    agent.wait_for("first: its pull started", MINUTE, |_| {
        agent
            .events("first")
            .iter()
            .any(|e| e["reason"] == "Pulling")
    });
    agent.write(
        "second.yaml",
        &pod_yaml(
            "second",
            &format!(
                "  - {{name: c, image: {APP}, imagePullPolicy: Always, command: [sleep, '3600']}}\n"
            ),
        ),
    );
    agent.wait_pod("second", "Running after its queued pull", MINUTE, |p| {
        phase(p) == "Running"
    });
    let out = Command::new(podlapse_tests::podlapse_bin())
        .args([
            "timeline",
            "--pod",
            &agent.name("second"),
            "-o",
            "json",
            "--api-socket",
        ])
        .arg(&agent.socket)
        .output()
        .unwrap();
    assert!(out.status.success(), "{}", podlapse_tests::stderr(&out));
    let t: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    let stages = t["pods"][0]["stages"].as_array().unwrap();
    let names: Vec<&str> = stages.iter().filter_map(|s| s["stage"].as_str()).collect();
    let wait = stages
        .iter()
        .find(|s| s["stage"] == "image_puller_wait:c")
        .unwrap_or_else(|| panic!("no wait stage in {names:?}"));
    assert_eq!(
        wait["detail"].as_str().unwrap(),
        format!(
            "behind default/{}; serialized image pulls",
            agent.name("first")
        ),
        "{wait:#}"
    );
    assert_eq!(wait["source"], "agent");
    // It queued from its pull's turn until the first pull failed at its 3 s deadline.
    let waited_ms = wait["duration_ns"].as_u64().unwrap() / 1_000_000;
    assert!((500..=3_500).contains(&waited_ms), "waited {waited_ms} ms");
    let pull = stages
        .iter()
        .find(|s| s["stage"] == "image_pull:c")
        .unwrap_or_else(|| panic!("no pull stage in {names:?}"));
    assert!(
        pull["start_ns"].as_u64() >= wait["end_ns"].as_u64(),
        "the pull starts when the wait ends: {wait:#} {pull:#}"
    );
}
