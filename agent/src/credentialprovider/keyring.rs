//! kubelet's BasicDockerKeyring: credentials indexed by registry key, matched against a
//! normalized repository by host (with `*` globs per dot-separated part), port, and
//! path prefix, most specific key first.

use std::collections::BTreeMap;

use super::Credential;
use super::config::DockerConfigEntry;
use super::image::{DEFAULT_REGISTRY_HOST, is_default_registry};
use crate::cri::api;

#[derive(Debug, Default)]
pub(super) struct Keyring {
    /// Keys sorted in reverse, so `quay.io/coreos` is tried before `quay.io`.
    index: Vec<String>,
    creds: BTreeMap<String, Vec<Credential>>,
}

impl Keyring {
    /// kubelet's Add for one secret's entries; an entry whose key has no host is skipped,
    /// as kubelet skips keys it cannot parse.
    pub(super) fn add(&mut self, secret: &str, entries: Vec<DockerConfigEntry>) {
        for e in entries {
            let Some(key) = registry_key(&e.registry) else {
                tracing::warn!(
                    secret,
                    registry = e.registry,
                    "ignoring a pull secret entry whose registry has no host"
                );
                continue;
            };
            let auth = api::AuthConfig {
                username: e.username,
                password: e.password,
                ..Default::default()
            };
            self.creds.entry(key.clone()).or_default().push(Credential {
                secret: secret.to_string(),
                registry: key.clone(),
                auth,
            });
            self.index.push(key);
        }
        self.index.sort_unstable_by(|a, b| b.cmp(a));
        self.index.dedup();
    }

    /// kubelet's Lookup for a normalized repository: every matching key's credentials in
    /// index order; failing that, the Docker Hub entry for a Docker Hub repository.
    pub(super) fn lookup(&self, repo: &str) -> Vec<Credential> {
        let mut out: Vec<Credential> = self
            .index
            .iter()
            .filter(|key| urls_match(key, repo))
            .flat_map(|key| self.creds[key].iter().cloned())
            .collect();
        if out.is_empty() && is_default_registry(repo) {
            out.extend(
                self.creds
                    .get(DEFAULT_REGISTRY_HOST)
                    .into_iter()
                    .flatten()
                    .cloned(),
            );
        }
        out
    }
}

/// The index key of a docker config location: its host, plus its path unless that is
/// empty, `/`, or docker's `/v1/` / `/v2/` API prefix.
fn registry_key(location: &str) -> Option<String> {
    let rest = location
        .strip_prefix("https://")
        .or_else(|| location.strip_prefix("http://"))
        .unwrap_or(location);
    let (host, path) = split_schemeless(rest);
    if host.is_empty() {
        return None;
    }
    let path = if path.starts_with("/v1/") || path.starts_with("/v2/") {
        &path[3..]
    } else {
        path
    };
    Some(if path.is_empty() || path == "/" {
        host.to_string()
    } else {
        format!("{host}{path}")
    })
}

/// Host and path of a URL without its scheme, dropping user info, query and fragment.
fn split_schemeless(s: &str) -> (&str, &str) {
    let s = s.split(['?', '#']).next().unwrap_or(s);
    let (authority, path) = match s.find('/') {
        Some(i) => (&s[..i], &s[i..]),
        None => (s, ""),
    };
    let host = authority.rsplit_once('@').map_or(authority, |(_, h)| h);
    (host, path)
}

/// kubelet's URLsMatch: same port, same number of host parts each matching its glob,
/// and the key's path a prefix of the repository's (a plain string prefix, as kubelet).
fn urls_match(glob: &str, target: &str) -> bool {
    let (glob_host, glob_path) = split_schemeless(glob);
    let (target_host, target_path) = split_schemeless(target);
    let (glob_name, glob_port) = split_host_port(glob_host);
    let (target_name, target_port) = split_host_port(target_host);
    if glob_port != target_port || !target_path.starts_with(glob_path) {
        return false;
    }
    let glob_parts: Vec<&str> = glob_name.split('.').collect();
    let target_parts: Vec<&str> = target_name.split('.').collect();
    glob_parts.len() == target_parts.len()
        && glob_parts
            .iter()
            .zip(&target_parts)
            .all(|(g, t)| glob_match(g.as_bytes(), t.as_bytes()))
}

