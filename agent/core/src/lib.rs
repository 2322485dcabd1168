//! podlapse's deterministic core, a crate of its own so that purity is the compiler's
//! business: its dependencies are the Kubernetes types and serde, nothing that does IO,
//! reads a clock or spawns a task.
//!
//! - [`kubelet`]: kubelet's decisions. Time and runtime observations come in as
//!   arguments; actions go out as ordered values.
//! - [`record`]: what a trace records (the runtime's spans, ...), shared by the agent
//!   that writes them and everything that reads them.

pub mod kubelet;
pub mod record;
