//! Nothing silently missing: whatever outputs a run is asked for (the trace, the OTLP
//! export, the API and /metrics, the runtime's spans received, the probes required or
//! not, a hold or none), the same pod gives the same kernel stages in each, the runtime's
//! `runtime:*` stages wherever its spans are received (without a hold: the run's end
//! waits for them), and every output says per pod which sources it has and why any is
//! absent.

use std::collections::BTreeSet;
use std::path::Path;
use std::sync::{Mutex, MutexGuard};
use std::time::Duration;

use podlapse_tests::agent::{Agent, phase};
use podlapse_tests::otlp::{ReceivedSpan, Receiver, reconnect_runtime_exporter};
use podlapse_tests::{
    Scratch, eventually, podlapse, require_lab, runtime_version, static_name, stderr, stdout,
};
use serde_json::Value;

use xtask::lab::IMAGE_APP as APP;

const MINUTE: Duration = Duration::from_secs(60);
/// How long a run's end may wait for the runtime's spans here: long enough for a
/// runtime exporter that is reconnecting to the address (its back-off grows from 1 s);
/// the wait ends as soon as every span came, so it costs nothing when they do.
const SPAN_WAIT: &str = "30s";

/// One run at a time: the runtime exports to one address, and each run's probes see the
/// others' pods.
static SERIAL: Mutex<()> = Mutex::new(());

fn serial() -> MutexGuard<'static, ()> {
    SERIAL.lock().unwrap_or_else(|e| e.into_inner())
}

/// The kernel stages every pod on this lab has, whatever else it has.
const CORE_KERNEL_STAGES: &[&str] = &[
    "netns_created",
    "cni_plugin:bridge",
    "cni_plugin:host-local",
    "pause_exec",
    "app_first_exec:app",
];

fn pod_yaml(name: &str) -> String {
    format!(
        "apiVersion: v1\nkind: Pod\nmetadata: {{name: {name}}}\nspec:\n  terminationGracePeriodSeconds: 1\n  containers:\n  - {{name: app, image: {APP}, imagePullPolicy: IfNotPresent, command: [sleep, '3600']}}\n"
    )
}

/// True when the runtime's gRPC server makes a span for each CRI call (containerd 2.x).
fn runtime_traces_cri_calls() -> bool {
    runtime_version().0 >= 2
}

/// `podlapse run --until-ready --cleanup` of one pod with `flags`; its JSON document.
fn run_one(scratch: &Scratch, name: &str, flags: &[&str]) -> (std::process::Output, Value) {
    let manifest = scratch.manifest(&format!("{name}.yaml"), &pod_yaml(name));
    let mut all = vec!["--cleanup"];
    all.extend_from_slice(flags);
    let (out, doc) = scratch.run(&[&manifest], &all);
    assert!(
        out.status.success(),
        "podlapse run {flags:?}:\n{}\n{}",
        stdout(&out),
        stderr(&out)
    );
    (out, doc)
}

/// The timeline of a trace file, as `podlapse timeline -o json` gives it.
fn trace_timeline(trace: &Path) -> Value {
    let out = podlapse(&["timeline", trace.to_str().unwrap(), "-o", "json"]);
    assert!(out.status.success(), "{}", stderr(&out));
    serde_json::from_slice(&out.stdout).unwrap()
}

fn pod_of<'a>(timeline: &'a Value, full: &str) -> &'a Value {
    timeline["pods"]
        .as_array()
        .into_iter()
        .flatten()
        .find(|p| p["name"] == full)
        .unwrap_or_else(|| panic!("no pod {full} in {timeline:#}"))
}

/// The names of a timeline pod's stages from `source` that fall inside its startup (what
/// the export carries: pod_seen until Ready, or Running).
fn stages_from(pod: &Value, source: &str) -> BTreeSet<String> {
    let stages = pod["stages"].as_array().unwrap();
    let at = |name: &str| {
        stages
            .iter()
            .find(|s| s["stage"] == name)
            .and_then(|s| s["start_ns"].as_u64())
    };
    let end = at("ready")
        .or_else(|| at("running"))
        .expect("a pod that ran");
    let seen = pod["seen_ns"].as_u64().unwrap_or(0);
    stages
        .iter()
        .filter(|s| s["source"] == source)
        .filter(|s| s["start_ns"].as_u64().unwrap() >= seen && s["end_ns"].as_u64().unwrap() <= end)
        .map(|s| s["stage"].as_str().unwrap().to_string())
        .collect()
}

