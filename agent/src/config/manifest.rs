//! Reading Pod manifests: files and directories of files. As kubelet does, a manifest is
//! one pod: its first YAML document; any further document is named as unread. A bad
//! manifest is reported with its file and field, and never stops the others.

use std::fmt;
use std::path::{Path, PathBuf};

use k8s_openapi::api::core::v1::Pod;

use super::{api_references, defaults, static_pod, validate};

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
        source: super::yaml::YamlError,
    },
    /// The document is YAML but not a `v1` `Pod`.
    #[error("{source_at}: not a Pod: {found}")]
    NotAPod { source_at: PodSource, found: String },
    /// The file holds more than one YAML document. kubelet decodes a static pod
    /// manifest as one object: it reads the first document and never sees the rest.
    #[error(
        "{}: {} not read: kubelet reads only a manifest's first YAML document{}; put each pod in a file of its own",
        file.display(),
        list(ignored),
        match read { Some((ns, name)) => format!(" (it read document 0, pod {ns}/{name})"), None => String::new() }
    )]
    ExtraDocuments {
        file: PathBuf,
        /// The pod read from the first document, if it was one.
        read: Option<(String, String)>,
        /// The 0-based indexes of the documents left unread.
        ignored: Vec<usize>,
    },
    /// A field is missing, has the wrong type, or has a value podlapse rejects.
    #[error("{source_at}: field {field}: {problem}")]
    Field {
        source_at: PodSource,
        field: String,
        problem: String,
        /// The pod's namespace and name (`<name>-<node>`, as it would run), when the
        /// document names one.
        pod: Option<Box<(String, String)>>,
    },
}

