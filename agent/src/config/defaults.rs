//! The API server's defaults for the fields podlapse reads, applied the way kubelet's file
//! source gets them when it decodes a static pod (what the node adds, its name among them,
//! comes after: `static_pod`).

use k8s_openapi::api::core::v1::{Container, Pod};

pub const DEFAULT_NAMESPACE: &str = "default";
pub const DEFAULT_TERMINATION_GRACE_PERIOD: i64 = 30;

pub fn apply(pod: &mut Pod) {
    let meta = &mut pod.metadata;
    meta.namespace
        .get_or_insert_with(|| DEFAULT_NAMESPACE.into());
    let Some(spec) = pod.spec.as_mut() else {
        return;
    };
    spec.restart_policy.get_or_insert_with(|| "Always".into());
    spec.dns_policy.get_or_insert_with(|| "ClusterFirst".into());
    spec.termination_grace_period_seconds
        .get_or_insert(DEFAULT_TERMINATION_GRACE_PERIOD);
    spec.scheduler_name
        .get_or_insert_with(|| "default-scheduler".into());
    for c in spec
        .init_containers
        .iter_mut()
        .flatten()
        .chain(spec.containers.iter_mut())
    {
        container(c);
    }
}

fn container(c: &mut Container) {
    let image = c.image.clone().unwrap_or_default();
    c.image_pull_policy
        .get_or_insert_with(|| default_pull_policy(&image).into());
    c.termination_message_path
        .get_or_insert_with(|| "/dev/termination-log".into());
    c.termination_message_policy
        .get_or_insert_with(|| "File".into());
    for p in c.ports.iter_mut().flatten() {
        p.protocol.get_or_insert_with(|| "TCP".into());
    }
}

/// `Always` for an image with no tag or the `latest` tag, else `IfNotPresent`.
pub fn default_pull_policy(image: &str) -> &'static str {
    if image_tag(image).is_none_or(|t| t == "latest") && !image.contains('@') {
        "Always"
    } else {
        "IfNotPresent"
    }
}

/// The tag of an image reference, if it names one (a `:` after the last `/`).
fn image_tag(image: &str) -> Option<&str> {
    let name = image.split('@').next().unwrap_or(image);
    let last = name.rsplit('/').next().unwrap_or(name);
    last.split_once(':').map(|(_, t)| t)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn pull_policy_follows_the_tag() {
        assert_eq!(default_pull_policy("busybox"), "Always");
        assert_eq!(default_pull_policy("busybox:latest"), "Always");
        assert_eq!(default_pull_policy("127.0.0.1:5000/app"), "Always");
        assert_eq!(
            default_pull_policy("127.0.0.1:5000/app:1.0"),
            "IfNotPresent"
        );
        assert_eq!(default_pull_policy("app@sha256:abcd"), "IfNotPresent");
    }
}
