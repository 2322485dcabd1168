//! Reading a trace back, strictly: a corrupt line is an error naming the file and line; a
//! newer schema is refused naming both versions; fields and record types this version
//! does not know are skipped (the compatibility policy in docs/trace-format.md).
//!
//! A trace whose writer was killed (SIGKILL, OOM, a node crash) has no footer and may end
//! in a torn line: it is read as incomplete, up to its last complete record, and the torn
//! line (the last one, without its newline) is left out.

use std::path::{Path, PathBuf};

use super::line::{Pods, parse_record};
use super::record::{Footer, Header, KNOWN_TYPES, SCHEMA_VERSION, TraceRecord};
use crate::cri::CriCall;

/// A trace read from a file.
#[derive(Debug, Clone)]
pub struct Trace {
    pub path: PathBuf,
    pub header: Header,
    /// Every record between the header and the footer, in file order.
    pub records: Vec<TraceRecord>,
    /// None when the trace is incomplete: the recording was cut short.
    pub footer: Option<Footer>,
    /// Records of types this version does not know, skipped.
    pub skipped: usize,
    /// The line number of a torn last line, left out.
    pub torn_line: Option<usize>,
    /// The number of the last line read.
    pub lines: usize,
}

impl Trace {
    pub fn is_complete(&self) -> bool {
        self.footer.is_some()
    }

    /// What a reader says once about an incomplete trace.
    pub fn incomplete_note(&self) -> Option<String> {
        if self.is_complete() {
            return None;
        }
        let torn = match self.torn_line {
            Some(line) => format!(", and its torn last line {line} is left out"),
            None => String::new(),
        };
        Some(format!(
            "{}: incomplete: the trace ends without its footer after line {} (the recording was cut short); reading its {} complete records{torn}",
            self.path.display(),
            self.lines,
            self.records.len()
        ))
    }

    /// The trace's CRI calls in recorded order. A replay names the call that answered
    /// each of its own by its index here.
    pub fn cri_calls(&self) -> Vec<&CriCall> {
        self.records
            .iter()
            .filter_map(|r| match r {
                TraceRecord::Cri(c) => Some(c),
                _ => None,
            })
            .collect()
    }

    /// When the recording ended: the footer's time, else the last record's.
    pub fn ended_ns(&self) -> u64 {
        match &self.footer {
            Some(f) => f.ended_ns,
            None => self
                .records
                .iter()
                .filter_map(TraceRecord::at_ns)
                .max()
                .unwrap_or(self.header.started_ns),
        }
    }
}

#[derive(Debug, thiserror::Error)]
pub enum TraceError {
    /// The file could not be read.
    #[error("{}: cannot read: {source}", path.display())]
    Io {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    /// A line is not a valid record.
    #[error("{}:{line}: corrupt record: {reason}", path.display())]
    Corrupt {
        path: PathBuf,
        line: usize,
        reason: String,
    },
    /// The file was written by a newer podlapse.
    #[error(
        "{}: trace schema version {found} is newer than this podlapse reads (up to {supported}); use a newer podlapse",
        path.display()
    )]
    NewerSchema {
        path: PathBuf,
        found: u64,
        supported: u32,
    },
    /// Two files given are the same file of one rotation.
    #[error("{}: the same file of its recording (part {index}) as {}", path.display(), other.display())]
    SamePart {
        path: PathBuf,
        other: PathBuf,
        index: u64,
    },
    /// The first line is not a header.
    #[error("{}:1: not a podlapse trace (the first record must be the header)", path.display())]
    NoHeader { path: PathBuf },
}

pub fn read_trace(path: &Path) -> Result<Trace, TraceError> {
    let text = std::fs::read_to_string(path).map_err(|source| TraceError::Io {
        path: path.to_path_buf(),
        source,
    })?;
    parse_trace(path, &text)
}

