//! Container starts and exits the kernel shows before the runtime does: a container's
//! first exec (from the probes) and its process's exit (from the probes, or from the
//! pidfd the PLEG watches). Each is shown in the pod's status at once; the sync that
//! follows the runtime's own account publishes that. Every source reaches the status
//! the same way, through this one handle.

use std::sync::Arc;

use crate::kubelet::observed_exit::with_observed_exit;
use crate::kubelet::observed_start::with_observed_start;

use super::StatusStore;
use super::start_watch::{ObservedExit, ObservedStart};

/// Where the kernel's view of starts and exits goes: the status store.
#[derive(Clone)]
pub struct KernelSeen {
    store: Arc<StatusStore>,
}

impl KernelSeen {
    pub fn new(store: Arc<StatusStore>) -> KernelSeen {
        KernelSeen { store }
    }

    /// The kernel ran the container's program.
    pub fn start(&self, s: &ObservedStart) {
        self.store.update_status(&s.pod_uid, |current| {
            with_observed_start(current, &s.container_name, &s.container_id, s.attempt)
        });
    }

    /// The container's process exited with `exit_code` (kubelet's: the status, or 128
    /// plus the signal).
    pub fn exit(&self, pod_uid: &str, container_id: &str, exit_code: i32) {
        self.store.update_status(pod_uid, |current| {
            with_observed_exit(current, container_id, exit_code)
        });
    }

    /// [`KernelSeen::exit`] of an exit the probes reported.
    pub fn observed_exit(&self, e: &ObservedExit) {
        self.exit(&e.pod_uid, &e.container_id, e.exit_code);
    }
}
