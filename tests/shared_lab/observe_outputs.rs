//! What the observer sees leaves the node: `podlapse observe` with `--metrics-addr`, the
//! span receiver (`--runtime-otlp-listen`, where the lab's containerd and the kubelet's
//! tracing point) and `--otlp-endpoint` (a collector of the test's own, the official
//! protos). A CRI client of the suite's own (`cri-pod-client`, not podlapse) plays a
//! tracing kubelet (`--kubelet-spans`: `syncPod` per sync, each CRI call a client span
//! under it with its `traceparent`; names and attributes from kubelet's own source, see
//! `tests/bin/kubelet_tracing.rs`) and creates six pods while the network's range has
//! five addresses: five run, the sixth finds the range full and is retried as a kubelet's
//! pod worker would.
//!
//! - The scrape is `promtool check metrics` clean, each stage counts the five pods, and
//!   the sixth shows in the live diagnosis's gauge by its cause.
//! - The collector gets one trace per pod: `syncPod` at its root, the kubelet's CRI
//!   client spans under it, containerd's server spans under those, podlapse's kernel
//!   stages under the call they happened in; no span whose parent is missing, none
//!   twice. `podlapse export` of the recorded trace gives the same spans.
//! - The recorded timeline shows the kubelet's syncs and calls beside the kernel's stages.
//!
//! Bad addresses stop the observer before it starts anything.

use std::collections::{BTreeMap, BTreeSet};
use std::time::Duration;

use podlapse::timeline::Timeline;
use podlapse_tests::agent::{free_loopback_addr, metric, promtool_check_metrics, scrape};
use podlapse_tests::cni_conf::{ConfSwap, network, pool};
use podlapse_tests::ebpf::{require_probes, serial};
use podlapse_tests::observer::{ClientPodsCleanup, ClientRun, Observer, cleanup_client_pods};
use podlapse_tests::otlp::{ReceivedSpan, Receiver, reconnect_runtime_exporter};
use podlapse_tests::{Scratch, podlapse, podlapse_bin, require_lab, runtime_version, stderr};
use xtask::lab::{IMAGE_APP, RUNTIME_OTLP_ADDR};

/// The client's pods, retried until the test kills the client.
const PREFIX: &str = "obs-outputs";
/// As long as a pod's verdict takes to show in the API (the observer's look, the
/// diagnosis's), and more: a bound for a broken observer only.
const SHOWS: Duration = Duration::from_secs(300);

/// The exposition once `done` holds for it, polled every 200 ms (the observer brings its
/// metrics up to date at each scrape), or a failure naming what it waited for.
fn scrape_when(addr: &str, what: &str, done: impl Fn(&str) -> bool) -> String {
    let poll = xtask::poll::Poll::new(what, SHOWS, Duration::from_millis(200));
    let mut text = String::new();
    let held = poll.holds(|| {
        text = scrape(addr);
        done(&text)
    });
    assert!(held, "{what}: not within {SHOWS:?}:\n{text}");
    text
}

/// OTLP span kinds, as the protos number them.
const INTERNAL: i32 = 1;
const SERVER: i32 = 2;
const CLIENT: i32 = 3;

/// The spans of one trace by span ID.
type Trace<'a> = BTreeMap<&'a str, &'a ReceivedSpan>;

/// Pod `uid`'s trace as the collector has it: the trace of its `syncPod`, all of whose
/// spans it holds. None until the kubelet's sync is there.
fn pod_trace<'a>(spans: &'a [ReceivedSpan], uid: &str) -> Option<Trace<'a>> {
    let sync = spans
        .iter()
        .find(|s| s.name == "syncPod" && s.attr("k8s.pod.uid") == Some(uid))?;
    Some(
        spans
            .iter()
            .filter(|s| s.trace_id == sync.trace_id)
            .map(|s| (s.span_id.as_str(), s))
            .collect(),
    )
}

/// The kubelet's client span for `method` in `trace`.
fn call<'a>(trace: &Trace<'a>, method: &str) -> Option<&'a ReceivedSpan> {
    trace.values().copied().find(|s| {
        s.service == "kubelet"
            && s.kind == CLIENT
            && s.name == format!("runtime.v1.RuntimeService/{method}")
    })
}

