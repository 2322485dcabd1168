//! Reading Pod manifests: files, several YAML documents per file, directories of files.
//! A bad document is reported with its file, index and field, and never stops the others.

use std::fmt;
use std::path::{Path, PathBuf};

use k8s_openapi::api::core::v1::Pod;
use serde::Deserialize;

use super::{defaults, uid, validate};

/// Where a pod came from: the file and the 0-based index of the YAML document within it.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, serde::Serialize)]
pub struct PodSource {
    pub file: PathBuf,
    pub document: usize,
}

impl fmt::Display for PodSource {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{} (document {})", self.file.display(), self.document)
    }
}

/// A pod read from a manifest, defaulted and validated, with its stable UID.
#[derive(Debug, Clone)]
pub struct StaticPod {
    pub pod: Pod,
    pub source: PodSource,
}

/// Why a manifest, or one document in it, was not turned into a pod.
#[derive(Debug, thiserror::Error)]
pub enum ManifestError {
    /// The file or directory could not be read.
    #[error("{}: cannot read: {source}", path.display())]
    Read {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    /// The document is not valid YAML.
    #[error("{source_at}: invalid YAML: {source}")]
    Yaml {
        source_at: PodSource,
        #[source]
        source: serde_yaml::Error,
    },
    /// The document is YAML but not a `v1` `Pod`.
    #[error("{source_at}: not a Pod: {found}")]
    NotAPod { source_at: PodSource, found: String },
    /// A field is missing, has the wrong type, or has a value podtrace rejects.
    #[error("{source_at}: field {field}: {problem}")]
    Field {
        source_at: PodSource,
        field: String,
        problem: String,
        /// The pod's namespace and name, when the document names one.
        pod: Option<Box<(String, String)>>,
    },
}

impl ManifestError {
    /// The pod the error is about, when the document names one.
    pub fn pod(&self) -> Option<&(String, String)> {
        match self {
            ManifestError::Field { pod, .. } => pod.as_deref(),
            _ => None,
        }
    }

    /// Where the error is: the file and document, or the path.
    pub fn location(&self) -> String {
        match self {
            ManifestError::Read { path, .. } => path.display().to_string(),
            ManifestError::Yaml { source_at, .. }
            | ManifestError::NotAPod { source_at, .. }
            | ManifestError::Field { source_at, .. } => source_at.to_string(),
        }
    }

