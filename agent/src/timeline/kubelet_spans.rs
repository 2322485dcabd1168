//! The kubelet's own spans, for a pod another client runs: `podlapse observe` receives
//! them when the kubelet's tracing (`tracing.endpoint` in its KubeletConfiguration) points
//! at the observer's `--runtime-otlp-listen`. Their trace is the pod's by the sync span's
//! `k8s.pod.uid` (`observe/runtime_spans.rs`), so the runtime's server spans under the
//! kubelet's calls come with it. Names and attributes are the kubelet's own:
//!
//! - `pkg/kubelet/kubelet.go`: a span per pod sync, `syncPod` (with `k8s.pod.update_type`:
//!   `create`, `update`, `sync`, `kill`), `syncTerminatingPod`, `syncTerminatedPod`, each
//!   with `k8s.pod.uid`, `k8s.pod.name`, `k8s.namespace.name`; an error sets its status;
//! - `staging/src/k8s.io/cri-client/pkg/remote_runtime.go`: otelgrpc's client handler, a
//!   client span per CRI call named `runtime.v1.RuntimeService/<Method>` (or
//!   `runtime.v1.ImageService/<Method>`), with the call's gRPC status as
//!   `rpc.grpc.status_code` (a number) or, in newer otelgrpc, `rpc.response.status_code`
//!   (the code's name), and the status message as the span's.
//!
//! | stage | from |
//! |---|---|
//! | `kubelet_sync:<update type>` | `syncPod`; `kubelet_sync:terminating` and `kubelet_sync:terminated` from the two others |
//! | `kubelet_call:<Method>` | a CRI call as the kubelet waited for it (`:<container>` for a container's, by the runtime's server span under it); its code and the kubelet's error text |

use podlapse_core::record::{GrpcCode, RuntimeSpan};

use super::stage_kind::StageKind;
use super::stage_name::StageName;

/// One stage of the kubelet's.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct KubeletStage {
    pub name: StageName,
    pub start_ns: u64,
    pub end_ns: u64,
    pub ok: bool,
    /// A call's gRPC status, as the kubelet got it.
    pub code: Option<GrpcCode>,
    pub container: Option<String>,
    pub sandbox_id: Option<String>,
    pub container_id: Option<String>,
    pub detail: String,
}

/// Whether the kubelet sent `s` (its resource's `service.name`, or its instrumentation
/// scope `k8s.io/kubernetes/pkg/kubelet...`).
pub fn is_kubelets(s: &RuntimeSpan) -> bool {
    s.service() == "kubelet" || s.scope.starts_with("k8s.io/kubernetes/pkg/kubelet")
}

fn sync_kind(s: &RuntimeSpan) -> Option<String> {
    match s.name.as_str() {
        "syncPod" => Some(
            s.attributes
                .get("k8s.pod.update_type")
                .and_then(serde_json::Value::as_str)
                .filter(|t| !t.is_empty())
                .unwrap_or("sync")
                .to_string(),
        ),
        "syncTerminatingPod" => Some("terminating".into()),
        "syncTerminatedPod" => Some("terminated".into()),
        _ => None,
    }
}

/// The CRI method of a kubelet's client span (`runtime.v1.RuntimeService/RunPodSandbox`).
fn client_method(s: &RuntimeSpan) -> Option<&str> {
    if s.kind != "client" {
        return None;
    }
    let (service, method) = s.name.rsplit_once('/')?;
    let service = service.strip_prefix('/').unwrap_or(service);
    matches!(
        service,
        "runtime.v1.RuntimeService" | "runtime.v1.ImageService"
    )
    .then_some(method)
    .filter(|m| !m.is_empty() && m.chars().all(|c| c.is_ascii_alphanumeric()))
}