/// The pod's trace as exported: (its root, every span of its trace).
fn exported(receiver: &Receiver, full: &str) -> (ReceivedSpan, Vec<ReceivedSpan>) {
    let spans = receiver.wait_for(&format!("{full}'s exported startup"), MINUTE, |spans| {
        spans
            .iter()
            .any(|s| s.name == "pod_startup" && s.attr("k8s.pod.name") == Some(full))
    });
    let root = spans
        .iter()
        .find(|s| s.name == "pod_startup" && s.attr("k8s.pod.name") == Some(full))
        .unwrap()
        .clone();
    let all = spans
        .into_iter()
        .filter(|s| s.trace_id == root.trace_id)
        .collect();
    (root, all)
}

/// The stages the export carries from the kernel.
fn exported_kernel_stages(spans: &[ReceivedSpan]) -> BTreeSet<String> {
    spans
        .iter()
        .filter(|s| s.service == "podlapse" && s.attr("podlapse.source") == Some("kernel"))
        .filter_map(|s| s.attr("podlapse.stage").map(str::to_string))
        .collect()
}

fn assert_core(what: &str, stages: &BTreeSet<String>) {
    for s in CORE_KERNEL_STAGES {
        assert!(
            stages.contains(*s),
            "{what} lacks the kernel stage {s}: {stages:?}"
        );
    }
}

fn state(sources: &Value, source: &str) -> String {
    sources[source]["state"].as_str().unwrap_or("").to_string()
}

/// The runtime's exporter is sending to the lab's address: a served agent listening
/// there has received its spans. (On a systemd node the runtime is restarted first, its
/// exporter having failed since boot.)
fn runtime_exporter_sending() {
    reconnect_runtime_exporter();
    let mut agent = Agent::start(
        "srcwarm",
        &["--runtime-otlp-listen", xtask::lab::RUNTIME_OTLP_ADDR],
    );
    eventually(
        "the runtime's exporter to send the agent a span",
        Duration::from_secs(240),
        Duration::from_millis(500),
        || {
            let n = agent.pods().len();
            let name = format!("warm{n}");
            agent.write(&format!("{name}.yaml"), &pod_yaml(&name));
            agent.wait_pod(&name, "Running", MINUTE, |p| phase(p) == "Running");
            let text = agent.metrics_when(Duration::from_secs(12), |t| {
                podlapse_tests::agent::metric(t, "podlapse_runtime_spans_received_total")
                    .unwrap_or(0.0)
                    > 0.0
            });
            match podlapse_tests::agent::metric(&text, "podlapse_runtime_spans_received_total") {
                Some(n) if n > 0.0 => Ok(()),
                _ => Err(format!("{} pods and no span", n + 1)),
            }
        },
    );
    agent.stop();
}

#[test]
fn an_export_without_a_trace_carries_the_kernels_stages_and_says_its_sources() {
    require_lab();
    let _one = serial();
    let receiver = Receiver::start("127.0.0.1:0");
    let scratch = Scratch::new();
    let (_, doc) = run_one(
        &scratch,
        "src-export",
        &["--otlp-endpoint", &receiver.endpoint()],
    );
    let full = static_name("src-export", doc["node"].as_str().unwrap());
    let (root, spans) = exported(&receiver, &full);
    assert_core(
        "the export of a run without --trace",
        &exported_kernel_stages(&spans),
    );
    assert_eq!(
        root.attr("podlapse.source.kernel"),
        Some("present"),
        "{root:#?}"
    );
    let runtime = root.attr("podlapse.source.runtime").unwrap_or("");
    assert!(
        runtime.starts_with("absent: ") && runtime.contains("--runtime-otlp-listen"),
        "{root:#?}"
    );
}

