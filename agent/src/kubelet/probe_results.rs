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

impl ProbeResults {
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
