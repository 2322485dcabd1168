//! The trace format, v1: JSON Lines. A header, then records in the order they happened
//! (pod config changes, CRI calls, kernel events, pod events), then stages, then a footer.
//! `docs/trace-format.md` is the reference; `docs/trace-format.schema.json` the schema.

mod config;
#[cfg(test)]
mod golden_tests;
mod line;
mod node_network;
mod observed;
mod parts;
mod reader;
mod record;
mod rotation;
#[cfg(test)]
mod rotation_tests;
mod sources;
mod writer;

pub use config::{ObserveMode, ObservedConfig, RunConfig, TraceConfig};
pub use node_network::{
    ConfFileRecord, HolderRecord, IpamRecord, NetworkCondition, NodeNetworkRecord, RangeSetRecord,
};
pub use parts::{Recording, join_recordings};
pub use reader::{Trace, TraceError, parse_trace, read_trace};
pub use record::{
    Footer, Header, Observation, ObservedFooter, ObservedHeader, ObservedRecord, ObservedVia,
    PodEventRecord, PodOp, PodOpRecord, PodStatusRecord, PodWaitRecord, SCHEMA_VERSION, TracePart,
    TraceRecord, redact_pod,
};
pub use rotation::{MIN_MAX_BYTES, Rotation, RotationError, part_path};
pub use sources::{
    KernelSource, PodSources, RecordingEnd, RuntimeSpanSource, SourceState, SourcesRecord,
    SpanWaitEnd,
};
pub use writer::{QUEUE_RECORDS, SYNC_EVERY, TraceSink, TraceWriter, WriterStats};
