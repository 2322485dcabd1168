//! Faults of the node's pod network, made for real on a lab of each test's own, get the
//! verdict naming the right stage from `podlapse diagnose` on the run's trace:
//!
//! - the CNI configuration removed: containerd reports NetworkReady=false and no sandbox
//!   is requested;
//! - a pool of two pod IPs and three pods: the third meets IPAM exhaustion in host-local;
//! - a plugin chained after portmap that exits 1 (`tuning` told to set a sysctl outside
//!   `net.`): the plugin, its exit code and the runtime's error text.
//!
//! Each changes the network every pod on the runtime uses, so each brings up a lab of its
//! own and takes it down again; they run one at a time, while the shared lab is down.

use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::{Mutex, MutexGuard};
use std::time::Duration;

use podlapse::cri::{CriClient, Endpoint, EndpointSource, RuntimeService, Timeouts};
use podlapse::diagnose::{Cause, Diagnosis, PodDiagnosis};
use podlapse_tests::agent::{Agent, phase};
use podlapse_tests::ebpf::require_probes;
use podlapse_tests::{Scratch, ip_in_subnet, lab, podlapse_bin, stderr};
use xtask::lab::{
    IMAGE_APP, LabOptions, LabPaths, POD_SUBNET, ResidueSnapshot, UpOutcome, down,
    snapshot_residue, up_with,
};

/// One lab at a time: they share the lab root and the registry's port.
const MINUTE: Duration = Duration::from_secs(60);

fn one_lab() -> MutexGuard<'static, ()> {
    static LOCK: Mutex<()> = Mutex::new(());
    LOCK.lock().unwrap_or_else(|e| e.into_inner())
}

/// A lab of the test's own, taken down when the test ends, passed or not.
struct OwnLab(LabPaths, Option<ResidueSnapshot>);

impl OwnLab {
    fn up(options: &LabOptions) -> OwnLab {
        let paths = lab();
        let before = snapshot_residue(&paths);
        match up_with(&paths, options, &|_| {}).expect("lab up") {
            UpOutcome::Started(_) => OwnLab(paths, Some(before)),
            UpOutcome::AlreadyUp(_) => panic!(
                "a lab was already up: this test needs its own (run it while the shared lab is down)"
            ),
        }
    }

    /// Takes the lab down and checks it left nothing behind, whatever the fault was.
    fn finish(mut self) {
        let before = self.1.take().expect("finished once");
        down(&self.0, &|_| {}).expect("lab down");
        let left = before.diff(&snapshot_residue(&self.0));
        assert!(left.is_empty(), "down left behind:\n{}", left.join("\n"));
    }
}

impl Drop for OwnLab {
    fn drop(&mut self) {
        if self.1.is_some()
            && let Err(e) = down(&self.0, &|_| {})
        {
            eprintln!("lab down: {e}");
        }
    }
}

fn pod_yaml(name: &str) -> String {
    format!(
        "apiVersion: v1\nkind: Pod\nmetadata: {{name: {name}}}\nspec:\n  terminationGracePeriodSeconds: 1\n  containers:\n  - {{name: app, image: {IMAGE_APP}, command: [sleep, '3600']}}\n"
    )
}

/// `podlapse run --until-ready --cleanup --trace` of `yaml`; returns the trace's path.
/// The run ends once every pod is Running or has failed once.
fn traced_run(scratch: &Scratch, yaml: &str) -> PathBuf {
    let manifest = scratch.manifest("pods.yaml", yaml);
    let trace = scratch.path().join("run.jsonl");
    let probes = require_probes();
    let (out, doc) = scratch.run(
        &[&manifest],
        &[
            "--ready-timeout",
            "60",
            "--cleanup",
            "--trace",
            trace.to_str().unwrap(),
            "--probes",
            probes.to_str().unwrap(),
        ],
    );
    eprintln!("{doc:#}\n{}", stderr(&out));
    trace
}

