//! kubelet stamps each container with a hash of the spec it was created from; a running
//! container whose hash no longer matches its spec is restarted. As in kubelet 1.37 the
//! hash covers only the fields a pod update may change and that need a new container:
//! the name and the image. Resources are resized in place (`resize_actions`), and every
//! other field cannot change without the pod being replaced.

use k8s_openapi::api::core::v1::Container;
use sha2::{Digest, Sha256};

/// A short, stable hash of the fields of a container's spec that restart it.
pub fn container_hash(c: &Container) -> String {
    let mut d = Sha256::new();
    d.update(c.name.as_bytes());
    d.update([0]);
    d.update(c.image.as_deref().unwrap_or_default().as_bytes());
    const HEX: &[u8; 16] = b"0123456789abcdef";
    let mut out = String::with_capacity(8);
    for b in &d.finalize()[..4] {
        out.push(char::from(HEX[usize::from(b >> 4)]));
        out.push(char::from(HEX[usize::from(b & 0xf)]));
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use k8s_openapi::api::core::v1::ResourceRequirements;

    fn c(image: &str) -> Container {
        Container {
            name: "app".into(),
            image: Some(image.into()),
            ..Container::default()
        }
    }

    #[test]
    fn only_the_name_and_image_change_the_hash() {
        let base = c("app:1");
        let mut other = base.clone();
        other.command = Some(vec!["sleep".into()]);
        other.resources = Some(ResourceRequirements::default());
        assert_eq!(container_hash(&base), container_hash(&other));
        assert_ne!(container_hash(&base), container_hash(&c("app:2")));
        let mut renamed = base.clone();
        renamed.name = "web".into();
        assert_ne!(container_hash(&base), container_hash(&renamed));
    }

    #[test]
    fn the_hash_is_the_first_four_bytes_of_sha256_in_lowercase_hex() {
        // The value running containers carry in their annotation: it must not change
        // between versions, or an upgraded agent would restart every container.
        // `printf 'app\0app:1' | sha256sum` begins 5bdc9c9b.
        assert_eq!(container_hash(&c("app:1")), "5bdc9c9b");
    }
}
