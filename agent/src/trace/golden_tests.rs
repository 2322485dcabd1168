//! The golden check of the trace format: every trace in the tree (`traces/*.jsonl`, the
//! fuzzers' seeds, any other `*.jsonl` outside `target/`) read record by record, both ways
//! the reader reads a line, and written back gives each line byte for byte (the footer
//! with the counts added since). The record types (their field order, names, enums such
//! as the CRI method, the typed CRI responses) can change shape only if the JSON does not;
//! and every CRI response in them reads fully typed, nothing kept as text.
//!
//! `PODLAPSE_GOLDEN_TRACE=<file>` checks that trace too, e.g. the replay benchmark's
//! 10,000 generated pods (`PODLAPSE_BENCH_TRACE=<file> cargo test -p xtask --bin xtask --
//! --ignored writes_the_benchmark_trace` writes it). That file is written by the
//! generator, not by podlapse: its keys are in name order throughout (`type` last), so a
//! record of it that podlapse writes in its own order is compared with both in name order,
//! and its `response` byte for byte as written.

use std::path::{Path, PathBuf};

use serde::Deserialize;
use serde_json::value::RawValue;

use super::line::{Pods, parse_record};
use super::record::TraceRecord;

/// Every `*.jsonl` under `dir`, leaving out build output and hidden directories.
fn traces(dir: &Path, out: &mut Vec<PathBuf>) {
    for entry in std::fs::read_dir(dir).unwrap() {
        let path = entry.unwrap().path();
        let name = path.file_name().unwrap().to_string_lossy();
        if path.is_dir() {
            if name != "target" && !name.starts_with('.') {
                traces(&path, out);
            }
        } else if name.ends_with(".jsonl") {
            out.push(path);
        }
    }
}

/// A line's `response`, as written.
#[derive(Deserialize)]
struct Response<'a> {
    #[serde(borrow)]
    response: Option<&'a RawValue>,
}

/// What one trace's check came to.
#[derive(Default, Debug)]
struct Checked {
    lines: usize,
    cri: usize,
    responses: usize,
    /// Lines written back in another key order (only where that is allowed).
    reordered: usize,
}

/// Reads every line of `text` both ways, writes it back and compares; the first line that
/// differs is named by file and line. `reorder`: a line whose keys are all in name order
/// may come back in the writer's order, equal once its keys are sorted again.
fn check(path: &Path, text: &str, reorder: bool) -> Result<Checked, String> {
    let mut checked = Checked::default();
    let mut pods = Pods::default();
    for (i, raw) in text.lines().enumerate() {
        let at = format!("{}:{}", path.display(), i + 1);
        let record: TraceRecord = serde_json::from_str(raw).map_err(|e| format!("{at}: {e}"))?;
        let fast = parse_record(raw, &mut pods);
        // The reader reads the header the general way only.
        let header = matches!(record, TraceRecord::Header(_));
        if fast.as_ref() != (!header).then_some(&record) {
            return Err(format!("{at}: read otherwise the fast way: {fast:?}"));
        }
        let written = serde_json::to_string(&record).unwrap();
        // The fixtures were recorded before the footer counted what the writer could
        // not write; those counts are written last, as zeros here.
        let expected = match raw.strip_suffix('}') {
            Some(head)
                if matches!(record, TraceRecord::Footer(_))
                    && !raw.contains("\"unwritten_records\"") =>
            {
                format!("{head},\"unwritten_records\":0,\"dropped_records\":0}}")
            }
            _ => raw.to_string(),
        };
        if written != expected {
            // A JSON value keeps its keys in name order.
            let sorted = |s: &str| {
                let value = serde_json::from_str::<serde_json::Value>(s).unwrap();
                serde_json::to_string(&value).unwrap()
            };
            if !reorder || sorted(&written) != sorted(&expected) {
                return Err(format!("{at}: written back as\n{written}\nnot\n{expected}"));
            }
            checked.reordered += 1;
        }
        if let TraceRecord::Cri(c) = &record {
            checked.cri += 1;
            let as_written = serde_json::from_str::<Response<'_>>(raw).unwrap().response;
            if let Some(text) = as_written {
                checked.responses += 1;
                if c.response.has_unknown_fields() {
                    return Err(format!(
                        "{at}: a response field not typed: {:?}",
                        c.response
                    ));
                }
                let typed = serde_json::to_string(&c.response).unwrap();
                if typed != text.get() {
                    return Err(format!("{at}: response written back as {typed}"));
                }
            }
        }
        checked.lines += 1;
    }
    Ok(checked)
}

#[test]
fn every_trace_in_the_tree_writes_back_byte_for_byte() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("..");
    let mut paths = Vec::new();
    traces(&root, &mut paths);
    paths.sort();
    let mut total = Checked::default();
    for path in &paths {
        let text = std::fs::read_to_string(path).unwrap();
        let c = check(path, &text, false).unwrap_or_else(|e| panic!("{e}"));
        total.lines += c.lines;
        total.cri += c.cri;
        total.responses += c.responses;
    }
    // traces/ and the trace reader's fuzz seeds.
    assert!(paths.len() >= 12, "{paths:?}");
    assert!(
        total.lines > 3000 && total.responses > 500,
        "{} files: {total:?}",
        paths.len()
    );
    if let Some(path) = std::env::var_os("PODLAPSE_GOLDEN_TRACE") {
        let path = PathBuf::from(path);
        let text = std::fs::read_to_string(&path).unwrap();
        let c = check(&path, &text, true).unwrap_or_else(|e| panic!("{e}"));
        eprintln!("{}: {c:?}", path.display());
        assert!(c.responses > 0, "{}: no response in it", path.display());
    }
}

#[test]
fn a_line_that_comes_back_otherwise_is_named() {
    let line = r#"{"type":"cri","method":"Version","attempt":0,"start_ns":1,"end_ns":2,"code":"OK","response":{"b":"1","a":"2"}}"#;
    let err = check(Path::new("t.jsonl"), line, false).unwrap_err();
    assert!(err.starts_with("t.jsonl:1: written back as"), "{err}");
    let sorted = r#"{"attempt":0,"code":"OK","end_ns":2,"method":"ListContainers","response":{"count":"1"},"start_ns":1,"type":"cri"}"#;
    assert!(check(Path::new("t.jsonl"), sorted, false).is_err());
    let c = check(Path::new("t.jsonl"), sorted, true).unwrap();
    assert_eq!((c.lines, c.cri, c.responses, c.reordered), (1, 1, 1, 1));
}