/// Reads a trace from `text`, the contents of the file `path` names (for messages).
pub fn parse_trace(path: &Path, text: &str) -> Result<Trace, TraceError> {
    let corrupt = |line: usize, reason: String| TraceError::Corrupt {
        path: path.to_path_buf(),
        line,
        reason,
    };
    let mut header = None;
    let mut footer = None;
    let mut skipped = 0;
    let mut last_line = 0;
    let mut torn_line = None;
    let ends_in_newline = text.ends_with('\n');
    let lines: Vec<&str> = text.lines().collect();
    let count = lines.len();
    // Most records read straight into their type, on every CPU at once, one slot per
    // line; the header, unknown types and anything that does not read so are read
    // through a JSON value below, in order, into their slots.
    let mut slots = parse_records(&lines);
    for (i, raw) in lines.iter().copied().enumerate() {
        let line = i + 1;
        last_line = line;
        if raw.trim().is_empty() {
            continue;
        }
        if footer.is_some() {
            return Err(corrupt(line, "a record after the footer".into()));
        }
        if line > 1 && slots[i].is_some() {
            if let Some(TraceRecord::Footer(_)) = &slots[i]
                && let Some(TraceRecord::Footer(f)) = slots[i].take()
            {
                footer = Some(f);
            }
            continue;
        }
        // The last line without its newline is a write cut short, when it does not parse.
        let torn = line == count && !ends_in_newline && line > 1;
        let value: serde_json::Value = match serde_json::from_str(raw) {
            Ok(v) => v,
            Err(_) if torn => {
                torn_line = Some(line);
                last_line = line - 1;
                break;
            }
            Err(e) => return Err(corrupt(line, e.to_string())),
        };
        let kind = value
            .get("type")
            .and_then(|t| t.as_str())
            .ok_or_else(|| corrupt(line, "no \"type\" field".into()))?
            .to_string();
        if line == 1 {
            if kind != "header" {
                return Err(TraceError::NoHeader {
                    path: path.to_path_buf(),
                });
            }
            let found = value
                .get("schema_version")
                .and_then(|v| v.as_u64())
                .unwrap_or(0);
            if found > u64::from(SCHEMA_VERSION) {
                return Err(TraceError::NewerSchema {
                    path: path.to_path_buf(),
                    found,
                    supported: SCHEMA_VERSION,
                });
            }
        }
        if !KNOWN_TYPES.contains(&kind.as_str()) {
            skipped += 1;
            continue;
        }
        let record: TraceRecord = serde_json::from_value(value)
            .map_err(|e| corrupt(line, format!("{kind} record: {e}")))?;
        match record {
            TraceRecord::Header(h) if header.is_none() => header = Some(h),
            TraceRecord::Header(_) => return Err(corrupt(line, "a second header".into())),
            TraceRecord::Footer(f) => footer = Some(f),
            other => slots[i] = Some(other),
        }
    }
    let records: Vec<TraceRecord> = slots.into_iter().flatten().collect();
    let header = header.ok_or_else(|| TraceError::NoHeader {
        path: path.to_path_buf(),
    })?;
    Ok(Trace {
        path: path.to_path_buf(),
        header,
        records,
        footer,
        skipped,
        torn_line,
        lines: last_line,
    })
}

/// Below this many lines a trace is read on one thread: a thread costs more than it saves.
const PARALLEL_LINES: usize = 4096;

/// Each line read straight into its record where it can be ([`parse_record`]; never
/// the first, the header), in line order. A large trace is cut into one run of lines per
/// CPU, read at once, each run straight into its own part of the one list of slots: no
/// part is copied after, which on a large trace is hundreds of megabytes not touched.
/// Within a run, a pod written again unchanged is read once and shared ([`Pods`]).
fn parse_records(lines: &[&str]) -> Vec<Option<TraceRecord>> {
    let mut slots: Vec<Option<TraceRecord>> = Vec::with_capacity(lines.len());
    slots.resize_with(lines.len(), || None);
    let read = |from: usize, part: &[&str], out: &mut [Option<TraceRecord>]| {
        let mut pods = Pods::default();
        for (i, (raw, slot)) in part.iter().zip(out).enumerate() {
            if from + i > 0 {
                *slot = parse_record(raw, &mut pods);
            }
        }
    };
    let cpus = std::thread::available_parallelism().map_or(1, |n| n.get());
    if cpus < 2 || lines.len() < PARALLEL_LINES {
        read(0, lines, &mut slots);
        return slots;
    }
    let chunk = lines.len().div_ceil(cpus);
    std::thread::scope(|s| {
        let mut parts = lines.chunks(chunk).zip(slots.chunks_mut(chunk)).enumerate();
        // The first run on this thread, the others on threads of their own.
        let first = parts.next();
        let others: Vec<_> = parts
            .map(|(k, (part, out))| s.spawn(move || read(k * chunk, part, out)))
            .collect();
        if let Some((_, (part, out))) = first {
            read(0, part, out);
        }
        for other in others {
            // A panic in the JSON reader is a bug; re-raise it here rather than read the
            // trace differently.
            if let Err(panic) = other.join() {
                std::panic::resume_unwind(panic);
            }
        }
    });
    slots
}

#[cfg(test)]
mod tests {
    use super::*;

    const HEADER: &str = r#"{"type":"header","schema_version":1,"podlapse_version":"0.1.0","node":"n","kernel":"6.18","runtime_name":"containerd","runtime_version":"1.6","config":{},"started_wall_ns":1,"started_ns":2}"#;
    const FOOTER: &str =
        r#"{"type":"footer","ended_ns":9,"counts":{"cri":1},"lost_events":0,"ebpf":true}"#;
    const CRI: &str = r#"{"type":"cri","method":"Version","start_ns":3,"end_ns":4,"code":"OK"}"#;

    fn parse(text: &str) -> Result<Trace, TraceError> {
        parse_trace(Path::new("t.jsonl"), text)
    }

    /// `n` CRI records, each with its own start time, between a header and a footer.
    fn long_trace(n: usize) -> String {
        let mut text = format!("{HEADER}\n");
        for k in 0..n {
            text.push_str(&format!(
                "{{\"type\":\"cri\",\"method\":\"Version\",\"start_ns\":{k},\"end_ns\":{k},\"code\":\"OK\"}}\n"
            ));
        }
        text.push_str(FOOTER);
        text.push('\n');
        text
    }

