//! Image pull credentials from a pod's `imagePullSecrets`: kubelet's
//! pkg/credentialprovider (the keyring and its matching) fed from secrets kept as files,
//! `<secrets_dir>/<name>.json`, in place of the API server's Secret objects.
//!
//! A file holds a docker config: `{"auths": {"<registry>": {"auth": "<base64 user:pass>"}}}`
//! or with `username` / `password` fields, the legacy `.dockercfg` map without `auths`, or
//! a whole `kubernetes.io/dockerconfigjson` / `kubernetes.io/dockercfg` Secret as JSON.
//!
//! As in kubelet, a secret that cannot be found does not stop the pull: it becomes a
//! [`CredentialWarning`] (kubelet's `FailedToRetrieveImagePullSecret` event) and the pull
//! goes ahead with what was found, anonymously if nothing matches. A secret that is there
//! but malformed is a [`CredentialError`], as kubelet fails the pull when it cannot build
//! the keyring. Credentials never appear in errors, warnings, `Debug` output or logs.

mod config;
mod error;
mod image;
mod keyring;

use std::collections::BTreeSet;
use std::fmt;
use std::io::ErrorKind;
use std::path::{Path, PathBuf};

use k8s_openapi::api::core::v1::Pod;

pub use error::CredentialError;

use crate::cri::api;

/// The reason of the warning event for pull secrets that could not be read.
pub const FAILED_TO_RETRIEVE_IMAGE_PULL_SECRET: &str = "FailedToRetrieveImagePullSecret";

/// One credential that matches an image, and where it came from.
#[derive(Clone, PartialEq)]
pub struct Credential {
    /// The pull secret's name.
    pub secret: String,
    /// The registry key it matched by (`host[:port][/path]`, possibly a host glob).
    pub registry: String,
    pub auth: api::AuthConfig,
}

impl fmt::Debug for Credential {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Credential")
            .field("secret", &self.secret)
            .field("registry", &self.registry)
            .finish_non_exhaustive()
    }
}

/// A pull secret that could not be read; the pull goes ahead without it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum CredentialWarning {
    /// `<secrets_dir>/<name>.json` does not exist.
    NotFound { secret: String, path: PathBuf },
    /// The file exists but cannot be read.
    Unreadable {
        secret: String,
        path: PathBuf,
        error: String,
    },
    /// The name cannot be a Secret's name, so it names no file.
    InvalidName { secret: String },
}

impl CredentialWarning {
    pub fn secret(&self) -> &str {
        match self {
            CredentialWarning::NotFound { secret, .. }
            | CredentialWarning::Unreadable { secret, .. }
            | CredentialWarning::InvalidName { secret } => secret,
        }
    }
}

impl fmt::Display for CredentialWarning {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            CredentialWarning::NotFound { secret, path } => {
                write!(
                    f,
                    "pull secret {secret:?}: {} does not exist",
                    path.display()
                )
            }
            CredentialWarning::Unreadable {
                secret,
                path,
                error,
            } => write!(
                f,
                "pull secret {secret:?}: reading {}: {error}",
                path.display()
            ),
            CredentialWarning::InvalidName { secret } => {
                write!(f, "pull secret {secret:?} is not a valid Secret name")
            }
        }
    }
}

/// kubelet's event message for the secrets that could not be read, if any.
pub fn failed_secrets_message(warnings: &[CredentialWarning]) -> Option<String> {
    if warnings.is_empty() {
        return None;
    }
    let names: Vec<&str> = warnings.iter().map(CredentialWarning::secret).collect();
    Some(format!(
        "Unable to retrieve some image pull secrets ({}); attempting to pull the image may not succeed.",
        names.join(", ")
    ))
}

/// A pod's pull secrets, read once per sync as kubelet reads them, then matched against
/// each image.
#[derive(Debug, Default)]
pub struct PullSecrets {
    keyring: keyring::Keyring,
    pub warnings: Vec<CredentialWarning>,
}

impl PullSecrets {
    /// Credentials for `image`, most specific registry key first; kubelet tries each in
    /// turn until a pull succeeds. Empty means pull anonymously.
    pub fn lookup(&self, image: &str) -> Result<Vec<Credential>, CredentialError> {
        let repo = image::repo_to_pull(image).map_err(|reason| CredentialError::InvalidImage {
            image: image.to_string(),
            reason,
        })?;
        Ok(self.keyring.lookup(&repo))
    }
}

