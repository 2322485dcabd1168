//! A CNI plugin made to fail shows on its pod's timeline: which plugin, with what exit
//! code. The failure needs a conflist no other test could live with (every pod on the
//! runtime would fail), so this test brings up a lab of its own, with the `tuning` plugin
//! chained after portmap and told to set a sysctl outside `net.` (which it refuses, exit
//! 1), and takes it down again. It runs while the shared lab is down.

use podlapse::ebpf::KernelEvent;
use podlapse::ebpf::event::CniOutput;
use podlapse::timeline::{CniReply, StageKind, StageName, build};
use podlapse::trace::{TraceRecord, read_trace};
use podlapse_tests::ebpf::require_probes;
use podlapse_tests::observer::{ClientRun, Observer, cri_pod_client};
use podlapse_tests::{Scratch, lab, pod, podlapse_bin, stderr, stdout};
use xtask::lab::{IMAGE_APP, LabOptions, LabPaths, UpOutcome, down, snapshot_residue, up_with};

/// Takes the lab down when the test ends, passed or not.
struct OwnLab(LabPaths);

impl Drop for OwnLab {
    fn drop(&mut self) {
        if let Err(e) = down(&self.0, &|_| {}) {
            eprintln!("lab down: {e}");
        }
    }
}

#[expect(
    clippy::too_many_lines,
    reason = "one story on a lab of its own: a failing plugin, then what each view shows of it"
)]
#[test]
fn a_failing_cni_plugin_shows_on_its_pods_timeline_with_its_exit_code() {
    let probes = require_probes();
    let paths = lab();
    let before = snapshot_residue(&paths);
    let options = LabOptions {
        extra_cni_plugins: vec![serde_json::json!({
            "type": "tuning",
            "sysctl": { "kernel.podlapse_lab_fail": "1" }
        })],
        ..LabOptions::default()
    };
    match up_with(&paths, &options, &|_| {}).expect("lab up") {
        UpOutcome::Started(_) => {}
        UpOutcome::AlreadyUp(_) => {
            panic!(
                "a lab was already up: this test needs its own (run it while the shared lab is down)"
            )
        }
    }
    let lab = OwnLab(paths);

    let scratch = Scratch::new();
    let manifest = scratch.manifest(
        "fail.yaml",
        &format!("apiVersion: v1\nkind: Pod\nmetadata: {{name: cni-fails, namespace: default}}\nspec:\n  terminationGracePeriodSeconds: 2\n  containers:\n  - {{name: app, image: {IMAGE_APP}, command: [sleep, '3600']}}\n"),
    );
    let trace_path = scratch.path().join("fail.jsonl");
    // The agent retries the sandbox with back-off, as kubelet does; a few attempts are
    // plenty.
    let (out, doc) = scratch.run(
        &[&manifest],
        &[
            "--ready-timeout",
            "10",
            "--cleanup",
            "--trace",
            trace_path.to_str().unwrap(),
            "--probes",
            probes.to_str().unwrap(),
        ],
    );
    assert!(
        !out.status.success(),
        "the pod ran despite its failing plugin: {doc:#}"
    );
    let p = pod(&doc, "cni-fails");
    let sandbox_failed = p["events"].as_array().into_iter().flatten().any(|e| {
        e["reason"] == "FailedCreatePodSandBox"
            && e["message"].as_str().is_some_and(|m| m.contains("tuning"))
    });
    assert!(sandbox_failed, "{p:#}\n{}", stderr(&out));

    let trace = read_trace(&trace_path).expect("the trace reads back");
    assert!(trace.footer.as_ref().unwrap().ebpf, "{:?}", trace.footer);
    let timeline = build(&trace.records);
    let t = &timeline.pods[0];
    assert_eq!(
        t.name,
        podlapse_tests::static_name("cni-fails", doc["node"].as_str().unwrap())
    );
    let tuning = t.stage("cni_plugin:tuning").unwrap_or_else(|| {
        panic!("no tuning stage: {:#?}", t.stages);
    });
    assert_eq!(
        (tuning.ok, tuning.exit_code),
        (false, Some(1)),
        "{tuning:?}"
    );
    // Its own words, from what it printed: the run attached the write hook before
    // RunPodSandbox went out.
    match &tuning.reply {
        Some(CniReply::Error { msg, .. }) => assert_eq!(
            msg, "invalid net sysctl key: \"kernel.podlapse_lab_fail\"",
            "{tuning:?}"
        ),
        other => panic!("tuning's reply is {other:?}: {tuning:?}"),
    }
    assert!(
        tuning
            .detail
            .contains("invalid net sysctl key: \"kernel.podlapse_lab_fail\""),
        "{tuning:?}"
    );
    for plugin in ["loopback", "bridge", "host-local", "portmap"] {
        let s = t
            .stage(StageName::of(StageKind::CniPlugin, plugin))
            .unwrap_or_else(|| panic!("no {plugin} stage: {:#?}", t.stages));
        assert_eq!(s.exit_code, Some(0), "{s:?}");
        assert_eq!(s.sandbox_id, tuning.sandbox_id);
    }
    let add = t.stage("cni_add").unwrap();
    assert!(!add.ok && add.exit_code == Some(1), "{add:?}");
    assert_eq!(add.detail, "tuning failed with exit code 1");
    // The runtime reports the failure too, and its sandbox ID was never returned: the
    // plugins' CNI_CONTAINERID is the only name that sandbox had.
    let requested = t.stage("sandbox_requested").unwrap();
    assert!(!requested.ok, "{requested:?}");
    assert!(requested.detail.contains("tuning"), "{requested:?}");
    assert!(requested.sandbox_id.is_none());
    assert!(t.stage("netns_created").is_some(), "{:#?}", t.stages);
    assert!(t.stage("sandbox_ready").is_none());

    let out = std::process::Command::new(podlapse_bin())
        .args(["timeline", trace_path.to_str().unwrap()])
        .output()
        .expect("podlapse timeline");
    let text = stdout(&out);
    eprintln!("{text}");
    let line = text
        .lines()
        .find(|l| l.contains("cni_plugin:tuning"))
        .unwrap_or_else(|| panic!("{text}"));
    assert!(line.contains(" 1  |") && line.contains("FAILED"), "{line}");

    // The same failure in another client's pod, as `podlapse observe` sees it: the
    // CRI-protos client retries the sandbox as a kubelet's pod worker does while the
    // observer records, and diagnose names the plugin from the kernel's view alone:
    // live, from the observer while the client still retries, and from the trace after.
    let observed = scratch.path().join("observed.jsonl");
    let cri = format!("unix://{}", lab.0.cri_socket().display());
    let observer = Observer::start(&observed, &probes, &cri, &[]);
    let client = ClientRun::spawn(
        env!("CARGO_BIN_EXE_cri-pod-client"),
        &cri,
        &[
            "--pods",
            "1",
            "--prefix",
            "observed-fails",
            "--image",
            xtask::lab::IMAGE_APP,
            "--retry-sandbox-every",
            "300",
            // Longer than the test waits: it is killed once the verdict is in.
            "--retry-for-seconds",
            "900",
        ],
    );
    let live = observer.wait_api(
        &["diagnose", "--live"],
        "the client's pod failing at tuning, retried",
        |d| observed_verdict(d).is_some_and(|(_, n)| n >= 2),
    );
    let (v, _) = observed_verdict(&live).unwrap();
    assert_eq!(v["cause"], "cni_plugin_failed", "{live:#}");
    assert_eq!(v["stage"], "cni_plugin:tuning", "{live:#}");
    // In the plugin's own words, as the probes captured what it printed.
    let evidence: Vec<&str> = v["evidence"]
        .as_array()
        .into_iter()
        .flatten()
        .filter_map(|e| e.as_str())
        .collect();
    assert!(
        evidence
            .iter()
            .any(|e| e.contains("cni_plugin:tuning ADD exited with code 1")
                && e.contains("it said: error 999: invalid net sysctl key")),
        "{live:#}"
    );
    assert!(
        v["summary"]
            .as_str()
            .is_some_and(|s| s.contains("invalid net sysctl key")),
        "{live:#}"
    );
    client.kill();
    let cleanup = std::process::Command::new(cri_pod_client(env!("CARGO_BIN_EXE_cri-pod-client")))
        .args(["--cri", &cri, "cleanup", "--prefix", "observed-fails"])
        .output()
        .expect("cri-pod-client cleanup runs");
    assert!(cleanup.status.success(), "{}", stderr(&cleanup));
    let (status, last) = observer.stop();
    assert!(status.success(), "the observer exited {status}: {last:?}");
    let out = std::process::Command::new(podlapse_bin())
        .args(["diagnose", observed.to_str().unwrap(), "-o", "json"])
        .output()
        .expect("podlapse diagnose");
    let d: serde_json::Value = serde_json::from_slice(&out.stdout)
        .unwrap_or_else(|e| panic!("diagnose printed no JSON ({e}): {}", stderr(&out)));
    let (v, n) = observed_verdict(&d)
        .unwrap_or_else(|| panic!("the client's pod is not in the diagnosis: {d:#}"));
    assert_eq!(v["cause"], "cni_plugin_failed", "{d:#}");
    assert_eq!(v["stage"], "cni_plugin:tuning", "{d:#}");
    assert!(n >= 2, "the client retried: {d:#}");
    observed_tuning_said_why(&observed);

    let paths = lab.0.clone();
    drop(lab);
    let left = before.diff(&snapshot_residue(&paths));
    assert!(left.is_empty(), "down left behind:\n{}", left.join("\n"));
}

