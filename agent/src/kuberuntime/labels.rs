//! The labels and annotations kubelet puts on sandboxes and containers, plus podlapse's
//! own marker, so runtime objects can be tied back to pods (and adopted after a restart).

use std::collections::HashMap;

use k8s_openapi::api::core::v1::{Container, Pod};

pub use crate::kubelet::labels::*;

pub fn node_name(pod: &Pod) -> &str {
    pod.spec
        .as_ref()
        .and_then(|s| s.node_name.as_deref())
        .unwrap_or_default()
}

pub fn pod_name(pod: &Pod) -> &str {
    pod.metadata.name.as_deref().unwrap_or_default()
}

pub fn pod_namespace(pod: &Pod) -> &str {
    pod.metadata.namespace.as_deref().unwrap_or("default")
}

pub fn pod_uid(pod: &Pod) -> &str {
    pod.metadata.uid.as_deref().unwrap_or_default()
}

fn pod_identity(pod: &Pod) -> HashMap<String, String> {
    HashMap::from([
        (POD_NAME.to_string(), pod_name(pod).to_string()),
        (POD_NAMESPACE.to_string(), pod_namespace(pod).to_string()),
        (POD_UID.to_string(), pod_uid(pod).to_string()),
        (MANAGED_BY.to_string(), MANAGED_BY_VALUE.to_string()),
        (NODE.to_string(), node_name(pod).to_string()),
    ])
}

/// Sandbox labels: the pod's own labels, then kubelet's identity labels over them.
pub fn sandbox_labels(pod: &Pod) -> HashMap<String, String> {
    let mut labels: HashMap<String, String> = pod
        .metadata
        .labels
        .iter()
        .flatten()
        .map(|(k, v)| (k.clone(), v.clone()))
        .collect();
    labels.extend(pod_identity(pod));
    labels
}

pub fn sandbox_annotations(pod: &Pod) -> HashMap<String, String> {
    pod.metadata
        .annotations
        .iter()
        .flatten()
        .map(|(k, v)| (k.clone(), v.clone()))
        .collect()
}

pub fn container_labels(pod: &Pod, c: &Container) -> HashMap<String, String> {
    let mut labels = pod_identity(pod);
    labels.insert(CONTAINER_NAME.to_string(), c.name.clone());
    labels
}

pub fn container_annotations(
    pod: &Pod,
    c: &Container,
    hash: &str,
    restart_count: u32,
) -> HashMap<String, String> {
    let grace = pod
        .spec
        .as_ref()
        .and_then(|s| s.termination_grace_period_seconds)
        .unwrap_or(30);
    HashMap::from([
        (CONTAINER_HASH.to_string(), hash.to_string()),
        (
            CONTAINER_RESTART_COUNT.to_string(),
            restart_count.to_string(),
        ),
        (
            CONTAINER_TERMINATION_MESSAGE_PATH.to_string(),
            c.termination_message_path.clone().unwrap_or_default(),
        ),
        (
            CONTAINER_TERMINATION_MESSAGE_POLICY.to_string(),
            c.termination_message_policy.clone().unwrap_or_default(),
        ),
        (POD_TERMINATION_GRACE_PERIOD.to_string(), grace.to_string()),
    ])
}
