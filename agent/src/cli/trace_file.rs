//! Reading a trace file for a command: a bad file is one line and exit code 2; an
//! incomplete one (its writer was killed) is said once and read up to its last complete
//! record.

use std::path::Path;
use std::process::ExitCode;

use crate::trace::{Trace, read_trace};

pub fn read(path: &Path) -> Result<Trace, ExitCode> {
    match read_trace(path) {
        Ok(trace) => {
            if let Some(note) = trace.incomplete_note() {
                eprintln!("podtrace: {note}");
            }
            Ok(trace)
        }
        Err(e) => {
            eprintln!("podtrace: {e}");
            Err(ExitCode::from(super::EXIT_BAD_INPUT))
        }
    }
}