/// Reads every secret `spec.imagePullSecrets` names from `secrets_dir`. Entries with no
/// name are skipped as kubelet skips them; a name listed twice is read once.
pub fn load_pull_secrets(secrets_dir: &Path, pod: &Pod) -> Result<PullSecrets, CredentialError> {
    let mut out = PullSecrets::default();
    let mut seen = BTreeSet::new();
    let names = pod
        .spec
        .iter()
        .flat_map(|s| s.image_pull_secrets.iter().flatten())
        .map(|r| r.name.as_str())
        .filter(|n| !n.is_empty());
    for name in names {
        if !seen.insert(name) {
            continue;
        }
        if !valid_secret_name(name) {
            out.warnings.push(CredentialWarning::InvalidName {
                secret: name.to_string(),
            });
            continue;
        }
        let path = secrets_dir.join(format!("{name}.json"));
        let bytes = match std::fs::read(&path) {
            Ok(b) => b,
            Err(e) if e.kind() == ErrorKind::NotFound => {
                out.warnings.push(CredentialWarning::NotFound {
                    secret: name.to_string(),
                    path,
                });
                continue;
            }
            Err(e) => {
                out.warnings.push(CredentialWarning::Unreadable {
                    secret: name.to_string(),
                    path,
                    error: e.to_string(),
                });
                continue;
            }
        };
        let src = config::Source {
            secret: name,
            path: &path,
        };
        out.keyring.add(name, config::parse(&bytes, &src)?);
    }
    Ok(out)
}

/// What [`lookup_auth`] found for one image.
#[derive(Debug, Default)]
pub struct AuthLookup {
    /// Matching credentials, most specific first; empty means pull anonymously.
    pub credentials: Vec<Credential>,
    /// Pull secrets that could not be read, for a `FailedToRetrieveImagePullSecret` event.
    pub warnings: Vec<CredentialWarning>,
}

impl AuthLookup {
    /// The credential to pull with first.
    pub fn auth(&self) -> Option<&api::AuthConfig> {
        self.credentials.first().map(|c| &c.auth)
    }

    pub fn into_auth(self) -> Option<api::AuthConfig> {
        self.credentials.into_iter().next().map(|c| c.auth)
    }

    /// kubelet's warning event message, when some secret could not be read.
    pub fn warning_message(&self) -> Option<String> {
        failed_secrets_message(&self.warnings)
    }
}

/// The pull credentials for `image` from the pod's pull secrets in `secrets_dir`: reads
/// the secrets and matches the image's registry host and path against them.
pub fn lookup_auth(
    secrets_dir: &Path,
    pod: &Pod,
    image: &str,
) -> Result<AuthLookup, CredentialError> {
    let secrets = load_pull_secrets(secrets_dir, pod)?;
    Ok(AuthLookup {
        credentials: secrets.lookup(image)?,
        warnings: secrets.warnings,
    })
}

/// A Secret name is a DNS subdomain; anything else (`..`, `/`) must not reach a path.
fn valid_secret_name(name: &str) -> bool {
    name.len() <= 253
        && name.split('.').all(|label| {
            !label.is_empty()
                && label
                    .bytes()
                    .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-')
                && !label.starts_with('-')
                && !label.ends_with('-')
        })
}

#[cfg(test)]
mod tests {
    use base64::Engine;
    use base64::engine::general_purpose::STANDARD;

    use super::*;

    fn pod(secrets: &[&str]) -> Pod {
        serde_json::from_value(serde_json::json!({
            "metadata": {"name": "p", "namespace": "default", "uid": "u"},
            "spec": {
                "containers": [{"name": "c", "image": "127.0.0.1:5000/podlapse/app:1.0"}],
                "imagePullSecrets": secrets.iter().map(|s| serde_json::json!({"name": s})).collect::<Vec<_>>(),
            },
        }))
        .unwrap()
    }

    fn write_secret(dir: &Path, name: &str, registry: &str, user: &str, pass: &str) {
        let doc = serde_json::json!({
            "auths": {registry: {"auth": STANDARD.encode(format!("{user}:{pass}"))}}
        });
        std::fs::write(dir.join(format!("{name}.json")), doc.to_string()).unwrap();
    }

