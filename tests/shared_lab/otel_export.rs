//! OpenTelemetry export on the lab: a pod's startup arrives at an OTLP receiver (the
//! OpenTelemetry project's generated server) as one trace with the right parents; the
//! modern node's containerd exports its own spans to the same receiver; `podlapse
//! export` of the run's trace gives the same spans; a receiver that goes away costs
//! spans, counted, and no pod work. On containerd 2.x, whose gRPC server traces CRI
//! calls, the agent receives the runtime's spans itself (`--runtime-otlp-listen`): they
//! hang under podlapse's CRI spans in the exported trace and show as `runtime:*` stages
//! inside RunPodSandbox in `timeline` and `report`.

use std::collections::{BTreeMap, BTreeSet};
use std::sync::{Mutex, MutexGuard};
use std::time::{Duration, Instant};

use podlapse_tests::agent::{Agent, metric, phase};
use podlapse_tests::otlp::{ReceivedSpan, Receiver, reconnect_runtime_exporter};
use podlapse_tests::{podlapse, require_lab, runtime_version, stderr};

use xtask::lab::IMAGE_APP as APP;
/// Used by no other test of the modern node's suite: its pull here is a real one.
use xtask::lab::IMAGE_BIG10 as BIG10;
const MINUTE: Duration = Duration::from_secs(60);
/// OTLP's SPAN_KIND_SERVER and SPAN_KIND_CLIENT.
const SERVER: i32 = 2;
const CLIENT: i32 = 3;

/// The lab's runtime exports to one address ([`xtask::lab::RUNTIME_OTLP_ADDR`]): the tests
/// here that listen on it, or whose agent's calls make the runtime export, take turns.
static RUNTIME_OTLP_PORT: Mutex<()> = Mutex::new(());

fn runtime_otlp_port() -> MutexGuard<'static, ()> {
    RUNTIME_OTLP_PORT.lock().unwrap_or_else(|e| e.into_inner())
}

fn pod_yaml(name: &str) -> String {
    pod_with_image(name, APP)
}

/// Pulled every time (`Always`).
fn pod_with_image(name: &str, image: &str) -> String {
    format!(
        "apiVersion: v1\nkind: Pod\nmetadata: {{name: {name}}}\nspec:\n  terminationGracePeriodSeconds: 2\n  containers:\n  - {{name: c, image: {image}, imagePullPolicy: Always, command: [sleep, '3600']}}\n"
    )
}

/// podlapse's spans of the pod named `pod` (`<name>-<node>`), once its root arrived.
fn pod_trace(receiver: &Receiver, pod: &str) -> Vec<ReceivedSpan> {
    let spans = receiver.wait_for(&format!("{pod}'s startup"), MINUTE, |spans| {
        spans
            .iter()
            .any(|s| s.name == "pod_startup" && s.attr("k8s.pod.name") == Some(pod))
    });
    let root = spans
        .iter()
        .find(|s| s.name == "pod_startup" && s.attr("k8s.pod.name") == Some(pod))
        .unwrap();
    spans
        .iter()
        .filter(|s| s.service == "podlapse" && s.trace_id == root.trace_id)
        .cloned()
        .collect()
}

fn one<'a>(
    spans: &'a [ReceivedSpan],
    what: impl Fn(&ReceivedSpan) -> bool,
    name: &str,
) -> &'a ReceivedSpan {
    let found: Vec<&ReceivedSpan> = spans.iter().filter(|s| what(s)).collect();
    assert_eq!(found.len(), 1, "{name}: {found:#?}");
    found[0]
}

/// True when the runtime exports spans of its own on this lab: containerd from 1.7 (the
/// modern node's is configured for it, and the host lab's 2.x); Debian's 1.6 build on
/// the host lab has no tracing plugin.
fn runtime_traces() -> bool {
    runtime_version() >= (1, 7)
}

/// True when the runtime's gRPC server makes a span for each CRI call under the
/// `traceparent` podlapse sends: containerd 2.x. Debian's 1.7 build leaves that
/// instrumentation out.
fn runtime_traces_cri_calls() -> bool {
    runtime_version().0 >= 2
}

