//! Static pods have no API server to assign a UID, so kubelet derives one from the
//! manifest. podtrace derives it from the pod's identity in its manifest (file, namespace,
//! name) and the node: it stays the same across agent restarts, which is what lets a
//! restarted agent adopt its pods, and across edits of the spec, so an edited manifest
//! is an UPDATE that restarts only the changed containers rather than a new pod.

use std::path::Path;

use k8s_openapi::api::core::v1::Pod;
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
