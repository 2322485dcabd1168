//! OpenTelemetry export on the lab: a pod's startup arrives at an OTLP receiver (the
//! OpenTelemetry project's generated server) as one trace with the right parents; the
//! modern node's containerd exports its own spans to the same receiver; `podtrace
//! export` of the run's trace gives the same spans; a receiver that goes away costs
//! spans, counted, and no pod work.

use std::collections::BTreeMap;
use std::time::Duration;

use podtrace_tests::agent::{Agent, metric, phase};
use podtrace_tests::otlp::{ReceivedSpan, Receiver};
use podtrace_tests::{podtrace, require_lab, stderr};

const APP: &str = "127.0.0.1:5000/podtrace/app:1.0";
/// Used by no other test of the modern node's suite: its pull here is a real one.
const BIG10: &str = "127.0.0.1:5000/podtrace/big10:1.0";
const MINUTE: Duration = Duration::from_secs(60);
/// OTLP's SPAN_KIND_CLIENT.
const CLIENT: i32 = 3;

fn pod_yaml(name: &str) -> String {
    pod_with_image(name, APP)
}

/// Pulled every time (`Always`).
fn pod_with_image(name: &str, image: &str) -> String {
    format!(
        "apiVersion: v1\nkind: Pod\nmetadata: {{name: {name}}}\nspec:\n  terminationGracePeriodSeconds: 2\n  containers:\n  - {{name: c, image: {image}, imagePullPolicy: Always, command: [sleep, '3600']}}\n"
    )
}

/// podtrace's spans of the pod named `pod`, once its root arrived.
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
        .filter(|s| s.service == "podtrace" && s.trace_id == root.trace_id)
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

/// The runtime's version as `cri info` reports it (`1.7.24~ds1`).
fn runtime_traces() -> bool {
    let out = podtrace(&["cri", "info"]);
    let text = String::from_utf8_lossy(&out.stdout).to_string();
    let version = text
        .lines()
        .find_map(|l| l.trim().strip_prefix("runtime:"))
        .unwrap_or_default()
        .to_string();
    // containerd traces CRI calls from 1.7 on this lab (the modern node's is configured
    // for it); Debian's 1.6 build on the host lab has no tracing plugin.
    let numbers: Vec<u32> = version
        .split_whitespace()
        .last()
        .unwrap_or_default()
        .split(|c: char| !c.is_ascii_digit())
        .take(2)
        .filter_map(|n| n.parse().ok())
        .collect();
    eprintln!("runtime: {version:?}");
    numbers.as_slice() >= [1, 7].as_slice()
}

/// Restarts the modern node's containerd now that the receiver listens. Its exporter's
/// gRPC connection has been failing since boot (nothing listened on the lab's OTLP
/// address during the tests before this one), and gRPC waits up to 120 s between
/// reconnection attempts by then, longer than the exporter keeps a batch: the spans of
/// the pull below would be dropped. A restarted containerd connects on its first export.
/// Its containers and shims keep running; systemd's restart returns once it is ready
/// (`Type=notify`), and the CRI socket is checked besides.
fn reconnect_runtime_exporter() {
    let out = std::process::Command::new("systemctl")
        .args(["restart", "containerd"])
        .output()
        .expect("systemctl");
    assert!(
        out.status.success(),
        "systemctl restart containerd: {}",
        stderr(&out)
    );
    // Ready for systemd is ready for CRI too; checked rather than assumed, within 30 s.
    let start = std::time::Instant::now();
    while !podtrace(&["cri", "info"]).status.success() {
        assert!(
            start.elapsed() < Duration::from_secs(30),
            "containerd did not answer CRI in 30 s after its restart"
        );
        std::thread::sleep(Duration::from_millis(100));
    }
}

