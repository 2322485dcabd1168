//! One CRI call as a trace records it: the method, the pod, container and attempt it was
//! for, its times on the kernel's clock, its outcome and the response fields that matter.
//! The agent's `cri::Recording` makes them.

use serde::{Deserialize, Serialize};

use super::{CriMethod, GrpcCode};

/// A call's response fields by name, in name order (as a map in JSON). A sorted list:
/// a call has one to three, and a tree would allocate a node of eleven slots for each,
/// which over a long trace's calls is most of the memory reading it takes.
pub type ResponseFields = litemap::LiteMap<String, String>;

/// One CRI call as it happened.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct CriCall {
    /// The CRI method, e.g. `RunPodSandbox`.
    pub method: CriMethod,
    /// The pod the call was for; empty for node-level calls (Version, Status, lists).
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub pod_uid: String,
    /// The container (by name) the call was for; empty for sandbox-level calls.
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub container: String,
    /// The sandbox or container attempt the call was for.
    #[serde(default)]
    pub attempt: u32,
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub sandbox_id: String,
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub container_id: String,
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub image: String,
    /// CLOCK_MONOTONIC ns at the call's start and end.
    pub start_ns: u64,
    pub end_ns: u64,
    /// How the call ended: `OK`, or the gRPC status code the runtime (or the client's
    /// deadline) ended it with.
    pub code: GrpcCode,
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub message: String,
    /// The response fields that matter (pod IP, image ref, container state, exit code).
    #[serde(default, skip_serializing_if = "ResponseFields::is_empty")]
    pub response: ResponseFields,
    /// The call went to the runtime with a sampled `traceparent`: its span is exported,
    /// and a tracing runtime's spans for it hang under that span.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub traced: bool,
}

impl CriCall {
    pub fn ok(&self) -> bool {
        self.code.is_ok()
    }

    /// Calls that only read state: frequent, and not stages of a pod's startup.
    pub fn is_observation(&self) -> bool {
        self.method.is_observation()
    }
}
