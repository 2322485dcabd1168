//! The span model on a recorded fixture: the tree, the names, the IDs.

use std::collections::BTreeMap;

use super::export::cri_calls;
use super::ids;
use super::spans::{Kind, PodSpan, Value, pod_spans};
use crate::cri::CriCall;
use crate::timeline::StageSource;
use crate::trace::{TraceRecord, read_trace};

fn fixture(name: &str) -> Vec<TraceRecord> {
    let path = std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../traces")
        .join(name);
    read_trace(&path).expect("a fixture").records
}

fn attr<'a>(s: &'a PodSpan, key: &str) -> Option<&'a Value> {
    s.attributes.iter().find(|(k, _)| *k == key).map(|(_, v)| v)
}

#[test]
fn a_pods_startup_is_one_trace_with_calls_under_the_root_and_kernel_stages_under_their_call() {
    let records = fixture("multi-container.jsonl");
    let timeline = crate::timeline::build(&records);
    let calls = cri_calls(&records);
    let pod = timeline
        .pods
        .iter()
        .find(|p| p.name == "app-with-sidecar")
        .unwrap();
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
        attr(sandbox, "podtrace.stage"),
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
        attr(bridge, "podtrace.cni.plugin"),
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
        .filter(|s| s.kind == Kind::Client && attr(s, "podtrace.stage").is_some())
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
fn a_call_sent_sampled_after_the_startup_ended_is_exported_and_an_unsampled_one_is_not() {
    let records = fixture("multi-container.jsonl");
    let timeline = crate::timeline::build(&records);
    let calls = cri_calls(&records);
    let pod = timeline
        .pods
        .iter()
        .find(|p| p.name == "app-with-sidecar")
        .unwrap();
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