/// podlapse's span for `stage` in `trace`.
fn stage<'a>(trace: &Trace<'a>, stage: &str) -> Option<&'a ReceivedSpan> {
    trace
        .values()
        .copied()
        .find(|s| s.service == "podlapse" && s.name == stage)
}

/// What a started pod's trace still lacks: its kernel stages exported under the calls,
/// and (where the runtime traces) containerd's server spans under the calls.
fn lacks(trace: &Trace, runtime_traces: bool) -> Vec<String> {
    let mut lacks = Vec::new();
    for (st, method) in [
        ("netns_created", "RunPodSandbox"),
        ("app_first_exec:app", "StartContainer"),
    ] {
        match (stage(trace, st), call(trace, method)) {
            (Some(s), Some(c)) if s.parent_span_id == c.span_id => {}
            (Some(s), Some(_)) => {
                let parent = trace.get(s.parent_span_id.as_str()).map(|p| &p.name);
                lacks.push(format!("{st} under {parent:?}, not {method}"));
            }
            (s, c) => lacks.push(format!("{st}: {}, {method}: {}", s.is_some(), c.is_some())),
        }
        if runtime_traces
            && !call(trace, method).is_some_and(|c| {
                trace.values().any(|s| {
                    s.service == "containerd" && s.kind == SERVER && s.parent_span_id == c.span_id
                })
            })
        {
            lacks.push(format!("containerd's {method} under the kubelet's"));
        }
    }
    if stage(trace, "pod_startup").is_none() {
        lacks.push("pod_startup".into());
    }
    lacks
}

/// The spans podlapse made, as (trace, span, parent, name): what the live export and
/// `podlapse export` of the recorded trace must agree on.
fn podlapses(
    spans: &[ReceivedSpan],
    uids: &BTreeSet<String>,
) -> BTreeSet<(String, String, String, String)> {
    spans
        .iter()
        .filter(|s| {
            s.service == "podlapse" && s.attr("k8s.pod.uid").is_some_and(|u| uids.contains(u))
        })
        .map(|s| {
            (
                s.trace_id.clone(),
                s.span_id.clone(),
                s.parent_span_id.clone(),
                s.name.clone(),
            )
        })
        .collect()
}

