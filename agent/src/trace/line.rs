//! One trace line straight into its record. A line is read twice over here: once for its
//! `type` alone (nothing else kept), then once into the record's own type. Going through
//! a JSON value first, as the general path in the reader does, builds every field twice.
//!
//! Only a well-formed record of a type known here is read this way; anything else (the
//! header, a record type this version does not know, a line that does not parse) gives
//! `None`, and the reader reads that line the general way, which names what is wrong.

use std::borrow::Cow;
use std::collections::HashMap;
use std::sync::Arc;

use foldhash::fast::FixedState;
use k8s_openapi::api::core::v1::Pod;
use serde::Deserialize;
use serde_json::value::RawValue;

use super::record::{KNOWN_TYPES, PodOp, PodOpRecord, TraceRecord};

/// A record's `type`, the rest of the line skipped.
#[derive(Deserialize)]
struct Tag<'a> {
    #[serde(rename = "type", borrow)]
    kind: Cow<'a, str>,
}

/// The `type` of a line as podlapse writes it: keys in name order, so `type` is the last
/// key and the line ends `,"type":"<kind>"}`. That `"type"` is then a key of the object
/// the line's last brace closes (a string cannot hold an unescaped quote, and nothing
/// follows the brace), so it is the last `type` of the top-level object: what the general
/// way reads, provided the whole line then parses, which the record's own read checks.
/// `None` for a line written otherwise: the tag is then looked for the slow way.
fn written_kind(raw: &str) -> Option<&'static str> {
    let rest = raw.strip_suffix("\"}")?;
    KNOWN_TYPES.iter().copied().find(|kind| {
        rest.strip_suffix(kind)
            .is_some_and(|r| r.ends_with(",\"type\":\"") || r == "{\"type\":\"")
    })
}

/// The record on `raw`, if it is an object whose `type` is one of the record types below
/// and whose fields all read.
/// A pod record with its pod left as written, to be read once per distinct text.
#[derive(Deserialize)]
struct PodOpLine<'a> {
    at_ns: u64,
    op: PodOp,
    #[serde(borrow)]
    pod: &'a RawValue,
}

/// The pods of one run of lines, by the JSON text they were written as. A pod is usually
/// written again unchanged (its REMOVE carries the pod its ADD did): the same text reads
/// into the same pod, so it is read once and shared, as the reconciler shares it.
#[derive(Default)]
pub(super) struct Pods<'a>(HashMap<&'a str, Arc<Pod>, FixedState>);

impl<'a> Pods<'a> {
    fn read(&mut self, line: &'a str) -> Option<PodOpRecord> {
        let l: PodOpLine<'a> = serde_json::from_str(line).ok()?;
        let text = l.pod.get();
        let pod = match self.0.get(text) {
            Some(pod) => pod.clone(),
            None => {
                let pod = Arc::new(serde_json::from_str::<Pod>(text).ok()?);
                self.0.insert(text, pod.clone());
                pod
            }
        };
        Some(PodOpRecord {
            at_ns: l.at_ns,
            op: l.op,
            pod,
        })
    }
}

pub(super) fn parse_record<'a>(raw: &'a str, pods: &mut Pods<'a>) -> Option<TraceRecord> {
    // A struct can also be read from a JSON array; a record is always an object.
    if !raw.trim_start().starts_with('{') {
        return None;
    }
    let tag = match written_kind(raw) {
        Some(kind) => Cow::Borrowed(kind),
        None => serde_json::from_str::<Tag>(raw).ok()?.kind,
    };
    let record = match tag.as_ref() {
        "pod" => TraceRecord::Pod(pods.read(raw)?),
        "cri" => TraceRecord::Cri(serde_json::from_str(raw).ok()?),
        "kernel" => TraceRecord::Kernel(serde_json::from_str(raw).ok()?),
        "event" => TraceRecord::Event(serde_json::from_str(raw).ok()?),
        "status" => TraceRecord::Status(serde_json::from_str(raw).ok()?),
        "wait" => TraceRecord::Wait(serde_json::from_str(raw).ok()?),
        "stage" => {
            // Read through the tag, a stage's value is the line without its `type`.
            let mut value: serde_json::Value = serde_json::from_str(raw).ok()?;
            value.as_object_mut()?.remove("type");
            TraceRecord::Stage(value)
        }
        "runtime_span" => TraceRecord::RuntimeSpan(serde_json::from_str(raw).ok()?),
        "footer" => TraceRecord::Footer(serde_json::from_str(raw).ok()?),
        _ => return None,
    };
    Some(record)
}

#[cfg(test)]
mod tests {
    use std::path::Path;

    use super::*;

    /// The general way: a JSON value, then the record through its tag.
    fn general(raw: &str) -> Option<TraceRecord> {
        let value: serde_json::Value = serde_json::from_str(raw).ok()?;
        serde_json::from_value(value).ok()
    }

    #[test]
    fn every_record_of_the_fixtures_reads_as_the_general_way_reads_it() {
        let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("../traces");
        let mut read = 0;
        for entry in std::fs::read_dir(&dir).unwrap() {
            let path = entry.unwrap().path();
            if path.extension().is_none_or(|e| e != "jsonl") {
                continue;
            }
            let text = std::fs::read_to_string(&path).unwrap();
            let mut pods = Pods::default();
            for (i, raw) in text.lines().enumerate().skip(1) {
                let fast = parse_record(raw, &mut pods);
                assert!(fast.is_some(), "{}:{}", path.display(), i + 1);
                assert_eq!(fast, general(raw), "{}:{}", path.display(), i + 1);
                read += 1;
            }
        }
        assert!(read > 1000, "{read}");
    }