    /// The file the error is about.
    pub fn file(&self) -> &Path {
        match self {
            ManifestError::Read { path, .. } => path,
            ManifestError::Yaml { source_at, .. }
            | ManifestError::NotAPod { source_at, .. }
            | ManifestError::Field { source_at, .. } => &source_at.file,
        }
    }
}

/// File name endings read from a directory, as kubelet's file source does.
const MANIFEST_EXTENSIONS: [&str; 3] = ["yaml", "yml", "json"];

/// Reads every pod from the given files and directories (not recursive; hidden files
/// skipped). Pods come out in path order, then document order.
pub fn load_paths(paths: &[PathBuf], node_name: &str) -> (Vec<StaticPod>, Vec<ManifestError>) {
    let mut pods = Vec::new();
    let mut errors = Vec::new();
    for file in expand(paths, &mut errors) {
        match std::fs::read_to_string(&file) {
            Ok(text) => load_text(&file, &text, node_name, &mut pods, &mut errors),
            // Removed between the listing and the read: it is no longer a manifest, and
            // the watch that follows reads the directory without it.
            Err(source) if source.kind() == std::io::ErrorKind::NotFound => {}
            Err(source) => errors.push(ManifestError::Read { path: file, source }),
        }
    }
    (pods, errors)
}

/// Reads the pods in `text`, the contents of manifest `file` (YAML or JSON, several
/// documents): what [`load_paths`] does with each file it reads.
pub fn parse_manifest_text(
    file: &Path,
    text: &str,
    node_name: &str,
) -> (Vec<StaticPod>, Vec<ManifestError>) {
    let (mut pods, mut errors) = (Vec::new(), Vec::new());
    load_text(file, text, node_name, &mut pods, &mut errors);
    (pods, errors)
}

fn expand(paths: &[PathBuf], errors: &mut Vec<ManifestError>) -> Vec<PathBuf> {
    let mut files = Vec::new();
    for path in paths {
        match std::fs::metadata(path) {
            Ok(meta) if meta.is_dir() => match std::fs::read_dir(path) {
                Ok(entries) => {
                    let mut found: Vec<PathBuf> = entries
                        .filter_map(|e| e.ok().map(|e| e.path()))
                        .filter(|p| is_manifest_file(p))
                        .collect();
                    found.sort();
                    files.extend(found);
                }
                Err(source) => errors.push(ManifestError::Read {
                    path: path.clone(),
                    source,
                }),
            },
            Ok(_) => files.push(path.clone()),
            Err(source) => errors.push(ManifestError::Read {
                path: path.clone(),
                source,
            }),
        }
    }
    files
}

fn is_manifest_file(p: &Path) -> bool {
    let hidden = p
        .file_name()
        .and_then(|n| n.to_str())
        .is_none_or(|n| n.starts_with('.'));
    let ext_ok = p
        .extension()
        .and_then(|e| e.to_str())
        .is_some_and(|e| MANIFEST_EXTENSIONS.contains(&e));
    !hidden && ext_ok && p.is_file()
}

fn load_text(
    file: &Path,
    text: &str,
    node_name: &str,
    pods: &mut Vec<StaticPod>,
    errors: &mut Vec<ManifestError>,
) {
    for (document, de) in serde_yaml::Deserializer::from_str(text).enumerate() {
        let source_at = PodSource {
            file: file.to_path_buf(),
            document,
        };
        let value = match serde_yaml::Value::deserialize(de) {
            Ok(v) => v,
            Err(source) => {
                errors.push(ManifestError::Yaml { source_at, source });
                // The YAML stream cannot be resynchronised after a syntax error.
                break;
            }
        };
        if value.is_null() {
            continue; // an empty document, e.g. a trailing `---`
        }
        match parse_pod(value, &source_at, node_name) {
            Ok(pod) => pods.push(StaticPod {
                pod,
                source: source_at,
            }),
            Err(e) => errors.push(e),
        }
    }
}

fn parse_pod(
    value: serde_yaml::Value,
    source_at: &PodSource,
    node_name: &str,
) -> Result<Pod, ManifestError> {
    let kind = value.get("kind").and_then(|k| k.as_str()).unwrap_or("");
    let api_version = value
        .get("apiVersion")
        .and_then(|k| k.as_str())
        .unwrap_or("");
    if kind != "Pod" || api_version != "v1" {
        let found = match (kind, api_version) {
            ("", _) => "no kind".to_string(),
            (k, v) => format!("kind {k:?} apiVersion {v:?} (want kind \"Pod\" apiVersion \"v1\")"),
        };
        return Err(ManifestError::NotAPod {
            source_at: source_at.clone(),
            found,
        });
    }
    let named = value.get("metadata").and_then(|m| {
        let name = m.get("name")?.as_str()?.to_string();
        let ns = m
            .get("namespace")
            .and_then(|n| n.as_str())
            .unwrap_or(super::defaults::DEFAULT_NAMESPACE)
            .to_string();
        Some(Box::new((ns, name)))
    });
    let mut pod: Pod = serde_path_to_error::deserialize(value).map_err(|e| {
        let field = e.path().to_string();
        ManifestError::Field {
            source_at: source_at.clone(),
            field: if field == "." {
                "(document)".into()
            } else {
                field
            },
            problem: e.into_inner().to_string(),
            pod: named.clone(),
        }
    })?;
    validate::validate(&pod).map_err(|(field, problem)| ManifestError::Field {
        source_at: source_at.clone(),
        field,
        problem,
        pod: named.clone(),
    })?;
    defaults::apply(&mut pod, node_name);
    let uid = uid::static_pod_uid(&pod, node_name, &source_at.file);
    pod.metadata.uid = Some(uid);
    Ok(pod)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn load(text: &str) -> (Vec<StaticPod>, Vec<ManifestError>) {
        let mut pods = Vec::new();
        let mut errors = Vec::new();
        load_text(
            Path::new("pods.yaml"),
            text,
            "node-a",
            &mut pods,
            &mut errors,
        );
        (pods, errors)
    }

    const GOOD: &str = "apiVersion: v1\nkind: Pod\nmetadata: {name: web}\nspec:\n  containers:\n  - {name: app, image: 127.0.0.1:5000/podtrace/app:1.0}\n";

    #[test]
    fn several_documents_and_empty_ones() {
        let text = format!("{GOOD}---\n---\n{}", GOOD.replace("web", "db"));
        let (pods, errors) = load(&text);
        assert!(errors.is_empty(), "{errors:?}");
        let names: Vec<_> = pods
            .iter()
            .map(|p| p.pod.metadata.name.clone().unwrap())
            .collect();
        assert_eq!(names, ["web", "db"]);
        assert_eq!(pods[1].source.document, 2);
    }

    #[test]
    fn a_bad_document_does_not_stop_the_others() {
        let text = format!(
            "{GOOD}---\napiVersion: v1\nkind: Service\nmetadata: {{name: s}}\n---\n{}",
            GOOD.replace("web", "db")
        );
        let (pods, errors) = load(&text);
        assert_eq!(pods.len(), 2);
        assert_eq!(errors.len(), 1);
        let msg = errors[0].to_string();
        assert!(
            msg.contains("pods.yaml (document 1)") && msg.contains("Service"),
            "{msg}"
        );
    }

    #[test]
    fn missing_required_field_is_named() {
        let (_, errors) = load("apiVersion: v1\nkind: Pod\nmetadata: {name: x}\nspec: {}\n");
        let msg = errors[0].to_string();
        assert!(msg.contains("containers"), "{msg}");
        assert!(msg.contains("document 0"), "{msg}");
    }

    #[test]
    fn wrong_type_names_the_path() {
        let (_, errors) = load(
            "apiVersion: v1\nkind: Pod\nmetadata: {name: x}\nspec:\n  containers:\n  - name: a\n    image: i\n    ports: [{containerPort: eighty}]\n",
        );
        let msg = errors[0].to_string();
        assert!(
            msg.contains("spec.containers[0].ports[0].containerPort"),
            "{msg}"
        );
    }

    #[test]
    fn invalid_yaml_is_reported_with_file() {
        let (pods, errors) = load("apiVersion: v1\nkind: Pod\nmetadata: {name: x\n");
        assert!(pods.is_empty());
        let msg = errors[0].to_string();
        assert!(
            msg.starts_with("pods.yaml (document 0): invalid YAML"),
            "{msg}"
        );
    }

    #[test]
    fn uid_is_stable_across_loads_and_spec_edits_but_not_names() {
        let (a, _) = load(GOOD);
        let (b, _) = load(GOOD);
        let (edited, _) = load(&GOOD.replace("app:1.0", "app:2.0"));
        let (renamed, _) = load(&GOOD.replace("name: web", "name: web2"));
        assert_eq!(a[0].pod.metadata.uid, b[0].pod.metadata.uid);
        assert_eq!(a[0].pod.metadata.uid, edited[0].pod.metadata.uid);
        assert_ne!(a[0].pod.metadata.uid, renamed[0].pod.metadata.uid);
    }
}
