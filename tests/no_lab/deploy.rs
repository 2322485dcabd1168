//! The manifests in deploy/: each parses into its Kubernetes type with no field left over
//! (a misspelt field fails here, not in a rollout), and they agree with each other and
//! with podlapse itself: the DaemonSet's arguments parse as `podlapse observe`'s, every
//! mount has its volume, the ports the Service and the ServiceMonitor name exist, the
//! selectors select the DaemonSet's pods.

use std::collections::BTreeSet;
use std::path::{Path, PathBuf};

use clap::Parser;
use k8s_openapi::api::apps::v1::DaemonSet;
use k8s_openapi::api::core::v1::{Namespace, Service};
use podlapse_tests::workspace_root;
use serde::Serialize;
use serde::de::DeserializeOwned;
use serde_json::Value;

/// The Prometheus Operator's ServiceMonitor, as far as deploy/ uses it: no Rust type is
/// published for the CRD, so its fields are named here, each refused when unknown.
mod service_monitor {
    use k8s_openapi::apimachinery::pkg::apis::meta::v1::{LabelSelector, ObjectMeta};
    use serde::{Deserialize, Serialize};

    #[derive(Debug, Serialize, Deserialize)]
    #[serde(deny_unknown_fields, rename_all = "camelCase")]
    pub struct ServiceMonitor {
        pub api_version: String,
        pub kind: String,
        pub metadata: ObjectMeta,
        pub spec: Spec,
    }

    #[derive(Debug, Serialize, Deserialize)]
    #[serde(deny_unknown_fields, rename_all = "camelCase")]
    pub struct Spec {
        pub selector: LabelSelector,
        #[serde(default, skip_serializing_if = "Option::is_none")]
        pub namespace_selector: Option<NamespaceSelector>,
        pub endpoints: Vec<Endpoint>,
        #[serde(default, skip_serializing_if = "Option::is_none")]
        pub job_label: Option<String>,
    }

    #[derive(Debug, Serialize, Deserialize)]
    #[serde(deny_unknown_fields, rename_all = "camelCase")]
    pub struct NamespaceSelector {
        #[serde(default, skip_serializing_if = "Vec::is_empty")]
        pub match_names: Vec<String>,
        #[serde(default, skip_serializing_if = "Option::is_none")]
        pub any: Option<bool>,
    }

    #[derive(Debug, Serialize, Deserialize)]
    #[serde(deny_unknown_fields, rename_all = "camelCase")]
    pub struct Endpoint {
        pub port: String,
        #[serde(default, skip_serializing_if = "Option::is_none")]
        pub path: Option<String>,
        #[serde(default, skip_serializing_if = "Option::is_none")]
        pub interval: Option<String>,
        #[serde(default, skip_serializing_if = "Option::is_none")]
        pub scrape_timeout: Option<String>,
        #[serde(default, skip_serializing_if = "Vec::is_empty")]
        pub relabelings: Vec<Relabeling>,
    }

    #[derive(Debug, Serialize, Deserialize)]
    #[serde(deny_unknown_fields, rename_all = "camelCase")]
    pub struct Relabeling {
        #[serde(default, skip_serializing_if = "Vec::is_empty")]
        pub source_labels: Vec<String>,
        #[serde(default, skip_serializing_if = "Option::is_none")]
        pub target_label: Option<String>,
        #[serde(default, skip_serializing_if = "Option::is_none")]
        pub regex: Option<String>,
        #[serde(default, skip_serializing_if = "Option::is_none")]
        pub replacement: Option<String>,
        #[serde(default, skip_serializing_if = "Option::is_none")]
        pub action: Option<String>,
    }
}
use service_monitor::ServiceMonitor;

fn deploy_dir() -> PathBuf {
    workspace_root().join("deploy")
}

/// The Kubernetes manifests of deploy/ (the Prometheus rule files are not: promtool
/// checks those), each file one object.
fn manifests() -> Vec<(PathBuf, Value)> {
    let mut out = Vec::new();
    for entry in std::fs::read_dir(deploy_dir()).unwrap() {
        let path = entry.unwrap().path();
        let name = path.file_name().unwrap().to_string_lossy().to_string();
        if path.extension().is_none_or(|e| e != "yaml") || name.starts_with("prometheus-rules") {
            continue;
        }
        let text = std::fs::read_to_string(&path).unwrap();
        let value: Value = serde_yaml::from_str(&text)
            .unwrap_or_else(|e| panic!("{}: not YAML: {e}", path.display()));
        out.push((path, value));
    }
    out.sort_by(|a, b| a.0.cmp(&b.0));
    out
}