    #[test]
    fn a_long_trace_read_on_every_cpu_keeps_its_order_and_line_numbers() {
        let n = PARALLEL_LINES * 3 + 7;
        let t = parse(&long_trace(n)).unwrap();
        assert!(t.is_complete());
        assert_eq!(t.records.len(), n);
        let starts: Vec<u64> = t
            .records
            .iter()
            .map(|r| match r {
                TraceRecord::Cri(c) => c.start_ns,
                other => panic!("not a CRI record: {other:?}"),
            })
            .collect();
        assert!(starts.iter().enumerate().all(|(k, s)| *s == k as u64));
        // A corrupt line late in the file, in another CPU's run, is named by its number.
        let mut lines: Vec<String> = long_trace(n).lines().map(String::from).collect();
        let bad = lines.len() - 3;
        lines[bad] = "{\"type\":\"cri\",\"meth".to_string();
        let err = parse(&(lines.join("\n") + "\n")).unwrap_err();
        assert!(
            err.to_string()
                .starts_with(&format!("t.jsonl:{}: corrupt record", bad + 1)),
            "{err}"
        );
        // A record after the footer, and a torn last line, as on one CPU.
        let after = parse(&format!("{}{CRI}\n", long_trace(n))).unwrap_err();
        assert!(
            after.to_string().contains("a record after the footer"),
            "{after}"
        );
        let cut = long_trace(n);
        let torn = parse(&cut[..cut.len() - FOOTER.len() - 1 + 10]).unwrap();
        assert_eq!((torn.records.len(), torn.torn_line), (n, Some(n + 2)));
    }

    #[test]
    fn reads_a_whole_trace() {
        let t = parse(&format!("{HEADER}\n{CRI}\n{FOOTER}\n")).unwrap();
        assert_eq!(t.records.len(), 1);
        assert_eq!(t.footer.as_ref().unwrap().counts["cri"], 1);
        assert!(t.is_complete() && t.incomplete_note().is_none());
    }

    #[test]
    fn a_corrupt_line_names_file_and_line() {
        let err = parse(&format!(
            "{HEADER}\n{CRI}\n{{\"type\":\"cri\",\"meth\n{FOOTER}\n"
        ))
        .unwrap_err();
        assert!(
            err.to_string().starts_with("t.jsonl:3: corrupt record"),
            "{err}"
        );
    }

    #[test]
    fn a_trace_without_its_footer_is_read_as_incomplete() {
        let t = parse(&format!("{HEADER}\n{CRI}\n")).unwrap();
        assert!(!t.is_complete());
        assert_eq!(t.records.len(), 1);
        assert_eq!(t.torn_line, None);
        assert_eq!(t.ended_ns(), 4, "the last record's end");
        assert_eq!(
            t.incomplete_note().unwrap(),
            "t.jsonl: incomplete: the trace ends without its footer after line 2 (the recording was cut short); reading its 1 complete records"
        );
    }

    #[test]
    fn a_torn_last_line_is_left_out() {
        let t = parse(&format!("{HEADER}\n{CRI}\n{{\"type\":\"cri\",\"meth")).unwrap();
        assert_eq!(t.records.len(), 1);
        assert_eq!(t.torn_line, Some(3));
        assert!(
            t.incomplete_note()
                .unwrap()
                .ends_with("reading its 1 complete records, and its torn last line 3 is left out")
        );
    }

    #[test]
    fn a_corrupt_last_line_with_its_newline_is_corrupt_not_torn() {
        let err = parse(&format!("{HEADER}\n{CRI}\n{{\"type\":\"cri\",\"meth\n")).unwrap_err();
        assert!(
            err.to_string().starts_with("t.jsonl:3: corrupt record"),
            "{err}"
        );
    }

    #[test]
    fn a_newer_schema_names_both_versions() {
        let err =
            parse(&HEADER.replace("\"schema_version\":1", "\"schema_version\":7")).unwrap_err();
        let msg = err.to_string();
        assert!(
            msg.contains("version 7") && msg.contains("up to 1"),
            "{msg}"
        );
    }

    #[test]
    fn unknown_fields_and_record_types_are_skipped() {
        let cri = CRI.replace("\"code\":\"OK\"", "\"code\":\"OK\",\"future_field\":[1,2]");
        let t = parse(&format!(
            "{HEADER}\n{cri}\n{{\"type\":\"hologram\",\"x\":1}}\n{FOOTER}\n"
        ))
        .unwrap();
        assert_eq!((t.records.len(), t.skipped), (1, 1));
    }

    #[test]
    fn a_known_record_with_a_bad_field_is_corrupt() {
        let bad = CRI.replace("\"start_ns\":3", "\"start_ns\":\"soon\"");
        let err = parse(&format!("{HEADER}\n{bad}\n{FOOTER}\n")).unwrap_err();
        assert!(
            err.to_string()
                .starts_with("t.jsonl:2: corrupt record: cri record"),
            "{err}"
        );
    }
}
