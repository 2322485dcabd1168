use podlapse_core::record::{CriMethod, GrpcCode};

use super::*;
use crate::trace::RecordingEnd;

fn call(method: CriMethod, start_ns: u64, traced: bool) -> CriCall {
    CriCall::new(method)
        .with_pod_uid("uid-1")
        .with_times(start_ns, start_ns + 1_000)
        .with_code(GrpcCode::Ok)
        .with_traced(traced)
}

fn span(parent: &CriCall, kind: &str) -> RuntimeSpan {
    RuntimeSpan {
        pod_uid: "uid-1".into(),
        trace_id: ids::hex(&ids::trace_id("uid-1")),
        span_id: "00000000000000aa".into(),
        parent_span_id: ids::hex(&ids::call_span_id(parent)),
        name: format!("runtime.v1.RuntimeService/{}", parent.method.as_str()),
        kind: kind.into(),
        start_ns: parent.start_ns,
        end_ns: parent.end_ns,
        attributes: Default::default(),
        events: Vec::new(),
        status: "unset".into(),
        status_message: String::new(),
        scope: String::new(),
        scope_version: String::new(),
        resource: Default::default(),
    }
}

fn listening(ended: Option<RecordingEnd>) -> SourcesRecord {
    SourcesRecord {
        at_ns: 1,
        kernel: KernelSource::On,
        runtime_spans: RuntimeSpanSource::Listening {
            listen: "127.0.0.1:14317".into(),
        },
        ended,
    }
}

fn ended(received: u64, wait: SpanWaitEnd) -> Option<RecordingEnd> {
    Some(RecordingEnd {
        runtime_spans_received: received,
        waited_ns: 8_000_000_000,
        bound_ns: 8_000_000_000,
        missing: 1,
        wait,
    })
}

fn sources_of(
    sources: &SourcesRecord,
    calls: &[&CriCall],
    kernel_events: u64,
    spans: &[&RuntimeSpan],
) -> PodSources {
    of_pod(
        Some(sources),
        &PodRecords {
            calls,
            observed: 0,
            kernel_events,
            runtime_spans: spans,
        },
    )
    .expect("a recording with sources")
}

#[test]
fn a_recording_without_sources_says_nothing_rather_than_guess() {
    let c = call(CriMethod::RunPodSandbox, 10, false);
    let pod = PodRecords {
        calls: &[&c],
        observed: 0,
        kernel_events: 3,
        runtime_spans: &[],
    };
    assert_eq!(of_pod(None, &pod), None);
}

#[test]
fn probes_turned_off_and_spans_not_asked_for_are_each_said() {
    let sources = SourcesRecord {
        at_ns: 1,
        kernel: KernelSource::Off {
            why: "--no-ebpf".into(),
        },
        runtime_spans: RuntimeSpanSource::Off,
        ended: None,
    };
    let c = call(CriMethod::RunPodSandbox, 10, false);
    let s = sources_of(&sources, &[&c], 0, &[]);
    assert_eq!(s.cri, SourceState::Present { records: 1 });
    assert_eq!(s.kernel.why(), Some("the probes were off (--no-ebpf)"));
    assert!(s.runtime.why().unwrap().contains("--runtime-otlp-listen"));
    assert!(!s.runtime_missing(), "nothing was owed");
    assert_eq!(s.line(), "cri 1, kernel absent, runtime absent");
}

#[test]
fn probes_the_node_refused_say_why() {
    let sources = SourcesRecord {
        kernel: KernelSource::Unavailable {
            why: "no BTF at /sys/kernel/btf/vmlinux".into(),
        },
        ..listening(None)
    };
    let s = sources_of(&sources, &[], 0, &[]);
    assert_eq!(
        s.kernel.why(),
        Some("the probes could not run on this node: no BTF at /sys/kernel/btf/vmlinux")
    );
    assert_eq!(s.cri.why(), Some("no CRI call was made for the pod"));
}

