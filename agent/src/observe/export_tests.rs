//! The observer's export against a collector of the test's own: what was received goes
//! out once on arrival, each observed startup once when it settled, under the kubelet's
//! calls.

use std::collections::BTreeMap;
use std::time::Duration;

use podlapse_core::record::{Attributes, RuntimeSpan};

use super::{KUBELET_WAIT_NS, ObservedExport, SETTLE_NS};
use crate::otel::ClockAnchor;
use crate::otel::runtime_span::unhex;
use crate::otel::test_collector;
use crate::timeline::Collector;
use crate::timeline::tests::{UID, observed_run};
use crate::trace::TraceRecord;

const MS: u64 = 1_000_000;
const TRACE: &str = "4bf92f3577b34da6a3ce929d0e0e4736";
const ANCHOR: ClockAnchor = ClockAnchor {
    wall_ns: 1_700_000_000_000_000_000,
    mono_ns: 0,
};

fn span(id: &str, parent: &str, name: &str, kind: &str, ms: (u64, u64)) -> RuntimeSpan {
    let service = if kind == "server" {
        "containerd"
    } else {
        "kubelet"
    };
    let mut attributes = Attributes::new();
    if name == "syncPod" {
        attributes.insert("k8s.pod.uid".into(), UID.into());
    }
    RuntimeSpan {
        pod_uid: UID.into(),
        trace_id: TRACE.into(),
        span_id: id.into(),
        parent_span_id: parent.into(),
        name: name.into(),
        kind: kind.into(),
        start_ns: ms.0 * MS,
        end_ns: ms.1 * MS,
        attributes,
        events: Vec::new(),
        status: "unset".into(),
        status_message: String::new(),
        scope: String::new(),
        scope_version: String::new(),
        resource: Attributes::from([("service.name".to_string(), service.into())]),
    }
}

const SYNC: &str = "00000000000000a1";
const RUN: &str = "00000000000000b2";
const START: &str = "00000000000000c3";

/// The kubelet's sync of the fixture's pod, its calls, containerd's server span under
/// RunPodSandbox, and a span of no pod (the kubelet's PLEG relist).
fn received() -> Vec<RuntimeSpan> {
    let mut stray = span(
        "00000000000000f6",
        "",
        "runtime.v1.RuntimeService/ListPodSandbox",
        "client",
        (1, 2),
    );
    stray.pod_uid.clear();
    stray.trace_id = "22".repeat(16);
    vec![
        span(SYNC, "", "syncPod", "internal", (2, 260)),
        span(
            RUN,
            SYNC,
            "runtime.v1.RuntimeService/RunPodSandbox",
            "client",
            (5, 150),
        ),
        span(
            "00000000000000d4",
            RUN,
            "runtime.v1.RuntimeService/RunPodSandbox",
            "server",
            (6, 149),
        ),
        span(
            START,
            SYNC,
            "runtime.v1.RuntimeService/StartContainer",
            "client",
            (171, 240),
        ),
        stray,
    ]
}

/// What the receiver placed with the pod of [`received`].
fn placed() -> Vec<RuntimeSpan> {
    received()
        .into_iter()
        .filter(|s| !s.pod_uid.is_empty())
        .collect()
}

fn collector(records: &[TraceRecord]) -> Collector {
    let c = Collector::new();
    for r in records {
        c.push(r);
    }
    c
}

#[tokio::test]
async fn received_spans_go_once_on_arrival_and_the_startup_once_it_settled_under_the_kubelets_calls()
 {
    let (collected, server, queue) = test_collector::start().await;
    let export = ObservedExport::new(queue, "node-1", ANCHOR);
    let spans = received();
    export.forward(&spans);
    let placed: Vec<RuntimeSpan> = spans
        .iter()
        .filter(|s| !s.pod_uid.is_empty())
        .cloned()
        .collect();
    export.observe_spans(&placed);
    let records = observed_run();
    let c = collector(&records);
    // Running at 240 ms: not settled 5 s on, then exported once, whatever the ticks.
    export.tick(&c, 240 * MS + 5_000_000_000);
    export.tick(&c, 260 * MS + SETTLE_NS);
    export.tick(&c, 260 * MS + 2 * SETTLE_NS);
    let stats = export
        .close(&crate::timeline::build(&records), Duration::from_secs(10))
        .await;
    server.abort();
    let got = collected.spans();
    // Each received span once, with its sender's resource; none made again.
    for s in &spans {
        let n = got
            .iter()
            .filter(|(_, g)| g.span_id == unhex::<8>(&s.span_id).unwrap())
            .count();
        assert_eq!(n, 1, "{} {}", s.kind, s.name);
    }
    assert_eq!(got.iter().filter(|(svc, _)| svc == "kubelet").count(), 4);
    assert_eq!(got.iter().filter(|(svc, _)| svc == "containerd").count(), 1);
    let ours: Vec<_> = got
        .iter()
        .filter(|(svc, _)| svc == "podlapse")
        .map(|(_, s)| s)
        .collect();
    let by_name: BTreeMap<&str, &opentelemetry_proto::tonic::trace::v1::Span> =
        ours.iter().map(|s| (s.name.as_str(), *s)).collect();
    assert_eq!(by_name.len(), ours.len(), "each stage once: {ours:#?}");
    let trace = unhex::<16>(TRACE).unwrap().to_vec();
    assert!(ours.iter().all(|s| s.trace_id == trace), "{ours:#?}");
    let parent = |name: &str| {
        by_name
            .get(name)
            .unwrap_or_else(|| panic!("no {name}: {:?}", by_name.keys()))
            .parent_span_id
            .clone()
    };
    let id = |hex: &str| unhex::<8>(hex).unwrap().to_vec();
    assert_eq!(parent("pod_startup"), id(SYNC));
    assert_eq!(parent("netns_created"), id(RUN));
    assert_eq!(parent("cni_plugin:bridge"), id(RUN));
    assert_eq!(parent("app_first_exec:app"), id(START));
    assert_eq!(stats.dropped(), 0);
    assert_eq!(stats.exported() as usize, got.len());
}