#[test]
fn the_observers_metrics_and_otlp_carry_every_pods_stages_inside_the_kubelets_traces() {
    let _one = serial();
    require_lab();
    // containerd 2.x traces a call sent with a sampled context: its server spans then
    // hang under the kubelet's.
    let runtime_traces = runtime_version().0 >= 2;
    let mut swap = ConfSwap::save();
    let conf = network(&swap, "podlapse-obs-outputs", pool(2, 6));
    swap.use_network(&conf);
    if runtime_traces {
        reconnect_runtime_exporter();
    }
    let collector = Receiver::start("127.0.0.1:0");
    let scratch = Scratch::new();
    let trace = scratch.path().join("observed.jsonl");
    let cri = format!("unix://{}", podlapse_tests::lab().cri_socket().display());
    let addr = free_loopback_addr();
    let endpoint = collector.endpoint();
    let observer = Observer::start(
        &trace,
        &require_probes(),
        &cri,
        &[
            "--metrics-addr",
            &addr,
            "--runtime-otlp-listen",
            RUNTIME_OTLP_ADDR,
            "--otlp-endpoint",
            &endpoint,
        ],
    );
    let kubelet_spans = format!("http://{RUNTIME_OTLP_ADDR}");
    let _cleanup = ClientPodsCleanup::new(env!("CARGO_BIN_EXE_cri-pod-client"), &cri, PREFIX);
    let client = ClientRun::spawn(
        env!("CARGO_BIN_EXE_cri-pod-client"),
        &cri,
        &[
            "--pods",
            "6",
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
            &kubelet_spans,
        ],
    );
    let started = client.pods(5);
    assert!(
        started.iter().all(|p| p["ok"] == true),
        "five pods take the five addresses: {started:?}"
    );
    let uids: BTreeSet<String> = started
        .iter()
        .map(|p| p["uid"].as_str().expect("a pod's uid").to_string())
        .collect();
    let text = scrape_when(
        &addr,
        "five pods started and the sixth without an IP",
        |t| {
            metric(t, "podlapse_observed_pod_start_duration_seconds_count") == Some(5.0)
                && metric(t, "podlapse_unhealthy_pods{cause=\"ipam_exhausted\"}") == Some(1.0)
                && metric(
                    t,
                    "podlapse_stage_duration_seconds_count{stage=\"app_first_exec\"}",
                ) == Some(5.0)
                // The node's network is looked at once a second, apart from the pods'
                // records: its full range shows at the first look after the fifth pod.
                && metric(t, "podlapse_node_network_findings{cause=\"ipam_exhausted\"}")
                    == Some(1.0)
        },
    );
    // Each started pod's startup goes out once it settled (10 s with nothing new), after
    // the kubelet's and the runtime's batches came.
    let spans = podlapse_tests::eventually(
        "each started pod's trace whole at the collector",
        SHOWS,
        Duration::from_millis(200),
        || {
            let spans = collector.spans();
            let lacking: Vec<String> = uids
                .iter()
                .filter_map(|u| {
                    let lacks = match pod_trace(&spans, u) {
                        None => vec!["its syncPod".to_string()],
                        Some(t) => lacks(&t, runtime_traces),
                    };
                    (!lacks.is_empty()).then(|| format!("{u}: {}", lacks.join("; ")))
                })
                .collect();
            if lacking.is_empty() {
                Ok(spans)
            } else {
                // What the export says of itself, for a failure to show.
                let export: Vec<String> = scrape(&addr)
                    .lines()
                    .filter(|l| {
                        l.starts_with("podlapse_otlp") || l.starts_with("podlapse_runtime_spans")
                    })
                    .map(str::to_string)
                    .collect();
                Err(format!("{}\n{}", lacking.join("\n"), export.join("\n")))
            }
        },
    );
    client.kill();
    cleanup_client_pods(env!("CARGO_BIN_EXE_cri-pod-client"), &cri, PREFIX);
    promtool_check_metrics(&text);
    check_metrics(&text);
    // Once the client's pods are removed, the five are not counted as not Running; the
    // sixth, which never had a sandbox the runtime kept, is counted until its client
    // could have tried again (6 minutes: longer than this test waits).
    observer.wait_api(&["pods"], "the client's pods removed", |l| {
        !l["items"].as_array().into_iter().flatten().any(|i| {
            i["metadata"]["name"]
                .as_str()
                .is_some_and(|n| n.starts_with(PREFIX))
        })
    });
    let text = scrape(&addr);
    assert_eq!(
        metric(&text, "podlapse_unhealthy_pods{cause=\"pending\"}").unwrap_or(0.0),
        0.0,
        "{text}"
    );
    assert_eq!(
        metric(&text, "podlapse_unhealthy_pods{cause=\"ipam_exhausted\"}"),
        Some(1.0),
        "{text}"
    );

    check_traces(&spans, &uids);

    // The sixth pod's startup goes once its client stopped retrying and it settled, or
    // at the observer's end at the latest.
    let (status, last) = observer.stop();
    assert!(status.success(), "the observer exited {status}: {last:?}");
    let spans = collector.spans();
    check_failing_and_once(&spans);
    check_recorded(&trace, &spans, &uids);
}

/// The sixth pod's failed plugin under its RunPodSandbox, and every span once, whoever
/// made it.
fn check_failing_and_once(spans: &[ReceivedSpan]) {
    let failing = spans
        .iter()
        .find(|s| s.name == "syncPod" && s.status_code == 2)
        .expect("the sixth pod's failed sync");
    let failing_uid = failing.attr("k8s.pod.uid").unwrap().to_string();
    let failed_plugin = spans
        .iter()
        .find(|s| {
            s.service == "podlapse"
                && s.attr("k8s.pod.uid") == Some(&failing_uid)
                && s.name.starts_with("cni_plugin:")
                && s.status_code == 2
        })
        .unwrap_or_else(|| panic!("the sixth pod's failed plugin: {spans:#?}"));
    let parent = spans
        .iter()
        .find(|s| s.span_id == failed_plugin.parent_span_id)
        .expect("the failed plugin's parent");
    assert_eq!(
        (parent.service.as_str(), parent.name.as_str()),
        ("kubelet", "runtime.v1.RuntimeService/RunPodSandbox")
    );
    // None twice: every span once, whoever made it.
    let mut ids: Vec<&str> = spans.iter().map(|s| s.span_id.as_str()).collect();
    let all = ids.len();
    ids.sort_unstable();
    ids.dedup();
    assert_eq!(ids.len(), all, "a span was sent twice");
}

