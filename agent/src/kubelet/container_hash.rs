//! kubelet stamps each container with a hash of the spec it was created from, so a
//! changed manifest restarts exactly the containers whose spec changed.

use k8s_openapi::api::core::v1::Container;
use sha2::{Digest, Sha256};

/// A short, stable hash of a container's spec.
pub fn container_hash(c: &Container) -> String {
    let bytes = serde_json::to_vec(c).unwrap_or_default();
    let d = Sha256::digest(&bytes);
    d[..4].iter().map(|b| format!("{b:02x}")).collect()
}
