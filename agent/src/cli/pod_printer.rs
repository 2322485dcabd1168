//! What `kubectl get pods` shows for a pod, computed as kubectl's pod printer does:
//! READY counts regular containers and started sidecars (restartable init containers),
//! STATUS is the pod's reason, an init container's progress or problem, or the most
//! telling container reason, and RESTARTS sums what kubectl sums. Also the Pod objects
//! of `-o json`, built from the agent's pod records.

use k8s_openapi::api::core::v1::{Container, ContainerStatus, Pod, PodSpec, PodStatus};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{ObjectMeta, Time};
use serde_json::Value;

/// One row of `podlapse pods`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PodRow {
    pub ready: usize,
    pub total: usize,
    pub status: String,
    pub restarts: i32,
}

/// The API Pod for an agent pod record (`GET /pods`): its manifest's metadata and spec,
/// the status the agent computed, and a creationTimestamp of when the agent first saw it
/// where the manifest has none (the API server sets it; the agent is the API here).
pub fn api_pod(record: &Value) -> Pod {
    let mut metadata: ObjectMeta =
        serde_json::from_value(record["metadata"].clone()).unwrap_or_default();
    metadata.name.get_or_insert_with(|| str_of(&record["name"]));
    metadata
        .namespace
        .get_or_insert_with(|| str_of(&record["namespace"]));
    metadata.uid.get_or_insert_with(|| str_of(&record["uid"]));
    if metadata.creation_timestamp.is_none() {
        metadata.creation_timestamp = record["first_seen"]
            .as_i64()
            .and_then(|ns| jiff::Timestamp::from_nanosecond(i128::from(ns)).ok())
            .map(Time);
    }
    Pod {
        metadata,
        spec: serde_json::from_value::<Option<PodSpec>>(record["spec"].clone()).unwrap_or_default(),
        status: serde_json::from_value(record["status"].clone()).ok(),
    }
}

fn str_of(v: &Value) -> String {
    v.as_str().unwrap_or_default().to_string()
}

/// `kubectl get pods -o json`'s document: a v1 List of Pods.
pub fn pod_list(pods: &[Pod]) -> Value {
    serde_json::json!({
        "apiVersion": "v1",
        "kind": "List",
        "metadata": { "resourceVersion": "" },
        "items": pods,
    })
}

fn is_restartable_init(c: Option<&Container>) -> bool {
    c.and_then(|c| c.restart_policy.as_deref()) == Some("Always")
}

/// READY, STATUS and RESTARTS as kubectl prints them for `pod`.
pub fn pod_row(pod: &Pod) -> PodRow {
    let default_spec = PodSpec::default();
    let default_status = PodStatus::default();
    let spec = pod.spec.as_ref().unwrap_or(&default_spec);
    let st = pod.status.as_ref().unwrap_or(&default_status);
    let init_specs = spec.init_containers.as_deref().unwrap_or_default();
    let init_spec = |name: &str| init_specs.iter().find(|c| c.name == name);

    let total = spec.containers.len()
        + init_specs
            .iter()
            .filter(|c| is_restartable_init(Some(c)))
            .count();
    let mut ready = 0;
    let mut restarts = 0;
    let mut sidecar_restarts = 0;
    let mut status = st
        .reason
        .clone()
        .filter(|r| !r.is_empty())
        .or_else(|| st.phase.clone())
        .unwrap_or_default();

    let mut initializing = false;
    for (i, c) in st
        .init_container_statuses
        .as_deref()
        .unwrap_or_default()
        .iter()
        .enumerate()
    {
        restarts += c.restart_count;
        let sidecar = is_restartable_init(init_spec(&c.name));
        if sidecar {
            sidecar_restarts += c.restart_count;
        }
        let state = c.state.as_ref();
        let terminated = state.and_then(|s| s.terminated.as_ref());
        let waiting_reason = state
            .and_then(|s| s.waiting.as_ref())
            .and_then(|w| w.reason.as_deref())
            .filter(|r| !r.is_empty() && *r != "PodInitializing");
        if terminated.is_some_and(|t| t.exit_code == 0) {
            continue;
        }
        if sidecar && c.started == Some(true) {
            if c.ready {
                ready += 1;
            }
            continue;
        }
        initializing = true;
        status = if let Some(t) = terminated {
            match t.reason.as_deref().filter(|r| !r.is_empty()) {
                Some(r) => format!("Init:{r}"),
                None if t.signal.is_some_and(|s| s != 0) => {
                    format!("Init:Signal:{}", t.signal.unwrap_or_default())
                }
                None => format!("Init:ExitCode:{}", t.exit_code),
            }
        } else if let Some(r) = waiting_reason {
            format!("Init:{r}")
        } else {
            format!("Init:{i}/{}", init_specs.len())
        };
        break;
    }

    if !initializing || condition_true(st, "Initialized") {
        restarts = sidecar_restarts;
        let mut has_running = false;
        for c in st
            .container_statuses
            .as_deref()
            .unwrap_or_default()
            .iter()
            .rev()
        {
            restarts += c.restart_count;
            if let Some(reason) = container_reason(c) {
                status = reason;
            } else if c.ready && c.state.as_ref().is_some_and(|s| s.running.is_some()) {
                has_running = true;
                ready += 1;
            }
        }
        if status == "Completed" && has_running {
            status = if condition_true(st, "Ready") {
                "Running".into()
            } else {
                "NotReady".into()
            };
        }
    }
    PodRow {
        ready,
        total,
        status,
        restarts,
    }
}

fn condition_true(st: &PodStatus, kind: &str) -> bool {
    st.conditions
        .as_deref()
        .unwrap_or_default()
        .iter()
        .any(|c| c.type_ == kind && c.status == "True")
}

/// A regular container's reason for STATUS: waiting reason, else terminated reason,
/// else its signal or exit code when terminated without one.
fn container_reason(c: &ContainerStatus) -> Option<String> {
    let state = c.state.as_ref()?;
    if let Some(r) = state
        .waiting
        .as_ref()
        .and_then(|w| w.reason.clone())
        .filter(|r| !r.is_empty())
    {
        return Some(r);
    }
    let t = state.terminated.as_ref()?;
    Some(match t.reason.clone().filter(|r| !r.is_empty()) {
        Some(r) => r,
        None if t.signal.is_some_and(|s| s != 0) => {
            format!("Signal:{}", t.signal.unwrap_or_default())
        }
        None => format!("ExitCode:{}", t.exit_code),
    })
}

#[cfg(test)]
#[path = "pod_printer_tests.rs"]
mod tests;