    #[test]
    fn a_stage_keeps_its_fields_but_not_its_type() {
        let raw = r#"{"type":"stage","name":"pull","start_ns":1,"nested":{"type":"x"}}"#;
        let fast = parse_record(raw, &mut Pods::default()).unwrap();
        assert_eq!(Some(&fast), general(raw).as_ref());
        let TraceRecord::Stage(v) = fast else {
            panic!("{fast:?}")
        };
        assert!(v.get("type").is_none() && v["nested"]["type"] == "x");
    }

    #[test]
    fn anything_but_a_well_formed_known_record_is_left_to_the_general_way() {
        for raw in [
            // The header: the reader checks its schema version first.
            r#"{"type":"header","schema_version":1}"#,
            // Unknown and missing types.
            r#"{"type":"hologram","x":1}"#,
            r#"{"method":"Version","start_ns":3,"end_ns":4,"code":"OK"}"#,
            r#"{"type":5}"#,
            // A duplicated type that is not last.
            r#"{"type":"cri","type":"pod","method":"Version","start_ns":3,"end_ns":4,"code":"OK"}"#,
            // A bad field, and a line cut short.
            r#"{"type":"cri","method":"Version","start_ns":"soon","end_ns":4,"code":"OK"}"#,
            r#"{"type":"cri","meth"#,
            // An array that would otherwise read as a struct.
            r#"["cri","Version","",""]"#,
        ] {
            assert_eq!(parse_record(raw, &mut Pods::default()), None, "{raw}");
        }
    }

    #[test]
    fn the_type_read_off_the_line_end_is_the_type_the_general_way_reads() {
        for raw in [
            // As podlapse writes it, and alone.
            r#"{"code":"OK","end_ns":4,"method":"Version","start_ns":3,"type":"cri"}"#,
            r#"{"type":"footer"}"#,
            // A duplicated type: the general way takes the last, and so does the end.
            r#"{"type":"pod","code":"OK","end_ns":4,"method":"Version","start_ns":3,"type":"cri"}"#,
            // A nested "type" at the end is not the record's.
            r#"{"code":"OK","end_ns":4,"method":"Version","start_ns":3,"x":{"a":1,"type":"cri"}}"#,
            // Inside a string, it is not a key at all.
            r#"{"code":"OK","end_ns":4,"message":"a,\"type\":\"cri\"}","method":"Version","start_ns":3}"#,
            // A line that looks right at its end but does not parse.
            r#"{"code":"OK","end_ns":4,"method":"Version","start_ns":3,,"type":"cri"}"#,
            r#"["x","type":"cri"}"#,
        ] {
            assert_eq!(
                parse_record(raw, &mut Pods::default()),
                general(raw),
                "{raw}"
            );
        }
        assert_eq!(
            written_kind(r#"{"a":1,"type":"runtime_span"}"#),
            Some("runtime_span")
        );
        assert_eq!(written_kind(r#"{"a":1,"type":"span"}"#), None);
        assert_eq!(written_kind(r#"{"a":1,"type":"cri"} "#), None);
        assert_eq!(written_kind(r#"{"a":{"type":"cri"}}"#), None);
    }

    #[test]
    fn a_type_with_an_escape_still_reads() {
        let raw = r#"{"type":"cr\u0069","method":"Version","start_ns":3,"end_ns":4,"code":"OK"}"#;
        assert_eq!(parse_record(raw, &mut Pods::default()), general(raw));
        assert!(matches!(
            parse_record(raw, &mut Pods::default()),
            Some(TraceRecord::Cri(_))
        ));
    }

    #[test]
    fn a_pod_written_again_unchanged_is_read_once_and_shared() {
        let pod = r#"{"metadata":{"name":"a","uid":"u1"},"spec":{"containers":[{"name":"c"}]}}"#;
        let other = r#"{"metadata":{"name":"b","uid":"u2"},"spec":{"containers":[{"name":"c"}]}}"#;
        let line =
            |op: &str, pod: &str| format!(r#"{{"at_ns":1,"op":"{op}","pod":{pod},"type":"pod"}}"#);
        let (add, remove, add_other) = (line("ADD", pod), line("REMOVE", pod), line("ADD", other));
        let mut pods = Pods::default();
        fn read<'a>(raw: &'a str, pods: &mut Pods<'a>) -> PodOpRecord {
            match parse_record(raw, pods) {
                Some(TraceRecord::Pod(p)) => p,
                other => panic!("{raw}: {other:?}"),
            }
        }
        let (a, r, o) = (
            read(&add, &mut pods),
            read(&remove, &mut pods),
            read(&add_other, &mut pods),
        );
        assert!(Arc::ptr_eq(&a.pod, &r.pod), "the same text, one pod");
        assert!(!Arc::ptr_eq(&a.pod, &o.pod));
        assert_eq!((a.op, r.op), (PodOp::Add, PodOp::Remove));
        for (raw, record) in [(&add, a), (&remove, r), (&add_other, o)] {
            assert_eq!(Some(TraceRecord::Pod(record)), general(raw), "{raw}");
        }
    }

    #[test]
    fn a_pod_record_that_does_not_read_is_left_to_the_general_way() {
        for raw in [
            // The pod is not a pod.
            r#"{"at_ns":1,"op":"ADD","pod":{"spec":5},"type":"pod"}"#,
            // Twice the pod.
            r#"{"at_ns":1,"op":"ADD","pod":{},"pod":{},"type":"pod"}"#,
            // No op.
            r#"{"at_ns":1,"pod":{},"type":"pod"}"#,
        ] {
            // The reader's general way then reads it, or names what is wrong, as before.
            assert_eq!(parse_record(raw, &mut Pods::default()), None, "{raw}");
        }
    }
}