/// `value` as a `T`, refusing any field `T` does not know: a field the type dropped is
/// missing from what it serialises back to, and is named by its path.
fn strict<T: DeserializeOwned + Serialize>(file: &Path, value: &Value) -> Result<T, String> {
    let typed: T =
        serde_json::from_value(value.clone()).map_err(|e| format!("{}: {e}", file.display()))?;
    let back = serde_json::to_value(&typed).unwrap();
    let mut unknown = Vec::new();
    left_over(value, &back, String::new(), &mut unknown);
    if unknown.is_empty() {
        Ok(typed)
    } else {
        Err(format!(
            "{}: unknown field(s) {}",
            file.display(),
            unknown.join(", ")
        ))
    }
}

/// The paths of `given` that `back` does not have.
fn left_over(given: &Value, back: &Value, at: String, out: &mut Vec<String>) {
    match (given, back) {
        (Value::Object(g), Value::Object(b)) => {
            for (k, v) in g {
                let path = if at.is_empty() {
                    k.clone()
                } else {
                    format!("{at}.{k}")
                };
                match b.get(k) {
                    Some(bv) => left_over(v, bv, path, out),
                    None => out.push(path),
                }
            }
        }
        (Value::Array(g), Value::Array(b)) => {
            for (i, (gv, bv)) in g.iter().zip(b).enumerate() {
                left_over(gv, bv, format!("{at}[{i}]"), out);
            }
        }
        _ => {}
    }
}

struct Deploy {
    daemon_set: DaemonSet,
    service: Service,
    namespace: Namespace,
    monitor: ServiceMonitor,
}

fn deploy() -> Deploy {
    let (mut ds, mut svc, mut ns, mut sm) = (None, None, None, None);
    for (path, value) in manifests() {
        let kind = value["kind"].as_str().unwrap_or_default().to_string();
        let r = match kind.as_str() {
            "DaemonSet" => strict(&path, &value).map(|t| ds = Some(t)),
            "Service" => strict(&path, &value).map(|t| svc = Some(t)),
            "Namespace" => strict(&path, &value).map(|t| ns = Some(t)),
            "ServiceMonitor" => strict(&path, &value).map(|t| sm = Some(t)),
            other => Err(format!("{}: no check for kind {other:?}", path.display())),
        };
        r.unwrap_or_else(|e| panic!("{e}"));
    }
    Deploy {
        daemon_set: ds.expect("deploy/ has a DaemonSet"),
        service: svc.expect("deploy/ has a Service"),
        namespace: ns.expect("deploy/ has a Namespace"),
        monitor: sm.expect("deploy/ has a ServiceMonitor"),
    }
}

#[test]
fn every_manifest_parses_into_its_type_with_no_unknown_field() {
    let d = deploy();
    let ns = d.namespace.metadata.name.as_deref().unwrap();
    for (kind, in_ns) in [
        ("DaemonSet", d.daemon_set.metadata.namespace.as_deref()),
        ("Service", d.service.metadata.namespace.as_deref()),
        ("ServiceMonitor", d.monitor.metadata.namespace.as_deref()),
    ] {
        assert_eq!(
            in_ns,
            Some(ns),
            "{kind} is not in the namespace deploy/ makes"
        );
    }
}

#[test]
fn a_misspelt_field_is_refused_by_its_path() {
    let (path, mut value) = manifests()
        .into_iter()
        .find(|(_, v)| v["kind"] == "DaemonSet")
        .unwrap();
    let spec = value["spec"]["template"]["spec"].as_object_mut().unwrap();
    let host_pid = spec.remove("hostPID").unwrap();
    spec.insert("hostPid".into(), host_pid);
    let err = strict::<DaemonSet>(&path, &value).unwrap_err();
    assert!(
        err.contains("unknown field(s) spec.template.spec.hostPid"),
        "{err}"
    );
    let (path, mut value) = manifests()
        .into_iter()
        .find(|(_, v)| v["kind"] == "ServiceMonitor")
        .unwrap();
    value["spec"]["endpoints"][0]["intervall"] = "30s".into();
    assert!(strict::<ServiceMonitor>(&path, &value).is_err());
}

