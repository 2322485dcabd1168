//! The downward API as kubelet resolves it: pod fields (`fieldRef`) and container
//! resources (`resourceFieldRef`, rounded up in units of the divisor, a missing limit
//! read as the node's allocatable), and the files of a `downwardAPI` volume with their
//! modes. Pure: everything it reads is an argument.

use std::collections::BTreeMap;

use k8s_openapi::api::core::v1::{
    Container, DownwardAPIVolumeSource, ObjectFieldSelector, Pod, ResourceFieldSelector,
};
use k8s_openapi::apimachinery::pkg::api::resource::Quantity;

use super::admission::NodeAllocatable;
use super::quantity;

/// kubelet's default mode for a downwardAPI volume's files.
pub const DEFAULT_MODE: i32 = 0o644;

/// A file of a downwardAPI volume: path inside the volume, contents, mode.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct VolumeFile {
    pub path: String,
    pub contents: String,
    pub mode: i32,
}

/// Go's `%q` of a string: double-quoted, with Go's escapes.
fn go_quote(s: &str) -> String {
    let mut out = String::with_capacity(s.len() + 2);
    out.push('"');
    for c in s.chars() {
        match c {
            '"' => out.push_str("\\\""),
            '\\' => out.push_str("\\\\"),
            '\n' => out.push_str("\\n"),
            '\t' => out.push_str("\\t"),
            '\r' => out.push_str("\\r"),
            '\u{7}' => out.push_str("\\a"),
            '\u{8}' => out.push_str("\\b"),
            '\u{c}' => out.push_str("\\f"),
            '\u{b}' => out.push_str("\\v"),
            c if (c as u32) < 0x20 || c as u32 == 0x7f => {
                out.push_str(&format!("\\x{:02x}", c as u32));
            }
            c => out.push(c),
        }
    }
    out.push('"');
    out
}

/// kubelet's `fieldpath.FormatMap`: `key="value"` lines in key order.
pub fn format_map(m: &BTreeMap<String, String>) -> String {
    m.iter()
        .map(|(k, v)| format!("{k}={}", go_quote(v)))
        .collect::<Vec<_>>()
        .join("\n")
}

/// `metadata.labels['key']` and `metadata.annotations['key']`: the map and the key.
fn subscript(path: &str) -> Option<(&str, &str)> {
    let (map, rest) = path.split_once("['")?;
    let key = rest.strip_suffix("']")?;
    Some((map, key))
}

/// The metadata fields both env and volumes resolve (kubelet's `fieldpath.ExtractFieldPathAsString`).
pub fn metadata_field(pod: &Pod, path: &str) -> Option<String> {
    let meta = &pod.metadata;
    let empty = BTreeMap::new();
    let labels = meta.labels.as_ref().unwrap_or(&empty);
    let annotations = meta.annotations.as_ref().unwrap_or(&empty);
    if let Some((map, key)) = subscript(path) {
        return match map {
            "metadata.labels" => Some(labels.get(key).cloned().unwrap_or_default()),
            "metadata.annotations" => Some(annotations.get(key).cloned().unwrap_or_default()),
            _ => None,
        };
    }
    Some(match path {
        "metadata.name" => meta.name.clone().unwrap_or_default(),
        "metadata.namespace" => meta.namespace.clone().unwrap_or_default(),
        "metadata.uid" => meta.uid.clone().unwrap_or_default(),
        "metadata.labels" => format_map(labels),
        "metadata.annotations" => format_map(annotations),
        _ => return None,
    })
}

/// A container's resource as `resourceFieldRef` reads it: kubelet's
/// `ExtractResourceValueByContainerNameAndNodeAllocatable`, in units of the divisor
/// (default 1), rounded up. A limit the container does not set is the node's allocatable;
/// a request it does not set is its limit, as the API's defaulting makes it.
pub fn resource_value(
    c: &Container,
    sel: &ResourceFieldSelector,
    node: &NodeAllocatable,
) -> Result<String, String> {
    let divisor = sel
        .divisor
        .as_ref()
        .filter(|d| quantity::milli_value(d).is_some_and(|m| m != 0))
        .cloned()
        .unwrap_or_else(|| Quantity("1".into()));
    let res = c.resources.as_ref();
    let get = |which: &str, name: &str| -> Option<Quantity> {
        let list = match which {
            "limits" => res.and_then(|r| r.limits.as_ref()),
            _ => res.and_then(|r| r.requests.as_ref()),
        };
        list.and_then(|l| l.get(name))
            .filter(|q| quantity::milli_value(q).is_some_and(|m| m != 0))
            .cloned()
    };
    let (which, name) = sel
        .resource
        .split_once('.')
        .ok_or_else(|| format!("unsupported container resource : {}", sel.resource))?;
    let allocatable = |name: &str| match name {
        "cpu" => Some(Quantity(format!("{}m", node.milli_cpu))),
        "memory" => Some(Quantity(node.memory_bytes.to_string())),
        _ => None,
    };
    let q = match (which, name) {
        ("limits", "cpu" | "memory" | "ephemeral-storage") => {
            get("limits", name).or_else(|| allocatable(name))
        }
        ("requests", "cpu" | "memory" | "ephemeral-storage") => {
            get("requests", name).or_else(|| get("limits", name))
        }
        _ => return Err(format!("unsupported container resource : {}", sel.resource)),
    };
    let q = q.unwrap_or_else(|| Quantity("0".into()));
    let value = if name == "cpu" {
        let have = quantity::milli_value(&q).unwrap_or(0) as f64;
        let per = quantity::milli_value(&divisor).unwrap_or(1).max(1) as f64;
        (have / per).ceil()
    } else {
        let have = quantity::value(&q).unwrap_or(0) as f64;
        let per = quantity::value(&divisor).unwrap_or(1).max(1) as f64;
        (have / per).ceil()
    };
    Ok((value as i64).to_string())
}

