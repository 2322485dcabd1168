//! What the prober last published, as the core reads it: by container ID, so a restarted
//! container starts with a clean slate.

use std::collections::{BTreeMap, BTreeSet};

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

/// A probe's last result for one container, as kubelet's results managers hold it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
pub enum ProbeState {
    Success,
    Failure,
    /// Registered with the prober, no verdict yet.
    Unknown,
}

impl ProbeResults {
    /// The startup probe's result for a container that has one; `None` until the prober
    /// runs it (kubelet's "not found").
    pub fn startup(&self, container_id: &str) -> Option<ProbeState> {
        if self.startup_failed.contains(container_id) {
            return Some(ProbeState::Failure);
        }
        if !self.registered.contains(container_id) {
            return None;
        }
        Some(if self.not_started.contains(container_id) {
            ProbeState::Unknown
        } else {
            ProbeState::Success
        })
    }

    /// The liveness probe's result for a container that has one; `None` until the prober
    /// runs it.
    pub fn liveness(&self, container_id: &str) -> Option<ProbeState> {
        if self.liveness_failed.contains(container_id) {
            return Some(ProbeState::Failure);
        }
        self.registered
            .contains(container_id)
            .then_some(ProbeState::Success)
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
