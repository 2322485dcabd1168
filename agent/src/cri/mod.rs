//! The CRI seam. Everything podlapse asks of a container runtime goes through
//! [`RuntimeService`] and [`ImageService`], mirroring kubelet's `internalapi` interfaces, so
//! the tonic client, a recording wrapper, the replay runtime and the in-memory fake for
//! unit tests ([`fake::FakeRuntime`]) are interchangeable.

mod client;
mod endpoint;
mod error;
pub mod fake;
mod node_shape;
pub mod recording;
pub mod service;
pub mod trace_context;

#[cfg(test)]
mod recording_response_tests;
#[cfg(test)]
mod recording_trace_tests;

pub use client::{CriClient, Timeouts};
pub use endpoint::{DEFAULT_SOCKET, Endpoint, EndpointSource, lab_dir};
pub use error::CriError;
pub use node_shape::{CNI_CONF_SOURCE, CniSource, DriverSource, NodeShape, NodeShapeError};
pub use recording::{
    CallHold, CallSink, CriCall, CriMethod, CriResponse, GrpcCode, Recording, grpc_code, tonic_code,
};
pub use service::{ImageService, RuntimeService};

/// The CRI v1 messages, re-exported so callers name one path.
pub use k8s_cri::v1 as api;