/// The gRPC status a client span carries, in either convention otelgrpc has used.
pub fn status_code(s: &RuntimeSpan) -> Option<GrpcCode> {
    let number = |v: &serde_json::Value| {
        v.as_i64()
            .or_else(|| v.as_str().and_then(|t| t.parse().ok()))
            .and_then(|n| i32::try_from(n).ok())
            .map(GrpcCode::from_number)
    };
    if let Some(v) = s.attributes.get("rpc.grpc.status_code") {
        return number(v);
    }
    let v = s.attributes.get("rpc.response.status_code")?;
    if let Some(code) = number(v) {
        return Some(code);
    }
    // The code's name, as gRPC spells it (`DEADLINE_EXCEEDED`).
    let name: String = v.as_str()?.chars().filter(|c| *c != '_').collect();
    GrpcCode::ALL
        .into_iter()
        .find(|c| c.as_str().eq_ignore_ascii_case(&name))
}

/// One of the kubelet's pod syncs (`syncPod`, `syncTerminatingPod`, `syncTerminatedPod`).
pub fn is_kubelet_sync(s: &RuntimeSpan) -> bool {
    is_kubelets(s) && sync_kind(s).is_some()
}

/// One of the kubelet's CRI calls, as its client saw it.
pub fn is_kubelet_call(s: &RuntimeSpan) -> bool {
    kubelet_call_method(s).is_some()
}

/// The CRI method of one of the kubelet's calls (`RunPodSandbox`), if `s` is one.
pub fn kubelet_call_method(s: &RuntimeSpan) -> Option<&str> {
    if is_kubelets(s) {
        client_method(s)
    } else {
        None
    }
}

