//! Pod sources: where desired pods come from. Today that is static manifests (files and
//! directories of Pod YAML), kubelet's "file" source.

mod api_references;
mod defaults;
mod manifest;
pub mod source;
mod static_pod;
mod uid;
mod validate;
mod yaml;

pub use validate::validate;

pub use manifest::{ManifestError, PodSource, StaticPod, load_paths, parse_manifest_text};
pub use static_pod::{CONFIG_HASH_ANNOTATION, CONFIG_SOURCE_ANNOTATION, static_pod_name};
pub use uid::static_pod_uid;
