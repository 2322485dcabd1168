//! The deterministic core: kubelet's decisions with no IO, no clock and no randomness of
//! their own. Time and runtime observations come in as arguments; actions go out as
//! ordered values. The async shell in `kuberuntime` carries the actions out.

pub mod admission;
pub mod backoff;
pub mod container_hash;
pub mod pod_actions;
pub mod pod_workers;
pub mod probe_results;
pub mod qos;
pub mod quantity;
pub mod runtime_pod;
pub mod status;

pub use pod_actions::{PodActions, compute_pod_actions};
pub use runtime_pod::RuntimePodStatus;

#[cfg(test)]
mod pod_actions_tests;