#[test]
fn a_pods_startup_arrives_as_one_trace_and_the_recorded_trace_exports_the_same() {
    require_lab();
    let _port = runtime_otlp_port();
    let receiver = Receiver::start(xtask::lab::RUNTIME_OTLP_ADDR);
    let traces = runtime_traces();
    // The modern node's containerd is a systemd unit whose exporter has been failing
    // since boot; the host lab's is the lab's own process, left alone (the other tests
    // of this binary use it at the same time).
    if traces {
        reconnect_runtime_exporter();
    }
    let trace_dir = tempfile::tempdir().unwrap();
    let trace = trace_dir.path().join("otel.jsonl");
    let mut agent = Agent::start(
        "otel",
        &[
            "--otlp-endpoint",
            &receiver.endpoint(),
            "--trace",
            trace.to_str().unwrap(),
        ],
    );
    // The image's layers are taken off the node first, so the runtime really pulls and
    // unpacks it: work a tracing runtime sends spans for. Absent already is as good.
    let lab = require_lab();
    let _ = std::process::Command::new("ctr")
        .arg("--address")
        .arg(lab.cri_socket())
        .args(["--namespace", "k8s.io", "images", "rm", BIG10])
        .output();
    agent.write("traced.yaml", &pod_with_image("traced", BIG10));
    agent.wait_pod("traced", "Running", MINUTE, |p| phase(p) == "Running");
    let spans = pod_trace(&receiver, &agent.name("traced"));
    let root = one(&spans, |s| s.name == "pod_startup", "the root");
    assert_eq!(root.parent_span_id, "", "the root has no parent");
    assert_eq!(
        root.resource.get("k8s.node.name").map(String::as_str),
        Some("otel")
    );
    assert_eq!(root.attr("k8s.namespace.name"), Some("default"));
    let by_id: BTreeMap<&str, &ReceivedSpan> =
        spans.iter().map(|s| (s.span_id.as_str(), s)).collect();
    for s in &spans {
        if s.span_id != root.span_id {
            assert!(
                by_id.contains_key(s.parent_span_id.as_str()),
                "{}'s parent is not in the trace",
                s.name
            );
        }
    }
    // CRI calls are client spans under the root, named as kubelet names them.
    let call = |method: &str| {
        one(
            &spans,
            |s| s.name.ends_with(&format!("/{method}")) && s.kind == CLIENT,
            method,
        )
    };
    let sandbox = call("RunPodSandbox");
    assert_eq!(sandbox.name, "runtime.v1.RuntimeService/RunPodSandbox");
    assert_eq!(sandbox.parent_span_id, root.span_id);
    assert_eq!(sandbox.attr("podlapse.stage"), Some("sandbox_requested"));
    let create = call("CreateContainer");
    let start = call("StartContainer");
    for c in [create, start] {
        assert_eq!(c.parent_span_id, root.span_id, "{}", c.name);
        assert_eq!(c.attr("k8s.container.name"), Some("c"));
        assert!(c.attr("container.id").is_some(), "{}", c.name);
    }
    // Kernel stages are children of the call they happened inside.
    let netns = one(&spans, |s| s.name == "netns_created", "netns_created");
    assert_eq!(netns.parent_span_id, sandbox.span_id);
    let plugins: Vec<&ReceivedSpan> = spans
        .iter()
        .filter(|s| s.name.starts_with("cni_plugin:"))
        .collect();
    assert!(!plugins.is_empty());
    for p in &plugins {
        assert_eq!(p.parent_span_id, sandbox.span_id, "{}", p.name);
        assert!(p.attr("podlapse.cni.plugin").is_some());
    }
    let cgroup = one(
        &spans,
        |s| s.name == "container_cgroup:c",
        "container_cgroup:c",
    );
    assert_eq!(cgroup.parent_span_id, start.span_id);
    let seen = one(&spans, |s| s.name == "pod_seen", "pod_seen");
    assert_eq!(seen.parent_span_id, root.span_id);
    // The runtime's own spans, sent straight to this receiver. The modern node's
    // containerd 1.7 exports its spans (its tracing is configured by the lab); Debian's
    // 1.6 build on the host lab has no tracing plugin. Debian's 1.7 build also leaves
    // out the gRPC server instrumentation (otelgrpc), so it makes no span for a CRI call
    // and does not read the traceparent podlapse sends: its spans (an image pull's)
    // start traces of their own. containerd 2.x makes its server span under podlapse's
    // call. Any runtime span that does join the pod's trace must hang under podlapse's.
    if traces {
        // containerd's exporter may be waiting out a reconnection back-off (up to two
        // minutes) from a time nothing listened here. It sends in batches, and a parent
        // ends (so is sent) after its children: wait until every containerd span of the
        // pod's trace has its parent here, ours or containerd's, or the bound passes.
        let ours: BTreeMap<&str, &ReceivedSpan> =
            spans.iter().map(|s| (s.span_id.as_str(), s)).collect();
        let all = receiver.wait_for(
            "containerd's own spans, each with its parent",
            3 * MINUTE,
            |all| {
                let joined: Vec<&ReceivedSpan> = all
                    .iter()
                    .filter(|s| s.service == "containerd" && s.trace_id == root.trace_id)
                    .collect();
                all.iter().any(|s| s.service == "containerd")
                    && joined.iter().all(|s| {
                        ours.contains_key(s.parent_span_id.as_str())
                            || joined.iter().any(|t| t.span_id == s.parent_span_id)
                    })
            },
        );
        let joined: Vec<&ReceivedSpan> = all
            .iter()
            .filter(|s| s.service == "containerd" && s.trace_id == root.trace_id)
            .collect();
        for s in &joined {
            let under_ours = ours.contains_key(s.parent_span_id.as_str());
            let under_theirs = joined.iter().any(|t| t.span_id == s.parent_span_id);
            assert!(
                under_ours || under_theirs,
                "containerd's {} joined the pod's trace outside podlapse's spans",
                s.name
            );
        }
        eprintln!(
            "containerd exported {} spans, {} in the pod's trace",
            all.iter().filter(|s| s.service == "containerd").count(),
            joined.len()
        );
    } else {
        eprintln!("this runtime does not trace (Debian's containerd 1.6 has no tracing plugin)");
    }
    // The recorded trace, exported, gives the same spans.
    agent.stop();
    let mut again = Receiver::start("127.0.0.1:0");
    let out = podlapse(&[
        "export",
        trace.to_str().unwrap(),
        "--otlp-endpoint",
        &again.endpoint(),
    ]);
    assert!(out.status.success(), "{}", stderr(&out));
    let exported = pod_trace(&again, &agent.name("traced"));
    let mut live = spans.clone();
    live.sort();
    let mut file = exported;
    file.sort();
    assert_eq!(
        file, live,
        "podlapse export of the trace against the live export"
    );
    again.stop();
}

