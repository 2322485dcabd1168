//! Reading a trace file for a command: a bad file is one line and exit code 2; an
//! incomplete one (its writer was killed) is said once and read up to its last complete
//! record. An observed trace keeps its header among its records: the timeline needs to
//! know the trace was observed (it then names pods by their CNI arguments too).

use std::path::Path;
use std::process::ExitCode;

use crate::trace::{Trace, TraceRecord, read_trace};

pub fn read(path: &Path) -> Result<Trace, ExitCode> {
    match read_trace(path) {
        Ok(mut trace) => {
            if let Some(note) = trace.incomplete_note() {
                eprintln!("podtrace: {note}");
            }
            if trace.header.observed.is_some() {
                trace
                    .records
                    .insert(0, TraceRecord::Header(trace.header.clone()));
            }
            Ok(trace)
        }
        Err(e) => {
            eprintln!("podtrace: {e}");
            Err(ExitCode::from(super::EXIT_BAD_INPUT))
        }
    }
}