#[test]
fn the_daemon_set_runs_podlapse_observe_on_every_node_with_its_mounts() {
    let d = deploy();
    let spec = &d.daemon_set.spec;
    let pod = spec.template.spec.as_ref().unwrap();
    assert_eq!(
        pod.priority_class_name.as_deref(),
        Some("system-node-critical")
    );
    assert!(
        pod.tolerations
            .iter()
            .flatten()
            .any(|t| t.operator.as_deref() == Some("Exists") && t.key.is_none()),
        "the pods tolerate every taint"
    );
    assert_eq!(pod.host_pid, Some(true));
    assert_eq!(pod.host_network, Some(true));
    assert_eq!(
        spec.update_strategy.as_ref().unwrap().type_.as_deref(),
        Some("RollingUpdate")
    );
    // The selector selects the template's pods.
    let labels = spec
        .template
        .metadata
        .as_ref()
        .unwrap()
        .labels
        .clone()
        .unwrap();
    for (k, v) in spec.selector.match_labels.iter().flatten() {
        assert_eq!(labels.get(k), Some(v), "selector {k}={v}");
    }
    let [c] = pod.containers.as_slice() else {
        panic!("one container")
    };
    // Its arguments are `podlapse observe`'s, as podlapse parses them (the kubelet's
    // $(VAR) expansions given values).
    let args: Vec<String> = c
        .args
        .iter()
        .flatten()
        .map(|a| {
            a.replace("$(NODE_NAME)", "node-a")
                .replace("$(NODE_IP)", "10.0.0.1")
        })
        .collect();
    let cli = podlapse::cli::Cli::try_parse_from(std::iter::once("podlapse".into()).chain(args))
        .unwrap_or_else(|e| panic!("the DaemonSet's args: {e}"));
    assert!(
        matches!(cli.command, podlapse::cli::Command::Observe(_)),
        "{cli:?}"
    );
    // Every variable the arguments expand is set from the pod's fields.
    let env: BTreeSet<&str> = c.env.iter().flatten().map(|e| e.name.as_str()).collect();
    for a in c.args.iter().flatten() {
        for var in a.split("$(").skip(1).filter_map(|s| s.split_once(')')) {
            assert!(
                env.contains(var.0),
                "{a} expands {} but no env sets it",
                var.0
            );
        }
    }
    // Every mount has its volume, every volume is mounted.
    let volumes: BTreeSet<&str> = pod
        .volumes
        .iter()
        .flatten()
        .map(|v| v.name.as_str())
        .collect();
    let mounts: BTreeSet<&str> = c
        .volume_mounts
        .iter()
        .flatten()
        .map(|m| m.name.as_str())
        .collect();
    assert_eq!(volumes, mounts);
    // The CRI socket --cri names is inside a mount; the trace and API socket too.
    let mounted = |path: &str| {
        c.volume_mounts
            .iter()
            .flatten()
            .any(|m| Path::new(path).starts_with(&m.mount_path))
    };
    for flag in ["--cri=unix://", "--trace=", "--api-socket="] {
        let a = c
            .args
            .iter()
            .flatten()
            .find(|a| a.starts_with(flag))
            .unwrap();
        assert!(mounted(&a[flag.len()..]), "{a} is on no mount");
    }
    // The kernel's files and the pods' cgroups are read-only.
    for path in ["/sys/kernel", "/sys/fs/cgroup", "/etc/cni/net.d"] {
        let m = c
            .volume_mounts
            .iter()
            .flatten()
            .find(|m| m.mount_path == path)
            .unwrap_or_else(|| panic!("{path} is not mounted"));
        assert_eq!(m.read_only, Some(true), "{path}");
    }
    // Not privileged: the capabilities it names, all others dropped.
    let sc = c.security_context.as_ref().unwrap();
    assert_eq!(sc.privileged, Some(false));
    let caps = sc.capabilities.as_ref().unwrap();
    assert_eq!(caps.drop.as_deref(), Some(&["ALL".to_string()][..]));
    assert!(caps.add.iter().flatten().any(|c| c == "BPF"));
    // Requests and a memory limit.
    let res = c.resources.as_ref().unwrap();
    assert!(res.requests.as_ref().unwrap().contains_key("memory"));
    assert!(res.limits.as_ref().unwrap().contains_key("memory"));
}

#[test]
fn the_service_and_monitor_reach_the_pods_metrics_port() {
    let d = deploy();
    let pod = d.daemon_set.spec.template.clone();
    let c = &pod.spec.as_ref().unwrap().containers[0];
    let port = c
        .ports
        .iter()
        .flatten()
        .find(|p| p.name.as_deref() == Some("metrics"))
        .expect("a port named metrics");
    // --metrics-addr listens on the port the pod declares.
    let addr = c
        .args
        .iter()
        .flatten()
        .find_map(|a| a.strip_prefix("--metrics-addr="))
        .unwrap();
    assert!(
        addr.ends_with(&format!(":{}", port.container_port)),
        "{addr} vs {}",
        port.container_port
    );
    let svc = d.service.spec.as_ref().unwrap();
    let labels = pod.metadata.as_ref().unwrap().labels.clone().unwrap();
    for (k, v) in svc.selector.iter().flatten() {
        assert_eq!(labels.get(k), Some(v), "the Service's selector {k}={v}");
    }
    let svc_port = svc
        .ports
        .iter()
        .flatten()
        .find(|p| p.name.as_deref() == Some("metrics"))
        .expect("the Service has a metrics port");
    assert_eq!(
        serde_json::to_value(svc_port.target_port.as_ref().unwrap()).unwrap(),
        "metrics"
    );
    let svc_labels = d.service.metadata.labels.clone().unwrap();
    for (k, v) in d.monitor.spec.selector.match_labels.iter().flatten() {
        assert_eq!(
            svc_labels.get(k),
            Some(v),
            "the ServiceMonitor's selector {k}={v}"
        );
    }
    assert!(d.monitor.spec.endpoints.iter().all(|e| e.port == "metrics"));
}