fn field(pod: &Pod, f: &ObjectFieldSelector) -> Result<String, String> {
    metadata_field(pod, &f.field_path).ok_or_else(|| {
        format!(
            "unsupported fieldPath {:?} (a downwardAPI volume reads metadata fields)",
            f.field_path
        )
    })
}

/// The files of the pod's downwardAPI volume `source`, in item order.
pub fn volume_files(
    pod: &Pod,
    source: &DownwardAPIVolumeSource,
    node: &NodeAllocatable,
) -> Result<Vec<VolumeFile>, String> {
    let default_mode = source.default_mode.unwrap_or(DEFAULT_MODE);
    let containers: Vec<&Container> = pod
        .spec
        .iter()
        .flat_map(|s| s.init_containers.iter().flatten().chain(&s.containers))
        .collect();
    let mut out = Vec::new();
    for item in source.items.iter().flatten() {
        let contents = match (&item.field_ref, &item.resource_field_ref) {
            (Some(f), _) => field(pod, f)?,
            (None, Some(r)) => {
                let name = r.container_name.as_deref().unwrap_or_default();
                let c = containers
                    .iter()
                    .find(|c| c.name == name)
                    .ok_or_else(|| format!("container {name:?} not found in the pod"))?;
                resource_value(c, r, node)?
            }
            (None, None) => return Err(format!("item {:?} names no field", item.path)),
        };
        out.push(VolumeFile {
            path: item.path.clone(),
            contents,
            mode: item.mode.unwrap_or(default_mode),
        });
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn node() -> NodeAllocatable {
        NodeAllocatable {
            milli_cpu: 2000,
            memory_bytes: 4 * 1024 * 1024 * 1024,
            max_pods: 110,
        }
    }

    fn pod() -> Pod {
        serde_yaml::from_str(
            r#"
metadata:
  name: web
  namespace: shop
  uid: u-1
  labels: {app: web, tier: "front end"}
  annotations: {note: "say \"hi\"\n"}
spec:
  containers:
  - name: app
    image: i
    resources:
      requests: {cpu: 250m, memory: 100M}
      limits: {cpu: 500m}
  - name: bare
    image: i
"#,
        )
        .unwrap()
    }

    fn sel(resource: &str, divisor: Option<&str>) -> ResourceFieldSelector {
        ResourceFieldSelector {
            container_name: None,
            divisor: divisor.map(|d| Quantity(d.into())),
            resource: resource.into(),
        }
    }

    #[test]
    fn resources_round_up_in_units_of_the_divisor() {
        let p = pod();
        let app = &p.spec.as_ref().unwrap().containers[0];
        let bare = &p.spec.as_ref().unwrap().containers[1];
        let cases = [
            (app, "requests.cpu", None, "1"),
            (app, "requests.cpu", Some("1m"), "250"),
            (app, "limits.cpu", Some("1m"), "500"),
            (app, "requests.memory", Some("1Mi"), "96"),
            (app, "requests.memory", None, "100000000"),
            // No memory limit: the node's allocatable.
            (app, "limits.memory", Some("1Gi"), "4"),
            (bare, "limits.cpu", None, "2"),
            (bare, "requests.cpu", None, "0"),
            (app, "requests.cpu", Some("0"), "1"),
        ];
        for (c, resource, divisor, want) in cases {
            assert_eq!(
                resource_value(c, &sel(resource, divisor), &node()).unwrap(),
                want,
                "{} {resource} / {divisor:?}",
                c.name
            );
        }
        assert_eq!(
            resource_value(app, &sel("limits.gpu", None), &node()).unwrap_err(),
            "unsupported container resource : limits.gpu"
        );
    }

    #[test]
    fn metadata_maps_are_key_ordered_go_quoted_lines() {
        let p = pod();
        assert_eq!(
            metadata_field(&p, "metadata.labels").unwrap(),
            "app=\"web\"\ntier=\"front end\""
        );
        assert_eq!(
            metadata_field(&p, "metadata.annotations").unwrap(),
            "note=\"say \\\"hi\\\"\\n\""
        );
        assert_eq!(
            metadata_field(&p, "metadata.labels['tier']").unwrap(),
            "front end"
        );
        assert_eq!(metadata_field(&p, "metadata.namespace").unwrap(), "shop");
        assert_eq!(metadata_field(&p, "spec.nodeName"), None);
    }

    #[test]
    fn a_volume_lists_its_items_with_their_modes() {
        let p = pod();
        let source: DownwardAPIVolumeSource = serde_yaml::from_str(
            r#"
defaultMode: 0o440
items:
- {path: labels, fieldRef: {fieldPath: metadata.labels}}
- {path: cpu_millis, mode: 0o400, resourceFieldRef: {containerName: app, resource: limits.cpu, divisor: 1m}}
"#
            .replace("0o440", "288")
            .replace("0o400", "256")
            .as_str(),
        )
        .unwrap();
        let files = volume_files(&p, &source, &node()).unwrap();
        assert_eq!(
            files,
            [
                VolumeFile {
                    path: "labels".into(),
                    contents: "app=\"web\"\ntier=\"front end\"".into(),
                    mode: 0o440,
                },
                VolumeFile {
                    path: "cpu_millis".into(),
                    contents: "500".into(),
                    mode: 0o400,
                },
            ]
        );
    }
}
