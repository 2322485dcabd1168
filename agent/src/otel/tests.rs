//! The span model on a recorded fixture: the tree, the names, the IDs.

use std::collections::BTreeMap;

use super::export::cri_calls;
use super::ids;
use super::spans::{Kind, PodSpan, Value, pod_spans};
use crate::cri::{CriCall, CriMethod};
use crate::timeline::StageSource;
use crate::trace::{TraceRecord, read_trace};

fn fixture(name: &str) -> Vec<TraceRecord> {
    let path = std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../traces")
        .join(name);
    read_trace(&path).expect("a fixture").records
}

/// The fixture's pod with a sidecar.
fn sidecar_pod(timeline: &crate::timeline::Timeline) -> &crate::timeline::PodTimeline {
    timeline
        .pods
        .iter()
        .find(|p| p.name == "app-with-sidecar")
        .expect("multi-container.jsonl's app-with-sidecar")
}

fn attr<'a>(s: &'a PodSpan, key: &str) -> Option<&'a Value> {
    s.attributes.iter().find(|(k, _)| *k == key).map(|(_, v)| v)
}

#[test]
fn a_pods_startup_is_one_trace_with_calls_under_the_root_and_kernel_stages_under_their_call() {
    let records = fixture("multi-container.jsonl");
    let timeline = crate::timeline::build(&records);
    let calls = cri_calls(&records);
    let pod = sidecar_pod(&timeline);
    let mine: Vec<&CriCall> = calls
        .iter()
        .copied()
        .filter(|c| c.pod_uid == pod.uid)
        .collect();
    let spans = pod_spans(pod, &mine, "node-1");
    let root = &spans[0];
    assert_eq!(root.name, "pod_startup");
    assert_eq!(root.parent, None);
    assert_eq!(root.span_id, ids::root_span_id(&pod.uid));
    assert_eq!(root.start_ns, pod.seen_ns.unwrap());
    assert_eq!(root.end_ns, pod.stage("ready").unwrap().end_ns);
    assert_eq!(
        attr(root, "k8s.node.name"),
        Some(&Value::Str("node-1".into()))
    );
    let by_id: BTreeMap<[u8; 8], &PodSpan> = spans.iter().map(|s| (s.span_id, s)).collect();
    assert_eq!(by_id.len(), spans.len(), "span IDs are unique");
    for s in &spans {
        assert_eq!(s.trace_id, ids::trace_id(&pod.uid), "one trace");
        assert!(
            s.start_ns >= root.start_ns && s.start_ns <= root.end_ns,
            "{}",
            s.name
        );
        if let Some(p) = s.parent {
            assert!(
                by_id.contains_key(&p),
                "{}'s parent is in the trace",
                s.name
            );
        }
    }
    // RunPodSandbox is the sandbox_requested stage, a client span under the root; the
    // netns and every CNI plugin are under it.
    let sandbox = spans
        .iter()
        .find(|s| s.name == "runtime.v1.RuntimeService/RunPodSandbox")
        .unwrap();
    assert_eq!(sandbox.kind, Kind::Client);
    assert_eq!(sandbox.parent, Some(root.span_id));
    assert_eq!(
        attr(sandbox, "podlapse.stage"),
        Some(&Value::Str("sandbox_requested".into()))
    );
    assert_eq!(attr(sandbox, "rpc.grpc.status_code"), Some(&Value::Int(0)));
    for stage in [
        "netns_created",
        "cni_plugin:bridge",
        "cni_plugin:loopback",
        "pause_exec",
    ] {
        let s = spans.iter().find(|s| s.name == stage).unwrap();
        assert_eq!(s.parent, Some(sandbox.span_id), "{stage}");
    }
    let bridge = spans
        .iter()
        .find(|s| s.name == "cni_plugin:bridge")
        .unwrap();
    assert_eq!(
        attr(bridge, "podlapse.cni.plugin"),
        Some(&Value::Str("bridge".into()))
    );
    // Each container's kernel stages are under its own StartContainer.
    for c in ["app", "tailer"] {
        let start = spans
            .iter()
            .find(|s| {
                s.name == "runtime.v1.RuntimeService/StartContainer"
                    && attr(s, "k8s.container.name") == Some(&Value::Str(c.into()))
            })
            .unwrap();
        let cgroup = spans
            .iter()
            .find(|s| s.name == format!("container_cgroup:{c}"))
            .unwrap();
        assert_eq!(cgroup.parent, Some(start.span_id), "{c}");
        assert!(attr(start, "container.id").is_some());
    }
    let pull = spans
        .iter()
        .find(|s| s.name == "runtime.v1.ImageService/PullImage");
    if let Some(pull) = pull {
        assert_eq!(pull.parent, Some(root.span_id));
    }
    // Every stage of the startup is a span: its own, or its call's.
    let stages = pod
        .stages
        .iter()
        .filter(|s| s.start_ns <= root.end_ns)
        .count();
    let own = spans
        .iter()
        .filter(|s| s.kind == Kind::Internal && s.parent.is_some())
        .count();
    let call_stages = spans
        .iter()
        .filter(|s| s.kind == Kind::Client && attr(s, "podlapse.stage").is_some())
        .count();
    assert_eq!(own + call_stages, stages);
    // The same inputs, the same spans.
    assert_eq!(pod_spans(pod, &mine, "node-1"), spans);
    assert!(pod.stages.iter().any(|s| s.source == StageSource::Kernel));
}