/// Each started pod's trace at the collector.
fn check_traces(spans: &[ReceivedSpan], uids: &BTreeSet<String>) {
    for uid in uids {
        let t = pod_trace(spans, uid).unwrap();
        // One trace: its one root is the kubelet's sync of the pod.
        let roots: Vec<&&ReceivedSpan> =
            t.values().filter(|s| s.parent_span_id.is_empty()).collect();
        assert_eq!(roots.len(), 1, "{uid}: roots {roots:#?}");
        assert_eq!(
            (roots[0].name.as_str(), roots[0].kind),
            ("syncPod", INTERNAL)
        );
        assert_eq!(roots[0].service, "kubelet");
        // No span whose parent is missing.
        for s in t.values() {
            assert!(
                s.parent_span_id.is_empty() || t.contains_key(s.parent_span_id.as_str()),
                "{uid}: {} ({}) has no parent in its trace",
                s.name,
                s.service
            );
        }
        // The kubelet's calls under its sync; podlapse's under the kubelet's.
        for s in t
            .values()
            .filter(|s| s.service == "kubelet" && s.kind == CLIENT)
        {
            assert_eq!(s.parent_span_id, roots[0].span_id, "{}", s.name);
        }
        for s in t.values().filter(|s| s.service == "podlapse") {
            let parent = t[s.parent_span_id.as_str()];
            assert!(
                parent.service == "kubelet" || parent.name == "pod_startup",
                "{uid}: {} under {} ({})",
                s.name,
                parent.name,
                parent.service
            );
        }
        assert_eq!(
            stage(&t, "pod_startup").unwrap().parent_span_id,
            roots[0].span_id
        );
        assert_eq!(
            stage(&t, "cni_plugin:bridge").unwrap().parent_span_id,
            call(&t, "RunPodSandbox").unwrap().span_id
        );
        // Every span podlapse made of the pod is in this trace.
        assert!(
            spans
                .iter()
                .filter(|s| s.service == "podlapse" && s.attr("k8s.pod.uid") == Some(uid))
                .all(|s| s.trace_id == roots[0].trace_id),
            "{uid}: podlapse's spans in another trace"
        );
    }
}

/// The recorded trace: its timeline, and its export against the live one's spans.
fn check_recorded(trace: &std::path::Path, spans: &[ReceivedSpan], uids: &BTreeSet<String>) {
    // The recorded trace: its timeline has the kubelet's syncs and calls beside the
    // kernel's stages, and its export gives podlapse's spans as the live export did.
    let out = podlapse(&["timeline", trace.to_str().unwrap(), "-o", "json"]);
    assert!(out.status.success(), "{}", stderr(&out));
    let recorded: Timeline = serde_json::from_slice(&out.stdout).unwrap();
    for p in recorded.pods.iter().filter(|p| uids.contains(&p.uid)) {
        for (name, source) in [
            ("kubelet_sync:create", "kubelet"),
            ("kubelet_call:RunPodSandbox", "kubelet"),
            ("kubelet_call:StartContainer:app", "kubelet"),
            ("netns_created", "kernel"),
            ("app_first_exec:app", "kernel"),
        ] {
            assert!(
                p.stages
                    .iter()
                    .any(|s| s.stage == name && s.source.to_string() == source),
                "{}: no {name} ({source})",
                p.name
            );
        }
    }
    let again = Receiver::start("127.0.0.1:0");
    let out = podlapse(&[
        "export",
        trace.to_str().unwrap(),
        "--otlp-endpoint",
        &again.endpoint(),
    ]);
    assert!(out.status.success(), "{}", stderr(&out));
    let live = podlapses(spans, uids);
    let exported = again.wait_for("the recorded trace's spans", SHOWS, |s| {
        podlapses(s, uids).len() >= live.len()
    });
    assert_eq!(podlapses(&exported, uids), live);
    // "Why has this pod no IP?" of the recorded trace quotes the kubelet's own words: the
    // runtime's error as the kubelet's failed RunPodSandbox got it.
    let out = podlapse(&["diagnose", trace.to_str().unwrap()]);
    let text = podlapse_tests::stdout(&out);
    assert!(
        text.contains("RunPodSandbox failed for the kubelet")
            && text.contains("no IP addresses available in range set"),
        "{text}"
    );
}

