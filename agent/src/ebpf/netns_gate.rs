//! Attaching the network-namespace programs only while they are needed.
//!
//! unshare and setns are syscall tracepoints, and while any syscall tracepoint is enabled
//! the kernel sends every syscall of every task on the node down its slow path, whatever
//! the programs do with it: about 45 ns a syscall here, 2% of an exec-heavy workload that
//! makes 150 syscalls per exec. The agent creates and enters pod namespaces only inside
//! a few CRI calls, so it holds the gate around those calls: the programs are attached
//! before the call goes out and detached once no such call has run for
//! [`NETNS_LINGER`]. Where the kernel-function hooks feed the namespace events instead
//! ([`super::NetnsHooks`]), the gate holds no programs: they cost nothing while unused.
//! The same window reports the execs and exits of the node's own
//! processes, as context around pod work; outside it the probes drop them in the kernel.

use std::sync::{Arc, Mutex, MutexGuard, Weak};
use std::time::{Duration, Instant};

use aya::Ebpf;
use aya::programs::TracePoint;
use aya::programs::trace_point::TracePointLink;

use super::loader::{ProgramSpec, set_node_processes};

/// How long the programs stay attached after the last call that needed them: pods
/// created one after another keep them attached rather than attaching for every call.
pub const NETNS_LINGER: Duration = Duration::from_secs(1);
/// How often an idle gate is checked.
const CHECK_EVERY: Duration = Duration::from_millis(250);

/// Shared by the probes and whoever makes the calls; cloning is cheap.
#[derive(Clone)]
pub struct NetnsGate {
    state: Arc<Mutex<GateState>>,
}

struct GateState {
    ebpf: Arc<Mutex<Ebpf>>,
    programs: Vec<&'static ProgramSpec>,
    /// Whether the node's own processes are reported while open (off: never).
    node_processes: bool,
    holders: usize,
    /// Held, or idle for less than the linger: the node's own processes are reported.
    open: bool,
    links: Vec<TracePointLink>,
    idle_since: Option<Instant>,
    /// Times the programs were attached, and the last failure to attach.
    attaches: u64,
    failure: Option<String>,
}

/// Held while a call that may create or enter a namespace runs; dropping it releases the
/// gate.
#[must_use = "the gate is released when the hold is dropped"]
pub struct NetnsHold {
    gate: NetnsGate,
}

impl Drop for NetnsHold {
    fn drop(&mut self) {
        let mut st = self.gate.lock();
        st.holders = st.holders.saturating_sub(1);
        if st.holders == 0 {
            st.idle_since = Some(Instant::now());
        }
    }
}

impl NetnsGate {
    /// A gate over `programs` of `ebpf`, loaded but not attached. Starts the task that
    /// detaches them when idle; it ends with the last clone of the gate. Must run inside
    /// a tokio runtime.
    pub(super) fn new(
        ebpf: Arc<Mutex<Ebpf>>,
        programs: Vec<&'static ProgramSpec>,
        node_processes: bool,
    ) -> NetnsGate {
        let gate = NetnsGate {
            state: Arc::new(Mutex::new(GateState {
                ebpf,
                programs,
                node_processes,
                holders: 0,
                open: false,
                links: Vec::new(),
                idle_since: None,
                attaches: 0,
                failure: None,
            })),
        };
        tokio::spawn(detach_when_idle(Arc::downgrade(&gate.state)));
        gate
    }

    fn lock(&self) -> MutexGuard<'_, GateState> {
        self.state.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Attaches the programs if they are not, and keeps them attached until the hold is
    /// dropped (and [`NETNS_LINGER`] after). An attach that fails is reported once per
    /// distinct error; the call goes on without namespace events.
    pub fn hold(&self) -> NetnsHold {
        let mut st = self.lock();
        st.holders += 1;
        st.idle_since = None;
        if !st.open {
            st.open = true;
            st.set_node_processes(true);
        }
        if st.links.is_empty() && !st.programs.is_empty() {
            let began = Instant::now();
            match st.attach() {
                Ok(links) => {
                    st.links = links;
                    st.attaches += 1;
                    tracing::debug!(took = ?began.elapsed(), "network namespace probes attached");
                }
                Err(e) => {
                    if st.failure.as_deref() != Some(e.as_str()) {
                        tracing::warn!("network namespace probes not attached: {e}");
                    }
                    st.failure = Some(e);
                }
            }
        }
        NetnsHold { gate: self.clone() }
    }

    /// True while the programs are attached; always when the gate holds none (the
    /// namespace events come from kernel-function hooks, attached from the start).
    pub fn is_attached(&self) -> bool {
        let st = self.lock();
        st.programs.is_empty() || !st.links.is_empty()
    }

    /// How many times the programs were attached so far.
    pub fn attaches(&self) -> u64 {
        self.lock().attaches
    }

    /// The programs behind the gate.
    pub fn programs(&self) -> Vec<&'static str> {
        self.lock().programs.iter().map(|p| p.program).collect()
    }
}

impl GateState {
    /// Attaches every program, or none: a partial attach is undone.
    fn attach(&mut self) -> Result<Vec<TracePointLink>, String> {
        let mut ebpf = self.ebpf.lock().unwrap_or_else(|e| e.into_inner());
        let mut links = Vec::with_capacity(self.programs.len());
        for p in &self.programs {
            let tp: &mut TracePoint = ebpf
                .program_mut(p.program)
                .ok_or_else(|| format!("{} is not in the probes object", p.program))?
                .try_into()
                .map_err(|e| format!("{}: {e}", p.program))?;
            let id = tp.attach(p.category, p.tracepoint).map_err(|e| {
                format!(
                    "attaching {} to {}:{}: {e}",
                    p.program, p.category, p.tracepoint
                )
            })?;
            links.push(
                tp.take_link(id)
                    .map_err(|e| format!("{}: {e}", p.program))?,
            );
        }
        Ok(links)
    }

    fn detach_if_idle(&mut self, now: Instant) {
        if self.holders == 0
            && self.open
            && self
                .idle_since
                .is_some_and(|at| now.duration_since(at) >= NETNS_LINGER)
        {
            // Dropping a link detaches its program.
            self.links.clear();
            self.open = false;
            self.set_node_processes(false);
        }
    }

    /// Reports the node's own execs and exits, or stops. A failure is logged: the probes
    /// then keep reporting what they did, which costs the node, not correctness.
    fn set_node_processes(&mut self, on: bool) {
        if !self.node_processes {
            return;
        }
        let mut ebpf = self.ebpf.lock().unwrap_or_else(|e| e.into_inner());
        if let Err(e) = set_node_processes(&mut ebpf, on) {
            tracing::warn!(
                "could not switch the node's own processes' events {}: {e}",
                if on { "on" } else { "off" }
            );
        }
    }
}

async fn detach_when_idle(state: Weak<Mutex<GateState>>) {
    let mut every = tokio::time::interval(CHECK_EVERY);
    every.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        every.tick().await;
        let Some(state) = state.upgrade() else { return };
        state
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .detach_if_idle(Instant::now());
    }
}