#[test]
fn a_quick_run_gives_its_trace_and_its_export_the_same_stages_the_runtimes_included() {
    require_lab();
    let _one = serial();
    let receives = runtime_traces_cri_calls();
    if receives {
        runtime_exporter_sending();
    } else {
        eprintln!(
            "this runtime makes no span for a CRI call: the runtime's stages are not expected"
        );
    }
    let receiver = Receiver::start("127.0.0.1:0");
    let scratch = Scratch::new();
    let trace = scratch.path().join("quick.jsonl");
    let endpoint = receiver.endpoint();
    let mut flags = vec![
        "--trace",
        trace.to_str().unwrap(),
        "--otlp-endpoint",
        &endpoint,
    ];
    if receives {
        flags.extend([
            "--runtime-otlp-listen",
            xtask::lab::RUNTIME_OTLP_ADDR,
            "--runtime-span-wait",
            SPAN_WAIT,
        ]);
    }
    // No hold: what a CI job runs.
    let (out, doc) = run_one(&scratch, "src-quick", &flags);
    let full = static_name("src-quick", doc["node"].as_str().unwrap());

    let timeline = trace_timeline(&trace);
    let pod = pod_of(&timeline, &full);
    let in_trace = stages_from(pod, "kernel");
    assert_core("the trace", &in_trace);
    let (root, spans) = exported(&receiver, &full);
    assert_eq!(
        exported_kernel_stages(&spans),
        in_trace,
        "the export and the trace of one run carry different kernel stages"
    );
    let sources = &pod["sources"];
    assert_eq!(state(sources, "kernel"), "present", "{sources:#}");
    assert_eq!(state(sources, "cri"), "present", "{sources:#}");
    if receives {
        let runtime_stages = stages_from(pod, "runtime");
        assert!(
            runtime_stages.iter().any(|s| s.starts_with("runtime:")),
            "no runtime stage in the trace of a run without a hold: {:?}\n{}",
            pod["stages"],
            stderr(&out)
        );
        assert_eq!(state(sources, "runtime"), "present", "{sources:#}");
        assert!(
            spans.iter().any(|s| s.service == "containerd"),
            "the runtime's spans were not forwarded with the pod's"
        );
        assert_eq!(
            root.attr("podlapse.source.runtime"),
            Some("present"),
            "{root:#?}"
        );
    }
    // The footer says the same per pod.
    let text = std::fs::read_to_string(&trace).unwrap();
    let footer: Value = serde_json::from_str(text.lines().last().unwrap()).unwrap();
    let uid = pod["uid"].as_str().unwrap();
    assert_eq!(footer["pod_sources"][uid], *sources, "{footer:#}");
    assert!(footer["sources"]["ended"].is_object(), "{footer:#}");
}

#[test]
fn a_served_agent_shows_the_same_kernel_stages_in_its_api_metrics_trace_and_export() {
    require_lab();
    let _one = serial();
    let receiver = Receiver::start("127.0.0.1:0");
    let dir = tempfile::tempdir().unwrap();
    let trace = dir.path().join("served.jsonl");
    let mut agent = Agent::start(
        "srcserve",
        &[
            "--trace",
            trace.to_str().unwrap(),
            "--otlp-endpoint",
            &receiver.endpoint(),
            "--require-ebpf",
        ],
    );
    agent.write("served.yaml", &pod_yaml("served"));
    agent.wait_pod("served", "Running", MINUTE, |p| phase(p) == "Running");
    let full = agent.name("served");
    let live = eventually(
        "the served pod's kernel stages in the API",
        MINUTE,
        Duration::from_millis(200),
        || {
            let t = agent.timeline();
            let p = pod_of(&t, &full).clone();
            let stages = stages_from(&p, "kernel");
            if CORE_KERNEL_STAGES.iter().all(|s| stages.contains(*s)) {
                Ok((p, stages))
            } else {
                Err(format!("{stages:?}"))
            }
        },
    );
    let (api_pod, in_api) = live;
    assert_eq!(state(&api_pod["sources"], "kernel"), "present");
    // /metrics counts each kernel stage kind the API shows.
    let kinds: BTreeSet<String> = in_api
        .iter()
        .map(|s| s.split(':').next().unwrap().to_string())
        .collect();
    let text = agent.metrics_when(MINUTE, |t| {
        kinds.iter().all(|k| {
            t.contains(&format!(
                "podlapse_stage_duration_seconds_count{{stage=\"{k}\"}}"
            ))
        })
    });
    for k in &kinds {
        assert!(
            text.contains(&format!(
                "podlapse_stage_duration_seconds_count{{stage=\"{k}\"}}"
            )),
            "/metrics has no {k} stage:\n{text}"
        );
    }
    let (_, spans) = exported(&receiver, &full);
    assert_eq!(exported_kernel_stages(&spans), in_api);
    agent.stop();
    let timeline = trace_timeline(&trace);
    assert_eq!(stages_from(pod_of(&timeline, &full), "kernel"), in_api);
}

