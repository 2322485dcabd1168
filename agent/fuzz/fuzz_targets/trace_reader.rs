//! The trace reader on any bytes, then everything built from what it accepts: the
//! timeline, the diagnosis and the report. None may panic; a trace read once must read
//! the same after being written out again.
#![no_main]

use std::path::Path;

use libfuzzer_sys::fuzz_target;
use podlapse::trace::parse_trace;

fuzz_target!(|data: &[u8]| {
    let Ok(text) = std::str::from_utf8(data) else {
        return;
    };
    let path = Path::new("fuzz.jsonl");
    let Ok(trace) = parse_trace(path, text) else {
        return;
    };
    let _ = trace.incomplete_note();
    let _ = trace.ended_ns();
    let timeline = podlapse::timeline::build(&trace.records);
    let _ = serde_json::to_string(&timeline).expect("a timeline serializes");
    let _ = podlapse::diagnose::diagnose(&trace.records, None);
    // Written out record by record, the trace reads back the same.
    let mut again = String::new();
    let header = podlapse::trace::TraceRecord::Header(trace.header.clone());
    again.push_str(&serde_json::to_string(&header).expect("a header serializes"));
    again.push('\n');
    for r in &trace.records {
        again.push_str(&serde_json::to_string(r).expect("a record serializes"));
        again.push('\n');
    }
    let reread = parse_trace(path, &again).expect("a trace written out reads back");
    assert_eq!(reread.records.len(), trace.records.len());
});