#[test]
fn a_failed_call_and_a_pod_that_never_ran_carry_error_status() {
    let records = fixture("cni-failure.jsonl");
    let timeline = crate::timeline::build(&records);
    let calls = cri_calls(&records);
    let failed = timeline
        .pods
        .iter()
        .find(|p| p.stage("running").is_none() && p.failures().next().is_some())
        .expect("the fixture has a pod that never ran");
    let spans = pod_spans(failed, &calls, "n");
    assert!(spans[0].error.is_some(), "{:?}", spans[0]);
    let sandbox = spans
        .iter()
        .find(|s| s.name.ends_with("/RunPodSandbox") && s.error.is_some())
        .expect("a failed RunPodSandbox");
    assert!(matches!(attr(sandbox, "rpc.grpc.status_code"), Some(Value::Int(c)) if *c != 0));
}

#[test]
fn a_stage_still_under_way_when_the_startup_ended_is_exported_by_neither_export() {
    let records = fixture("multi-container.jsonl");
    let timeline = crate::timeline::build(&records);
    let calls = cri_calls(&records);
    let mut pod = sidecar_pod(&timeline).clone();
    let ready = pod.stage("ready").unwrap().end_ns;
    // A pod worker's wait that the Ready sync was held in: it began before Ready and
    // ended after it, which the live export, made at Ready, cannot have seen.
    let mut wait = pod.stage("ready").unwrap().clone();
    wait.stage = "pod_worker_wait".into();
    wait.source = StageSource::Agent;
    wait.start_ns = ready - 2_000_000;
    wait.end_ns = ready + 100_000;
    wait.duration_ns = wait.end_ns - wait.start_ns;
    pod.stages.push(wait);
    let spans = pod_spans(&pod, &calls, "n");
    assert!(
        spans.iter().all(|s| s.name != "pod_worker_wait"),
        "{:?}",
        spans.iter().map(|s| &s.name).collect::<Vec<_>>()
    );
    assert!(spans.iter().any(|s| s.name == "ready"));
}

#[test]
fn a_call_sent_sampled_after_the_startup_ended_is_exported_and_an_unsampled_one_is_not() {
    let records = fixture("multi-container.jsonl");
    let timeline = crate::timeline::build(&records);
    let calls = cri_calls(&records);
    let pod = sidecar_pod(&timeline);
    let end = super::spans::startup_end(pod).unwrap();
    let mut late: Vec<CriCall> = calls
        .iter()
        .filter(|c| c.pod_uid == pod.uid && c.start_ns > end)
        .map(|c| (*c).clone())
        .take(2)
        .collect();
    assert_eq!(late.len(), 2, "the fixture has calls after the startup");
    late[0].traced = true;
    let refs: Vec<&CriCall> = late.iter().collect();
    let spans = pod_spans(pod, &refs, "n");
    let ids: Vec<[u8; 8]> = spans.iter().map(|s| s.span_id).collect();
    assert!(
        ids.contains(&ids::call_span_id(&late[0])),
        "the sampled call"
    );
    assert!(
        !ids.contains(&ids::call_span_id(&late[1])),
        "the unsampled call"
    );
    let span = spans
        .iter()
        .find(|s| s.span_id == ids::call_span_id(&late[0]))
        .unwrap();
    assert_eq!(span.parent, Some(ids::root_span_id(&pod.uid)));
}