#[test]
fn probes_turned_off_are_said_on_the_pod_in_every_output() {
    require_lab();
    let _one = serial();
    let receiver = Receiver::start("127.0.0.1:0");
    let scratch = Scratch::new();
    let trace = scratch.path().join("nobpf.jsonl");
    let (_, doc) = run_one(
        &scratch,
        "src-noebpf",
        &[
            "--no-ebpf",
            "--trace",
            trace.to_str().unwrap(),
            "--otlp-endpoint",
            &receiver.endpoint(),
        ],
    );
    let full = static_name("src-noebpf", doc["node"].as_str().unwrap());
    let timeline = trace_timeline(&trace);
    let pod = pod_of(&timeline, &full);
    assert!(stages_from(pod, "kernel").is_empty());
    assert_eq!(
        pod["sources"]["kernel"]["why"], "the probes were off (--no-ebpf)",
        "{pod:#}"
    );
    let (root, _) = exported(&receiver, &full);
    assert_eq!(
        root.attr("podlapse.source.kernel"),
        Some("absent: the probes were off (--no-ebpf)")
    );
    let text = stdout(&podlapse(&["timeline", trace.to_str().unwrap()]));
    assert!(
        text.contains("sources: cri ") && text.contains("kernel: the probes were off (--no-ebpf)"),
        "{text}"
    );
    let diagnosis = stdout(&podlapse(&["diagnose", trace.to_str().unwrap()]));
    assert!(
        diagnosis.contains("kernel absent") && diagnosis.contains("--no-ebpf"),
        "{diagnosis}"
    );
    let report = stdout(&podlapse(&["report", trace.to_str().unwrap()]));
    assert!(
        report.contains("kernel: the probes were off (--no-ebpf)"),
        "{report}"
    );
}

#[test]
fn runtime_spans_that_never_come_end_the_run_at_the_bound_and_are_said_on_the_pod() {
    require_lab();
    let _one = serial();
    // The runtime exports to the lab's address, never to this one.
    let listen = podlapse_tests::agent::free_loopback_addr();
    let scratch = Scratch::new();
    let trace = scratch.path().join("nospans.jsonl");
    let (out, doc) = run_one(
        &scratch,
        "src-nospans",
        &[
            "--trace",
            trace.to_str().unwrap(),
            "--runtime-otlp-listen",
            &listen,
            "--runtime-span-wait",
            "3s",
        ],
    );
    let full = static_name("src-nospans", doc["node"].as_str().unwrap());
    assert!(
        stderr(&out).contains("did not arrive"),
        "the run did not say the spans did not come:\n{}",
        stderr(&out)
    );
    let text = std::fs::read_to_string(&trace).unwrap();
    let footer: Value = serde_json::from_str(text.lines().last().unwrap()).unwrap();
    let ended = &footer["sources"]["ended"];
    assert_eq!(ended["wait"], "bound", "{footer:#}");
    assert_eq!(ended["runtime_spans_received"], 0, "{footer:#}");
    let waited = ended["waited_ns"].as_u64().unwrap();
    assert!(
        (3_000_000_000..4_000_000_000).contains(&waited),
        "the end waited {waited} ns for a 3 s bound"
    );
    let timeline = trace_timeline(&trace);
    let pod = pod_of(&timeline, &full);
    let runtime = &pod["sources"]["runtime"];
    assert_eq!(runtime["state"], "absent", "{pod:#}");
    let why = runtime["why"].as_str().unwrap();
    assert!(
        why.contains(&format!("the runtime sent no span to {listen}")),
        "{why}"
    );
    // The report does not call the call's unexplained remainder the runtime's own work.
    let report = stdout(&podlapse(&["report", trace.to_str().unwrap()]));
    assert!(
        report.contains("not broken down, the runtime's spans of it did not arrive"),
        "{report}"
    );
}

