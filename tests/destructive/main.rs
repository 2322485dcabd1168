//! Kills the shared lab's containerd and restarts it: a binary of its own, run last, so no
//! other test runs while the runtime is gone (`xtask/src/integration.rs`).

mod fault_containerd;
