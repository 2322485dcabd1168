//! Integration tests that start and stop a lab of their own: `cargo xtask test` runs each
//! module on its own while the shared lab is down (`xtask/src/integration.rs`).

/// A lab of its own per network fault.
mod diagnose_network;
/// The lab's own lifecycle: teardown residue, a busy port, half-up, a killed containerd.
mod lab_lifecycle;
/// A lab of its own with a CNI plugin that fails.
mod timeline_cni_failure;