/// One combination of output flags, and the outputs of it that carry stages.
struct Combination {
    flags: Vec<String>,
    trace: bool,
    export: bool,
}

#[test]
fn every_combination_of_output_flags_gives_the_same_kernel_stages() {
    require_lab();
    let _one = serial();
    let receives = runtime_traces_cri_calls();
    if receives {
        runtime_exporter_sending();
    }
    let receiver = Receiver::start("127.0.0.1:0");
    let scratch = Scratch::new();
    let endpoint = receiver.endpoint();
    let runtime = [
        "--runtime-otlp-listen",
        xtask::lab::RUNTIME_OTLP_ADDR,
        "--runtime-span-wait",
        SPAN_WAIT,
    ];
    let mut combinations: Vec<Combination> = Vec::new();
    for (i, (trace, export, require, hold, spans)) in [
        (true, false, false, false, false),
        (true, false, true, false, false),
        (true, false, false, true, false),
        (false, true, true, true, false),
        (true, true, false, false, true),
        (false, true, false, false, true),
    ]
    .into_iter()
    .enumerate()
    {
        if spans && !receives {
            continue;
        }
        let mut flags: Vec<String> = Vec::new();
        if trace {
            let path = scratch.path().join(format!("combination{i}.jsonl"));
            flags.extend(["--trace".into(), path.display().to_string()]);
        }
        if export {
            flags.extend(["--otlp-endpoint".into(), endpoint.clone()]);
        }
        if require {
            flags.push("--require-ebpf".into());
        }
        if hold {
            flags.extend(["--hold".into(), "1s".into()]);
        }
        if spans {
            flags.extend(runtime.iter().map(|s| s.to_string()));
        }
        combinations.push(Combination {
            flags,
            trace,
            export,
        });
    }
    let mut seen: Vec<(String, BTreeSet<String>)> = Vec::new();
    for (i, c) in combinations.iter().enumerate() {
        let name = format!("src-combo{i}");
        let flags: Vec<&str> = c.flags.iter().map(String::as_str).collect();
        let (_, doc) = run_one(&scratch, &name, &flags);
        let full = static_name(&name, doc["node"].as_str().unwrap());
        let spans_received = flags.contains(&"--runtime-otlp-listen");
        if c.trace {
            let path = scratch.path().join(format!("combination{i}.jsonl"));
            let timeline = trace_timeline(&path);
            let pod = pod_of(&timeline, &full);
            seen.push((
                format!("the trace of {flags:?}"),
                stages_from(pod, "kernel"),
            ));
            if spans_received {
                assert!(
                    !stages_from(pod, "runtime").is_empty(),
                    "{flags:?}: no runtime stage in the trace: {:#}",
                    pod["sources"]
                );
            }
        }
        if c.export {
            let (_, spans) = exported(&receiver, &full);
            seen.push((
                format!("the export of {flags:?}"),
                exported_kernel_stages(&spans),
            ));
            if spans_received {
                assert!(
                    spans.iter().any(|s| s.service == "containerd"),
                    "{flags:?}: the runtime's spans were not forwarded"
                );
            }
        }
    }
    let (first, stages) = &seen[0];
    assert_core(first, stages);
    for (what, other) in &seen[1..] {
        assert_eq!(other, stages, "{what} against {first}");
    }
}