/// Go's net.SplitHostPort, falling back to the whole string and no port.
fn split_host_port(host: &str) -> (&str, &str) {
    if let Some(rest) = host.strip_prefix('[') {
        return match rest.split_once("]:") {
            Some((h, p)) => (h, p),
            None => (host, ""),
        };
    }
    match host.split_once(':') {
        Some((h, p)) if !p.contains(':') => (h, p),
        _ => (host, ""),
    }
}

/// A `*` glob (any run of characters) matched against one host part. kubelet's
/// filepath.Match would take `?` too, but its URL parsing reads `?` as the start of a
/// query first, so `*` is the only wildcard that ever reaches it.
fn glob_match(pattern: &[u8], s: &[u8]) -> bool {
    match (pattern.first(), s.first()) {
        (None, None) => true,
        (Some(b'*'), _) => {
            glob_match(&pattern[1..], s) || (!s.is_empty() && glob_match(pattern, &s[1..]))
        }
        (Some(p), Some(c)) if p == c => glob_match(&pattern[1..], &s[1..]),
        _ => false,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn entry(registry: &str, user: &str) -> DockerConfigEntry {
        DockerConfigEntry {
            registry: registry.into(),
            username: user.into(),
            password: "pw".into(),
        }
    }

    fn users(creds: &[Credential]) -> Vec<&str> {
        creds.iter().map(|c| c.auth.username.as_str()).collect()
    }

    #[test]
    fn keys_like_kubelet() {
        let cases = [
            ("127.0.0.1:5000", "127.0.0.1:5000"),
            ("http://127.0.0.1:5000", "127.0.0.1:5000"),
            ("https://index.docker.io/v1/", "index.docker.io"),
            ("https://quay.io/v2/coreos", "quay.io/coreos"),
            ("quay.io/coreos/", "quay.io/coreos/"),
            ("https://u@reg.example/", "reg.example"),
        ];
        for (loc, want) in cases {
            assert_eq!(registry_key(loc).as_deref(), Some(want), "{loc}");
        }
        assert_eq!(registry_key("https:///nohost"), None);
    }

    #[test]
    fn matching_table() {
        let cases = [
            ("127.0.0.1:5000", "127.0.0.1:5000/podlapse/app", true),
            ("127.0.0.1:5000", "127.0.0.1:5001/podlapse/app", false),
            ("127.0.0.1", "127.0.0.1:5000/podlapse/app", false),
            (
                "127.0.0.1:5000/podlapse",
                "127.0.0.1:5000/podlapse/app",
                true,
            ),
            ("127.0.0.1:5000/other", "127.0.0.1:5000/podlapse/app", false),
            ("*.example.com", "reg.example.com/x", true),
            ("*.example.com", "example.com/x", false),
            ("*.example.com", "a.b.example.com/x", false),
            // `?` starts a URL query, so this key is the host `reg-`, as in kubelet.
            ("reg-?.example.com", "reg-1.example.com/x", false),
            ("quay.io", "docker.io/library/busybox", false),
        ];
        for (glob, target, want) in cases {
            assert_eq!(urls_match(glob, target), want, "{glob} vs {target}");
        }
    }

    #[test]
    fn most_specific_key_first_then_secret_order() {
        let mut k = Keyring::default();
        k.add("first", vec![entry("127.0.0.1:5000", "host-a")]);
        k.add(
            "second",
            vec![
                entry("127.0.0.1:5000/podlapse", "path"),
                entry("127.0.0.1:5000", "host-b"),
            ],
        );
        let got = k.lookup("127.0.0.1:5000/podlapse/app");
        assert_eq!(users(&got), ["path", "host-a", "host-b"]);
        assert_eq!(got[0].secret, "second");
        assert_eq!(got[0].registry, "127.0.0.1:5000/podlapse");
        assert_eq!(
            users(&k.lookup("127.0.0.1:5000/other")),
            ["host-a", "host-b"]
        );
        assert!(k.lookup("quay.io/x").is_empty());
    }

    #[test]
    fn docker_hub_falls_back_to_the_index_entry() {
        let mut k = Keyring::default();
        k.add("hub", vec![entry("https://index.docker.io/v1/", "hubuser")]);
        assert_eq!(users(&k.lookup("docker.io/library/busybox")), ["hubuser"]);
        assert!(k.lookup("127.0.0.1:5000/app").is_empty());
    }
}
