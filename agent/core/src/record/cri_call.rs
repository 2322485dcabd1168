//! One CRI call as a trace records it: the method, the pod, container and attempt it was
//! for, its times on the kernel's clock, its outcome and the response fields that matter.
//! The agent's `cri::Recording` makes them; [`CriCall::new`] and its `with_*` methods
//! build one anywhere else. A trace reads one with its method first, so the response's
//! fields read into that method's types (`cri_call_de.rs`).

use serde::Serialize;

use super::{CriMethod, CriResponse, GrpcCode};

/// One CRI call as it happened.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct CriCall {
    /// The CRI method, e.g. `RunPodSandbox`.
    pub method: CriMethod,
    /// The pod the call was for; empty for node-level calls (Version, Status, lists).
    #[serde(skip_serializing_if = "String::is_empty")]
    pub pod_uid: String,
    /// The container (by name) the call was for; empty for sandbox-level calls.
    #[serde(skip_serializing_if = "String::is_empty")]
    pub container: String,
    /// The sandbox or container attempt the call was for.
    pub attempt: u32,
    #[serde(skip_serializing_if = "String::is_empty")]
    pub sandbox_id: String,
    #[serde(skip_serializing_if = "String::is_empty")]
    pub container_id: String,
    #[serde(skip_serializing_if = "String::is_empty")]
    pub image: String,
    /// CLOCK_MONOTONIC ns at the call's start and end.
    pub start_ns: u64,
    pub end_ns: u64,
    /// How the call ended: `OK`, or the gRPC status code the runtime (or the client's
    /// deadline) ended it with.
    pub code: GrpcCode,
    #[serde(skip_serializing_if = "String::is_empty")]
    pub message: String,
    /// The response fields that matter (pod IP, image ref, container state, exit code),
    /// typed by the method.
    #[serde(skip_serializing_if = "CriResponse::is_empty")]
    pub response: CriResponse,
    /// The call went to the runtime with a sampled `traceparent`: its span is exported,
    /// and a tracing runtime's spans for it hang under that span.
    #[serde(skip_serializing_if = "std::ops::Not::not")]
    pub traced: bool,
}

impl CriCall {
    /// A call of `method` before it is made: for no pod, container, attempt, sandbox or
    /// image in particular, at 0 ns, its outcome `Unknown`, nothing in its response.
    pub fn new(method: CriMethod) -> CriCall {
        CriCall {
            method,
            pod_uid: String::new(),
            container: String::new(),
            attempt: 0,
            sandbox_id: String::new(),
            container_id: String::new(),
            image: String::new(),
            start_ns: 0,
            end_ns: 0,
            code: GrpcCode::Unknown,
            message: String::new(),
            response: CriResponse::empty(),
            traced: false,
        }
    }

    /// The call, for the pod with UID `uid`.
    pub fn with_pod_uid(mut self, uid: impl Into<String>) -> CriCall {
        self.pod_uid = uid.into();
        self
    }

    /// The call, for the container named `name`.
    pub fn with_container(mut self, name: impl Into<String>) -> CriCall {
        self.container = name.into();
        self
    }

    /// The call, for the sandbox or container attempt `attempt`.
    pub fn with_attempt(mut self, attempt: u32) -> CriCall {
        self.attempt = attempt;
        self
    }

    /// The call, naming the sandbox with runtime ID `id`.
    pub fn with_sandbox_id(mut self, id: impl Into<String>) -> CriCall {
        self.sandbox_id = id.into();
        self
    }

    /// The call, naming the container with runtime ID `id`.
    pub fn with_container_id(mut self, id: impl Into<String>) -> CriCall {
        self.container_id = id.into();
        self
    }

    /// The call, for the image `image`.
    pub fn with_image(mut self, image: impl Into<String>) -> CriCall {
        self.image = image.into();
        self
    }

    /// The call, made from `start_ns` to `end_ns`.
    pub fn with_times(mut self, start_ns: u64, end_ns: u64) -> CriCall {
        self.start_ns = start_ns;
        self.end_ns = end_ns;
        self
    }

    /// The call, ended with `code`.
    pub fn with_code(mut self, code: GrpcCode) -> CriCall {
        self.code = code;
        self
    }

    /// The call, with the runtime's (or the client's) `message` for its outcome.
    pub fn with_message(mut self, message: impl Into<String>) -> CriCall {
        self.message = message.into();
        self
    }

    /// The call, with `response` recorded.
    pub fn with_response(mut self, response: impl Into<CriResponse>) -> CriCall {
        self.response = response.into();
        self
    }

    /// The call, sent with a sampled `traceparent` or not.
    pub fn with_traced(mut self, traced: bool) -> CriCall {
        self.traced = traced;
        self
    }

    pub fn ok(&self) -> bool {
        self.code.is_ok()
    }

    /// Calls that only read state: frequent, and not stages of a pod's startup.
    pub fn is_observation(&self) -> bool {
        self.method.is_observation()
    }
}