#[tokio::test]
async fn a_pod_found_running_has_no_startup_to_export() {
    let (collected, server, queue) = test_collector::start().await;
    let export = ObservedExport::new(queue, "node-1", ANCHOR);
    let mut records = observed_run();
    for r in &mut records {
        if let TraceRecord::Observed(o) = r {
            o.before_start = o.what == crate::trace::Observation::SandboxReady;
        }
    }
    let c = collector(&records);
    export.tick(&c, 10 * SETTLE_NS);
    export
        .close(&crate::timeline::build(&records), Duration::from_secs(10))
        .await;
    server.abort();
    assert!(collected.spans().is_empty(), "{:?}", collected.names());
}

#[tokio::test]
async fn a_startup_not_settled_when_the_observer_stops_goes_as_it_stands_in_its_own_trace() {
    let (collected, server, queue) = test_collector::start().await;
    let export = ObservedExport::new(queue, "node-1", ANCHOR);
    let records = observed_run();
    let c = collector(&records);
    export.tick(&c, 241 * MS);
    assert!(collected.spans().is_empty());
    export
        .close(&crate::timeline::build(&records), Duration::from_secs(10))
        .await;
    server.abort();
    let got = collected.spans();
    assert!(
        got.iter().any(|(_, s)| s.name == "pod_startup"),
        "{:?}",
        collected.names()
    );
    let own = crate::otel::ids::trace_id(UID).to_vec();
    assert!(
        got.iter()
            .all(|(svc, s)| svc == "podlapse" && s.trace_id == own)
    );
}

/// The kubelet's sync of another pod: its tracing is on.
fn another_pods_sync() -> RuntimeSpan {
    let mut other = span("00000000000000e5", "", "syncPod", "internal", (1, 3));
    other.pod_uid = "0a1b2c3d-0000-4000-8000-0000000000ff".into();
    other.trace_id = "33".repeat(16);
    other
}

#[tokio::test]
async fn with_the_kubelet_tracing_a_startup_waits_for_the_sync_that_ran_it() {
    let (collected, server, queue) = test_collector::start().await;
    let export = ObservedExport::new(queue, "node-1", ANCHOR);
    export.observe_spans(&[another_pods_sync()]);
    let records = observed_run();
    let c = collector(&records);
    // Quiet for longer than the settling, but the kubelet's sync of the pod (it ends once
    // StartContainer returned, and is exported then) has not come.
    export.tick(&c, 260 * MS + SETTLE_NS);
    export.tick(&c, 260 * MS + 2 * SETTLE_NS);
    assert!(
        !export.state().done.contains(UID),
        "exported before its sync"
    );
    let placed = placed();
    export.observe_spans(&placed);
    export.tick(&c, 260 * MS + 3 * SETTLE_NS);
    assert!(export.state().done.contains(UID), "its sync came: exported");
    let stats = export
        .close(&crate::timeline::build(&records), Duration::from_secs(10))
        .await;
    server.abort();
    let got = collected.spans();
    let startup = got
        .iter()
        .find(|(_, s)| s.name == "pod_startup")
        .map(|(_, s)| s)
        .unwrap_or_else(|| panic!("{:?}", collected.names()));
    assert_eq!(startup.parent_span_id, unhex::<8>(SYNC).unwrap().to_vec());
    assert_eq!(stats.dropped(), 0);
}

#[tokio::test]
async fn a_pod_the_kubelet_sampled_out_goes_in_its_own_trace_after_the_wait() {
    let (collected, server, queue) = test_collector::start().await;
    let export = ObservedExport::new(queue, "node-1", ANCHOR);
    export.observe_spans(&[another_pods_sync()]);
    let records = observed_run();
    let c = collector(&records);
    export.tick(&c, 260 * MS + SETTLE_NS);
    assert!(!export.state().done.contains(UID), "it may still come");
    export.tick(&c, 260 * MS + KUBELET_WAIT_NS);
    assert!(export.state().done.contains(UID), "waited out: exported");
    export
        .close(&crate::timeline::build(&records), Duration::from_secs(10))
        .await;
    server.abort();
    let got = collected.spans();
    let own = crate::otel::ids::trace_id(UID).to_vec();
    assert!(
        got.iter().any(|(_, s)| s.name == "pod_startup"),
        "{:?}",
        collected.names()
    );
    assert!(
        got.iter()
            .all(|(svc, s)| svc == "podlapse" && s.trace_id == own)
    );
}

#[tokio::test]
async fn a_forgotten_pod_goes_out_as_it_stands_and_its_late_spans_are_not_kept() {
    let (collected, server, queue) = test_collector::start().await;
    let export = ObservedExport::new(queue, "node-1", ANCHOR);
    let records = observed_run();
    let timeline = crate::timeline::build(&records);
    export.forget(&[UID.to_string()], &timeline);
    {
        let st = export.state();
        assert!(st.done.is_empty() && st.pending.is_empty());
    }
    let placed = placed();
    export.observe_spans(&placed);
    assert!(
        export.state().kubelet.is_empty(),
        "late spans of a forgotten pod"
    );
    export
        .close(
            &crate::timeline::Timeline::default(),
            Duration::from_secs(10),
        )
        .await;
    server.abort();
    let got = collected.spans();
    assert_eq!(
        got.iter().filter(|(_, s)| s.name == "pod_startup").count(),
        1,
        "{:?}",
        collected.names()
    );
}
