//! The observed pod's spans inside the kubelet's traces.

use std::collections::BTreeMap;

use podlapse_core::record::{Attributes, RuntimeSpan};

use super::joined_pod_spans;
use crate::otel::ids;
use crate::otel::runtime_span::unhex;
use crate::otel::spans::{EXEC_LAG_NS, PodSpan};
use crate::timeline::{PodTimeline, Stage, StageKind, StageName, StageSource};

const UID: &str = "0b6c1f9e-2a4d-4c1e-9f3a-5d6e7f8a9b0c";
const TRACE: &str = "4bf92f3577b34da6a3ce929d0e0e4736";

fn stage(name: StageName, start: u64, end: u64, source: StageSource) -> Stage {
    Stage::new(UID, "default", "web", name, start, end, source)
}

/// Seen at 100 (its pod cgroup, before the sync the test's kubelet began at 105), the
/// netns begun a moment before, the bridge inside RunPodSandbox, Running and then the
/// app's exec inside StartContainer; the runtime's and the kubelet's own stages besides.
fn pod() -> PodTimeline {
    let mut bridge = stage(
        StageName::of(StageKind::CniPlugin, "bridge"),
        130,
        150,
        StageSource::Kernel,
    );
    bridge.exit_code = Some(0);
    let mut exec = stage(
        StageName::of(StageKind::AppFirstExec, "app"),
        385,
        385,
        StageSource::Kernel,
    );
    exec.container = Some("app".into());
    PodTimeline {
        uid: UID.into(),
        namespace: "default".into(),
        name: "web".into(),
        seen_ns: Some(100),
        sandbox_ids: vec!["sb".into()],
        containers: BTreeMap::new(),
        ip: Some("10.0.0.2".into()),
        stages: vec![
            stage(StageKind::PodSeen.into(), 100, 100, StageSource::Kernel),
            stage(
                StageKind::PodCgroupCreated.into(),
                100,
                101,
                StageSource::Kernel,
            ),
            // The runtime was creating the netns when the pod's first event came.
            stage(StageKind::NetnsCreated.into(), 95, 121, StageSource::Kernel),
            bridge,
            stage(
                StageName::of(StageKind::Runtime, "sandbox_start"),
                110,
                200,
                StageSource::Runtime,
            ),
            stage(
                StageName::of(StageKind::KubeletCall, "RunPodSandbox"),
                110,
                200,
                StageSource::Kubelet,
            ),
            stage(
                StageKind::SandboxReady.into(),
                200,
                200,
                StageSource::Runtime,
            ),
            exec,
            // The runtime shows the container started a moment before the app's exec.
            stage(StageKind::Running.into(), 380, 380, StageSource::Runtime),
        ],
        kernel_events: BTreeMap::new(),
        notes: Vec::new(),
        sources: None,
    }
}

fn received(id: &str, parent: &str, name: &str, kind: &str, span: (u64, u64)) -> RuntimeSpan {
    let service = if kind == "server" {
        "containerd"
    } else {
        "kubelet"
    };
    RuntimeSpan {
        pod_uid: UID.into(),
        trace_id: TRACE.into(),
        span_id: id.into(),
        parent_span_id: parent.into(),
        name: name.into(),
        kind: kind.into(),
        start_ns: span.0,
        end_ns: span.1,
        attributes: Attributes::new(),
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

/// The kubelet's sync (105–450) with RunPodSandbox (110–200) and StartContainer
/// (300–390), and containerd's server span under RunPodSandbox.
fn kubelets() -> Vec<RuntimeSpan> {
    let mut sync = received(SYNC, "", "syncPod", "internal", (105, 450));
    sync.attributes.insert("k8s.pod.uid".into(), UID.into());
    vec![
        sync,
        received(
            RUN,
            SYNC,
            "runtime.v1.RuntimeService/RunPodSandbox",
            "client",
            (110, 200),
        ),
        received(
            "00000000000000d4",
            RUN,
            "runtime.v1.RuntimeService/RunPodSandbox",
            "server",
            (111, 199),
        ),
        received(
            START,
            SYNC,
            "runtime.v1.RuntimeService/StartContainer",
            "client",
            (300, 390),
        ),
    ]
}

fn named<'a>(spans: &'a [PodSpan], name: &str) -> &'a PodSpan {
    spans
        .iter()
        .find(|s| s.name == name)
        .unwrap_or_else(|| panic!("no {name} in {spans:#?}"))
}

fn id(hex: &str) -> [u8; 8] {
    unhex::<8>(hex).unwrap()
}

