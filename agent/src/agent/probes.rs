//! Starting the kernel probes, or knowing why they cannot run: a node without eBPF (no
//! permission, no BTF, no tracefs) runs without kernel events unless they are required.

use crate::ebpf::{EbpfError, EventReceiver, KernelProbes, ProbeConfig};

use super::AgentError;

/// Running probes and the events they report.
pub type Started = (KernelProbes, EventReceiver);

/// What starting the probes came to, short of an error.
pub enum Probes {
    Running(Box<Started>),
    /// The node cannot run them; the run goes on without kernel events.
    Unavailable(EbpfError),
}

/// Loads and attaches the probes. `require`: a node that cannot run them is an error,
/// not a run without kernel events.
pub fn start_probes(config: ProbeConfig, require: bool) -> Result<Probes, AgentError> {
    let started = KernelProbes::start(config);
    // Loading parsed the kernel's BTF twice (offsets, relocations): give that back.
    super::malloc::trim();
    match started {
        Ok(started) => Ok(Probes::Running(Box::new(started))),
        Err(e) if e.is_unavailable() && !require => Ok(Probes::Unavailable(e)),
        Err(e) if e.is_unavailable() => Err(AgentError::ProbesRequired(e)),
        Err(e) => Err(AgentError::Probes(e)),
    }
}

/// The line that says a run goes on without kernel events.
pub fn unavailable_note(e: &EbpfError) -> String {
    format!("kernel events unavailable: {e}; continuing without them")
}
