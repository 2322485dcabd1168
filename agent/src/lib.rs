//! podlapse: kubelet's pod-creation pipeline over CRI, timed stage by stage.
//!
//! Read ARCHITECTURE.md first. In short: `config` reads desired pods, `kubelet` (the
//! `podlapse-core` crate) holds the deterministic decisions, `kuberuntime` carries them
//! out over `cri`, and `cli` is the `podlapse` command.

pub mod agent;
pub mod allocator;
pub mod cli;
pub mod clock;
pub mod cm;
pub mod cni;
pub mod config;
pub mod credentialprovider;
pub mod cri;
pub mod diagnose;
pub mod ebpf;
pub mod event_thread;
/// kubelet's decisions, from the core crate (`agent/core`).
pub use podlapse_core::kubelet;
pub mod kuberuntime;
pub mod lifecycle;
pub mod metrics;
pub mod observe;
pub mod otel;
pub mod prober;
pub mod queues;
pub mod replay;
pub mod report;
pub mod syncloop;
pub mod timeline;
pub mod trace;

#[cfg(test)]
mod module_graph_tests;
#[cfg(test)]
mod typed_responses_tests;
