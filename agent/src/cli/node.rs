//! The node podlapse acts as: its name, IP, and where pod data and logs go.

use std::path::PathBuf;

use crate::kuberuntime::{HostDns, RuntimeConfig};

#[derive(Debug, Clone, clap::Args)]
pub struct NodeArgs {
    /// Node name (kubelet's --hostname-override), in lower case as kubelet takes it.
    /// Default: the host name. Static pods are named `<name>-<node name>`.
    #[arg(long, value_name = "NAME", value_parser = parse_node_name)]
    pub node_name: Option<String>,
    /// kubelet's --root-dir: pod directories and volumes.
    #[arg(long, default_value = "/var/lib/podlapse", value_name = "DIR")]
    pub root_dir: PathBuf,
    /// Where pod and container logs go (kubelet's /var/log/pods).
    #[arg(long, default_value = "/var/log/podlapse/pods", value_name = "DIR")]
    pub pod_logs_dir: PathBuf,
    /// RuntimeClass name to CRI runtime handler, repeatable: NAME=HANDLER.
    #[arg(long = "runtime-class", value_name = "NAME=HANDLER", value_parser = parse_pair)]
    pub runtime_classes: Vec<(String, String)>,
}

/// kubelet's `GetHostname`: trimmed, in lower case, and not empty.
fn parse_node_name(s: &str) -> Result<String, String> {
    let name = s.trim().to_lowercase();
    if name.is_empty() {
        return Err("empty node name".into());
    }
    Ok(name)
}

fn parse_pair(s: &str) -> Result<(String, String), String> {
    s.split_once('=')
        .filter(|(k, v)| !k.is_empty() && !v.is_empty())
        .map(|(k, v)| (k.to_string(), v.to_string()))
        .ok_or_else(|| format!("{s:?} is not NAME=HANDLER"))
}

impl NodeArgs {
    pub fn node_name(&self) -> String {
        self.node_name.clone().unwrap_or_else(|| {
            nix::unistd::gethostname()
                .ok()
                .and_then(|h| h.into_string().ok())
                .unwrap_or_else(|| "localhost".into())
                .to_lowercase()
        })
    }

    pub fn runtime_config(&self) -> RuntimeConfig {
        RuntimeConfig {
            node_name: self.node_name(),
            node_ip: node_ip().unwrap_or_else(|| "127.0.0.1".into()),
            root_dir: self.root_dir.clone(),
            pod_logs_dir: self.pod_logs_dir.clone(),
            host_dns: HostDns::parse(
                &std::fs::read_to_string("/etc/resolv.conf").unwrap_or_default(),
            ),
            runtime_handlers: self.runtime_classes.iter().cloned().collect(),
            touch_host: true,
            user_namespace_handlers: None,
            allocatable: None,
        }
    }
}

/// The first global IPv4 address of an interface that is up, as kubelet picks a node IP
/// when none is configured.
fn node_ip() -> Option<String> {
    let addrs = nix::ifaddrs::getifaddrs().ok()?;
    let mut found: Vec<(String, String)> = addrs
        .filter(|a| a.flags.contains(nix::net::if_::InterfaceFlags::IFF_UP))
        .filter(|a| {
            !a.flags
                .contains(nix::net::if_::InterfaceFlags::IFF_LOOPBACK)
        })
        .filter_map(|a| {
            let ip = a.address?.as_sockaddr_in()?.ip();
            Some((a.interface_name, ip.to_string()))
        })
        .collect();
    found.sort();
    found.into_iter().map(|(_, ip)| ip).next()
}
