//! `podlapse diagnose` against the live agent on the shared lab: a pod whose image is
//! not in the registry, a pod whose container crashes on start, and a healthy pod, each
//! get their verdict naming the stage, with the evidence the agent recorded.

use std::path::Path;
use std::process::Command;
use std::time::Duration;

use podlapse::diagnose::{Cause, Diagnosis, PodDiagnosis};
use podlapse_tests::agent::Agent;
use podlapse_tests::ebpf::{require_probes, serial};
use podlapse_tests::{ip_in_subnet, podlapse_bin, require_lab, static_name, stderr, stdout};
use xtask::lab::{IMAGE_APP, REGISTRY_ADDR};

fn pods() -> String {
    format!(
        "\
apiVersion: v1
kind: Pod
metadata: {{name: diag-healthy}}
spec:
  terminationGracePeriodSeconds: 1
  containers:
  - {{name: app, image: {IMAGE_APP}, command: [sleep, '3600']}}
---
apiVersion: v1
kind: Pod
metadata: {{name: diag-no-image}}
spec:
  terminationGracePeriodSeconds: 1
  containers:
  - {{name: app, image: {REGISTRY_ADDR}/podlapse/not-pushed:1.0, command: [sleep, '3600']}}
---
apiVersion: v1
kind: Pod
metadata: {{name: diag-crash}}
spec:
  terminationGracePeriodSeconds: 1
  containers:
  - {{name: app, image: {IMAGE_APP}, command: [/bin/sh, -c, 'echo crashing; exit 3']}}
"
    )
}

/// `podlapse diagnose -o json` against the agent; exit code 1 (a pod has a problem) is
/// an answer too.
fn diagnose(socket: &Path, extra: &[&str]) -> Option<Diagnosis> {
    let out = Command::new(podlapse_bin())
        .args(["diagnose", "-o", "json", "--api-socket"])
        .arg(socket)
        .args(extra)
        .output()
        .ok()?;
    if !matches!(out.status.code(), Some(0 | 1)) {
        return None;
    }
    serde_json::from_slice(&out.stdout).ok()
}

/// The agent's node: its pods are named `<manifest name>-diagnose`.
const NODE: &str = "diagnose";

/// The verdict on the pod of the manifest that names it `name`.
fn verdict<'d>(d: &'d Diagnosis, name: &str) -> Option<&'d PodDiagnosis> {
    let name = static_name(name, NODE);
    d.pods.iter().find(|p| p.name == name)
}

#[test]
fn the_live_agent_names_a_missing_image_a_crash_on_start_and_a_healthy_pod() {
    let _one = serial();
    require_lab();
    let probes = require_probes();
    // Short back-off, so the crashing container is restarted (and backed off) within
    // seconds rather than kubelet's 10 s.
    let agent = Agent::start(
        NODE,
        &[
            "--probes",
            probes.to_str().unwrap(),
            "--backoff-initial",
            "1s",
            "--backoff-max",
            "2s",
        ],
    );
    agent.write("pods.yaml", &pods());
    let expected = [
        ("diag-healthy", Cause::Healthy),
        ("diag-no-image", Cause::ImagePullFailed),
        ("diag-crash", Cause::CrashLoop),
    ];
    // Each look is one API call; the verdicts settle as the agent records the pulls,
    // exits and back-offs, well within the limit.
    let d = podlapse_tests::eventually(
        "the verdicts to settle",
        Duration::from_secs(120),
        Duration::from_millis(100),
        || {
            let d = diagnose(&agent.socket, &[]);
            // The kernel's exit events reach the agent through the ring buffer, on their
            // own path: wait for them too.
            match d {
                Some(d)
                    if expected
                        .iter()
                        .all(|(n, c)| verdict(&d, n).is_some_and(|p| p.verdict.cause == *c))
                        && verdict(&d, "diag-crash").is_some_and(|p| {
                            p.verdict
                                .evidence
                                .iter()
                                .any(|e| e.starts_with("the kernel saw its process end:"))
                        }) =>
                {
                    Ok(d)
                }
                other => Err(format!("{other:#?}")),
            }
        },
    );
    eprintln!("{d:#?}");

    let ok = verdict(&d, "diag-healthy").unwrap();
    assert_eq!(ok.verdict.stage, "running");
    assert!(ok.running && ok.also.is_empty(), "{ok:#?}");
    assert!(
        ok.ip
            .as_deref()
            .is_some_and(|ip| ip_in_subnet(ip, xtask::lab::POD_SUBNET)),
        "{ok:#?}"
    );

    let pull = verdict(&d, "diag-no-image").unwrap();
    assert_eq!(pull.verdict.stage, "image_pull:app", "{pull:#?}");
    assert!(!pull.running, "{pull:#?}");
    assert!(
        pull.verdict
            .evidence
            .iter()
            .any(|e| e.contains("PullImage failed") && e.contains("not-pushed")),
        "{pull:#?}"
    );

    let crash = verdict(&d, "diag-crash").unwrap();
    assert_eq!(crash.verdict.stage, "container_start:app", "{crash:#?}");
    assert!(crash.verdict.summary.contains("exit code 3"), "{crash:#?}");
    let ev = &crash.verdict.evidence;
    assert!(
        ev.iter()
            .any(|e| e.starts_with("the kernel saw its process end:") && e.contains("exit 3")),
        "{crash:#?}"
    );
    assert!(
        ev.iter()
            .any(|e| e.contains("restarting failed container=app")),
        "{crash:#?}"
    );

    // The table, for one pod.
    let out = Command::new(podlapse_bin())
        .args([
            "diagnose",
            "--pod",
            &agent.name("diag-crash"),
            "--api-socket",
        ])
        .arg(&agent.socket)
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(1), "{}", stderr(&out));
    let text = stdout(&out);
    assert!(
        text.starts_with("default/diag-crash-diagnose  uid "),
        "{text}"
    );
    assert!(
        text.contains("crash_loop  stage container_start:app: "),
        "{text}"
    );
    assert!(
        text.ends_with("1 pod, 0 healthy, 1 with a problem\n"),
        "{text}"
    );
}
