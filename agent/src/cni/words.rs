//! What the runtime and the CNI plugins say for each network fault, in their own words:
//! the phrases are libcni's, go-cni's, containerd's and host-local's, and a verdict
//! quotes the text it found them in.

/// host-local (and the other IPAM plugins of containernetworking/plugins), when every
/// range of a range set is used up: `no IP addresses available in range set: A-B`.
pub const IPAM_EXHAUSTED: &str = "no IP addresses available in range set";
/// The shorter form some IPAM plugins use.
pub const IPAM_EXHAUSTED_SHORT: &str = "no IP addresses available";
/// go-cni when no network configuration is loaded.
pub const NOT_INITIALIZED: &str = "cni plugin not initialized";
/// containerd when the CNI result has no address for the pod's interface.
pub const NO_NETWORK_INFO: &str = "failed to find network info for sandbox";

/// libcni's `failed to find plugin "<type>" in path [<dir> <dir>]`: the plugin and the
/// directories searched.
pub fn missing_plugin(message: &str) -> Option<(String, Vec<String>)> {
    let rest = message.split("failed to find plugin \"").nth(1)?;
    let (plugin, rest) = rest.split_once('"')?;
    let dirs = rest
        .split_once("in path [")
        .and_then(|(_, d)| d.split_once(']'))
        .map(|(d, _)| d.split_whitespace().map(str::to_string).collect())
        .unwrap_or_default();
    Some((plugin.to_string(), dirs))
}

/// The range set of host-local's exhaustion message (`A-B`, or several joined by
/// commas), when the text has one.
pub fn exhausted_range(message: &str) -> Option<&str> {
    let rest = message.split(IPAM_EXHAUSTED).nth(1)?;
    let rest = rest.trim_start_matches(':').trim_start();
    let end = rest
        .find(|c: char| c.is_whitespace() || c == '"' || c == ';')
        .unwrap_or(rest.len());
    Some(&rest[..end]).filter(|r| !r.is_empty())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_runtimes_words_give_the_plugin_the_directories_and_the_range() {
        let m = "failed to setup network for sandbox \"0a1b\": plugin type=\"flannel\" failed (add): failed to find plugin \"flannel\" in path [/opt/cni/bin /usr/lib/cni]";
        assert_eq!(
            missing_plugin(m),
            Some((
                "flannel".to_string(),
                vec!["/opt/cni/bin".to_string(), "/usr/lib/cni".to_string()]
            ))
        );
        assert_eq!(
            missing_plugin("plugin type=\"bridge\" failed (add): x"),
            None
        );
        let e = "plugin type=\"bridge\" failed (add): failed to allocate for range 0: no IP addresses available in range set: 10.244.77.2-10.244.77.2";
        assert_eq!(exhausted_range(e), Some("10.244.77.2-10.244.77.2"));
        assert_eq!(exhausted_range("no IP addresses available"), None);
    }
}
