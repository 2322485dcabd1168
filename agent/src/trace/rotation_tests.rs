//! A rotating trace over a few hundred pods: every file reads alone as a whole trace,
//! and the files together give every pod once, with all its records.

use std::collections::BTreeMap;
use std::sync::Arc;

use k8s_openapi::api::core::v1::Pod;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;

use super::*;
use crate::cri::{CriCall, CriMethod, GrpcCode};

const PODS: usize = 300;

fn header() -> Header {
    Header {
        schema_version: SCHEMA_VERSION,
        podlapse_version: "test".into(),
        node: "n".into(),
        kernel: "k".into(),
        runtime_name: "containerd".into(),
        runtime_version: "2.1.9".into(),
        config: TraceConfig::empty(),
        started_wall_ns: 1_700_000_000_000_000_000,
        started_ns: 1,
        observed: None,
        part: None,
    }
}

fn pod(i: usize) -> Arc<Pod> {
    Arc::new(Pod {
        metadata: ObjectMeta {
            name: Some(format!("web-{i}")),
            namespace: Some("default".into()),
            uid: Some(format!("uid-{i:04}")),
            // Bulk, as a real spec's labels and annotations are.
            annotations: Some(BTreeMap::from([(
                "example.com/notes".to_string(),
                "x".repeat(12_000),
            )])),
            ..ObjectMeta::default()
        },
        ..Pod::default()
    })
}

fn call(i: usize, method: CriMethod, at: u64) -> TraceRecord {
    TraceRecord::Cri(
        CriCall::new(method)
            .with_pod_uid(format!("uid-{i:04}"))
            .with_sandbox_id(format!("sb-{i}"))
            .with_times(at, at + 1_000)
            .with_code(GrpcCode::Ok),
    )
}

fn sources(at_ns: u64) -> TraceRecord {
    TraceRecord::Sources(SourcesRecord {
        at_ns,
        kernel: KernelSource::Off {
            why: "--no-ebpf".into(),
        },
        runtime_spans: RuntimeSpanSource::Off,
        ended: None,
    })
}

/// Pods interleaved as on a busy node: each pod's ADD, then later its two calls, so
/// most pods' records straddle a rotation.
fn records() -> Vec<TraceRecord> {
    let mut out = vec![sources(2)];
    for i in 0..PODS {
        let t = 10 + i as u64 * 1_000_000;
        out.push(TraceRecord::Pod(PodOpRecord {
            at_ns: t,
            op: PodOp::Add,
            pod: pod(i),
        }));
        if i >= 3 {
            out.push(call(i - 3, CriMethod::RunPodSandbox, t + 10));
            out.push(call(i - 3, CriMethod::StartContainer, t + 20));
        }
    }
    for i in PODS - 3..PODS {
        out.push(call(i, CriMethod::RunPodSandbox, 10_000_000_000 + i as u64));
        out.push(call(
            i,
            CriMethod::StartContainer,
            10_000_000_100 + i as u64,
        ));
    }
    out
}

fn write(path: &std::path::Path, rotation: Rotation) {
    let rt = tokio::runtime::Builder::new_current_thread()
        .build()
        .unwrap();
    rt.block_on(async {
        let w = TraceWriter::create_rotating(path, header(), Some(rotation)).unwrap();
        let sink = w.sink();
        for r in records() {
            sink.send_waiting(r).await;
        }
        w.finish(Footer {
            ended_ns: 99,
            ..Footer::default()
        })
        .await
        .unwrap();
    });
}

#[test]
fn a_rotated_trace_reads_file_by_file_and_whole() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("t.jsonl");
    let rotation = Rotation {
        max_bytes: 1 << 20,
        keep: 100,
    };
    write(&path, rotation);
    let files: Vec<_> = (0..100)
        .map(|age| part_path(&path, age))
        .take_while(|p| p.exists())
        .collect();
    assert!(files.len() >= 3, "{} files", files.len());
    let mut traces = Vec::new();
    for (age, f) in files.iter().enumerate() {
        let size = std::fs::metadata(f).unwrap().len();
        // A file ends at the first record past the bound.
        assert!(
            size < rotation.max_bytes + 32 * 1024,
            "{}: {size}",
            f.display()
        );
        let t = read_trace(f).unwrap();
        // Each file alone: a header saying its place, a footer, the recording's state.
        let part = t.header.part.clone().unwrap();
        assert_eq!(
            part.index as usize,
            files.len() - 1 - age,
            "{}",
            f.display()
        );
        let footer = t.footer.as_ref().expect("every file has its footer");
        assert_eq!(footer.continued, age != 0, "{}", f.display());
        let counted: u64 = footer.counts.values().sum();
        assert_eq!(counted as usize, t.records.len(), "{}", f.display());
        assert!(
            matches!(t.records.first(), Some(TraceRecord::Sources(_))),
            "{} starts with the sources",
            f.display()
        );
        let _ = crate::timeline::from_records(&t.records);
        traces.push(t);
    }
    // Given newest first, joined oldest first.
    let mut recordings = join_recordings(traces).unwrap();
    assert_eq!(recordings.len(), 1);
    let joined = recordings.remove(0);
    assert!(joined.notes.is_empty(), "{:?}", joined.notes);
    assert!(!joined.trace.footer.as_ref().unwrap().continued);
    let mut calls: BTreeMap<&str, Vec<CriMethod>> = BTreeMap::new();
    let mut adds: BTreeMap<&str, usize> = BTreeMap::new();
    for r in &joined.trace.records {
        match r {
            TraceRecord::Cri(c) => calls.entry(c.pod_uid.as_str()).or_default().push(c.method),
            TraceRecord::Pod(p) => {
                *adds
                    .entry(p.pod.metadata.uid.as_deref().unwrap())
                    .or_default() += 1
            }
            _ => {}
        }
    }
    assert_eq!(adds.len(), PODS);
    assert!(adds.values().all(|n| *n == 1));
    assert_eq!(calls.len(), PODS);
    assert!(
        calls
            .values()
            .all(|m| m == &[CriMethod::RunPodSandbox, CriMethod::StartContainer])
    );
    let timeline = crate::timeline::from_records(&joined.trace.records);
    assert_eq!(timeline.pods.len(), PODS);
}

#[test]
fn the_oldest_files_beyond_keep_go_and_a_gap_is_said() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("t.jsonl");
    write(
        &path,
        Rotation {
            max_bytes: 256 * 1024,
            keep: 3,
        },
    );
    assert!(part_path(&path, 2).exists());
    assert!(!part_path(&path, 3).exists());
    // The newest and the oldest kept, without the one between.
    let traces = vec![
        read_trace(&path).unwrap(),
        read_trace(&part_path(&path, 2)).unwrap(),
    ];
    let joined = join_recordings(traces).unwrap().remove(0);
    assert_eq!(joined.notes.len(), 1, "{:?}", joined.notes);
    assert!(
        joined.notes[0].contains("1 between them was not given"),
        "{:?}",
        joined.notes
    );
    // The same file twice is refused, naming both.
    let twice = vec![read_trace(&path).unwrap(), read_trace(&path).unwrap()];
    let err = join_recordings(twice).err().unwrap();
    assert!(matches!(err, TraceError::SamePart { .. }), "{err}");
}
