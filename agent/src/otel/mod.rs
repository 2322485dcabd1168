//! Pod startups as OpenTelemetry traces, over OTLP/gRPC.
//!
//! - `spans.rs`: the span model, pure: a pod's timeline and CRI calls as spans.
//! - `ids`: trace and span IDs derived from what the trace records, and the
//!   `traceparent` each CRI call carries to the runtime (in the core, with the records).
//! - `sdk.rs`: the model as the SDK's span data, the exporter, the endpoint's checks.
//! - `queue.rs`: the bounded export queue and its sending task; drops are counted.
//! - `live.rs`: the agent exports each pod once its startup is over.
//! - `gate.rs`: which CRI calls carry a sampled trace context to the runtime.
//! - `joined.rs`: an observed pod's spans inside the kubelet's own traces.
//! - `export.rs`: spans of recorded traces (`podlapse export`).
//! - `runtime_span.rs`: a span the container runtime sent, from OTLP and back (the record
//!   itself is the core's).
//! - `receiver.rs`: the OTLP/gRPC receiver of the runtime's spans.

mod error;
mod export;
mod gate;
pub mod joined;
mod live;
mod queue;
pub mod receiver;
pub mod runtime_span;
mod sdk;
pub mod spans;

#[cfg(test)]
pub(crate) mod test_collector;
#[cfg(test)]
mod tests;

pub use error::OtelError;
pub use export::{runtime_batches, trace_spans};
pub use gate::TraceGate;
pub use joined::joined_pod_spans;
pub use live::LiveExport;
pub use podlapse_core::record::ids;
pub use queue::{ExportQueue, ExportStats};
pub use receiver::{Listen, ReceiverStats, RuntimeReceiver, parse_listen};
pub use runtime_span::RuntimeSpan;
pub use sdk::{ClockAnchor, endpoint, exporter, resource, span_data};