/// What the scrape says of the five pods and the sixth.
fn check_metrics(text: &str) {
    // Each stage of the five pods' startups, once per pod, from the kernel and the
    // runtime; the sixth, failed, counts in the stages it reached.
    let stage = |s: &str| {
        metric(
            text,
            &format!("podlapse_stage_duration_seconds_count{{stage=\"{s}\"}}"),
        )
    };
    for s in [
        "sandbox_ready",
        "container_started",
        "app_first_exec",
        "running",
    ] {
        assert_eq!(stage(s), Some(5.0), "{s}:\n{text}");
    }
    for s in [
        "pod_seen",
        "netns_created",
        "cni_plugin",
        "kubelet_sync:create",
        "kubelet_call:RunPodSandbox",
        "kubelet_call:StartContainer",
    ] {
        assert!(stage(s).is_some_and(|n| n >= 5.0), "{s}:\n{text}");
    }
    // The runs of each plugin of the chain.
    assert!(
        metric(
            text,
            "podlapse_cni_plugin_duration_seconds_count{plugin=\"bridge\",exit_code=\"0\"}"
        )
        .is_some_and(|n| n >= 5.0),
        "{text}"
    );
    // The node: its network ready, and its range full (the sixth pod's evidence).
    assert_eq!(
        metric(text, "podlapse_node_network_ready{reason=\"\"}"),
        Some(1.0),
        "{text}"
    );
    assert_eq!(
        metric(
            text,
            "podlapse_node_network_findings{cause=\"ipam_exhausted\"}"
        ),
        Some(1.0),
        "{text}"
    );
    // No label names a pod.
    for line in text.lines().filter(|l| !l.starts_with('#')) {
        assert!(!line.contains(PREFIX), "a pod's name in a label: {line}");
    }
    // No family of run's that an observer cannot fill: it made no call of its own.
    assert!(!text.contains("kubelet_runtime_operations"), "{text}");
    // The spans it received and exported.
    assert!(
        metric(text, "podlapse_runtime_spans_received_total").is_some_and(|n| n > 0.0),
        "{text}"
    );
    assert!(
        text.contains("podlapse_otlp_spans_exported_total"),
        "{text}"
    );
}

#[test]
fn a_metrics_address_in_use_a_host_name_or_a_bad_collector_stops_the_observer_before_it_starts() {
    require_lab();
    let cri = format!("unix://{}", podlapse_tests::lab().cri_socket().display());
    let held = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let in_use = held.local_addr().unwrap().to_string();
    for (flag, value, says) in [
        (
            "--metrics-addr",
            in_use.as_str(),
            format!("metrics address {in_use}: "),
        ),
        (
            "--metrics-addr",
            "metrics.example:9102",
            "\"metrics.example\" is not an IP address".to_string(),
        ),
        (
            "--otlp-endpoint",
            "ftp://collector:4317",
            "scheme \"ftp\" is not http or https".to_string(),
        ),
    ] {
        let scratch = Scratch::new();
        let trace = scratch.path().join("observed.jsonl");
        let out = std::process::Command::new(podlapse_bin())
            .args(["observe", "--cri", &cri, "--no-api", "--duration", "30"])
            .arg("--trace")
            .arg(&trace)
            .args([flag, value])
            .output()
            .expect("podlapse observe runs");
        let err = stderr(&out);
        assert_eq!(out.status.code(), Some(2), "{value}: {err}");
        assert!(
            err.contains(flag) && err.contains(value) && err.contains(&says),
            "{value}: {err}"
        );
        assert_eq!(err.lines().count(), 1, "one line: {err}");
        // Nothing started: no trace was begun.
        assert!(!trace.exists(), "{value}: a trace was started");
    }
}
