//! Container lifecycle hooks: kubelet's `pkg/kubelet/lifecycle` handler runner for
//! postStart and preStop. The pipeline decides when a hook runs; this runs it.

pub mod handlers;

pub use handlers::{HandlerError, run_handler};

#[cfg(test)]
mod handlers_tests;
