//! Docker config files as pull secrets hold them: `{"auths": {...}}` (a
//! `.dockerconfigjson`, also `~/.docker/config.json`), the legacy bare map of a
//! `.dockercfg`, or a whole Secret object of either type.
//!
//! The JSON is walked by hand rather than deserialized into structs: serde's type errors
//! quote the offending value, and here that value may be a password.

use std::fmt;
use std::path::Path;

use base64::Engine;
use base64::engine::general_purpose::{STANDARD, STANDARD_NO_PAD};
use serde_json::{Map, Value};

use super::CredentialError;

/// Keys of a docker `config.json`; a top level with any of them is that format, not the
/// legacy map of registries.
const CONFIG_JSON_KEYS: &[&str] = &["auths", "credsStore", "credHelpers", "HttpHeaders"];

/// One registry's credentials, as kubelet's DockerConfigEntry after decoding `auth`.
#[derive(Clone, PartialEq, Eq)]
pub(super) struct DockerConfigEntry {
    /// The key as written: a host, `host/path`, a URL, or a host glob.
    pub registry: String,
    pub username: String,
    pub password: String,
}

impl fmt::Debug for DockerConfigEntry {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("DockerConfigEntry")
            .field("registry", &self.registry)
            .finish_non_exhaustive()
    }
}

/// Which secret is being read, for errors.
pub(super) struct Source<'a> {
    pub secret: &'a str,
    pub path: &'a Path,
}

impl Source<'_> {
    fn malformed(&self, problem: impl Into<String>) -> CredentialError {
        CredentialError::Malformed {
            secret: self.secret.to_string(),
            path: self.path.to_path_buf(),
            problem: problem.into(),
        }
    }

    fn json(&self, e: &serde_json::Error) -> CredentialError {
        CredentialError::Json {
            secret: self.secret.to_string(),
            path: self.path.to_path_buf(),
            line: e.line(),
            column: e.column(),
        }
    }
}

/// Every registry entry in one secret file.
pub(super) fn parse(
    bytes: &[u8],
    src: &Source<'_>,
) -> Result<Vec<DockerConfigEntry>, CredentialError> {
    let doc: Value = serde_json::from_slice(bytes).map_err(|e| src.json(&e))?;
    let Value::Object(top) = &doc else {
        return Err(src.malformed("the top level is not a JSON object"));
    };
    if is_secret_object(top) {
        return secret_object(top, src);
    }
    if CONFIG_JSON_KEYS.iter().any(|k| top.contains_key(*k)) {
        return match top.get("auths") {
            None | Some(Value::Null) => Ok(Vec::new()),
            Some(Value::Object(auths)) => entries(auths, src),
            Some(_) => Err(src.malformed("`auths` is not an object")),
        };
    }
    entries(top, src)
}

fn is_secret_object(top: &Map<String, Value>) -> bool {
    top.get("kind").and_then(Value::as_str) == Some("Secret")
        || (top.contains_key("type")
            && (top.contains_key("data") || top.contains_key("stringData")))
}

/// A Secret object, used as kubelet's MakeDockerKeyring uses one: the key its type names,
/// from `data` (base64) or `stringData`; a Secret of another type adds nothing.
fn secret_object(
    top: &Map<String, Value>,
    src: &Source<'_>,
) -> Result<Vec<DockerConfigEntry>, CredentialError> {
    let (key, wrapped) = match top.get("type").and_then(Value::as_str) {
        Some("kubernetes.io/dockerconfigjson") => (".dockerconfigjson", true),
        Some("kubernetes.io/dockercfg") => (".dockercfg", false),
        _ => return Ok(Vec::new()),
    };
    let field = |section: &str| top.get(section).and_then(|d| d.get(key));
    let raw: Vec<u8> = if let Some(v) = field("stringData") {
        v.as_str()
            .ok_or_else(|| src.malformed(format!("`stringData.{key}` is not a string")))?
            .as_bytes()
            .to_vec()
    } else if let Some(v) = field("data") {
        let text = v
            .as_str()
            .ok_or_else(|| src.malformed(format!("`data.{key}` is not a string")))?;
        STANDARD
            .decode(text)
            .map_err(|_| src.malformed(format!("`data.{key}` is not base64")))?
    } else {
        return Ok(Vec::new());
    };
    if raw.is_empty() {
        return Ok(Vec::new());
    }
    let inner: Value = serde_json::from_slice(&raw).map_err(|e| {
        src.malformed(format!(
            "`{key}` is not valid JSON: syntax error at line {}, column {}",
            e.line(),
            e.column()
        ))
    })?;
    let map = if wrapped {
        match inner.get("auths") {
            Some(Value::Object(a)) => a,
            None | Some(Value::Null) => return Ok(Vec::new()),
            Some(_) => return Err(src.malformed(format!("`auths` in `{key}` is not an object"))),
        }
    } else {
        inner
            .as_object()
            .ok_or_else(|| src.malformed(format!("`{key}` is not a JSON object")))?
    };
    entries(map, src)
}

