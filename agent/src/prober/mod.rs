//! kubelet's prober: liveness, readiness and startup probes. `spec` and `state` are the
//! deterministic part (validation with the API defaults, and one worker's thresholds and
//! schedule, with time as an argument); `action` and `http` run one probe; `manager` is the
//! shell that drives one task per probe and reports changed results.

pub mod action;
mod dialer;
pub(crate) mod gofmt;
pub mod grpc;
pub mod http;
pub mod manager;
pub mod spec;
pub mod state;
mod tls;

#[cfg(test)]
pub(crate) mod http_tests;
#[cfg(test)]
mod spec_tests;
#[cfg(test)]
mod state_tests;

pub use action::{ProbeOutcome, run_probe};
pub use manager::{ProbeManager, ProbeUpdate, monotonic_from_wall_ns, now_ns};
pub use spec::{ProbeAction, ProbeError, ProbeKind, ProbeSpec};
pub use state::{ProbeResult, ProbeWorker, container_started, probe_allowed};
