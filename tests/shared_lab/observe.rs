//! `podlapse observe` beside other CRI clients on the lab: a kubelet-like client built on
//! the official CRI protos (`cri-pod-client`) and a second podlapse each create pods while
//! the observer records. Every pod gets its own kernel stages and the runtime's times,
//! none attributed to another pod, both while they run (the observer's API) and in its
//! trace; every call the observer made only reads (a recording proxy between it and the
//! runtime keeps them), and replay refuses the observed trace.

use podlapse::timeline::{PodTimeline, StageSource, Timeline};
use podlapse::trace::read_trace;
use podlapse_tests::cri_proxy::CriProxy;
use podlapse_tests::ebpf::{require_probes, serial};
use podlapse_tests::observer::{ClientRun, Observer};
use podlapse_tests::otlp::reconnect_runtime_exporter;
use podlapse_tests::{Scratch, podlapse, require_lab, runtime_version, stderr};
use serde_json::Value;
use xtask::lab::IMAGE_APP;

fn waterfall(p: &PodTimeline) -> String {
    p.stages
        .iter()
        .map(|s| {
            format!(
                "{:<28} {:<8} {:?} {}",
                s.stage,
                s.source.to_string(),
                s.sandbox_id,
                s.detail
            )
        })
        .collect::<Vec<_>>()
        .join("\n")
}

/// The pod's kernel stages and the runtime's times are all there, on its own sandbox.
fn assert_observed(t: &Timeline, uid: &str, sandbox: &str, container: &str) {
    let p = t
        .pods
        .iter()
        .find(|p| p.uid == uid)
        .unwrap_or_else(|| panic!("pod {uid} is not in the observed timeline"));
    for name in [
        "netns_created",
        "cni_add",
        "cni_plugin:bridge",
        "pause_exec",
        "app_first_exec:app",
    ] {
        let s = p
            .stage(name)
            .unwrap_or_else(|| panic!("{}: no {name}\n{}", p.name, waterfall(p)));
        assert_eq!(s.source, StageSource::Kernel, "{name}");
    }
    for name in ["sandbox_ready", "container_started:app", "running"] {
        let s = p
            .stage(name)
            .unwrap_or_else(|| panic!("{}: no {name}\n{}", p.name, waterfall(p)));
        assert_eq!(s.source, StageSource::Runtime, "{name}");
    }
    assert!(p.ip.is_some(), "{}: no IP\n{}", p.name, waterfall(p));
    // Nothing of another pod's: every stage naming a sandbox or container names this
    // pod's.
    for s in &p.stages {
        if let Some(id) = &s.sandbox_id {
            assert_eq!(
                id,
                sandbox,
                "{}: {} on another sandbox\n{}",
                p.name,
                s.stage,
                waterfall(p)
            );
        }
        if let Some(id) = &s.container_id {
            assert!(
                container.ends_with(id.as_str()),
                "{}: {} of container {id}, not {container}",
                p.name,
                s.stage
            );
        }
    }
    // What only the client knows is absent, not guessed.
    assert!(p.stage("admitted").is_none() && p.stage("sandbox_requested").is_none());
}

/// The runtime's network setup inside RunPodSandbox and its task's start inside
/// StartContainer, from its own spans.
fn has_runtime_stages(p: &PodTimeline) -> bool {
    p.stage("runtime:network_setup").is_some()
        && p.stages
            .iter()
            .any(|s| s.stage.runtime_step() == Some("task_start"))
}

fn assert_runtime_stages(p: &PodTimeline, sandbox: &str) {
    assert!(
        has_runtime_stages(p),
        "{}: no runtime stages\n{}",
        p.name,
        waterfall(p)
    );
    let net = p.stage("runtime:network_setup").unwrap();
    assert_eq!(net.source, StageSource::Runtime);
    assert_eq!(net.sandbox_id.as_deref(), Some(sandbox), "{net:?}");
    // At the time the kernel saw the CNI plugins run (the runtime's clock and the
    // kernel's are two clocks: overlapping, not nested to the nanosecond).
    let add = p.stage("cni_add").unwrap();
    assert!(
        net.start_ns < add.end_ns && add.start_ns < net.end_ns,
        "{}: network setup {}..{} is not at the CNI ADD {}..{}\n{}",
        p.name,
        net.start_ns,
        net.end_ns,
        add.start_ns,
        add.end_ns,
        waterfall(p)
    );
}

#[test]
fn the_observer_times_the_pods_of_two_other_clients_each_on_its_own_and_changes_nothing() {
    beside_two_clients(Learn::Auto);
}

