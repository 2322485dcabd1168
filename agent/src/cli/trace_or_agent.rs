//! The arguments of commands that read either a trace file or the running agent
//! (`timeline`, `diagnose`).

use std::path::PathBuf;

use super::output::Output;
use crate::syncloop::api;

#[derive(Debug, Clone, clap::Args)]
pub struct TraceOrAgentArgs {
    /// A trace written by `podtrace run --trace`. Without it, the running agent.
    #[arg(value_name = "TRACE")]
    pub trace: Option<PathBuf>,
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
