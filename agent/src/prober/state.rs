//! One probe worker's state machine: kubelet's `prober/worker.go` without the goroutine,
//! the ticker or the clock. Time comes in as monotonic nanoseconds.
//!
//! Call order for the shell driving one worker:
//! 1. `ProbeWorker::new` when a container starts (a restarted container gets a new worker,
//!    which is kubelet's reset on a new container ID); publish `result()` as the initial
//!    value.
//! 2. Wait until `next_due()`; `None` means the worker is done for this container.
//! 3. If [`probe_allowed`] says the startup gate is closed, call `skip(now)`; otherwise run
//!    the action and call `observe(now, raw)`, publishing what it returns.
//! 4. When a readiness worker's container becomes started, `expedite(now)` probes it at
//!    once (kubelet's manual trigger) instead of at the next period.

use super::spec::{ProbeKind, ProbeSpec};

const NANOS_PER_SECOND: u64 = 1_000_000_000;

pub use podlapse_core::kubelet::probe_results::ProbeResult;

/// The result a worker publishes before its first verdict: a container is not ready until
/// proven so, alive until proven dead, and of unknown startup.
pub fn initial_result(kind: ProbeKind) -> ProbeResult {
    match kind {
        ProbeKind::Readiness => ProbeResult::Failure,
        ProbeKind::Liveness => ProbeResult::Success,
        ProbeKind::Startup => ProbeResult::Unknown,
    }
}

/// Whether a container counts as started: it has no startup probe (`None`), or its startup
/// probe has succeeded.
pub fn container_started(startup: Option<ProbeResult>) -> bool {
    matches!(startup, None | Some(ProbeResult::Success))
}

/// The startup gate: liveness and readiness do not run until the container has started,
/// and the startup probe does not run after.
pub fn probe_allowed(kind: ProbeKind, started: bool) -> bool {
    match kind {
        ProbeKind::Startup => !started,
        ProbeKind::Liveness | ProbeKind::Readiness => started,
    }
}

/// One (container, probe kind) worker.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ProbeWorker {
    kind: ProbeKind,
    spec_period_ns: u64,
    success_threshold: u32,
    failure_threshold: u32,
    /// The first instant probing is allowed: container start plus initialDelaySeconds.
    first_allowed_ns: u64,
    next_due_ns: Option<u64>,
    result: ProbeResult,
    last_raw: ProbeResult,
    run: u32,
}

impl ProbeWorker {
    /// A worker for a container that started at `container_started_at_ns`. The first probe
    /// is due once initialDelaySeconds have passed; kubelet's ticker adds up to one period
    /// of phase on top, which podlapse leaves out so probes start as early as allowed.
    pub fn new(kind: ProbeKind, spec: &ProbeSpec, container_started_at_ns: u64) -> ProbeWorker {
        let first_allowed_ns = container_started_at_ns
            .saturating_add(u64::from(spec.initial_delay_seconds) * NANOS_PER_SECOND);
        ProbeWorker {
            kind,
            spec_period_ns: u64::from(spec.period_seconds.max(1)) * NANOS_PER_SECOND,
            success_threshold: spec.success_threshold.max(1),
            failure_threshold: spec.failure_threshold.max(1),
            first_allowed_ns,
            next_due_ns: Some(first_allowed_ns),
            result: initial_result(kind),
            last_raw: ProbeResult::Unknown,
            run: 0,
        }
    }

    pub fn kind(&self) -> ProbeKind {
        self.kind
    }

    /// The published result.
    pub fn result(&self) -> ProbeResult {
        self.result
    }

    /// When the next probe is due, or `None` once the worker has nothing left to do for
    /// this container: on hold after a liveness or startup failure (the container will be
    /// restarted and get a new worker), or a startup probe that has succeeded.
    pub fn next_due(&self) -> Option<u64> {
        self.next_due_ns
    }

    /// A due probe that the startup gate kept from running: wait for the next period.
    pub fn skip(&mut self, now_ns: u64) {
        self.reschedule(now_ns);
    }

    /// Probe as soon as allowed rather than at the next period.
    pub fn expedite(&mut self, now_ns: u64) {
        if self.next_due_ns.is_some() {
            self.next_due_ns = Some(now_ns.max(self.first_allowed_ns));
        }
    }

    /// Takes a raw result from running the action at `now_ns` and applies the thresholds.
    /// Returns the new published result only when it changed. A raw `Unknown` (the prober
    /// erred) and a result before initialDelaySeconds are thrown away, as kubelet does.
    pub fn observe(&mut self, now_ns: u64, raw: ProbeResult) -> Option<ProbeResult> {
        if self.next_due_ns.is_none() || now_ns < self.first_allowed_ns {
            return None;
        }
        self.reschedule(now_ns);
        if raw == ProbeResult::Unknown {
            return None;
        }
        if raw == self.last_raw {
            self.run = self.run.saturating_add(1);
        } else {
            self.last_raw = raw;
            self.run = 1;
        }
        let threshold = match raw {
            ProbeResult::Success => self.success_threshold,
            _ => self.failure_threshold,
        };
        if self.run < threshold {
            return None;
        }
        let changed = self.result != raw;
        self.result = raw;
        let kills = matches!(self.kind, ProbeKind::Liveness | ProbeKind::Startup);
        if raw == ProbeResult::Failure && kills {
            // kubelet puts the worker on hold until a new container ID: probing a container
            // that is being stopped only adds noise (and once corrupted runtime state).
            self.next_due_ns = None;
            self.run = 0;
        } else if raw == ProbeResult::Success && self.kind == ProbeKind::Startup {
            // A started container stays started until it restarts, with a new worker.
            self.next_due_ns = None;
        }
        changed.then_some(raw)
    }

    /// Like a Go ticker that buffers one tick: the next probe is one period after the last
    /// due time, or right away if the probe overran the period.
    fn reschedule(&mut self, now_ns: u64) {
        if let Some(due) = self.next_due_ns {
            self.next_due_ns = Some(due.saturating_add(self.spec_period_ns).max(now_ns));
        }
    }
}
