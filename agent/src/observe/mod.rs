//! `podlapse observe`: time and diagnose the pods another CRI client (a kubelet) runs,
//! changing nothing. Its inputs are the probes, the runtime's read-only CRI calls (its
//! event stream where subscribing is safe, lists otherwise) and, where the runtime
//! exports them, its spans; its output is a trace in the format `run` writes, marked as
//! observed, which `timeline`, `report`, `diagnose` and `export` read unchanged.
//!
//! [`watch`] is the pure part: from statuses to the records of what changed.
//! [`observer`] is the loop around it, and [`runtime_view`] the only way it reaches the
//! runtime: a view with the reading calls and nothing else. [`observed_pods`] folds what
//! it saw into the pods its API serves; [`runtime_spans`] ties the runtime's spans to
//! those pods; [`node_network`] looks at the node's pod network (the runtime's
//! NetworkReady, its CNI configuration, host-local's pool) and records its changes;
//! [`export`] sends what was received, and each observed startup inside the kubelet's
//! traces, over OTLP. [`session`] runs it all in phases, as `podlapse observe` does.

pub mod export;
pub mod node_network;
pub mod observed_pods;
pub mod observer;
pub mod runtime_spans;
pub mod runtime_view;
pub mod session;
pub mod watch;

#[cfg(test)]
mod tests;

pub use observed_pods::ObservedPods;
pub use observer::{EventsMode, ObserveConfig, ObserveSummary, observe, on_event, use_stream};
pub use runtime_spans::ObservedSpans;
pub use runtime_view::RuntimeView;
pub use watch::Watcher;
