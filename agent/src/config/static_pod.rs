//! What kubelet's file source does to a decoded pod before validation (its
//! `applyDefaults` for a file): the UID, derived from the pod as written, then the name
//! `<name>-<node>`, the node's name in `spec.nodeName`, the config annotations, and the
//! toleration of every NoExecute taint.

use std::collections::BTreeMap;
use std::path::Path;

use k8s_openapi::api::core::v1::{Pod, Toleration};

use super::uid;

/// The annotation kubelet keeps a static pod's UID in (the hash of its manifest).
pub const CONFIG_HASH_ANNOTATION: &str = "kubernetes.io/config.hash";
/// The annotation naming the source a pod came from.
pub const CONFIG_SOURCE_ANNOTATION: &str = "kubernetes.io/config.source";
/// The source name of manifests read from files.
pub const FILE_SOURCE: &str = "file";

/// A static pod's name: the manifest's name, a dash, and the node's name in lower case
/// (kubelet's `generatePodName`).
pub fn static_pod_name(name: &str, node_name: &str) -> String {
    format!("{name}-{}", node_name.to_lowercase())
}

/// Applies kubelet's file-source defaults to `pod`, read from `file` on node `node_name`.
/// A UID written in the manifest is kept, as kubelet keeps it; otherwise it is derived
/// from the pod before it is renamed.
pub fn apply(pod: &mut Pod, node_name: &str, file: &Path) {
    let uid = match pod.metadata.uid.as_deref() {
        Some(u) if !u.is_empty() => u.to_string(),
        _ => uid::static_pod_uid(pod, node_name, file),
    };
    pod.metadata.uid = Some(uid.clone());
    // A pod without a name keeps none, so validation names the missing field.
    if let Some(name) = pod.metadata.name.as_mut() {
        *name = static_pod_name(name, node_name);
    }
    let annotations = pod.metadata.annotations.get_or_insert_with(BTreeMap::new);
    annotations.insert(CONFIG_HASH_ANNOTATION.into(), uid);
    annotations.insert(CONFIG_SOURCE_ANNOTATION.into(), FILE_SOURCE.into());
    let Some(spec) = pod.spec.as_mut() else {
        return;
    };
    spec.node_name = Some(node_name.to_string());
    // Static pods are not evicted by node problems: they tolerate every NoExecute taint.
    let tolerate = Toleration {
        operator: Some("Exists".into()),
        effect: Some("NoExecute".into()),
        ..Toleration::default()
    };
    let tolerations = spec.tolerations.get_or_insert_with(Vec::new);
    match tolerations
        .iter_mut()
        .find(|t| same_toleration(t, &tolerate))
    {
        Some(t) => *t = tolerate,
        None => tolerations.push(tolerate),
    }
}

/// kubelet's `AddOrUpdateTolerationInPod` matches on key, operator, value and effect.
fn same_toleration(a: &Toleration, b: &Toleration) -> bool {
    a.key.as_deref().unwrap_or_default() == b.key.as_deref().unwrap_or_default()
        && a.operator.as_deref().unwrap_or("Equal") == b.operator.as_deref().unwrap_or("Equal")
        && a.value.as_deref().unwrap_or_default() == b.value.as_deref().unwrap_or_default()
        && a.effect.as_deref().unwrap_or_default() == b.effect.as_deref().unwrap_or_default()
}

#[cfg(test)]
mod tests {
    use super::*;
    use k8s_openapi::api::core::v1::{Container, PodSpec};

    fn pod(name: Option<&str>) -> Pod {
        let mut p = Pod::default();
        p.metadata.name = name.map(str::to_string);
        p.metadata.namespace = Some("default".into());
        p.spec = Some(PodSpec {
            node_name: Some("elsewhere".into()),
            containers: vec![Container {
                name: "app".into(),
                image: Some("app:1".into()),
                ..Container::default()
            }],
            ..PodSpec::default()
        });
        p
    }

    #[test]
    fn named_after_the_node_in_lower_case_and_bound_to_it() {
        let mut p = pod(Some("web"));
        apply(&mut p, "Node-A", Path::new("/m/web.yaml"));
        assert_eq!(p.metadata.name.as_deref(), Some("web-node-a"));
        assert_eq!(
            p.spec.as_ref().unwrap().node_name.as_deref(),
            Some("Node-A"),
            "spec.nodeName is the node's name, whatever the manifest said"
        );
        let a = p.metadata.annotations.as_ref().unwrap();
        assert_eq!(a[CONFIG_HASH_ANNOTATION], *p.metadata.uid.as_ref().unwrap());
        assert_eq!(a[CONFIG_SOURCE_ANNOTATION], "file");
    }

    #[test]
    fn the_uid_is_derived_before_the_rename() {
        let mut p = pod(Some("web"));
        let before = uid::static_pod_uid(&p, "node-a", Path::new("/m/web.yaml"));
        apply(&mut p, "node-a", Path::new("/m/web.yaml"));
        assert_eq!(p.metadata.uid.as_deref(), Some(before.as_str()));
    }

    #[test]
    fn a_uid_in_the_manifest_is_kept() {
        let mut p = pod(Some("web"));
        p.metadata.uid = Some("given-uid".into());
        apply(&mut p, "node-a", Path::new("/m/web.yaml"));
        assert_eq!(p.metadata.uid.as_deref(), Some("given-uid"));
        assert_eq!(
            p.metadata.annotations.unwrap()[CONFIG_HASH_ANNOTATION],
            "given-uid"
        );
    }

    #[test]
    fn no_execute_is_tolerated_once() {
        let mut p = pod(Some("web"));
        p.spec.as_mut().unwrap().tolerations = Some(vec![
            Toleration {
                key: Some("dedicated".into()),
                operator: Some("Equal".into()),
                value: Some("gpu".into()),
                effect: Some("NoSchedule".into()),
                ..Toleration::default()
            },
            Toleration {
                operator: Some("Exists".into()),
                effect: Some("NoExecute".into()),
                toleration_seconds: Some(30),
                ..Toleration::default()
            },
        ]);
        apply(&mut p, "node-a", Path::new("/m/web.yaml"));
        let t = p.spec.unwrap().tolerations.unwrap();
        assert_eq!(t.len(), 2, "{t:?}");
        assert_eq!(t[0].key.as_deref(), Some("dedicated"));
        assert_eq!(
            t[1].toleration_seconds, None,
            "kubelet's toleration replaces the equal one"
        );
    }

    #[test]
    fn a_pod_without_a_name_stays_without_one() {
        let mut p = pod(None);
        apply(&mut p, "node-a", Path::new("/m/web.yaml"));
        assert_eq!(p.metadata.name, None);
    }
}
