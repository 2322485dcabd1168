//! The recording layer gives each call made for a pod the `traceparent` of the span the
//! trace export makes for it: the pod's trace, the call's own span ID; sampled when the
//! sink says the call is exported, unsampled otherwise and for calls of no pod.

use std::sync::{Arc, Mutex};

use super::fake::FakeRuntime;
use super::recording::{CallSink, CriCall, Recording};
use super::{ImageService, RuntimeService, api, trace_context};
use crate::otel::ids;

/// (method, the traceparent it ran with), in call order, as the runtime saw them.
type Log = Arc<Mutex<Vec<(&'static str, Option<String>)>>>;

/// Keeps every call; `exporting` says whether calls of pods are exported.
#[derive(Default)]
struct Calls {
    calls: Mutex<Vec<CriCall>>,
    exporting: bool,
}

impl CallSink for Calls {
    fn record(&self, call: CriCall) {
        self.calls.lock().unwrap().push(call);
    }

    fn sampled(&self, _call: &CriCall) -> bool {
        self.exporting
    }
}

/// Makes the calls of one pod's start (and the node's Version) through a recorder over
/// `sink`; returns what the runtime saw and what was recorded.
async fn start_a_pod(sink: Arc<Calls>) -> (Vec<(&'static str, Option<String>)>, Vec<CriCall>) {
    let seen = Log::default();
    let noted = seen.clone();
    // The observer runs inside each call, where the recording layer's context is set.
    let runtime = FakeRuntime::new().with_observer(move |call| {
        noted
            .lock()
            .unwrap()
            .push((call.method().as_str(), trace_context::current()));
    });
    let rec = Recording::new(runtime, sink.clone());
    let config = sandbox_config();
    rec.version().await.unwrap();
    let sandbox = rec
        .run_pod_sandbox(api::RunPodSandboxRequest {
            config: Some(config.clone()),
            runtime_handler: String::new(),
        })
        .await
        .unwrap();
    rec.pull_image(
        api::ImageSpec {
            image: "i".into(),
            ..Default::default()
        },
        None,
        Some(config.clone()),
    )
    .await
    .unwrap();
    let id = rec
        .create_container(api::CreateContainerRequest {
            pod_sandbox_id: sandbox.pod_sandbox_id,
            config: Some(api::ContainerConfig {
                metadata: Some(api::ContainerMetadata {
                    name: "c".into(),
                    attempt: 0,
                }),
                ..Default::default()
            }),
            sandbox_config: Some(config),
        })
        .await
        .unwrap();
    rec.start_container(&id).await.unwrap();
    let seen = seen.lock().unwrap().clone();
    let calls = sink.calls.lock().unwrap().clone();
    (seen, calls)
}

#[tokio::test]
async fn every_call_for_a_pod_carries_its_own_spans_traceparent() {
    let sink = Arc::new(Calls {
        exporting: true,
        ..Calls::default()
    });
    let (seen, calls) = start_a_pod(sink).await;
    assert_eq!(seen.len(), calls.len());
    for ((method, tp), call) in seen.iter().zip(&calls) {
        assert_eq!(*method, call.method.as_str());
        let tp = tp.as_deref().expect("every call carries a context");
        assert_eq!(tp, ids::traceparent(call), "{method}");
        if call.pod_uid.is_empty() {
            // The node's own calls belong to no pod's trace, and are never sampled.
            assert!(!call.traced, "{method}");
            assert!(tp.ends_with("-00"), "{method}: {tp}");
            assert!(tp.contains(&hex(&ids::node_trace_id())), "{method}: {tp}");
        } else {
            // The export's span for the call: its pod's trace, its own span, sampled.
            assert_eq!(call.pod_uid, "uid-1", "{method} is tied to its pod");
            assert!(call.traced, "{method}");
            assert_eq!(
                tp,
                format!(
                    "00-{}-{}-01",
                    hex(&ids::trace_id("uid-1")),
                    hex(&ids::call_span_id(call))
                ),
                "{method}"
            );
        }
    }
    let sampled = seen
        .iter()
        .filter(|(_, tp)| tp.as_deref().is_some_and(|t| t.ends_with("-01")))
        .count();
    assert_eq!(sampled, 4, "{seen:?}");
    // Outside a call, nothing.
    assert_eq!(trace_context::current(), None);
}

#[tokio::test]
async fn calls_whose_spans_are_not_exported_carry_an_unsampled_context() {
    let (seen, calls) = start_a_pod(Arc::new(Calls::default())).await;
    assert_eq!(seen.len(), 5);
    for ((method, tp), call) in seen.iter().zip(&calls) {
        assert!(!call.traced, "{method}");
        let tp = tp.as_deref().unwrap();
        assert!(tp.ends_with("-00"), "{method}: {tp}");
        assert_eq!(tp, ids::traceparent(call), "{method}");
    }
}

fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

/// Pod `p` (UID `uid-1`) in `default`, first attempt: the sandbox these tests record.
pub(super) fn sandbox_config() -> api::PodSandboxConfig {
    api::PodSandboxConfig {
        metadata: Some(api::PodSandboxMetadata {
            name: "p".into(),
            uid: "uid-1".into(),
            namespace: "default".into(),
            attempt: 0,
        }),
        ..Default::default()
    }
}
