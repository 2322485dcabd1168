//! Reading a trace file for a command: a bad file is one line and exit code 2; an
//! incomplete one (its writer was killed) is said once and read up to its last complete
//! record. An observed trace keeps its header among its records: the timeline needs to
//! know the trace was observed (it then names pods by their CNI arguments too).

use std::path::{Path, PathBuf};
use std::process::ExitCode;

use crate::trace::{Recording, Trace, TraceRecord, join_recordings, read_trace};

pub fn read(path: &Path) -> Result<Trace, ExitCode> {
    let mut recordings = read_recordings(std::slice::from_ref(&path.to_path_buf()))?;
    Ok(recordings.remove(0).trace)
}

/// The recordings `paths` hold: the files of one rotated trace are joined into one (in
/// their order in the rotation, whatever order they were given in), every other file is
/// one of its own.
pub fn read_recordings(paths: &[PathBuf]) -> Result<Vec<Recording>, ExitCode> {
    let bad = |e: &dyn std::fmt::Display| {
        eprintln!("podlapse: {e}");
        ExitCode::from(super::EXIT_BAD_INPUT)
    };
    let mut traces = Vec::with_capacity(paths.len());
    for path in paths {
        traces.push(read_trace(path).map_err(|e| bad(&e))?);
    }
    let mut recordings = join_recordings(traces).map_err(|e| bad(&e))?;
    for r in &mut recordings {
        for note in &r.notes {
            eprintln!("podlapse: {note}");
        }
        if r.files.len() == 1
            && let Some(note) = earlier_files_note(&r.trace)
        {
            eprintln!("podlapse: {note}");
        }
        if let Some(note) = r.trace.incomplete_note() {
            eprintln!("podlapse: {note}");
        }
        if r.trace.header.observed.is_some() {
            let header = TraceRecord::Header(r.trace.header.clone());
            r.trace.records.insert(0, header);
        }
    }
    Ok(recordings)
}

/// One file of a rotation given alone, with the files before it beside it: what it
/// leaves out.
fn earlier_files_note(trace: &Trace) -> Option<String> {
    let index = trace.header.part.as_ref()?.index;
    if index == 0 {
        return None;
    }
    let older = crate::trace::part_path(&trace.path, 1);
    older.exists().then(|| {
        format!(
            "{} is file {index} of a rotated recording; the files before it ({}, ...) are beside it: give them too to read pods whose records started there",
            trace.path.display(),
            older.display()
        )
    })
}

/// One recording from `paths`, for the commands that read one.
pub fn read_one(paths: &[PathBuf]) -> Result<Trace, ExitCode> {
    let mut recordings = read_recordings(paths)?;
    if recordings.len() > 1 {
        eprintln!(
            "podlapse: {} are {} recordings; this reads one (the files of one rotated trace count as one): give one, or use podlapse report",
            paths
                .iter()
                .map(|p| p.display().to_string())
                .collect::<Vec<_>>()
                .join(", "),
            recordings.len()
        );
        return Err(ExitCode::from(super::EXIT_BAD_INPUT));
    }
    Ok(recordings.remove(0).trace)
}
