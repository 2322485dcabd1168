//! Which AppArmor profile applies to a container, as kubelet's `apparmor.GetProfile`
//! finds it: the container's `appArmorProfile`, else the deprecated per-container
//! annotation, else the pod's `appArmorProfile`.

use k8s_openapi::api::core::v1::{AppArmorProfile, Container, Pod};

/// The AppArmor annotation kubelet still reads for a container (deprecated by the
/// `appArmorProfile` field, which wins when both are set).
pub const APPARMOR_ANNOTATION_PREFIX: &str = "container.apparmor.security.beta.kubernetes.io/";

/// The AppArmor profile that applies to `c`, if any (kubelet's `apparmor.GetProfile`).
pub fn container_apparmor(pod: &Pod, c: &Container) -> Option<AppArmorProfile> {
    if let Some(p) = c
        .security_context
        .as_ref()
        .and_then(|s| s.app_armor_profile.clone())
    {
        return Some(p);
    }
    let annotation = pod
        .metadata
        .annotations
        .as_ref()
        .and_then(|a| a.get(&format!("{APPARMOR_ANNOTATION_PREFIX}{}", c.name)));
    if let Some(value) = annotation {
        return Some(match value.as_str() {
            "runtime/default" => apparmor("RuntimeDefault", None),
            "unconfined" => apparmor("Unconfined", None),
            v => match v.strip_prefix("localhost/") {
                Some(name) => apparmor("Localhost", Some(name)),
                None => apparmor(v, None),
            },
        });
    }
    pod.spec
        .as_ref()?
        .security_context
        .as_ref()?
        .app_armor_profile
        .clone()
}

pub fn apparmor(kind: &str, name: Option<&str>) -> AppArmorProfile {
    AppArmorProfile {
        type_: kind.to_string(),
        localhost_profile: name.map(str::to_string),
    }
}
