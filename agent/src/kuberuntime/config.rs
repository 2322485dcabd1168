//! Settings of the runtime shell: where pod data and logs go, and what the node is.

use std::collections::BTreeMap;
use std::path::PathBuf;

use super::{SyncError, SyncReason};

/// What the shell needs to know about the node to build CRI requests.
#[derive(Debug, Clone, serde::Serialize)]
pub struct RuntimeConfig {
    pub node_name: String,
    /// The node's IP, for `status.hostIP` env references.
    pub node_ip: String,
    /// kubelet's `--root-dir`: pod directories and volumes live under `<root>/pods/<uid>`.
    pub root_dir: PathBuf,
    /// kubelet's `/var/log/pods`.
    pub pod_logs_dir: PathBuf,
    /// The host's resolver config, used for `dnsPolicy: Default` and `ClusterFirst` when no
    /// cluster DNS is configured (kubelet falls back the same way).
    pub host_dns: HostDns,
    /// RuntimeClass name to CRI runtime handler, kubelet's RuntimeClass lookup.
    pub runtime_handlers: BTreeMap<String, String>,
    /// Create pod directories, volumes and log directories on this host. Replay turns it
    /// off: its runtime is a recording, not this machine.
    pub touch_host: bool,
    /// The runtime handlers that can run a pod in a user namespace of its own, as the
    /// runtime's Status says; None when unknown (a replay answers from its recording).
    pub user_namespace_handlers: Option<Vec<String>>,
    /// The node's allocatable CPU and memory: what `resourceFieldRef` reads for a limit a
    /// container does not set. None until the agent knows it.
    pub allocatable: Option<crate::kubelet::admission::NodeAllocatable>,
}

#[derive(Debug, Clone, Default, serde::Serialize)]
pub struct HostDns {
    pub servers: Vec<String>,
    pub searches: Vec<String>,
    pub options: Vec<String>,
}

impl HostDns {
    /// Parses resolv.conf text.
    pub fn parse(text: &str) -> HostDns {
        let mut dns = HostDns::default();
        for line in text.lines() {
            let mut words = line.split_whitespace();
            match words.next() {
                Some("nameserver") => dns.servers.extend(words.next().map(str::to_string)),
                Some("search") | Some("domain") => {
                    dns.searches = words.map(str::to_string).collect()
                }
                Some("options") => dns.options.extend(words.map(str::to_string)),
                _ => {}
            }
        }
        dns
    }
}

impl RuntimeConfig {
    /// The CRI runtime handler for a pod's `runtimeClassName`.
    pub fn runtime_handler(&self, class: &str) -> Result<String, SyncError> {
        self.runtime_handlers.get(class).cloned().ok_or_else(|| {
            SyncError::new(
                SyncReason::CreatePodSandboxError,
                format!("RuntimeClass {class:?} not found (configure it with --runtime-class NAME=HANDLER)"),
            )
        })
    }

    /// The pod's directory, kubelet's `getPodDir`.
    pub fn pod_dir(&self, uid: &str) -> PathBuf {
        self.root_dir.join("pods").join(uid)
    }

    /// Where an emptyDir volume lives on disk.
    pub fn empty_dir_path(&self, uid: &str, volume: &str) -> PathBuf {
        self.pod_dir(uid)
            .join("volumes/kubernetes.io~empty-dir")
            .join(volume)
    }

    /// Where a downwardAPI volume's files live on disk.
    pub fn downward_api_path(&self, uid: &str, volume: &str) -> PathBuf {
        self.pod_dir(uid)
            .join("volumes/kubernetes.io~downward-api")
            .join(volume)
    }

    /// The pod's log directory, `<ns>_<name>_<uid>` as kubelet names it.
    pub fn pod_log_dir(&self, namespace: &str, name: &str, uid: &str) -> PathBuf {
        self.pod_logs_dir.join(format!("{namespace}_{name}_{uid}"))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_resolv_conf() {
        let d = HostDns::parse(
            "# c\nnameserver 10.0.0.2\nnameserver 1.1.1.1\nsearch a.b c\noptions ndots:2\n",
        );
        assert_eq!(d.servers, ["10.0.0.2", "1.1.1.1"]);
        assert_eq!(d.searches, ["a.b", "c"]);
        assert_eq!(d.options, ["ndots:2"]);
    }
}
