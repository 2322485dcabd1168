//! Where the CRI socket is: `--cri`, else `PODLAPSE_CRI`, else the node lab's socket when
//! the lab is up, else containerd's default socket.

use std::fmt;
use std::path::{Path, PathBuf};

use super::CriError;

/// containerd's default CRI socket, the last fallback.
pub const DEFAULT_SOCKET: &str = "/run/containerd/containerd.sock";
/// Environment variable naming the endpoint when `--cri` is not given.
pub const ENV_ENDPOINT: &str = "PODLAPSE_CRI";
/// Environment variable naming the node lab's directory.
pub const ENV_LAB_DIR: &str = "PODLAPSE_LAB_DIR";
/// The node lab's default directory.
pub const DEFAULT_LAB_DIR: &str = "/var/lib/podlapse-lab";

/// Which rule chose the endpoint; printed so a user knows why podlapse talks to a socket.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum EndpointSource {
    Flag,
    Env,
    Lab,
    Default,
}

impl fmt::Display for EndpointSource {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            EndpointSource::Flag => "--cri",
            EndpointSource::Env => ENV_ENDPOINT,
            EndpointSource::Lab => "node lab",
            EndpointSource::Default => "default",
        })
    }
}

/// A CRI endpoint: a unix socket path, as given by the user and as resolved.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Endpoint {
    /// The text the endpoint was given as (e.g. `unix:///run/x.sock`), for messages.
    pub given: String,
    pub path: PathBuf,
    pub source: EndpointSource,
}

impl Endpoint {
    /// Parses `unix:///path`, `unix:/path` or a bare absolute path.
    pub fn parse(given: &str, source: EndpointSource) -> Result<Endpoint, CriError> {
        let path = if let Some(rest) = given.strip_prefix("unix://") {
            rest
        } else if let Some(rest) = given.strip_prefix("unix:") {
            rest
        } else if given.contains("://") {
            return Err(CriError::BadEndpoint {
                endpoint: given.to_string(),
                reason: "only unix sockets are supported (unix:///path or /path)".into(),
            });
        } else {
            given
        };
        if !path.starts_with('/') {
            return Err(CriError::BadEndpoint {
                endpoint: given.to_string(),
                reason: "the socket path must be absolute".into(),
            });
        }
        Ok(Endpoint {
            given: given.to_string(),
            path: PathBuf::from(path),
            source,
        })
    }

    /// Applies the precedence rules. `flag` is `--cri`, `env` is `PODLAPSE_CRI`, `lab_dir`
    /// the lab's directory; taking them as arguments keeps this testable.
    pub fn resolve(
        flag: Option<&str>,
        env: Option<&str>,
        lab_dir: &Path,
    ) -> Result<Endpoint, CriError> {
        if let Some(flag) = flag.filter(|s| !s.is_empty()) {
            return Endpoint::parse(flag, EndpointSource::Flag);
        }
        if let Some(env) = env.filter(|s| !s.is_empty()) {
            return Endpoint::parse(env, EndpointSource::Env);
        }
        if let Some(sock) = lab_socket(lab_dir) {
            return Ok(Endpoint {
                given: sock.display().to_string(),
                path: sock,
                source: EndpointSource::Lab,
            });
        }
        Endpoint::parse(DEFAULT_SOCKET, EndpointSource::Default)
    }

    /// Resolves from the process environment.
    pub fn from_env(flag: Option<&str>) -> Result<Endpoint, CriError> {
        let env = std::env::var(ENV_ENDPOINT).ok();
        Endpoint::resolve(flag, env.as_deref(), &lab_dir())
    }
}

impl fmt::Display for Endpoint {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.given)
    }
}

/// The node lab's directory from `PODLAPSE_LAB_DIR`, else the default.
pub fn lab_dir() -> PathBuf {
    std::env::var_os(ENV_LAB_DIR)
        .map(PathBuf::from)
        .unwrap_or_else(|| PathBuf::from(DEFAULT_LAB_DIR))
}

/// The lab's CRI socket, when the lab is up (its state file and socket both exist).
fn lab_socket(lab_dir: &Path) -> Option<PathBuf> {
    let sock = lab_dir.join("containerd").join("containerd.sock");
    (lab_dir.join("lab.json").is_file() && sock.exists()).then_some(sock)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn lab_with_socket() -> tempfile::TempDir {
        let dir = tempfile::tempdir().unwrap();
        std::fs::create_dir_all(dir.path().join("containerd")).unwrap();
        std::fs::write(dir.path().join("lab.json"), "{}").unwrap();
        std::fs::write(dir.path().join("containerd/containerd.sock"), "").unwrap();
        dir
    }

    #[test]
    fn flag_beats_env_and_lab() {
        let lab = lab_with_socket();
        let e = Endpoint::resolve(Some("unix:///a.sock"), Some("/b.sock"), lab.path()).unwrap();
        assert_eq!(e.path, PathBuf::from("/a.sock"));
        assert_eq!(e.source, EndpointSource::Flag);
    }

    #[test]
    fn env_beats_lab() {
        let lab = lab_with_socket();
        let e = Endpoint::resolve(None, Some("/b.sock"), lab.path()).unwrap();
        assert_eq!(e.path, PathBuf::from("/b.sock"));
        assert_eq!(e.source, EndpointSource::Env);
    }

    #[test]
    fn lab_socket_when_lab_is_up() {
        let lab = lab_with_socket();
        let e = Endpoint::resolve(None, None, lab.path()).unwrap();
        assert_eq!(e.path, lab.path().join("containerd/containerd.sock"));
        assert_eq!(e.source, EndpointSource::Lab);
    }

    #[test]
    fn default_when_lab_is_down() {
        let lab = tempfile::tempdir().unwrap();
        let e = Endpoint::resolve(None, Some(""), lab.path()).unwrap();
        assert_eq!(e.path, PathBuf::from(DEFAULT_SOCKET));
        assert_eq!(e.source, EndpointSource::Default);
    }

    #[test]
    fn rejects_tcp_and_relative_paths() {
        let err = Endpoint::parse("tcp://127.0.0.1:1", EndpointSource::Flag).unwrap_err();
        assert!(err.to_string().contains("tcp://127.0.0.1:1"), "{err}");
        let err = Endpoint::parse("run/x.sock", EndpointSource::Flag).unwrap_err();
        assert!(err.to_string().contains("absolute"), "{err}");
    }
}