/// containerd 1.x's way: the observer lists the runtime's sandboxes and containers.
#[test]
fn polling_instead_of_the_event_stream_gives_the_same_pods_and_stages() {
    beside_two_clients(Learn::Polling);
}

#[derive(Debug, Clone, Copy, PartialEq)]
enum Learn {
    /// The event stream where the runtime is containerd 2.x.
    Auto,
    Polling,
}

#[expect(
    clippy::too_many_lines,
    reason = "one story on a live lab: two clients, their pods, then what observe shows of each"
)]
fn beside_two_clients(learn: Learn) {
    let _one = serial();
    require_lab();
    let probes = require_probes();
    let scratch = Scratch::new();
    let trace = scratch.path().join("observed.jsonl");
    // The observer reaches the runtime only through a proxy that keeps every method.
    let proxy = CriProxy::start(&podlapse_tests::lab().cri_socket(), scratch.path());
    // containerd 2.x traces the CRI calls sent with a sampled context: the client sends
    // one, as a kubelet with tracing on does, and the observer receives the spans.
    let runtime_spans = learn == Learn::Auto && runtime_version().0 >= 2;
    let mut extra: Vec<&str> = Vec::new();
    match learn {
        Learn::Auto => {}
        Learn::Polling => extra.extend(["--cri-events", "poll"]),
    }
    if runtime_spans {
        reconnect_runtime_exporter();
        extra.extend(["--runtime-otlp-listen", xtask::lab::RUNTIME_OTLP_ADDR]);
    }
    let observer = Observer::start(&trace, &probes, &proxy.endpoint(), &extra);

    // A second podlapse as one client, the CRI-protos client as the other, at once. The
    // client holds its pods until told to tear them down.
    let manifest = scratch.manifest(
        "pt.yaml",
        &format!(
            "apiVersion: v1\nkind: Pod\nmetadata: {{name: observed-by-podlapse}}\nspec:\n  terminationGracePeriodSeconds: 2\n  containers:\n  - {{name: app, image: {IMAGE_APP}, command: [sleep, '3600']}}\n"
        ),
    );
    let cri = format!("unix://{}", podlapse_tests::lab().cri_socket().display());
    let mut client_args = vec![
        "--pods",
        "5",
        "--prefix",
        "observed",
        "--image",
        IMAGE_APP,
        "--hold-seconds",
        "900",
    ];
    if runtime_spans {
        client_args.push("--trace-calls");
    }
    let client_run = ClientRun::spawn(env!("CARGO_BIN_EXE_cri-pod-client"), &cri, &client_args);
    let (out, doc) = scratch.run(&[&manifest], &["--cleanup", "--no-ebpf"]);
    assert!(out.status.success(), "{doc:#}\n{}", stderr(&out));
    let client = client_run.pods(5);
    for p in &client {
        assert_eq!(p["ok"], true, "the client's pod did not start: {p}");
    }

    // While they run, the observer's API shows them: as the runtime runs them
    // (`podlapse pods`), and their timelines so far (`podlapse timeline --live`).
    let uid = |p: &Value| p["uid"].as_str().unwrap().to_string();
    let listed = observer.wait_api(&["pods"], "the client's pods running, with IPs", |l| {
        client.iter().all(|p| {
            l["items"].as_array().into_iter().flatten().any(|item| {
                item["metadata"]["uid"] == p["uid"]
                    && item["status"]["podIP"].is_string()
                    && item["status"]["containerStatuses"][0]["state"]["running"].is_object()
            })
        })
    });
    for item in listed["items"].as_array().unwrap() {
        if client.iter().any(|p| item["metadata"]["uid"] == p["uid"]) {
            assert_eq!(item["status"]["phase"], "Running", "{item:#}");
            assert_eq!(item["metadata"]["namespace"], "default", "{item:#}");
        }
    }
    let live = observer.wait_api(
        &["timeline", "--live"],
        if runtime_spans {
            "the client's pods with their first exec, Running and the runtime's spans"
        } else {
            "the client's pods with their first exec and Running"
        },
        |t| {
            let t: Timeline = serde_json::from_value(t.clone()).unwrap_or_default();
            client.iter().all(|p| {
                t.pods.iter().any(|tp| {
                    tp.uid == uid(p)
                        && tp.stage("running").is_some()
                        && tp.stage("app_first_exec:app").is_some()
                        && (!runtime_spans || has_runtime_stages(tp))
                })
            })
        },
    );
    let live: Timeline = serde_json::from_value(live).unwrap();
    for p in &client {
        assert_observed(
            &live,
            p["uid"].as_str().unwrap(),
            p["sandbox_id"].as_str().unwrap(),
            p["container_id"].as_str().unwrap(),
        );
    }
    if runtime_spans {
        for p in &client {
            let tp = live.pods.iter().find(|tp| tp.uid == uid(p)).unwrap();
            assert_runtime_stages(tp, p["sandbox_id"].as_str().unwrap());
        }
    }
    let torn_down = client_run.stop();
    assert!(torn_down.success(), "cri-pod-client tore down: {torn_down}");
    let (status, last) = observer.stop();
    assert!(status.success(), "the observer exited {status}: {last:?}");
    // It changed nothing: every call it made only reads.
    let methods = proxy.methods();
    let reads = [
        "Version",
        "Status",
        "RuntimeConfig",
        "ListPodSandbox",
        "ListContainers",
        "PodSandboxStatus",
        "ContainerStatus",
        "GetContainerEvents",
    ];
    assert!(
        methods.iter().all(|m| reads.contains(&m.as_str())),
        "the observer called more than reads: {methods:?}"
    );
    assert!(
        methods.contains("ListPodSandbox") && methods.contains("ListContainers"),
        "the proxy saw none of the observer's reads: {methods:?}"
    );

    // Every line is a record the published schema allows.
    // Built in: the modern node's guest has the test binary, not the workspace.
    let schema: Value =
        serde_json::from_str(include_str!("../../docs/trace-format.schema.json")).unwrap();
    let validator = jsonschema::validator_for(&schema).expect("the schema compiles");
    for (n, line) in std::fs::read_to_string(&trace).unwrap().lines().enumerate() {
        let record: Value = serde_json::from_str(line).expect("a JSON line");
        if let Err(e) = validator.validate(&record) {
            panic!("line {}: {e}\n{line}", n + 1);
        }
    }
    let read = read_trace(&trace).expect("the observed trace reads back");
    let observed = read
        .header
        .observed
        .as_ref()
        .expect("the header says observed");
    assert!(
        observed.sources.iter().any(|s| s == "kernel"),
        "{observed:?}"
    );
    let containerd_2 = read
        .header
        .runtime_version
        .trim_start_matches('v')
        .starts_with('2');
    if learn == Learn::Auto && containerd_2 {
        assert!(
            observed.sources.iter().any(|s| s == "cri:events"),
            "{observed:?}"
        );
        assert!(methods.contains("GetContainerEvents"), "{methods:?}");
    } else {
        // Polling, as on containerd 1.x, where subscribing would take events from the
        // kubelet: the stream is never opened.
        assert!(
            observed.sources.iter().any(|s| s == "cri:polling"),
            "{observed:?}"
        );
        assert!(!methods.contains("GetContainerEvents"), "{methods:?}");
    }
    assert!(read.footer.is_some(), "the trace was closed");
    let t = podlapse::timeline::build(&read.records);

    for p in &client {
        assert_observed(
            &t,
            p["uid"].as_str().unwrap(),
            p["sandbox_id"].as_str().unwrap(),
            p["container_id"].as_str().unwrap(),
        );
        if runtime_spans {
            let tp = t.pods.iter().find(|tp| tp.uid == uid(p)).unwrap();
            assert_runtime_stages(tp, p["sandbox_id"].as_str().unwrap());
        }
    }
    if runtime_spans {
        assert!(
            observed.sources.iter().any(|s| s == "runtime_spans"),
            "{observed:?}"
        );
    }
    let mine = &doc["pods"][0];
    let uid = mine["uid"].as_str().unwrap();
    let p = t
        .pods
        .iter()
        .find(|p| p.uid == uid)
        .expect("podlapse's pod was observed");
    let sandbox = p.sandbox_ids.last().expect("a sandbox").clone();
    let container = p.containers.keys().next().expect("a container").clone();
    assert_observed(&t, uid, &sandbox, &container);
    assert_eq!(
        p.ip.as_deref(),
        mine["ip"].as_str(),
        "the IP the client got"
    );

    // Every pod's sandbox is its own: no two pods share one.
    let mut sandboxes: Vec<&String> = t.pods.iter().flat_map(|p| &p.sandbox_ids).collect();
    let n = sandboxes.len();
    sandboxes.sort();
    sandboxes.dedup();
    assert_eq!(sandboxes.len(), n, "a sandbox in two pods");

    // The views read it; replay refuses it with its reason.
    let trace_arg = trace.to_str().unwrap();
    let report = podlapse(&["report", trace_arg]);
    assert!(report.status.success(), "{}", stderr(&report));
    let replay = podlapse(&["replay", trace_arg]);
    assert_eq!(replay.status.code(), Some(2), "{}", stderr(&replay));
    assert!(
        stderr(&replay).contains("observed trace"),
        "{}",
        stderr(&replay)
    );
}