fn entries(
    map: &Map<String, Value>,
    src: &Source<'_>,
) -> Result<Vec<DockerConfigEntry>, CredentialError> {
    map.iter()
        .map(|(registry, v)| entry(registry, v, src))
        .collect()
}

/// kubelet's DockerConfigEntry.UnmarshalJSON: `username`/`password`, overridden by
/// `auth` (base64 of `user:password`) when that is present.
fn entry(
    registry: &str,
    v: &Value,
    src: &Source<'_>,
) -> Result<DockerConfigEntry, CredentialError> {
    let Value::Object(fields) = v else {
        return Err(src.malformed(format!(
            "the entry for registry {registry:?} is not an object"
        )));
    };
    let string = |name: &str| -> Result<String, CredentialError> {
        match fields.get(name) {
            None | Some(Value::Null) => Ok(String::new()),
            Some(Value::String(s)) => Ok(s.clone()),
            Some(_) => Err(src.malformed(format!(
                "field `{name}` of registry {registry:?} is not a string"
            ))),
        }
    };
    let mut out = DockerConfigEntry {
        registry: registry.to_string(),
        username: string("username")?,
        password: string("password")?,
    };
    let auth = string("auth")?;
    if !auth.is_empty() {
        let (user, pass) = decode_auth(&auth).map_err(|problem| {
            src.malformed(format!("field `auth` of registry {registry:?} {problem}"))
        })?;
        out.username = user;
        out.password = pass;
    }
    Ok(out)
}

