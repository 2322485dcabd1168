//! The kubelet's own spans, received by `podlapse observe` (its `--runtime-otlp-listen`,
//! where a kubelet's `tracing.endpoint` points): the suite's own CRI client exports what a
//! tracing kubelet exports (`cri-pod-client --kubelet-spans`: `syncPod` per sync, each CRI
//! call a client span under it with its `traceparent`; names and attributes from
//! kubelet's `pkg/kubelet/kubelet.go` and `cri-client/pkg/remote_runtime.go`, see
//! `tests/bin/kubelet_tracing.rs`). Three pods against a range of two addresses: two run,
//! the third's RunPodSandbox fails and is retried. The observed timeline shows the
//! kubelet's syncs and calls beside the kernel's stages, the runtime's spans under the
//! kubelet's calls (containerd 2.x traces a call that carries a sampled context), and the
//! failing call with the error text the kubelet got.

use podlapse::timeline::Timeline;
use podlapse_tests::cni_conf::{ConfSwap, network, pool};
use podlapse_tests::ebpf::{require_probes, serial};
use podlapse_tests::observer::{ClientRun, Observer, cleanup_client_pods};
use podlapse_tests::otlp::reconnect_runtime_exporter;
use podlapse_tests::{Scratch, podlapse, require_lab, runtime_version, stderr};
use serde_json::Value;
use xtask::lab::{IMAGE_APP, RUNTIME_OTLP_ADDR};

const PREFIX: &str = "obs-kubelet";

/// The stages of pod `name` by name, with their source and whether each is ok.
fn stages(t: &Timeline, name: &str) -> Vec<(String, String, bool, String)> {
    t.pods
        .iter()
        .find(|p| p.name == name)
        .map(|p| {
            p.stages
                .iter()
                .map(|s| {
                    (
                        s.stage.to_string(),
                        s.source.to_string(),
                        s.ok,
                        s.detail.clone(),
                    )
                })
                .collect()
        })
        .unwrap_or_default()
}

fn has(stages: &[(String, String, bool, String)], stage: &str, source: &str) -> bool {
    stages
        .iter()
        .any(|(s, src, _, _)| s == stage && src == source)
}

#[test]
fn the_kubelets_syncs_and_calls_show_beside_the_kernels_stages_with_the_error_it_got() {
    let _one = serial();
    require_lab();
    // containerd 2.x traces a call sent with a sampled context: its server spans then
    // hang under the kubelet's.
    let runtime_traces = runtime_version().0 >= 2;
    let mut swap = ConfSwap::save();
    let conf = network(&swap, "podlapse-obs-kubelet", pool(2, 3));
    swap.use_network(&conf);
    if runtime_traces {
        reconnect_runtime_exporter();
    }
    let scratch = Scratch::new();
    let trace = scratch.path().join("observed.jsonl");
    let cri = format!("unix://{}", podlapse_tests::lab().cri_socket().display());
    let observer = Observer::start(
        &trace,
        &require_probes(),
        &cri,
        &["--runtime-otlp-listen", RUNTIME_OTLP_ADDR],
    );
    let endpoint = format!("http://{RUNTIME_OTLP_ADDR}");
    let client = ClientRun::spawn(
        env!("CARGO_BIN_EXE_cri-pod-client"),
        &cri,
        &[
            "--pods",
            "3",
            "--prefix",
            PREFIX,
            "--image",
            IMAGE_APP,
            "--hold-seconds",
            "900",
            "--retry-sandbox-every",
            "300",
            "--retry-for-seconds",
            "900",
            "--kubelet-spans",
            &endpoint,
        ],
    );
    let started = client.pods(2);
    assert!(started.iter().all(|p| p["ok"] == true), "{started:?}");
    let names: Vec<String> = started
        .iter()
        .map(|p| p["name"].as_str().unwrap().to_string())
        .collect();
    let failing = (0..3)
        .map(|i| format!("{PREFIX}-{i}"))
        .find(|n| !names.contains(n))
        .unwrap();
    let live = observer.wait_api(
        &["timeline", "--live"],
        "the kubelet's syncs and calls of the three pods",
        |t| {
            let t: Timeline = serde_json::from_value(t.clone()).unwrap_or_default();
            names.iter().all(|n| {
                let s = stages(&t, n);
                has(&s, "kubelet_sync:create", "kubelet")
                    && has(&s, "kubelet_call:StartContainer:app", "kubelet")
                    && has(&s, "app_first_exec:app", "kernel")
                    && (!runtime_traces
                        || s.iter().any(|(n, src, _, _)| {
                            n.starts_with("runtime:task_start") && src == "runtime"
                        }))
            }) && stages(&t, &failing)
                .iter()
                .any(|(n, _, ok, _)| n == "kubelet_call:RunPodSandbox" && !ok)
        },
    );
    client.kill();
    cleanup_client_pods(env!("CARGO_BIN_EXE_cri-pod-client"), &cri, PREFIX);
    let (status, last) = observer.stop();
    assert!(status.success(), "the observer exited {status}: {last:?}");
    let out = podlapse(&["timeline", trace.to_str().unwrap(), "-o", "json"]);
    assert!(out.status.success(), "{}", stderr(&out));
    let recorded: Value = serde_json::from_slice(&out.stdout).unwrap();
    let recorded: Timeline = serde_json::from_value(recorded).unwrap();
    for t in [
        serde_json::from_value::<Timeline>(live.clone()).unwrap(),
        recorded,
    ] {
        for n in &names {
            let s = stages(&t, n);
            for (stage, source) in [
                ("kubelet_sync:create", "kubelet"),
                ("kubelet_call:RunPodSandbox", "kubelet"),
                ("kubelet_call:CreateContainer:app", "kubelet"),
                ("kubelet_call:StartContainer:app", "kubelet"),
                ("netns_created", "kernel"),
                ("pause_exec", "kernel"),
                ("app_first_exec:app", "kernel"),
                ("running", "runtime"),
            ] {
                assert!(
                    has(&s, stage, source),
                    "{n}: no {stage} ({source}) in {s:#?}"
                );
            }
            // Every call the kubelet made for the pod succeeded.
            assert!(
                s.iter()
                    .filter(|(st, _, _, _)| st.starts_with("kubelet_call:"))
                    .all(|(_, _, ok, _)| *ok),
                "{n}: {s:#?}"
            );
        }
        // The failing pod: each sync the kubelet retried, and the error it got, in the
        // plugin's own words as the runtime passed them on.
        let s = stages(&t, &failing);
        let failed: Vec<&String> = s
            .iter()
            .filter(|(st, _, ok, _)| st == "kubelet_call:RunPodSandbox" && !ok)
            .map(|(_, _, _, d)| d)
            .collect();
        assert!(!failed.is_empty(), "{failing}: {s:#?}");
        assert!(
            failed
                .iter()
                .all(|d| d.contains("no IP addresses available in range set")),
            "{failing}: {failed:#?}"
        );
        assert!(
            s.iter()
                .any(|(st, _, ok, _)| st == "kubelet_sync:create" && !ok),
            "{failing}: {s:#?}"
        );
    }
}
