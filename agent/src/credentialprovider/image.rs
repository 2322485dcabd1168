//! The repository an image reference pulls from, normalized as kubelet's
//! `parsers.ParseImageName` does before it asks the keyring: `busybox:1.36` is
//! `docker.io/library/busybox`, `127.0.0.1:5000/app@sha256:...` is `127.0.0.1:5000/app`.

/// Docker Hub's canonical domain in a normalized repository.
const DOCKER_HUB: &str = "docker.io";
/// The host a docker config's Docker Hub entry (`https://index.docker.io/v1/`) is keyed by.
pub(super) const DEFAULT_REGISTRY_HOST: &str = "index.docker.io";

/// `domain/path` of the repository `image` names, without tag or digest.
pub(super) fn repo_to_pull(image: &str) -> Result<String, &'static str> {
    if image.is_empty() {
        return Err("the reference is empty");
    }
    if image.chars().any(|c| c.is_whitespace() || c.is_control()) {
        return Err("the reference contains whitespace");
    }
    let name = image.split_once('@').map_or(image, |(n, _)| n);
    let last_slash = name.rfind('/').map_or(0, |i| i + 1);
    let name = match name[last_slash..].find(':') {
        Some(i) => &name[..last_slash + i],
        None => name,
    };
    let (domain, path) = match name.split_once('/') {
        Some((first, rest))
            if first.contains(['.', ':'])
                || first == "localhost"
                || first.to_lowercase() != first =>
        {
            (first, rest.to_string())
        }
        _ => (DOCKER_HUB, name.to_string()),
    };
    let domain = if domain == DEFAULT_REGISTRY_HOST {
        DOCKER_HUB
    } else {
        domain
    };
    let path = if domain == DOCKER_HUB && !path.contains('/') {
        format!("library/{path}")
    } else {
        path
    };
    let valid_path = !path.is_empty()
        && path.split('/').all(|part| {
            !part.is_empty()
                && part
                    .chars()
                    .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || "._-".contains(c))
        });
    if !valid_path {
        return Err("the repository path must be lowercase letters, digits and . _ - separators");
    }
    Ok(format!("{domain}/{path}"))
}

/// kubelet's isDefaultRegistryMatch: a repository Docker Hub serves.
pub(super) fn is_default_registry(repo: &str) -> bool {
    let Some((first, _)) = repo.split_once('/') else {
        return !repo.is_empty();
    };
    if first.is_empty() {
        return false;
    }
    first == DOCKER_HUB || first == DEFAULT_REGISTRY_HOST || !first.contains(['.', ':'])
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn normalizes_like_kubelet() {
        let cases = [
            ("busybox", "docker.io/library/busybox"),
            ("busybox:1.36", "docker.io/library/busybox"),
            ("library/busybox@sha256:abc", "docker.io/library/busybox"),
            ("index.docker.io/foo/bar:1", "docker.io/foo/bar"),
            (
                "127.0.0.1:5000/podlapse/app:1.0",
                "127.0.0.1:5000/podlapse/app",
            ),
            ("127.0.0.1:5000/app@sha256:0123", "127.0.0.1:5000/app"),
            ("localhost/app", "localhost/app"),
            (
                "registry.example.com:8443/team/app:v2",
                "registry.example.com:8443/team/app",
            ),
            ("quay.io/coreos/etcd", "quay.io/coreos/etcd"),
        ];
        for (image, want) in cases {
            assert_eq!(repo_to_pull(image).as_deref(), Ok(want), "{image}");
        }
    }

    #[test]
    fn refuses_broken_references() {
        for image in ["", "a b", "Busybox", "127.0.0.1:5000/", "127.0.0.1:5000//x"] {
            assert!(repo_to_pull(image).is_err(), "{image:?}");
        }
    }

    #[test]
    fn default_registry() {
        assert!(is_default_registry("docker.io/library/busybox"));
        assert!(is_default_registry("index.docker.io/x/y"));
        assert!(is_default_registry("team/app"));
        assert!(!is_default_registry("127.0.0.1:5000/app"));
        assert!(!is_default_registry("quay.io/x"));
    }
}