/// The fixture's records with the runtime's spans for one pod's sandbox and app start,
/// as a tracing runtime would have sent them: the sandbox call and the start marked as
/// sent sampled, the runtime's server span under each, its work under that.
fn with_runtime_spans() -> (crate::trace::Trace, String) {
    use super::runtime_span::{RuntimeSpan, RuntimeSpanEvent};
    let path =
        std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../traces/multi-container.jsonl");
    let mut trace = read_trace(&path).unwrap();
    let timeline = crate::timeline::build(&trace.records);
    let uid = timeline
        .pods
        .iter()
        .find(|p| p.name == "app-with-sidecar")
        .unwrap()
        .uid
        .clone();
    let hex = |b: &[u8]| b.iter().map(|b| format!("{b:02x}")).collect::<String>();
    let mut spans = Vec::new();
    let mut n = 0u8;
    let mut span = |parent: &str, name: &str, start: u64, end: u64| {
        n += 1;
        RuntimeSpan {
            pod_uid: uid.clone(),
            trace_id: hex(&ids::trace_id(&uid)),
            span_id: format!("{n:02x}").repeat(8),
            parent_span_id: parent.to_string(),
            name: name.into(),
            kind: "internal".into(),
            start_ns: start,
            end_ns: end,
            attributes: Default::default(),
            events: Vec::new(),
            status: "unset".into(),
            status_message: String::new(),
            scope: "containerd".into(),
            scope_version: String::new(),
            resource: [(
                "service.name".to_string(),
                serde_json::Value::String("containerd".into()),
            )]
            .into(),
        }
    };
    for r in &mut trace.records {
        let TraceRecord::Cri(c) = r else { continue };
        if c.pod_uid != uid {
            continue;
        }
        let (a, z) = (c.start_ns, c.end_ns);
        let d = (z - a) / 100;
        if c.method == CriMethod::RunPodSandbox && spans.is_empty() {
            c.traced = true;
            let mut server = span(
                &hex(&ids::call_span_id(c)),
                "runtime.v1.RuntimeService/RunPodSandbox",
                a + d,
                z - d,
            );
            server.kind = "server".into();
            server.events.push(RuntimeSpanEvent {
                name: "setup pod network".into(),
                at_ns: a + 5 * d,
                attributes: Default::default(),
            });
            let id = server.span_id.clone();
            spans.push(server);
            spans.push(span(&id, "metadata.sandbox.Update", a + 6 * d, a + 7 * d));
            spans.push(span(&id, "metadata.sandbox.Update", a + 40 * d, a + 41 * d));
            spans.push(span(&id, "pull.Pull", a + 45 * d, a + 60 * d));
            spans.push(span(&id, "client.NewContainer", a + 62 * d, a + 65 * d));
        } else if c.method == CriMethod::StartContainer && c.container == "app" && c.ok() {
            c.traced = true;
            let server = span(
                &hex(&ids::call_span_id(c)),
                "runtime.v1.RuntimeService/StartContainer",
                a + d,
                z - d,
            );
            let id = server.span_id.clone();
            spans.push(server);
            spans.push(span(&id, "task.Start", a + 2 * d, z - 2 * d));
        }
    }
    assert_eq!(spans.len(), 7);
    trace.records.extend(
        spans
            .into_iter()
            .map(|s| TraceRecord::RuntimeSpan(Box::new(s))),
    );
    (trace, uid)
}

