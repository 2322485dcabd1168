//! The arguments of commands that read either a trace file or the running agent or
//! observer (`timeline`, `diagnose`).

use std::path::PathBuf;

use super::output::Output;
use crate::syncloop::api;

#[derive(Debug, Clone, clap::Args)]
pub struct TraceOrAgentArgs {
    /// A trace written by `podlapse run --trace` or `podlapse observe`, or the files of
    /// one rotated trace (TRACE TRACE.1 ...), read as one. Without it, the running agent
    /// or observer, as with --live.
    #[arg(value_name = "TRACE", num_args = 0..)]
    pub traces: Vec<PathBuf>,
    /// Ask the running agent or observer (at --api-socket) about the pods as they are
    /// now, a pod still being retried included.
    #[arg(long, conflicts_with = "traces")]
    pub live: bool,
    /// Only this pod: a name, namespace/name, or UID.
    #[arg(long, value_name = "NAME")]
    pub pod: Option<String>,
    /// The agent's API socket (when no trace is given).
    #[arg(long = "api-socket", default_value = api::DEFAULT_API_SOCKET, value_name = "PATH")]
    pub socket: PathBuf,
    /// Output format.
    #[arg(short = 'o', long = "output", value_enum, default_value_t = Output::Table)]
    pub output: Output,
}