#[test]
fn a_receiver_that_goes_away_costs_counted_spans_and_no_pod_work() {
    require_lab();
    let _port = runtime_otlp_port();
    // The agent's calls go out sampled, and a runtime that traces them exports its
    // spans: something listens for them meanwhile, so its exporter stays connected for
    // the other tests here.
    let _runtime_sink = runtime_traces().then(|| Receiver::start(xtask::lab::RUNTIME_OTLP_ADDR));
    let mut receiver = Receiver::start("127.0.0.1:0");
    let trace_dir = tempfile::tempdir().unwrap();
    let trace = trace_dir.path().join("gone.jsonl");
    let mut agent = Agent::start(
        "otelgone",
        &[
            "--otlp-endpoint",
            &receiver.endpoint(),
            "--trace",
            trace.to_str().unwrap(),
        ],
    );
    agent.write("first.yaml", &pod_yaml("first"));
    agent.wait_pod("first", "Running", MINUTE, |p| phase(p) == "Running");
    let sent = pod_trace(&receiver, &agent.name("first")).len();
    assert!(sent > 5);
    receiver.stop();
    agent.write("second.yaml", &pod_yaml("second"));
    agent.wait_pod("second", "Running with the receiver gone", MINUTE, |p| {
        phase(p) == "Running"
    });
    // The second pod's spans are dropped and counted once its export fails; polled, as
    // the export runs after the pod is Ready.
    let counter = |text: &str, name: &str| metric(text, name).unwrap_or(0.0);
    let text = agent.metrics_when(MINUTE, |t| {
        counter(t, "podlapse_otlp_spans_dropped_total") > 0.0
    });
    assert!(
        counter(&text, "podlapse_otlp_spans_dropped_total") > 5.0,
        "no dropped spans counted:\n{text}"
    );
    assert!(counter(&text, "podlapse_otlp_export_failures_total") >= 1.0);
    assert_eq!(
        counter(&text, "podlapse_otlp_spans_exported_total") as usize,
        sent,
        "{text}"
    );
    // The agent goes on: a third pod runs too.
    agent.write("third.yaml", &pod_yaml("third"));
    agent.wait_pod("third", "Running", MINUTE, |p| phase(p) == "Running");
    // The trace file has all three startups, whatever the collector did.
    agent.stop();
    let out = podlapse(&["timeline", trace.to_str().unwrap(), "-o", "json"]);
    assert!(out.status.success(), "{}", stderr(&out));
    let timeline: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    for name in ["first", "second", "third"] {
        let pod = timeline["pods"]
            .as_array()
            .unwrap()
            .iter()
            .find(|p| p["name"] == agent.name(name).as_str())
            .unwrap_or_else(|| panic!("{name} is not in the trace"));
        assert!(
            pod["stages"]
                .as_array()
                .unwrap()
                .iter()
                .any(|s| s["stage"] == "running"),
            "{name} has no running stage in the trace"
        );
    }
}