/// base64 of `user:password`, padded or not (kubelet picks the decoder by a trailing
/// `=`). The error says what is wrong without echoing any of it.
fn decode_auth(field: &str) -> Result<(String, String), &'static str> {
    let compact: String = field.chars().filter(|c| *c != '\n' && *c != '\r').collect();
    let decoded = if compact.trim().ends_with('=') {
        STANDARD.decode(compact.trim())
    } else {
        STANDARD_NO_PAD.decode(compact.trim())
    }
    .map_err(|_| "is not base64")?;
    let text = String::from_utf8(decoded).map_err(|_| "does not decode to UTF-8 text")?;
    let (user, pass) = text
        .split_once(':')
        .ok_or("must be base64 of `username:password`")?;
    Ok((user.to_string(), pass.to_string()))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn src() -> Source<'static> {
        Source {
            secret: "regcred",
            path: Path::new("/secrets/regcred.json"),
        }
    }

    fn b64(s: &str) -> String {
        STANDARD.encode(s)
    }

    fn pairs(entries: &[DockerConfigEntry]) -> Vec<(&str, &str, &str)> {
        entries
            .iter()
            .map(|e| {
                (
                    e.registry.as_str(),
                    e.username.as_str(),
                    e.password.as_str(),
                )
            })
            .collect()
    }

    #[test]
    fn auths_with_auth_field() {
        let doc = format!(
            r#"{{"auths": {{"127.0.0.1:5000": {{"auth": "{}"}}}}}}"#,
            b64("alice:s3cr:et")
        );
        let got = parse(doc.as_bytes(), &src()).unwrap();
        assert_eq!(pairs(&got), [("127.0.0.1:5000", "alice", "s3cr:et")]);
    }

    #[test]
    fn username_password_fields_and_unpadded_auth() {
        let doc = r#"{"auths": {
            "a.example": {"username": "u", "password": "p", "email": "x@y"},
            "b.example": {"auth": "dTpw"}
        }, "credsStore": "desktop"}"#;
        let got = parse(doc.as_bytes(), &src()).unwrap();
        assert_eq!(
            pairs(&got),
            [("a.example", "u", "p"), ("b.example", "u", "p")]
        );
        // "dTpw" is "u:p" and needs no padding; a padded value takes the other decoder.
        let padded = format!(r#"{{"auths": {{"c": {{"auth": "{}"}}}}}}"#, b64("ab:c"));
        assert!(padded.contains('='));
        assert_eq!(
            pairs(&parse(padded.as_bytes(), &src()).unwrap()),
            [("c", "ab", "c")]
        );
    }

    #[test]
    fn auth_overrides_username_and_password() {
        let doc = format!(
            r#"{{"auths": {{"r": {{"username": "old", "password": "old", "auth": "{}"}}}}}}"#,
            b64("new:pw")
        );
        assert_eq!(
            pairs(&parse(doc.as_bytes(), &src()).unwrap()),
            [("r", "new", "pw")]
        );
    }

    #[test]
    fn legacy_dockercfg_map() {
        let doc = format!(
            r#"{{"https://index.docker.io/v1/": {{"auth": "{}"}}}}"#,
            b64("d:h")
        );
        assert_eq!(
            pairs(&parse(doc.as_bytes(), &src()).unwrap()),
            [("https://index.docker.io/v1/", "d", "h")]
        );
    }

    #[test]
    fn secret_objects() {
        let inner = format!(
            r#"{{"auths": {{"127.0.0.1:5000": {{"auth": "{}"}}}}}}"#,
            b64("s:t")
        );
        let data = format!(
            r#"{{"apiVersion": "v1", "kind": "Secret", "type": "kubernetes.io/dockerconfigjson",
                "data": {{".dockerconfigjson": "{}"}}}}"#,
            b64(&inner)
        );
        assert_eq!(
            pairs(&parse(data.as_bytes(), &src()).unwrap()),
            [("127.0.0.1:5000", "s", "t")]
        );
        let string_data = serde_json::json!({
            "kind": "Secret",
            "type": "kubernetes.io/dockercfg",
            "stringData": {".dockercfg": format!(r#"{{"r": {{"auth": "{}"}}}}"#, b64("x:y"))},
        })
        .to_string();
        assert_eq!(
            pairs(&parse(string_data.as_bytes(), &src()).unwrap()),
            [("r", "x", "y")]
        );
        let opaque = r#"{"kind": "Secret", "type": "Opaque", "data": {"k": "dg=="}}"#;
        assert!(parse(opaque.as_bytes(), &src()).unwrap().is_empty());
    }

    #[test]
    fn errors_never_echo_secrets() {
        let cases = [
            r#"{"auths": {"r": {"auth": "!!!not-base64-hunter2"}}}"#.to_string(),
            format!(
                r#"{{"auths": {{"r": {{"auth": "{}"}}}}}}"#,
                b64("nocolonhunter2")
            ),
            r#"{"auths": {"r": {"password": 12345678}}}"#.to_string(),
            r#"{"auths": {"r": "hunter2"}}"#.to_string(),
            r#"{"auths": {"r": {"password": "hunter2"}"#.to_string(),
            r#"["hunter2"]"#.to_string(),
        ];
        for doc in cases {
            let err = parse(doc.as_bytes(), &src()).unwrap_err();
            let text = format!("{err} {err:?}");
            assert!(!text.contains("hunter2"), "{text}");
            assert!(!text.contains("12345678"), "{text}");
            assert!(text.contains("regcred"), "{text}");
        }
    }

    #[test]
    fn debug_hides_credentials() {
        let e = DockerConfigEntry {
            registry: "r".into(),
            username: "alice".into(),
            password: "hunter2".into(),
        };
        let text = format!("{e:?}");
        assert!(
            !text.contains("hunter2") && !text.contains("alice"),
            "{text}"
        );
    }
}
