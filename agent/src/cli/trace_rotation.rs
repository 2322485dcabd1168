//! `--trace-max-bytes` and `--trace-keep`, shared by `run` and `observe`.

use crate::trace::{Rotation, RotationError};

#[derive(Debug, Clone, clap::Args)]
pub struct TraceRotationArgs {
    /// Rotate the trace once a file holds this much (bytes, or a size: 64MiB, 1GiB; at
    /// least 64KiB). The file being written is always the --trace path; the ones before
    /// it are PATH.1 (the newest) up to PATH.N. Each file is a whole trace every command
    /// reads; the files of one recording given together read as one.
    #[arg(long, value_name = "SIZE", requires = "trace")]
    pub trace_max_bytes: Option<String>,
    /// Files a rotating trace keeps, the one being written among them (default 5); the
    /// oldest beyond it is removed.
    #[arg(long, value_name = "N", requires = "trace_max_bytes")]
    pub trace_keep: Option<u32>,
}

impl TraceRotationArgs {
    pub fn rotation(&self) -> Result<Option<Rotation>, RotationError> {
        Rotation::from_flags(self.trace_max_bytes.as_deref(), self.trace_keep)
    }
}