#[test]
fn a_malformed_endpoint_is_one_line_and_exit_2() {
    for bad in ["localhost:4317", "ftp://collector:4317", "http://"] {
        let out = podlapse(&["export", "/nonexistent.jsonl", "--otlp-endpoint", bad]);
        assert_eq!(out.status.code(), Some(2), "{bad}: {}", stderr(&out));
        let err = stderr(&out);
        assert_eq!(err.trim().lines().count(), 1, "{err}");
        assert!(err.contains(bad), "{err}");
    }
}

/// The spans of the trace whose root is `pod`'s, of every service, once `done` holds for
/// them (the runtime's arrive in batches, after the pod's).
fn whole_trace(
    receiver: &Receiver,
    pod: &str,
    what: &str,
    done: impl Fn(&[ReceivedSpan]) -> bool,
) -> Vec<ReceivedSpan> {
    let of_pod = |all: &[ReceivedSpan]| -> Vec<ReceivedSpan> {
        let Some(root) = all
            .iter()
            .find(|s| s.name == "pod_startup" && s.attr("k8s.pod.name") == Some(pod))
        else {
            return Vec::new();
        };
        all.iter()
            .filter(|s| s.trace_id == root.trace_id)
            .cloned()
            .collect()
    };
    let all = receiver.wait_for(what, 2 * MINUTE, |all| {
        let mine = of_pod(all);
        !mine.is_empty() && done(&mine)
    });
    of_pod(&all)
}

/// Every CRI client span podlapse exported has the runtime's server span as a child.
fn every_call_has_its_server_span(spans: &[ReceivedSpan]) -> bool {
    spans
        .iter()
        .filter(|s| s.service == "podlapse" && s.kind == CLIENT)
        .all(|c| {
            spans.iter().any(|s| {
                s.service == "containerd" && s.kind == SERVER && s.parent_span_id == c.span_id
            })
        })
}

fn counter(text: &str, name: &str) -> f64 {
    metric(text, name).unwrap_or(0.0)
}

/// A stage of `pod` in a timeline document (`podlapse timeline -o json`).
fn stages_of<'a>(timeline: &'a serde_json::Value, pod: &str) -> Vec<&'a serde_json::Value> {
    timeline["pods"]
        .as_array()
        .into_iter()
        .flatten()
        .filter(|p| p["name"] == pod)
        .flat_map(|p| p["stages"].as_array().into_iter().flatten())
        .collect()
}

fn stage_named<'a>(stages: &[&'a serde_json::Value], name: &str) -> Option<&'a serde_json::Value> {
    stages.iter().copied().find(|s| s["stage"] == name)
}