#[test]
fn each_stage_hangs_under_the_kubelets_call_it_happened_in_inside_the_kubelets_trace() {
    let spans = kubelets();
    let refs: Vec<&RuntimeSpan> = spans.iter().collect();
    let out = joined_pod_spans(&pod(), &refs, "node-1");
    let trace = unhex::<16>(TRACE).unwrap();
    assert!(out.iter().all(|s| s.trace_id == trace), "{out:#?}");
    // pod_startup under the sync it was seen in... or, seen before the sync began, the
    // first sync; it holds what no span of the kubelet's was under way for.
    let root = &out[0];
    assert_eq!(root.name, "pod_startup");
    assert_eq!(root.parent, Some(id(SYNC)));
    assert_eq!(root.span_id, ids::root_span_id(UID));
    assert_eq!(named(&out, "pod_cgroup_created").parent, Some(root.span_id));
    // The kernel's stages under the call they happened in.
    for s in ["cni_plugin:bridge", "sandbox_ready"] {
        assert_eq!(named(&out, s).parent, Some(id(RUN)), "{s}");
    }
    // Begun before the pod was seen and before the kubelet's sync: in the startup, under
    // pod_startup.
    assert_eq!(named(&out, "netns_created").parent, Some(root.span_id));
    assert_eq!(root.start_ns, 95);
    // The app's exec after Running is part of the startup.
    assert_eq!(named(&out, "running").parent, Some(id(START)));
    assert_eq!(named(&out, "app_first_exec:app").parent, Some(id(START)));
    assert_eq!(root.end_ns, 385);
    // The runtime's and the kubelet's own spans are forwarded, never made again.
    assert!(
        out.iter()
            .all(|s| !s.name.starts_with("runtime") && !s.name.starts_with("kubelet")),
        "{out:#?}"
    );
    // Every span once.
    let mut ids: Vec<[u8; 8]> = out.iter().map(|s| s.span_id).collect();
    ids.sort();
    ids.dedup();
    assert_eq!(ids.len(), out.len());
}

#[test]
fn without_the_kubelets_spans_the_pod_has_a_trace_of_its_own() {
    // Only the runtime's server spans (a client that does not trace).
    let spans: Vec<RuntimeSpan> = kubelets()
        .into_iter()
        .filter(|s| s.kind == "server")
        .collect();
    let refs: Vec<&RuntimeSpan> = spans.iter().collect();
    let out = joined_pod_spans(&pod(), &refs, "node-1");
    assert!(out.iter().all(|s| s.trace_id == ids::trace_id(UID)));
    assert_eq!(out[0].parent, None);
    assert!(out[1..].iter().all(|s| s.parent == Some(out[0].span_id)));
}

#[test]
fn a_pod_seen_during_a_later_sync_starts_in_that_syncs_trace() {
    let mut spans = kubelets();
    // The kubelet's first sync failed early and left no trace of the pod's seeing; the
    // one under way when it was seen is a second trace.
    spans[0].start_ns = 5;
    spans[0].end_ns = 50;
    let mut second = received("00000000000000e5", "", "syncPod", "internal", (90, 460));
    second.trace_id = "11111111111111111111111111111111".into();
    spans.push(second);
    let refs: Vec<&RuntimeSpan> = spans.iter().collect();
    let out = joined_pod_spans(&pod(), &refs, "node-1");
    assert_eq!(out[0].parent, Some(id("00000000000000e5")));
    assert_eq!(out[0].trace_id, [0x11; 16]);
    // The calls' stages stay in the calls' trace.
    assert_eq!(
        named(&out, "cni_plugin:bridge").trace_id,
        unhex::<16>(TRACE).unwrap()
    );
    // A span the kubelet did not send (bad IDs) is no holder.
    let mut bad = kubelets();
    for s in &mut bad {
        s.span_id = "zz".into();
    }
    let refs: Vec<&RuntimeSpan> = bad.iter().collect();
    let out = joined_pod_spans(&pod(), &refs, "node-1");
    assert_eq!(out[0].parent, None);
}

fn with_exec_at(at: u64) -> PodTimeline {
    let mut pod = pod();
    for s in &mut pod.stages {
        if s.stage.kind() == &StageKind::AppFirstExec {
            s.start_ns = at;
            s.end_ns = at;
        }
    }
    pod
}

#[test]
fn an_exec_after_the_kubelet_had_the_reply_stays_under_the_call_that_caused_it() {
    // StartContainer for the app (300–390) and then for a sidecar (392–398), its server
    // span naming the container; the app's exec came at 395, after its reply.
    let mut spans = kubelets();
    spans.push(received(
        "00000000000000f6",
        SYNC,
        "runtime.v1.RuntimeService/StartContainer",
        "client",
        (392, 398),
    ));
    let mut server = received(
        "00000000000000f7",
        "00000000000000f6",
        "runtime.v1.RuntimeService/StartContainer",
        "server",
        (393, 397),
    );
    server
        .attributes
        .insert("container.name".into(), "sidecar_web_default_u_0".into());
    spans.push(server);
    let refs: Vec<&RuntimeSpan> = spans.iter().collect();
    let out = joined_pod_spans(&with_exec_at(395), &refs, "node-1");
    assert_eq!(named(&out, "app_first_exec:app").parent, Some(id(START)));
    // Without the sidecar's call the nearest is still the app's.
    let refs: Vec<&RuntimeSpan> = spans[..4].iter().collect();
    let out = joined_pod_spans(&with_exec_at(395), &refs, "node-1");
    assert_eq!(named(&out, "app_first_exec:app").parent, Some(id(START)));
}

#[test]
fn an_exec_long_after_every_call_is_no_calls() {
    // Past the lag after StartContainer's reply (390), inside a longer sync.
    let mut spans = kubelets();
    spans[0].end_ns = 390 + EXEC_LAG_NS + 100;
    let refs: Vec<&RuntimeSpan> = spans.iter().collect();
    let out = joined_pod_spans(&with_exec_at(390 + EXEC_LAG_NS + 1), &refs, "node-1");
    assert_eq!(named(&out, "app_first_exec:app").parent, Some(id(SYNC)));
    // Begun before the call: not the call's.
    let out = joined_pod_spans(&with_exec_at(299), &refs, "node-1");
    assert_eq!(named(&out, "app_first_exec:app").parent, Some(id(SYNC)));
}
