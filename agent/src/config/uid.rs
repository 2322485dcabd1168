//! Static pods have no API server to assign a UID, so kubelet derives one from the
//! manifest, spec included: any edit makes a new pod. podlapse derives it from the pod's
//! identity in its manifest (file, namespace, name), the node, and the spec less the
//! fields an API pod may change in place (container images and resources). So the UID
//! stays the same across agent restarts, which is what lets a restarted agent adopt its
//! pods; an edit of an image or of resources is an UPDATE that kubelet's in-place paths
//! carry out (a restart of that container, an in-place resize); any other edit replaces
//! the pod, as the API server would refuse it as an update.

use std::path::Path;

use k8s_openapi::api::core::v1::{Container, Pod};
use sha2::{Digest, Sha256};

pub fn static_pod_uid(pod: &Pod, node_name: &str, file: &Path) -> String {
    let mut h = Sha256::new();
    for part in [
        format!("host:{node_name}"),
        format!("file:{}", file.display()),
        format!(
            "namespace:{}",
            pod.metadata.namespace.as_deref().unwrap_or_default()
        ),
        format!("name:{}", pod.metadata.name.as_deref().unwrap_or_default()),
        format!("spec:{}", fixed_spec(pod)),
    ] {
        h.update(part.as_bytes());
        h.update([0]);
    }
    let d = h.finalize();
    let hex: String = d[..16].iter().map(|b| format!("{b:02x}")).collect();
    format!(
        "{}-{}-{}-{}-{}",
        &hex[0..8],
        &hex[8..12],
        &hex[12..16],
        &hex[16..20],
        &hex[20..32]
    )
}

/// The spec without the fields a pod update may change, as JSON.
fn fixed_spec(pod: &Pod) -> String {
    let mut spec = pod.spec.clone().unwrap_or_default();
    let clear = |c: &mut Container| {
        c.image = None;
        c.resources = None;
    };
    spec.containers.iter_mut().for_each(clear);
    spec.init_containers.iter_mut().flatten().for_each(clear);
    serde_json::to_string(&spec).unwrap_or_default()
}

#[cfg(test)]
mod tests {
    use super::*;
    use k8s_openapi::api::core::v1::{PodSpec, ResourceRequirements};

    fn pod(image: &str, command: &str) -> Pod {
        let mut p = Pod::default();
        p.metadata.name = Some("web".into());
        p.spec = Some(PodSpec {
            containers: vec![Container {
                name: "app".into(),
                image: Some(image.into()),
                command: Some(vec![command.into()]),
                ..Container::default()
            }],
            ..PodSpec::default()
        });
        p
    }

    fn uid(p: &Pod) -> String {
        static_pod_uid(p, "node-a", Path::new("/m/web.yaml"))
    }

    #[test]
    fn images_and_resources_keep_the_pod_other_edits_replace_it() {
        let base = pod("app:1", "serve");
        assert_eq!(uid(&base), uid(&pod("app:2", "serve")));
        let mut resized = base.clone();
        resized.spec.as_mut().unwrap().containers[0].resources =
            Some(ResourceRequirements::default());
        assert_eq!(uid(&base), uid(&resized));
        assert_ne!(uid(&base), uid(&pod("app:1", "other")));
        assert_ne!(
            uid(&base),
            static_pod_uid(&base, "node-b", Path::new("/m/web.yaml"))
        );
    }
}
