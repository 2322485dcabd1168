//! Several trace files read as the recordings they hold: the files of one rotation
//! (the same `part.rotation` in their headers) are joined in `part.index` order into one
//! trace, so a pod whose records span two files is whole; every other file is a
//! recording of its own.

use std::collections::BTreeMap;
use std::path::PathBuf;

use super::reader::{Trace, TraceError};
use super::record::TraceRecord;

/// One recording: a trace file, or the files of one rotation joined.
pub struct Recording {
    pub trace: Trace,
    /// The files it was read from, oldest first.
    pub files: Vec<PathBuf>,
    /// What the reader should know: files of the rotation missing between those given.
    pub notes: Vec<String>,
}

/// The recordings `traces` hold, in the order their first file was given.
pub fn join_recordings(traces: Vec<Trace>) -> Result<Vec<Recording>, TraceError> {
    // Rotation ID to the recording's place in `out`.
    let mut rotations: BTreeMap<String, usize> = BTreeMap::new();
    let mut groups: Vec<Vec<Trace>> = Vec::new();
    for trace in traces {
        match trace.header.part.as_ref().map(|p| p.rotation.clone()) {
            None => groups.push(vec![trace]),
            Some(id) => match rotations.get(&id) {
                Some(&i) => groups[i].push(trace),
                None => {
                    rotations.insert(id, groups.len());
                    groups.push(vec![trace]);
                }
            },
        }
    }
    groups.into_iter().map(join).collect()
}

fn join(mut parts: Vec<Trace>) -> Result<Recording, TraceError> {
    if parts.len() == 1 {
        let trace = parts.remove(0);
        return Ok(Recording {
            files: vec![trace.path.clone()],
            trace,
            notes: Vec::new(),
        });
    }
    parts.sort_by_key(|t| t.header.part.as_ref().map_or(0, |p| p.index));
    for pair in parts.windows(2) {
        let (a, b) = (&pair[0], &pair[1]);
        if a.header.part == b.header.part {
            return Err(TraceError::SamePart {
                path: b.path.clone(),
                other: a.path.clone(),
                index: a.header.part.as_ref().map_or(0, |p| p.index),
            });
        }
    }
    let index = |t: &Trace| t.header.part.as_ref().map_or(0, |p| p.index);
    let mut notes = Vec::new();
    for pair in parts.windows(2) {
        let (a, b) = (index(&pair[0]), index(&pair[1]));
        if b > a + 1 {
            notes.push(format!(
                "{} and {} are files {a} and {b} of one recording; {} between them {} not given: pods with records there are partial",
                pair[0].path.display(),
                pair[1].path.display(),
                b - a - 1,
                if b - a - 1 == 1 { "was" } else { "were" },
            ));
        }
    }
    for t in &parts[..parts.len() - 1] {
        if !t.footer.as_ref().is_some_and(|f| f.continued) {
            notes.push(format!(
                "{}: file {} of its recording ends without going on (cut short); the next file picks up after it",
                t.path.display(),
                index(t),
            ));
        }
    }
    let files: Vec<PathBuf> = parts.iter().map(|t| t.path.clone()).collect();
    let mut iter = parts.into_iter();
    let mut joined = iter.next().expect("at least two parts");
    for next in iter {
        // Each file starts with the recording's state as it stood (its sources, the
        // node's network): kept, as the same record again changes nothing.
        joined.skipped += next.skipped;
        joined.lines += next.lines;
        joined.torn_line = next.torn_line;
        joined.footer = next.footer;
        joined.records.extend(
            next.records
                .into_iter()
                .filter(|r| !matches!(r, TraceRecord::Header(_) | TraceRecord::Footer(_))),
        );
    }
    // The last file's footer ends the recording unless it goes on in a file not given.
    if joined.footer.as_ref().is_some_and(|f| f.continued) {
        notes.push(format!(
            "{}: the recording goes on in a later file not given",
            files_last(&files)
        ));
    }
    Ok(Recording {
        trace: joined,
        files,
        notes,
    })
}

fn files_last(files: &[PathBuf]) -> String {
    files
        .last()
        .map(|p| p.display().to_string())
        .unwrap_or_default()
}