    #[test]
    fn finds_the_registry_credential() {
        let dir = tempfile::tempdir().unwrap();
        write_secret(dir.path(), "regcred", "127.0.0.1:5000", "alice", "hunter2");
        write_secret(dir.path(), "other", "quay.io", "bob", "pw");
        let got = lookup_auth(
            dir.path(),
            &pod(&["other", "regcred"]),
            "127.0.0.1:5000/podlapse/app:1.0",
        )
        .unwrap();
        let auth = got.auth().expect("a credential");
        assert_eq!(
            (auth.username.as_str(), auth.password.as_str()),
            ("alice", "hunter2")
        );
        assert_eq!(got.credentials.len(), 1);
        assert_eq!(got.credentials[0].secret, "regcred");
        assert!(got.warnings.is_empty());
        assert_eq!(got.warning_message(), None);
        let text = format!("{got:?}");
        assert!(
            !text.contains("hunter2") && !text.contains("alice"),
            "{text}"
        );
    }

    #[test]
    fn no_match_means_anonymous() {
        let dir = tempfile::tempdir().unwrap();
        write_secret(dir.path(), "regcred", "quay.io", "bob", "pw");
        let got = lookup_auth(dir.path(), &pod(&["regcred"]), "127.0.0.1:5000/app").unwrap();
        assert!(got.into_auth().is_none());
        let none = lookup_auth(dir.path(), &pod(&[]), "127.0.0.1:5000/app").unwrap();
        assert!(none.credentials.is_empty() && none.warnings.is_empty());
    }

    #[test]
    fn missing_secrets_warn_and_the_rest_still_match() {
        let dir = tempfile::tempdir().unwrap();
        write_secret(dir.path(), "regcred", "127.0.0.1:5000", "alice", "pw");
        let got = lookup_auth(
            dir.path(),
            &pod(&["gone", "regcred", "", "../etc/passwd", "gone"]),
            "127.0.0.1:5000/app",
        )
        .unwrap();
        assert_eq!(got.auth().map(|a| a.username.as_str()), Some("alice"));
        assert_eq!(
            got.warnings,
            [
                CredentialWarning::NotFound {
                    secret: "gone".into(),
                    path: dir.path().join("gone.json"),
                },
                CredentialWarning::InvalidName {
                    secret: "../etc/passwd".into()
                },
            ]
        );
        assert_eq!(
            got.warning_message().unwrap(),
            "Unable to retrieve some image pull secrets (gone, ../etc/passwd); attempting to \
             pull the image may not succeed."
        );
    }

    #[test]
    fn a_malformed_secret_fails_the_lookup_without_leaking() {
        let dir = tempfile::tempdir().unwrap();
        std::fs::write(
            dir.path().join("bad.json"),
            r#"{"auths": {"127.0.0.1:5000": {"auth": "hunter2!"}}}"#,
        )
        .unwrap();
        let err = lookup_auth(dir.path(), &pod(&["bad"]), "127.0.0.1:5000/app").unwrap_err();
        let text = err.to_string();
        assert!(text.contains("bad") && !text.contains("hunter2"), "{text}");
        assert!(matches!(err, CredentialError::Malformed { .. }));
    }

    #[test]
    fn an_invalid_image_is_an_error() {
        let dir = tempfile::tempdir().unwrap();
        let err = lookup_auth(dir.path(), &pod(&[]), "Not An Image").unwrap_err();
        assert!(matches!(err, CredentialError::InvalidImage { .. }));
    }

    #[test]
    fn secrets_load_once_for_many_images() {
        let dir = tempfile::tempdir().unwrap();
        write_secret(dir.path(), "a", "127.0.0.1:5000/podlapse", "scoped", "pw");
        write_secret(dir.path(), "b", "127.0.0.1:5000", "wide", "pw");
        let secrets = load_pull_secrets(dir.path(), &pod(&["b", "a"])).unwrap();
        let users = |image| -> Vec<String> {
            secrets
                .lookup(image)
                .unwrap()
                .into_iter()
                .map(|c| c.auth.username)
                .collect()
        };
        assert_eq!(users("127.0.0.1:5000/podlapse/app:1"), ["scoped", "wide"]);
        assert_eq!(users("127.0.0.1:5000/pause"), ["wide"]);
    }

    #[test]
    fn secret_names() {
        for ok in ["regcred", "my-secret.v1", "a"] {
            assert!(valid_secret_name(ok), "{ok}");
        }
        for bad in ["..", "a/b", "-x", "UPPER", "a..b", ""] {
            assert!(!valid_secret_name(bad), "{bad}");
        }
    }
}