#[test]
fn the_runtimes_spans_are_stages_inside_their_calls_and_exported_as_the_runtimes_own() {
    let (trace, uid) = with_runtime_spans();
    let timeline = crate::timeline::build(&trace.records);
    let pod = timeline.pods.iter().find(|p| p.uid == uid).unwrap();
    let sandbox = pod.stage("sandbox_requested").unwrap();
    let start = pod.stage("container_start:app").unwrap();
    for (name, call) in [
        ("runtime:network_setup", sandbox),
        ("runtime:metadata", sandbox),
        ("runtime:sandbox_image_pull", sandbox),
        ("runtime:container_new", sandbox),
        ("runtime:task_start:app", start),
    ] {
        let s = pod
            .stage(name)
            .unwrap_or_else(|| panic!("no {name}: {:#?}", pod.stages));
        assert_eq!(s.source, StageSource::Runtime, "{name}");
        assert!(
            s.start_ns >= call.start_ns && s.end_ns <= call.end_ns,
            "{name} inside its call"
        );
    }
    assert_eq!(
        pod.stage("runtime:task_start:app")
            .unwrap()
            .container
            .as_deref(),
        Some("app")
    );
    // The server spans are the calls' own: no stage.
    assert_eq!(
        pod.stages
            .iter()
            .filter(|s| s.source == StageSource::Runtime)
            .count(),
        6
    );
    // The report breaks RunPodSandbox down further, and says nothing is missing there.
    let without = crate::timeline::build(
        &trace
            .records
            .iter()
            .filter(|r| !matches!(r, TraceRecord::RuntimeSpan(_)))
            .cloned()
            .collect::<Vec<_>>(),
    );
    let before =
        crate::report::breakdown(without.pods.iter().find(|p| p.uid == uid).unwrap()).unwrap();
    let after = crate::report::breakdown(pod).unwrap();
    let remainder = |b: &crate::report::Breakdown| {
        b.parts
            .iter()
            .find(|p| p.part == "runtime_sandbox")
            .unwrap()
            .ns
    };
    assert!(remainder(&after) < remainder(&before));
    assert_eq!(after.total_ns, before.total_ns);
    assert_eq!(
        after.parts.iter().map(|p| p.ns).sum::<u64>(),
        after.total_ns
    );
    assert!(
        after.notes.iter().all(|n| !n.contains("runtime_sandbox")),
        "{:?}",
        after.notes
    );
    assert!(
        before.notes[0].starts_with("runtime_sandbox"),
        "{:?}",
        before.notes
    );
    // The export: podlapse's spans make none of the runtime's stages again, and the
    // runtime's spans are forwarded as they came, under the calls' spans.
    let mine: Vec<&CriCall> = cri_calls(&trace.records)
        .into_iter()
        .filter(|c| c.pod_uid == uid)
        .collect();
    let spans = pod_spans(pod, &mine, "n");
    assert!(spans.iter().all(|s| !s.name.starts_with("runtime:")));
    let batches = super::export::runtime_batches(&trace.header, &trace.records, &timeline);
    assert_eq!(batches.len(), 1);
    let forwarded = &batches[0].2;
    assert_eq!(forwarded.len(), 7);
    let ours: std::collections::BTreeSet<[u8; 8]> = spans.iter().map(|s| s.span_id).collect();
    let theirs: std::collections::BTreeSet<[u8; 8]> = forwarded
        .iter()
        .map(|s| s.span_context.span_id().to_bytes())
        .collect();
    for s in forwarded {
        let p = s.parent_span_id.to_bytes();
        assert!(
            ours.contains(&p) || theirs.contains(&p),
            "{} dangles",
            s.name
        );
        assert_eq!(s.span_context.trace_id().to_bytes(), ids::trace_id(&uid));
    }
    // The Chrome JSON export shows them.
    let input = crate::report::TraceInput {
        name: "t".into(),
        records: trace.records.clone(),
        timeline: timeline.clone(),
    };
    let chrome = crate::report::chrome_trace(&[input]).to_string();
    assert!(chrome.contains("runtime:task_start:app"));
}

#[test]
fn runtime_span_records_read_back_from_a_trace_file_and_old_readers_skip_them() {
    let (trace, _) = with_runtime_spans();
    let mut text = serde_json::to_string(&TraceRecord::Header(trace.header.clone())).unwrap();
    for r in &trace.records {
        text.push('\n');
        text.push_str(&serde_json::to_string(r).unwrap());
    }
    text.push('\n');
    let again = crate::trace::parse_trace(std::path::Path::new("t.jsonl"), &text).unwrap();
    assert_eq!(again.records, trace.records);
    assert_eq!(again.skipped, 0);
    assert_eq!(
        crate::timeline::build(&again.records),
        crate::timeline::build(&trace.records)
    );
    // A record type the reader does not know is skipped, as an older podlapse skips
    // runtime_span.
    let unknown = text.replace("\"type\":\"runtime_span\"", "\"type\":\"runtime_span_v9\"");
    let old = crate::trace::parse_trace(std::path::Path::new("t.jsonl"), &unknown).unwrap();
    assert_eq!(old.skipped, 7);
}

#[tokio::test]
async fn the_live_export_forwards_the_runtimes_spans_with_the_runtimes_resource() {
    let (collected, server, queue) = super::test_collector::start().await;
    let (trace, uid) = with_runtime_spans();
    let anchor = super::ClockAnchor {
        wall_ns: trace.header.started_wall_ns,
        mono_ns: trace.header.started_ns,
    };
    let gate = std::sync::Arc::new(super::TraceGate::new());
    gate.enable();
    for r in &trace.records {
        // The pods as added (the fixture's run removed them at its end).
        if let TraceRecord::Pod(p) = r
            && p.op == crate::trace::PodOp::Add
        {
            gate.observe(r);
        }
    }
    let live = super::LiveExport::new(queue, "node-1", anchor, gate.clone());
    let late = crate::cri::CriCall {
        pod_uid: uid.clone(),
        ..cri_calls(&trace.records)[0].clone()
    };
    assert!(gate.sampled(&late), "the pod's startup is not over yet");
    let runtime: Vec<super::RuntimeSpan> = trace
        .records
        .iter()
        .filter_map(|r| match r {
            TraceRecord::RuntimeSpan(s) => Some((**s).clone()),
            _ => None,
        })
        .collect();
    for r in &trace.records {
        if let TraceRecord::Cri(c) = r {
            live.observe_call(c);
        }
    }
    // Before the pod goes: kept for it. Then the pod goes, and a late span goes at once.
    live.observe_runtime_spans(&runtime[..5]);
    let mut timeline = crate::timeline::build(&trace.records);
    timeline.pods.retain(|p| p.uid == uid);
    live.forget(&[], &timeline);
    live.observe_runtime_spans(&runtime[5..]);
    let stats = live
        .close(
            &crate::timeline::Timeline::default(),
            std::time::Duration::from_secs(10),
        )
        .await;
    server.abort();
    let got = collected.names();
    let of = |service: &str| got.iter().filter(|(s, _)| s == service).count();
    assert_eq!(of("containerd"), runtime.len(), "{got:?}");
    assert!(of("podlapse") > 10, "{got:?}");
    assert_eq!(stats.exported() as usize, got.len());
    assert_eq!(stats.dropped(), 0);
    assert!(got.iter().any(|(_, n)| n == "task.Start"));
    // Exported: the pod's later calls go out unsampled.
    assert!(!gate.sampled(&late));
}