/// The stages the kubelet's spans among `spans` (one pod's) make, in the order they
/// started. `container_of` names a container by its ID (what the observer recorded).
pub fn kubelet_stages(
    spans: &[&RuntimeSpan],
    container_of: &dyn Fn(&str) -> Option<String>,
) -> Vec<KubeletStage> {
    let text = |s: &RuntimeSpan, k: &str| {
        s.attributes
            .get(k)
            .and_then(serde_json::Value::as_str)
            .filter(|v| !v.is_empty())
            .map(str::to_string)
    };
    let mut out = Vec::new();
    for s in spans.iter().copied().filter(|s| is_kubelets(s)) {
        let end_ns = s.end_ns.max(s.start_ns);
        if let Some(kind) = sync_kind(s) {
            out.push(KubeletStage {
                name: StageName::of(StageKind::KubeletSync, kind),
                start_ns: s.start_ns,
                end_ns,
                ok: s.ok(),
                code: None,
                container: None,
                sandbox_id: None,
                container_id: None,
                detail: if s.ok() {
                    "the kubelet's sync".into()
                } else {
                    format!("the kubelet's sync failed: {}", s.status_message)
                },
            });
            continue;
        }
        let Some(method) = client_method(s) else {
            continue;
        };
        // The runtime's server span for the call is its child: it names the sandbox and
        // the container.
        let server = spans
            .iter()
            .find(|c| c.parent_span_id == s.span_id && c.kind == "server");
        let sandbox_id = server.and_then(|c| text(c, "sandbox.id"));
        let container_id = server.and_then(|c| text(c, "container.id"));
        let container = server
            .and_then(|c| text(c, "container.name"))
            .and_then(|n| n.split('_').next().map(str::to_string))
            .or_else(|| container_id.as_deref().and_then(container_of));
        let code = status_code(s).or_else(|| (!s.ok()).then_some(GrpcCode::Unknown));
        let ok = code.is_none_or(GrpcCode::is_ok) && s.ok();
        let name = match &container {
            Some(c) => format!("{method}:{c}"),
            None => method.to_string(),
        };
        out.push(KubeletStage {
            name: StageName::of(StageKind::KubeletCall, name),
            start_ns: s.start_ns,
            end_ns,
            ok,
            code,
            container,
            sandbox_id,
            container_id,
            detail: if ok {
                format!("{method}, as the kubelet waited for it")
            } else {
                format!(
                    "{method} failed for the kubelet ({}): {}",
                    code.unwrap_or(GrpcCode::Unknown),
                    s.status_message
                )
            },
        });
    }
    out.sort_by_key(|s| (s.start_ns, s.end_ns));
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use podlapse_core::record::Attributes;

    fn span(id: &str, parent: &str, name: &str, kind: &str, service: &str) -> RuntimeSpan {
        RuntimeSpan {
            pod_uid: "u".into(),
            trace_id: "0".repeat(32),
            span_id: id.into(),
            parent_span_id: parent.into(),
            name: name.into(),
            kind: kind.into(),
            start_ns: 10,
            end_ns: 20,
            attributes: Attributes::new(),
            events: Vec::new(),
            status: "unset".into(),
            status_message: String::new(),
            scope: String::new(),
            scope_version: String::new(),
            resource: Attributes::from([("service.name".to_string(), service.into())]),
        }
    }

    #[test]
    fn syncs_and_calls_are_the_kubelets_stages_with_its_status_and_words() {
        let mut sync = span("a", "", "syncPod", "internal", "kubelet");
        sync.attributes.insert("k8s.pod.uid".into(), "u".into());
        sync.attributes
            .insert("k8s.pod.update_type".into(), "create".into());
        let mut run = span(
            "b",
            "a",
            "runtime.v1.RuntimeService/RunPodSandbox",
            "client",
            "kubelet",
        );
        run.status = "error".into();
        run.status_message = "failed to setup network for sandbox: plugin type=\"bridge\" failed (add): no IP addresses available in range set".into();
        run.attributes
            .insert("rpc.grpc.status_code".into(), 2.into());
        let mut create = span(
            "c",
            "a",
            "runtime.v1.RuntimeService/CreateContainer",
            "client",
            "kubelet",
        );
        create
            .attributes
            .insert("rpc.response.status_code".into(), "OK".into());
        let mut server = span(
            "d",
            "c",
            "runtime.v1.RuntimeService/CreateContainer",
            "server",
            "containerd",
        );
        server
            .attributes
            .insert("container.name".into(), "app_web_default_u_0".into());
        let pull = span(
            "e",
            "a",
            "runtime.v1.ImageService/PullImage",
            "client",
            "kubelet",
        );
        let listed = [&sync, &run, &create, &server, &pull];
        let stages = kubelet_stages(&listed, &|_| None);
        let names: Vec<String> = stages.iter().map(|s| s.name.to_string()).collect();
        assert_eq!(
            names,
            [
                "kubelet_sync:create",
                "kubelet_call:RunPodSandbox",
                "kubelet_call:CreateContainer:app",
                "kubelet_call:PullImage",
            ]
        );
        assert!(!stages[1].ok);
        assert_eq!(stages[1].code, Some(GrpcCode::Unknown));
        assert!(
            stages[1]
                .detail
                .contains("no IP addresses available in range set"),
            "{}",
            stages[1].detail
        );
        assert!(stages[2].ok);
        assert_eq!(stages[2].code, Some(GrpcCode::Ok));
    }

    #[test]
    fn both_status_conventions_are_read() {
        let mut s = span(
            "a",
            "",
            "runtime.v1.RuntimeService/RunPodSandbox",
            "client",
            "kubelet",
        );
        s.attributes.insert(
            "rpc.response.status_code".into(),
            "DEADLINE_EXCEEDED".into(),
        );
        assert_eq!(status_code(&s), Some(GrpcCode::DeadlineExceeded));
        s.attributes.clear();
        s.attributes
            .insert("rpc.grpc.status_code".into(), 14.into());
        assert_eq!(status_code(&s), Some(GrpcCode::Unavailable));
        // The runtime's own spans are not the kubelet's.
        let c = span("b", "", "syncPod", "internal", "containerd");
        assert!(kubelet_stages(&[&c], &|_| None).is_empty());
    }
}
