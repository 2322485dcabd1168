//! What the prober last published, as the core reads it: by container ID, so a restarted
//! container starts with a clean slate.

use std::collections::{BTreeMap, BTreeSet};
use std::fmt;

use serde::Serialize;

#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize)]
pub struct ProbeResults {
    /// Containers whose liveness probe failed: restart them.
    pub liveness_failed: BTreeSet<String>,
    /// Containers whose startup probe failed: restart them.
    pub startup_failed: BTreeSet<String>,
    /// Readiness by container ID, for containers that have a readiness probe. A container
    /// without an entry and without a probe is ready once running.
    pub ready: BTreeMap<String, bool>,
    /// Containers that have a readiness probe (not ready until it succeeds).
    pub has_readiness_probe: BTreeSet<String>,
    /// Containers whose startup probe has not succeeded yet (not started).
    pub not_started: BTreeSet<String>,
    /// Containers whose probes the prober runs.
    pub registered: BTreeSet<String>,
}

/// What taking one probe result changed.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Applied {
    /// The pod's probe results differ: its status is published again.
    pub changed: bool,
    /// The container's startup probe passed just now: it counts as started from here.
    pub startup_passed: bool,
}

/// Which of a container's probes; kubelet's `probeType`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize)]
pub enum ProbeKind {
    Liveness,
    Readiness,
    Startup,
}

impl ProbeKind {
    pub const ALL: [ProbeKind; 3] = [
        ProbeKind::Liveness,
        ProbeKind::Readiness,
        ProbeKind::Startup,
    ];

    /// The container field the probe comes from, for messages that point at the manifest.
    pub fn field(self) -> &'static str {
        match self {
            ProbeKind::Liveness => "livenessProbe",
            ProbeKind::Readiness => "readinessProbe",
            ProbeKind::Startup => "startupProbe",
        }
    }
}

impl fmt::Display for ProbeKind {
    /// kubelet's spelling, as in the `Unhealthy` event: "Liveness probe failed: ...".
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            ProbeKind::Liveness => "Liveness",
            ProbeKind::Readiness => "Readiness",
            ProbeKind::Startup => "Startup",
        })
    }
}

/// A probe's published result; kubelet's `results.Result`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize)]
pub enum ProbeResult {
    Success,
    Failure,
    /// Not known yet (a startup probe before its first verdict). As a raw result from an
    /// action it means the prober itself erred, and kubelet throws such a result away.
    Unknown,
}

impl fmt::Display for ProbeResult {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            ProbeResult::Success => "Success",
            ProbeResult::Failure => "Failure",
            ProbeResult::Unknown => "Unknown",
        })
    }
}

impl ProbeResults {
    /// The startup probe's result for a container that has one; `None` until the prober
    /// runs it (kubelet's "not found").
    pub fn startup(&self, container_id: &str) -> Option<ProbeResult> {
        if self.startup_failed.contains(container_id) {
            return Some(ProbeResult::Failure);
        }
        if !self.registered.contains(container_id) {
            return None;
        }
        Some(if self.not_started.contains(container_id) {
            ProbeResult::Unknown
        } else {
            ProbeResult::Success
        })
    }

    /// The liveness probe's result for a container that has one; `None` until the prober
    /// runs it.
    pub fn liveness(&self, container_id: &str) -> Option<ProbeResult> {
        if self.liveness_failed.contains(container_id) {
            return Some(ProbeResult::Failure);
        }
        self.registered
            .contains(container_id)
            .then_some(ProbeResult::Success)
    }

    /// Is the running container with this ID ready?
    pub fn is_ready(&self, container_id: &str) -> bool {
        if self.not_started.contains(container_id) {
            return false;
        }
        match self.ready.get(container_id) {
            Some(r) => *r,
            None => !self.has_readiness_probe.contains(container_id),
        }
    }

    /// Takes a probe's published result for a container, as kubelet's three results
    /// managers do: a liveness or startup failure marks the container for a restart, a
    /// startup success marks it started, readiness is kept as given.
    pub fn apply(&mut self, kind: ProbeKind, result: ProbeResult, container_id: &str) -> Applied {
        let before = self.clone();
        let id = container_id.to_string();
        let mut startup_passed = false;
        match (kind, result) {
            (ProbeKind::Liveness, ProbeResult::Failure) => {
                self.liveness_failed.insert(id);
            }
            (ProbeKind::Liveness, _) => {
                self.liveness_failed.remove(&id);
            }
            (ProbeKind::Startup, ProbeResult::Success) => {
                startup_passed = self.not_started.remove(&id);
            }
            (ProbeKind::Startup, r) => {
                if r == ProbeResult::Failure {
                    self.startup_failed.insert(id.clone());
                }
                self.not_started.insert(id);
            }
            (ProbeKind::Readiness, r) => {
                self.ready.insert(id, r == ProbeResult::Success);
            }
        }
        Applied {
            changed: *self != before,
            startup_passed,
        }
    }

