//! A span the container runtime exported (containerd's own, under a CRI call's span), as
//! a trace keeps it: its IDs, name, kind, times on the trace's clock, attributes, events,
//! status, instrumentation scope and resource. Kept whole, so an export can forward it as
//! the runtime sent it, and the timeline can make stages of it. The agent's `otel`
//! receives and exports them.

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};

/// Attributes by key; values as JSON (strings, numbers, booleans, arrays).
pub type Attributes = BTreeMap<String, serde_json::Value>;

/// One span of the runtime's.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct RuntimeSpan {
    /// The pod whose trace the span is in.
    pub pod_uid: String,
    /// Lower-case hex: 32 digits, 16 digits, and the parent's 16 (empty for a root).
    pub trace_id: String,
    pub span_id: String,
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub parent_span_id: String,
    pub name: String,
    /// `internal`, `server`, `client`, `producer`, `consumer` or `unspecified`.
    pub kind: String,
    /// On the trace's clock (CLOCK_MONOTONIC), placed by the run's clock anchor.
    pub start_ns: u64,
    pub end_ns: u64,
    #[serde(default, skip_serializing_if = "Attributes::is_empty")]
    pub attributes: Attributes,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub events: Vec<RuntimeSpanEvent>,
    /// `unset`, `ok` or `error`.
    #[serde(default = "unset")]
    pub status: String,
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub status_message: String,
    /// The instrumentation scope (`go.opentelemetry.io/.../otelgrpc`, `containerd`, ...).
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub scope: String,
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub scope_version: String,
    /// The resource's attributes (`service.name` = `containerd`, ...).
    #[serde(default, skip_serializing_if = "Attributes::is_empty")]
    pub resource: Attributes,
}

fn unset() -> String {
    "unset".into()
}

/// A point in a runtime span (containerd's `setup pod network`).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct RuntimeSpanEvent {
    pub name: String,
    pub at_ns: u64,
    #[serde(default, skip_serializing_if = "Attributes::is_empty")]
    pub attributes: Attributes,
}

impl RuntimeSpan {
    /// The service that sent it (`containerd`), from its resource.
    pub fn service(&self) -> &str {
        self.resource
            .get("service.name")
            .and_then(serde_json::Value::as_str)
            .unwrap_or("")
    }

    pub fn ok(&self) -> bool {
        self.status != "error"
    }
}