/// `document 1`, or `documents 2, 3`.
fn list(indexes: &[usize]) -> String {
    let numbers = indexes
        .iter()
        .map(usize::to_string)
        .collect::<Vec<_>>()
        .join(", ");
    if indexes.len() == 1 {
        format!("document {numbers}")
    } else {
        format!("documents {numbers}")
    }
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
            ManifestError::Read { path, .. } | ManifestError::ExtraDocuments { file: path, .. } => {
                path.display().to_string()
            }
            ManifestError::Yaml { source_at, .. }
            | ManifestError::NotAPod { source_at, .. }
            | ManifestError::Field { source_at, .. } => source_at.to_string(),
        }
    }

    /// The file the error is about.
    pub fn file(&self) -> &Path {
        match self {
            ManifestError::Read { path, .. } | ManifestError::ExtraDocuments { file: path, .. } => {
                path
            }
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
    let (docs, syntax) = super::yaml::documents(text);
    let mut read = None;
    let mut documents = docs.into_iter().enumerate();
    match documents.next() {
        // An empty file, or one holding only comments.
        None | Some((_, serde_json::Value::Null)) => {}
        Some((document, value)) => {
            let source_at = PodSource {
                file: file.to_path_buf(),
                document,
            };
            match parse_pod(value, &source_at, node_name) {
                Ok(pod) => {
                    read = Some((
                        pod.metadata.namespace.clone().unwrap_or_default(),
                        pod.metadata.name.clone().unwrap_or_default(),
                    ));
                    pods.push(StaticPod {
                        pod,
                        source: source_at,
                    });
                }
                Err(e) => errors.push(e),
            }
        }
    }
    // What kubelet never reads is named, not run: an empty document (a trailing `---`)
    // holds nothing to lose, and one that does not parse is still left unread.
    let mut ignored: Vec<usize> = documents
        .filter(|(_, v)| !v.is_null())
        .map(|(i, _)| i)
        .collect();
    if let Some(source) = syntax {
        let document = read_count(text, &source);
        if document == 0 {
            errors.push(ManifestError::Yaml {
                source_at: PodSource {
                    file: file.to_path_buf(),
                    document: 0,
                },
                source,
            });
            return;
        }
        ignored.push(document);
    }
    if !ignored.is_empty() {
        errors.push(ManifestError::ExtraDocuments {
            file: file.to_path_buf(),
            read,
            ignored,
        });
    }
}

/// Which document a syntax error is in: the `---` lines before its line.
fn read_count(text: &str, e: &super::yaml::YamlError) -> usize {
    let starts = text
        .lines()
        .take(e.line.saturating_sub(1))
        .filter(|l| l.trim_end() == "---" || l.starts_with("--- "))
        .count();
    // A leading `---` opens the first document rather than a second.
    let leading = text
        .lines()
        .find(|l| !l.trim().is_empty() && !l.trim_start().starts_with('#'))
        .is_some_and(|l| l.trim_end() == "---" || l.starts_with("--- "));
    starts - usize::from(leading && starts > 0)
}

fn parse_pod(
    value: serde_json::Value,
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
    // A pod refused below is still shown where it would be: under the name it would
    // run as.
    let named = value.get("metadata").and_then(|m| {
        let name = static_pod::static_pod_name(m.get("name")?.as_str()?, node_name);
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
    let refused = |(field, problem): (String, String)| ManifestError::Field {
        source_at: source_at.clone(),
        field,
        problem,
        pod: named.clone(),
    };
    // kubelet's decode of a static pod: the API's defaults, then the file source's (the
    // UID, the name `<name>-<node>`, the node's name), validation, then the ban on API
    // references; only then what podlapse itself cannot run.
    defaults::apply(&mut pod);
    static_pod::apply(&mut pod, node_name, &source_at.file);
    validate::validate(&pod).map_err(refused)?;
    if let Some((field, resource)) = api_references::api_object_reference(&pod).map_err(refused)? {
        return Err(refused((
            field,
            format!("static pods may not reference {resource}"),
        )));
    }
    validate::supported(&pod).map_err(refused)?;
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

    const GOOD: &str = "apiVersion: v1\nkind: Pod\nmetadata: {name: web}\nspec:\n  containers:\n  - {name: app, image: 127.0.0.1:5000/podlapse/app:1.0}\n";

    #[test]
    fn only_the_first_document_is_read_and_the_rest_are_named() {
        let text = format!(
            "{GOOD}---\n---\napiVersion: v1\nkind: Service\nmetadata: {{name: s}}\n---\n{}",
            GOOD.replace("web", "db")
        );
        let (pods, errors) = load(&text);
        let names: Vec<_> = pods
            .iter()
            .map(|p| p.pod.metadata.name.clone().unwrap())
            .collect();
        assert_eq!(
            names,
            ["web-node-a"],
            "kubelet names a static pod <name>-<node>"
        );
        assert_eq!(errors.len(), 1, "{errors:?}");
        assert_eq!(
            errors[0].to_string(),
            "pods.yaml: documents 2, 3 not read: kubelet reads only a manifest's first YAML \
             document (it read document 0, pod default/web-node-a); put each pod in a file of its own"
        );
    }

    #[test]
    fn a_trailing_separator_is_no_second_document() {
        let (pods, errors) = load(&format!("---\n{GOOD}---\n"));
        assert_eq!(pods.len(), 1);
        assert!(errors.is_empty(), "{errors:?}");
    }

    #[test]
    fn a_bad_first_document_is_named_and_the_rest_still_unread() {
        let text = format!(
            "apiVersion: v1\nkind: Service\nmetadata: {{name: s}}\n---\n{}",
            GOOD.replace("web", "db")
        );
        let (pods, errors) = load(&text);
        assert!(pods.is_empty());
        let msgs: Vec<String> = errors.iter().map(|e| e.to_string()).collect();
        assert!(
            msgs[0].contains("pods.yaml (document 0)") && msgs[0].contains("Service"),
            "{msgs:?}"
        );
        assert!(
            msgs[1].starts_with("pods.yaml: document 1 not read") && !msgs[1].contains("it read"),
            "{msgs:?}"
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