    /// Forgets a container (it was removed or restarted).
    pub fn forget(&mut self, container_id: &str) {
        self.liveness_failed.remove(container_id);
        self.startup_failed.remove(container_id);
        self.ready.remove(container_id);
        self.has_readiness_probe.remove(container_id);
        self.not_started.remove(container_id);
        self.registered.remove(container_id);
    }
}

#[cfg(test)]
mod tests {
    use super::ProbeKind::{Liveness, Readiness, Startup};
    use super::ProbeResult::{Failure, Success, Unknown};
    use super::*;

    /// A container "c" registered with every probe, not started and not ready yet: what
    /// the prober's first results find.
    fn fresh() -> ProbeResults {
        let mut r = ProbeResults::default();
        r.registered.insert("c".into());
        r.has_readiness_probe.insert("c".into());
        r.not_started.insert("c".into());
        r
    }

    #[test]
    fn each_result_changes_what_kubelets_results_managers_would() {
        // (what came before, then this result) -> (changed, startup passed, and what the
        // core then reads: liveness, startup, ready).
        type Row = (
            &'static [(ProbeKind, ProbeResult)],
            (ProbeKind, ProbeResult),
            (bool, bool),
            (Option<ProbeResult>, Option<ProbeResult>, bool),
        );
        let rows: &[Row] = &[
            // Liveness: a failure asks for a restart, a later success takes it back.
            (
                &[],
                (Liveness, Failure),
                (true, false),
                (Some(Failure), Some(Unknown), false),
            ),
            (
                &[(Liveness, Failure)],
                (Liveness, Success),
                (true, false),
                (Some(Success), Some(Unknown), false),
            ),
            (
                &[],
                (Liveness, Success),
                (false, false),
                (Some(Success), Some(Unknown), false),
            ),
            (
                &[],
                (Liveness, Unknown),
                (false, false),
                (Some(Success), Some(Unknown), false),
            ),
            // Startup: success starts the container once; a failure restarts it.
            (
                &[],
                (Startup, Success),
                (true, true),
                (Some(Success), Some(Success), false),
            ),
            (
                &[(Startup, Success)],
                (Startup, Success),
                (false, false),
                (Some(Success), Some(Success), false),
            ),
            (
                &[],
                (Startup, Failure),
                (true, false),
                (Some(Success), Some(Failure), false),
            ),
            (
                &[],
                (Startup, Unknown),
                (false, false),
                (Some(Success), Some(Unknown), false),
            ),
            (
                &[(Startup, Success)],
                (Startup, Unknown),
                (true, false),
                (Some(Success), Some(Unknown), false),
            ),
            // Readiness counts only once the container has started.
            (
                &[],
                (Readiness, Success),
                (true, false),
                (Some(Success), Some(Unknown), false),
            ),
            (
                &[(Startup, Success)],
                (Readiness, Success),
                (true, false),
                (Some(Success), Some(Success), true),
            ),
            (
                &[(Startup, Success), (Readiness, Success)],
                (Readiness, Failure),
                (true, false),
                (Some(Success), Some(Success), false),
            ),
            (
                &[(Startup, Success), (Readiness, Success)],
                (Readiness, Success),
                (false, false),
                (Some(Success), Some(Success), true),
            ),
            (
                &[(Startup, Success), (Readiness, Success)],
                (Readiness, Unknown),
                (true, false),
                (Some(Success), Some(Success), false),
            ),
        ];
        for (i, (before, (kind, result), (changed, passed), (live, start, ready))) in
            rows.iter().enumerate()
        {
            let mut r = fresh();
            for (k, v) in before.iter() {
                r.apply(*k, *v, "c");
            }
            let applied = r.apply(*kind, *result, "c");
            assert_eq!(
                (applied.changed, applied.startup_passed),
                (*changed, *passed),
                "row {i}: {kind} {result} after {before:?}"
            );
            assert_eq!(
                (r.liveness("c"), r.startup("c"), r.is_ready("c")),
                (*live, *start, *ready),
                "row {i}: {kind} {result} after {before:?}"
            );
        }
    }

    #[test]
    fn a_result_for_one_container_leaves_the_others_alone() {
        let mut r = fresh();
        r.registered.insert("d".into());
        r.apply(Liveness, Failure, "c");
        r.apply(Startup, Success, "c");
        assert_eq!(r.liveness("d"), Some(Success));
        assert_eq!(r.startup("d"), Some(Success));
        assert!(!r.not_started.contains("c") && r.liveness("c") == Some(Failure));
    }
}