#[test]
fn an_exec_after_its_calls_reply_is_still_that_calls() {
    // On a busy node `runc init` execs the program after the runtime replied: the exec
    // stays under the call that caused it.
    let records = fixture("multi-container.jsonl");
    let timeline = crate::timeline::build(&records);
    let calls = cri_calls(&records);
    let mut pod = sidecar_pod(&timeline).clone();
    let mine: Vec<&CriCall> = calls
        .iter()
        .copied()
        .filter(|c| c.pod_uid == pod.uid)
        .collect();
    let end_of = |m: CriMethod, container: &str| {
        mine.iter()
            .filter(|c| c.method == m && c.container == container)
            .map(|c| c.end_ns)
            .max()
            .unwrap()
    };
    let (sandbox_end, start_end) = (
        end_of(CriMethod::RunPodSandbox, ""),
        end_of(CriMethod::StartContainer, "app"),
    );
    for s in &mut pod.stages {
        let at = match s.stage.to_string().as_str() {
            "pause_exec" => sandbox_end + 3_000_000,
            "app_first_exec:app" => start_end + 3_000_000,
            _ => continue,
        };
        (s.start_ns, s.end_ns) = (at, at);
    }
    let spans = pod_spans(&pod, &mine, "node-1");
    let parent_name = |stage: &str| {
        let s = spans.iter().find(|s| s.name == stage).unwrap();
        let p = spans.iter().find(|p| Some(p.span_id) == s.parent).unwrap();
        (p.name.clone(), attr(p, "k8s.container.name").cloned())
    };
    assert_eq!(
        parent_name("app_first_exec:app"),
        (
            "runtime.v1.RuntimeService/StartContainer".to_string(),
            Some(Value::Str("app".into()))
        )
    );
    assert_eq!(
        parent_name("pause_exec").0,
        "runtime.v1.RuntimeService/RunPodSandbox"
    );
}

#[test]
fn a_ready_pod_waits_for_its_containers_first_execs_when_the_probes_saw_it() {
    use crate::timeline::{PodSources, SourceState, StageKind};
    let records = fixture("multi-container.jsonl");
    let timeline = crate::timeline::build(&records);
    let mut pod = sidecar_pod(&timeline).clone();
    let started: Vec<String> = pod
        .stages
        .iter()
        .filter(|s| s.ok && s.stage.kind() == &StageKind::ContainerStart)
        .filter_map(|s| s.stage.name().map(str::to_string))
        .collect();
    assert!(started.len() >= 2, "{started:?}");
    pod.sources = Some(PodSources {
        cri: SourceState::Present { records: 12 },
        kernel: SourceState::Present { records: 40 },
        runtime: SourceState::Absent {
            why: "not asked for".into(),
        },
        runtime_owed: false,
    });
    // Every started container's first exec is in: nothing to wait for.
    assert!(!super::live::first_execs_pending(&pod));
    // The last container's exec not read yet: the export waits for it.
    let last = started.last().unwrap().clone();
    pod.stages.retain(|s| {
        !(s.stage.kind() == &StageKind::AppFirstExec && s.stage.name() == Some(last.as_str()))
    });
    assert!(super::live::first_execs_pending(&pod));
    // Without the probes' events for the pod, none is owed.
    pod.sources.as_mut().unwrap().kernel = SourceState::Absent {
        why: "the probes were off (--no-ebpf)".into(),
    };
    assert!(!super::live::first_execs_pending(&pod));
}