fn diagnose(trace: &Path) -> Diagnosis {
    let out = Command::new(podlapse_bin())
        .args(["diagnose", "-o", "json"])
        .arg(trace)
        .output()
        .expect("podlapse diagnose");
    let d: Diagnosis = serde_json::from_slice(&out.stdout)
        .unwrap_or_else(|e| panic!("no diagnosis ({e}): {}", stderr(&out)));
    eprintln!("{d:#?}");
    let healthy = d.pods.iter().all(|p| p.verdict.cause.is_healthy());
    assert_eq!(out.status.code(), Some(if healthy { 0 } else { 1 }));
    d
}

fn evidence(p: &PodDiagnosis, text: &str) -> bool {
    p.verdict.evidence.iter().any(|e| e.contains(text))
}

/// The runtime's NetworkReady condition: (status, reason, message).
fn network_ready(paths: &LabPaths) -> (bool, String, String) {
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    rt.block_on(async {
        let sock = paths.cri_socket();
        let ep = Endpoint {
            given: sock.display().to_string(),
            path: sock,
            source: EndpointSource::Flag,
        };
        let cri = CriClient::connect(ep, Timeouts::default())
            .await
            .expect("lab CRI");
        let status = cri.status(false).await.expect("CRI Status");
        let c = status
            .status
            .into_iter()
            .flat_map(|s| s.conditions)
            .find(|c| c.r#type == "NetworkReady")
            .expect("a NetworkReady condition");
        (c.status, c.reason, c.message)
    })
}

/// Waits until containerd reports NetworkReady=false (it watches its CNI configuration
/// directory and reloads on change); its reason and message.
fn not_ready(paths: &LabPaths) -> (String, String) {
    podlapse_tests::eventually(
        "containerd to report NetworkReady=false without a conflist",
        Duration::from_secs(60),
        Duration::from_millis(50),
        || match network_ready(paths) {
            (false, reason, message) => Ok((reason, message)),
            (true, _, _) => Err("still NetworkReady=true"),
        },
    )
}

#[test]
fn a_removed_cni_configuration_is_network_not_ready() {
    let _one = one_lab();
    let lab = OwnLab::up(&LabOptions::default());
    assert!(network_ready(&lab.0).0, "the lab's network starts ready");
    std::fs::remove_file(lab.0.cni_conflist()).expect("remove the conflist");
    // containerd watches its CNI config directory and reloads on change; each look is
    // one CRI call, bounded.
    let (reason, message) = not_ready(&lab.0);
    assert_eq!(reason, "NetworkPluginNotReady");

    let scratch = Scratch::new();
    let trace = traced_run(&scratch, &pod_yaml("no-network"));
    let d = diagnose(&trace);
    let p = &d.pods[0];
    assert_eq!(
        (p.verdict.cause, p.verdict.stage.to_string().as_str()),
        (Cause::NetworkNotReady, "sandbox_requested"),
        "{p:#?}"
    );
    assert!(
        evidence(
            p,
            &format!("CRI Status: NetworkReady=false ({reason}: {message})")
        ),
        "{p:#?}"
    );
    assert!(evidence(p, "no RunPodSandbox was called"), "{p:#?}");
    assert!(p.ip.is_none() && !p.running);
    lab.finish();
}

#[test]
fn a_pod_created_before_the_network_is_ready_waits_for_it_as_a_stage() {
    let _one = one_lab();
    let lab = OwnLab::up(&LabOptions::default());
    let conflist = lab.0.cni_conflist();
    let saved = std::fs::read(&conflist).expect("read the conflist");
    std::fs::remove_file(&conflist).expect("remove the conflist");
    not_ready(&lab.0);

    // An agent (not `--until-ready`, which settles on a pod the network holds back)
    // retries after its error back-off; once it has met the closed gate, the network
    // comes back.
    let agent = Agent::start("late-network", &["--error-backoff", "1s"]);
    agent.write("pods.yaml", &pod_yaml("late-network"));
    agent.wait_pod("late-network", "NetworkNotReady", MINUTE, |p| {
        p["events"]
            .as_array()
            .is_some_and(|e| e.iter().any(|e| e["reason"] == "NetworkNotReady"))
    });
    std::fs::write(&conflist, &saved).expect("restore the conflist");
    agent.wait_pod("late-network", "Running", MINUTE, |p| phase(p) == "Running");
    let timeline = agent.timeline();
    let stages = timeline["pods"][0]["stages"].as_array().unwrap();
    let stage = |name: &str| {
        stages
            .iter()
            .find(|s| s["stage"] == name)
            .unwrap_or_else(|| panic!("no {name}: {stages:#?}"))
    };
    let wait = stage("network_wait");
    assert!(
        wait["detail"]
            .as_str()
            .unwrap()
            .contains("the runtime's network was not ready: NetworkPluginNotReady"),
        "{wait:#}"
    );
    // It ends when the sandbox's creation can begin, and covers at least one error
    // back-off.
    assert!(
        wait["duration_ns"].as_u64().unwrap() >= 1_000_000_000,
        "{wait:#}"
    );
    assert!(
        wait["end_ns"].as_u64() <= stage("sandbox_requested")["start_ns"].as_u64(),
        "{stages:#?}"
    );
    drop(agent);
    lab.finish();
}

#[test]
fn a_pool_of_two_pod_ips_leaves_the_third_pod_to_ipam_exhaustion() {
    let _one = one_lab();
    let lab = OwnLab::up(&LabOptions {
        max_pod_ips: Some(2),
        ..LabOptions::default()
    });
    let scratch = Scratch::new();
    let yaml = ["pool-a", "pool-b", "pool-c"].map(pod_yaml).join("---\n");
    let trace = traced_run(&scratch, &yaml);
    let d = diagnose(&trace);
    let (exhausted, healthy): (Vec<&PodDiagnosis>, Vec<&PodDiagnosis>) = d
        .pods
        .iter()
        .partition(|p| p.verdict.cause == Cause::IpamExhausted);
    assert_eq!(exhausted.len(), 1, "{d:#?}");
    let p = exhausted[0];
    assert_eq!(p.verdict.stage, "cni_plugin:host-local", "{p:#?}");
    assert!(evidence(p, "no IP addresses available"), "{p:#?}");
    assert!(
        evidence(p, "cni_plugin:host-local ADD exited with code"),
        "{p:#?}"
    );
    assert!(p.ip.is_none());
    let mut ips: Vec<&str> = healthy
        .iter()
        .map(|h| {
            assert_eq!(h.verdict.cause, Cause::Healthy, "{h:#?}");
            h.ip.as_deref().unwrap()
        })
        .collect();
    ips.sort_unstable();
    assert_eq!(ips, ["10.244.77.2", "10.244.77.3"]);
    assert!(ips.iter().all(|ip| ip_in_subnet(ip, POD_SUBNET)));
    lab.finish();
}

#[test]
fn a_cni_plugin_that_exits_1_is_named_with_its_exit_code_and_the_runtimes_error() {
    let _one = one_lab();
    let lab = OwnLab::up(&LabOptions {
        extra_cni_plugins: vec![serde_json::json!({
            "type": "tuning",
            "sysctl": { "kernel.podlapse_lab_fail": "1" }
        })],
        ..LabOptions::default()
    });
    let scratch = Scratch::new();
    let trace = traced_run(&scratch, &pod_yaml("plugin-fails"));
    let d = diagnose(&trace);
    let p = &d.pods[0];
    assert_eq!(
        (p.verdict.cause, p.verdict.stage.to_string().as_str()),
        (Cause::CniPluginFailed, "cni_plugin:tuning"),
        "{p:#?}"
    );
    // With the plugin's own words, as the probes captured what it printed.
    assert_eq!(
        p.verdict.summary,
        "CNI plugin tuning exited with code 1 during ADD; it said: invalid net sysctl key: \"kernel.podlapse_lab_fail\""
    );
    assert!(
        evidence(p, "cni_plugin:tuning ADD exited with code 1 (kernel, pid "),
        "{p:#?}"
    );
    assert!(
        evidence(
            p,
            "plugin type=\"tuning\" failed (add): invalid net sysctl key"
        ),
        "{p:#?}"
    );
    // The runtime tore the sandbox's network down again: nothing leaked.
    assert!(p.also.is_empty(), "{p:#?}");
    lab.finish();
}