#[expect(
    clippy::too_many_lines,
    reason = "one story on a live lab: a pod, its exported spans, then each span checked in turn"
)]
#[test]
fn the_runtimes_spans_hang_under_podlapses_and_are_stages_inside_run_pod_sandbox() {
    let lab = require_lab();
    let _port = runtime_otlp_port();
    if !runtime_traces_cri_calls() {
        // containerd 1.6 traces nothing, 1.7 (Debian's) no CRI call: no span would come.
        eprintln!("this runtime makes no span for a CRI call: nothing to receive");
        return;
    }
    let receiver = Receiver::start("127.0.0.1:0");
    let trace_dir = tempfile::tempdir().unwrap();
    let trace = trace_dir.path().join("runtime.jsonl");
    let mut agent = Agent::start(
        "otelrt",
        &[
            "--otlp-endpoint",
            &receiver.endpoint(),
            "--runtime-otlp-listen",
            xtask::lab::RUNTIME_OTLP_ADDR,
            "--trace",
            trace.to_str().unwrap(),
        ],
    );
    // containerd's exporter may be waiting out a reconnection back-off (up to two
    // minutes) from a time nothing listened on the address: pods are started until the
    // agent has received the runtime's spans.
    let start = Instant::now();
    for i in 0.. {
        let name = format!("warmup{i}");
        agent.write(&format!("{name}.yaml"), &pod_yaml(&name));
        agent.wait_pod(&name, "Running", MINUTE, |p| phase(p) == "Running");
        let text = agent.metrics_when(Duration::from_secs(15), |t| {
            counter(t, "podlapse_runtime_spans_received_total") > 0.0
        });
        if counter(&text, "podlapse_runtime_spans_received_total") > 0.0 {
            break;
        }
        assert!(
            start.elapsed() < Duration::from_secs(200),
            "containerd sent the agent no span in 200 s:\n{text}"
        );
    }
    // The pod under test, with the sandbox image taken off the node first so the
    // runtime pulls it inside RunPodSandbox. Another test's sandbox may pull it back
    // before ours: then ours pulls nothing, and another pod tries again.
    let mut found = None;
    for attempt in 0..3 {
        let name = format!("sandboxed{attempt}");
        let _ = std::process::Command::new("ctr")
            .arg("--address")
            .arg(lab.cri_socket())
            .args([
                "--namespace",
                "k8s.io",
                "images",
                "rm",
                xtask::lab::IMAGE_PAUSE,
            ])
            .output();
        agent.write(&format!("{name}.yaml"), &pod_yaml(&name));
        agent.wait_pod(&name, "Running", MINUTE, |p| phase(p) == "Running");
        // The runtime's spans come in batches after the pod ran: until its network
        // setup (whose end the runtime's last sandbox spans mark) is a stage.
        let stages = podlapse_tests::eventually(
            &format!("{name}'s runtime stages in the agent's timeline"),
            MINUTE,
            Duration::from_millis(200),
            || {
                let timeline = agent.timeline();
                let stages: Vec<serde_json::Value> = stages_of(&timeline, &agent.name(&name))
                    .into_iter()
                    .cloned()
                    .collect();
                let refs: Vec<&serde_json::Value> = stages.iter().collect();
                if stage_named(&refs, "runtime:network_setup").is_some()
                    && stage_named(&refs, "runtime:task_start").is_some()
                {
                    Ok(stages)
                } else {
                    Err(serde_json::Value::Array(stages))
                }
            },
        );
        let refs: Vec<&serde_json::Value> = stages.iter().collect();
        if stage_named(&refs, "runtime:sandbox_image_pull").is_some() {
            found = Some(name);
            break;
        }
        eprintln!(
            "{name}: the sandbox image was back on the node before its sandbox (attempt {attempt})"
        );
    }
    let name = agent.name(&found.expect("a sandbox whose image the runtime pulled"));

    // The exported trace: one tree. Every containerd span in the pod's trace hangs under
    // a span podlapse exported, and every CRI call has the runtime's server span.
    let spans = whole_trace(
        &receiver,
        &name,
        "the runtime's spans under every call",
        every_call_has_its_server_span,
    );
    let by_id: BTreeMap<&str, &ReceivedSpan> =
        spans.iter().map(|s| (s.span_id.as_str(), s)).collect();
    let runtime: Vec<&ReceivedSpan> = spans.iter().filter(|s| s.service == "containerd").collect();
    assert!(!runtime.is_empty());
    for s in &runtime {
        let mut cur = *s;
        let mut hops = 0;
        while cur.service != "podlapse" {
            cur = by_id.get(cur.parent_span_id.as_str()).unwrap_or_else(|| {
                panic!(
                    "containerd's {} hangs under {}, which is not in the trace",
                    s.name, cur.parent_span_id
                )
            });
            hops += 1;
            assert!(hops < 64, "{}'s parents go round", s.name);
        }
    }
    let sandbox = one(
        &spans,
        |s| s.service == "podlapse" && s.name.ends_with("/RunPodSandbox"),
        "RunPodSandbox",
    );
    let server = one(
        &spans,
        |s| s.service == "containerd" && s.parent_span_id == sandbox.span_id,
        "RunPodSandbox's server span",
    );
    assert_eq!(server.kind, SERVER);
    assert_eq!(server.name, "runtime.v1.RuntimeService/RunPodSandbox");
    // podlapse made no span of its own for the runtime's stages: they are the runtime's.
    assert!(
        spans
            .iter()
            .all(|s| s.service != "podlapse" || !s.name.starts_with("runtime:")),
        "{spans:#?}"
    );

    // What the agent counted; then the trace, read back.
    let text = agent.metrics();
    assert!(counter(&text, "podlapse_runtime_spans_received_total") >= runtime.len() as f64);
    agent.stop();
    let out = podlapse(&["timeline", trace.to_str().unwrap(), "-o", "json"]);
    assert!(out.status.success(), "{}", stderr(&out));
    let timeline: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    let stages = stages_of(&timeline, &name);
    let call = stage_named(&stages, "sandbox_requested").expect("sandbox_requested");
    let (call_start, call_end) = (
        call["start_ns"].as_u64().unwrap(),
        call["end_ns"].as_u64().unwrap(),
    );
    for want in ["runtime:sandbox_image_pull", "runtime:network_setup"] {
        let s = stage_named(&stages, want).unwrap_or_else(|| panic!("no {want}: {stages:#?}"));
        assert_eq!(s["source"], "runtime", "{want}");
        let (a, z) = (
            s["start_ns"].as_u64().unwrap(),
            s["end_ns"].as_u64().unwrap(),
        );
        assert!(
            call_start <= a && z <= call_end,
            "{want} inside RunPodSandbox: {s}"
        );
    }
    let out = podlapse(&["report", trace.to_str().unwrap(), "--pod", &name]);
    assert!(out.status.success(), "{}", stderr(&out));
    let report = String::from_utf8_lossy(&out.stdout).to_string();
    for want in [
        "runtime:sandbox_image_pull",
        "runtime:network_setup",
        "runtime_sandbox",
    ] {
        assert!(
            report.contains(&format!("  {want} ")),
            "{want} in the report:\n{report}"
        );
    }
    assert!(
        !report.contains("runtime_sandbox not broken down") && !report.contains("runtime_sandbox,"),
        "{report}"
    );

    // podlapse export of the trace forwards the same runtime spans the agent did.
    let mut again = Receiver::start("127.0.0.1:0");
    let out = podlapse(&[
        "export",
        trace.to_str().unwrap(),
        "--otlp-endpoint",
        &again.endpoint(),
    ]);
    assert!(out.status.success(), "{}", stderr(&out));
    let exported = whole_trace(
        &again,
        &name,
        "the exported trace",
        every_call_has_its_server_span,
    );
    let ids = |spans: &[ReceivedSpan]| -> BTreeSet<String> {
        spans
            .iter()
            .filter(|s| s.service == "containerd")
            .map(|s| s.span_id.clone())
            .collect()
    };
    assert_eq!(ids(&exported), ids(&spans));
    again.stop();
}