#[test]
fn a_pods_startup_arrives_as_one_trace_and_the_recorded_trace_exports_the_same() {
    require_lab();
    let receiver = Receiver::start(xtask::lab::RUNTIME_OTLP_ADDR);
    let traces = runtime_traces();
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
    let spans = pod_trace(&receiver, "traced");
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
    assert_eq!(sandbox.attr("podtrace.stage"), Some("sandbox_requested"));
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
        assert!(p.attr("podtrace.cni.plugin").is_some());
    }
    let cgroup = one(
        &spans,
        |s| s.name == "container_cgroup:c",
        "container_cgroup:c",
    );
    assert_eq!(cgroup.parent_span_id, start.span_id);
    let seen = one(&spans, |s| s.name == "pod_seen", "pod_seen");
    assert_eq!(seen.parent_span_id, root.span_id);
    // The runtime's own spans. The modern node's containerd 1.7 exports its spans to
    // the receiver (its tracing is configured by the lab); Debian's 1.6 build on the host
    // lab has no tracing plugin. Debian's containerd builds also leave out the gRPC server
    // instrumentation (otelgrpc), so they make no span for a CRI call and do not read the
    // traceparent podtrace sends: their spans (an image pull's) start traces of their
    // own. Any runtime span that does join the pod's trace must hang under podtrace's.
    if traces {
        let all = receiver.wait_for("containerd's own spans", MINUTE, |all| {
            all.iter().any(|s| s.service == "containerd")
        });
        let ours: BTreeMap<&str, &ReceivedSpan> =
            spans.iter().map(|s| (s.span_id.as_str(), s)).collect();
        let joined: Vec<&ReceivedSpan> = all
            .iter()
            .filter(|s| s.service == "containerd" && s.trace_id == root.trace_id)
            .collect();
        for s in &joined {
            let under_ours = ours.contains_key(s.parent_span_id.as_str());
            let under_theirs = joined.iter().any(|t| t.span_id == s.parent_span_id);
            assert!(
                under_ours || under_theirs,
                "containerd's {} joined the pod's trace outside podtrace's spans",
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
    let out = podtrace(&[
        "export",
        trace.to_str().unwrap(),
        "--otlp-endpoint",
        &again.endpoint(),
    ]);
    assert!(out.status.success(), "{}", stderr(&out));
    let exported = pod_trace(&again, "traced");
    let mut live = spans.clone();
    live.sort();
    let mut file = exported;
    file.sort();
    assert_eq!(
        file, live,
        "podtrace export of the trace against the live export"
    );
    again.stop();
}

#[test]
fn a_receiver_that_goes_away_costs_counted_spans_and_no_pod_work() {
    require_lab();
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
    let sent = pod_trace(&receiver, "first").len();
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
        counter(t, "podtrace_otlp_spans_dropped_total") > 0.0
    });
    assert!(
        counter(&text, "podtrace_otlp_spans_dropped_total") > 5.0,
        "no dropped spans counted:\n{text}"
    );
    assert!(counter(&text, "podtrace_otlp_export_failures_total") >= 1.0);
    assert_eq!(
        counter(&text, "podtrace_otlp_spans_exported_total") as usize,
        sent,
        "{text}"
    );
    // The agent goes on: a third pod runs too.
    agent.write("third.yaml", &pod_yaml("third"));
    agent.wait_pod("third", "Running", MINUTE, |p| phase(p) == "Running");
    // The trace file has all three startups, whatever the collector did.
    agent.stop();
    let out = podtrace(&["timeline", trace.to_str().unwrap(), "-o", "json"]);
    assert!(out.status.success(), "{}", stderr(&out));
    let timeline: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    for name in ["first", "second", "third"] {
        let pod = timeline["pods"]
            .as_array()
            .unwrap()
            .iter()
            .find(|p| p["name"] == name)
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
        let out = podtrace(&["export", "/nonexistent.jsonl", "--otlp-endpoint", bad]);
        assert_eq!(out.status.code(), Some(2), "{bad}: {}", stderr(&out));
        let err = stderr(&out);
        assert_eq!(err.trim().lines().count(), 1, "{err}");
        assert!(err.contains(bad), "{err}");
    }
}
