//! Static pods have no API server to assign a UID, so kubelet derives one from the pod's
//! content, the node and the file it came from. The same manifest keeps its UID across
//! agent restarts, which is what lets a restarted agent adopt its pods.

use std::path::Path;

use k8s_openapi::api::core::v1::Pod;
use sha2::{Digest, Sha256};

pub fn static_pod_uid(pod: &Pod, node_name: &str, file: &Path) -> String {
    let mut pod = pod.clone();
    pod.metadata.uid = None;
    // serde_json writes struct fields in declaration order and maps sorted (BTreeMap), so
    // the bytes are a canonical form of the pod.
    let canonical = serde_json::to_vec(&pod).unwrap_or_default();
    let mut h = Sha256::new();
    h.update(&canonical);
    h.update(format!("host:{node_name}").as_bytes());
    h.update(format!("file:{}", file.display()).as_bytes());
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