#[test]
fn every_sampled_call_with_its_server_span_is_present() {
    let run = call(CriMethod::RunPodSandbox, 10, true);
    let start = call(CriMethod::StartContainer, 20, true);
    let (a, b, inner) = (
        span(&run, "server"),
        span(&start, "server"),
        span(&run, "internal"),
    );
    let s = sources_of(&listening(None), &[&run, &start], 7, &[&a, &b, &inner]);
    assert_eq!(s.kernel, SourceState::Present { records: 7 });
    assert_eq!(s.runtime, SourceState::Present { records: 3 });
    assert!(s.runtime_owed && !s.runtime_missing());
}

#[test]
fn an_internal_span_under_a_call_is_not_its_server_span() {
    let run = call(CriMethod::RunPodSandbox, 10, true);
    let inner = span(&run, "internal");
    let s = sources_of(&listening(None), &[&run], 1, &[&inner]);
    assert!(
        matches!(s.runtime, SourceState::Pending { records: 1, .. }),
        "{s:?}"
    );
}

#[test]
fn spans_not_yet_come_while_recording_are_pending() {
    let run = call(CriMethod::RunPodSandbox, 10, true);
    let s = sources_of(&listening(None), &[&run], 1, &[]);
    let SourceState::Pending { records, why } = &s.runtime else {
        panic!("{s:?}");
    };
    assert_eq!(*records, 0);
    assert!(
        why.starts_with("1 of the 1 sampled calls (RunPodSandbox) have no runtime span yet"),
        "{why}"
    );
}

#[test]
fn a_runtime_that_sent_nothing_at_all_is_named_with_the_address() {
    let run = call(CriMethod::RunPodSandbox, 10, true);
    let s = sources_of(&listening(ended(0, SpanWaitEnd::Bound)), &[&run], 1, &[]);
    let why = s.runtime.why().unwrap();
    assert!(matches!(s.runtime, SourceState::Absent { .. }));
    assert!(
        why.contains("sent no span to 127.0.0.1:14317") && why.contains("waited 8.0 s"),
        "{why}"
    );
    assert!(s.runtime_missing());
}

#[test]
fn calls_left_without_spans_at_the_bound_make_the_source_partial() {
    let run = call(CriMethod::RunPodSandbox, 10, true);
    let create = call(CriMethod::CreateContainer, 20, true);
    let start = call(CriMethod::StartContainer, 30, true);
    let a = span(&run, "server");
    let s = sources_of(
        &listening(ended(12, SpanWaitEnd::Bound)),
        &[&run, &create, &start],
        1,
        &[&a],
    );
    let SourceState::Partial { records, why } = &s.runtime else {
        panic!("{s:?}");
    };
    assert_eq!(*records, 1);
    assert_eq!(
        why,
        "2 of the 3 sampled calls (CreateContainer, StartContainer) have no runtime span: none \
         came in the 8.0 s the end waited"
    );
}

#[test]
fn a_batch_after_the_calls_says_the_runtime_makes_no_span_for_them() {
    let pull = call(CriMethod::PullImage, 10, true);
    let s = sources_of(
        &listening(ended(40, SpanWaitEnd::BatchAfterCalls)),
        &[&pull],
        1,
        &[],
    );
    assert!(
        s.runtime
            .why()
            .unwrap()
            .contains("makes no span for these calls"),
        "{s:?}"
    );
}

#[test]
fn the_timeline_of_a_trace_with_sources_carries_them_per_pod() {
    use crate::trace::TraceRecord;
    let run = call(CriMethod::RunPodSandbox, 10, false);
    let mut records = vec![TraceRecord::Cri(run)];
    assert_eq!(super::super::build(&records).pods[0].sources, None);
    records.push(TraceRecord::Sources(SourcesRecord {
        runtime_spans: RuntimeSpanSource::Off,
        ..listening(None)
    }));
    let t = super::super::build(&records);
    let s = t.pods[0].sources.as_ref().expect("sources");
    assert_eq!(s.line(), "cri 1, kernel absent, runtime absent");
    assert_eq!(
        s.kernel.why(),
        Some("the probes ran and saw none of the pod's work")
    );
}