/// In the observer's trace (no CRI call of its own: the write hook is attached when the
/// reader sees the namespace created or a plugin exec'd), tuning's error is captured in
/// the client's sandbox attempts, read from the kernel records themselves; how much of
/// each plugin run's output was captured is printed.
fn observed_tuning_said_why(observed: &std::path::Path) {
    let trace = read_trace(observed).expect("the observed trace reads back");
    let kernel: Vec<&KernelEvent> = trace
        .records
        .iter()
        .filter_map(|r| match r {
            TraceRecord::Kernel(e) => Some(e),
            _ => None,
        })
        .collect();
    let mut errors = 0;
    for e in &kernel {
        let KernelEvent::CniExec(c) = e else { continue };
        if c.command != "ADD" {
            continue;
        }
        let mut chunks: Vec<&CniOutput> = kernel
            .iter()
            .filter_map(|o| match o {
                KernelEvent::CniOutput(o) if o.meta.tgid == c.meta.tgid && !o.end => {
                    Some(o.as_ref())
                }
                _ => None,
            })
            .filter(|o| o.meta.ktime_ns >= c.meta.ktime_ns)
            .collect();
        chunks.sort_by_key(|o| o.offset);
        let bytes: Vec<u8> = chunks.iter().flat_map(|o| o.bytes()).collect();
        let reply = CniReply::parse(&bytes, false);
        eprintln!(
            "observed {} (pid {}): {} bytes captured: {}",
            c.plugin,
            c.meta.tgid,
            bytes.len(),
            reply.summary()
        );
        if c.plugin == "tuning"
            && matches!(&reply, CniReply::Error { msg, .. } if msg.contains("kernel.podlapse_lab_fail"))
        {
            errors += 1;
        }
    }
    assert!(
        errors >= 1,
        "no tuning error captured in the observed trace"
    );
}

/// The verdict on the CRI-protos client's failing pod in a diagnosis, and how many
/// sandbox attempts its evidence counts.
fn observed_verdict(d: &serde_json::Value) -> Option<(&serde_json::Value, usize)> {
    let p = d["pods"]
        .as_array()?
        .iter()
        .find(|p| p["name"] == "observed-fails-0")?;
    let v = &p["verdict"];
    let attempts = v["evidence"][0].as_str()?;
    if !attempts.contains(" the kernel saw") {
        return None;
    }
    let n = attempts.split_whitespace().next()?.parse().ok()?;
    Some((v, n))
}
