//! createPodSandbox: build the sandbox config kubelet would, then RunPodSandbox.

use k8s_openapi::api::core::v1::{Pod, PodSpec};

use super::config::RuntimeConfig;
use super::labels;
use super::security_context::sandbox_security_context;
use super::{SyncError, SyncReason};
use crate::cri::{RuntimeService, api};

/// kubelet's generatePodSandboxConfig. Pure: reads only the pod and the config.
pub fn generate_pod_sandbox_config(
    pod: &Pod,
    attempt: u32,
    cfg: &RuntimeConfig,
) -> api::PodSandboxConfig {
    // Read in place: only a few of its fields are needed, not a copy of every container.
    let no_spec = PodSpec::default();
    let spec = pod.spec.as_ref().unwrap_or(&no_spec);
    let (name, namespace, uid) = (
        labels::pod_name(pod),
        labels::pod_namespace(pod),
        labels::pod_uid(pod),
    );
    let host_network = spec.host_network.unwrap_or(false);
    // A hostNetwork pod keeps the node's hostname; others get their own.
    let hostname = if host_network {
        String::new()
    } else {
        pod_hostname(spec.hostname.as_deref().unwrap_or(name))
    };
    let port_mappings = spec
        .containers
        .iter()
        .flat_map(|c| c.ports.iter().flatten())
        .filter(|p| p.host_port.unwrap_or(0) > 0)
        .map(|p| api::PortMapping {
            protocol: match p.protocol.as_deref() {
                Some("UDP") => api::Protocol::Udp as i32,
                Some("SCTP") => api::Protocol::Sctp as i32,
                _ => api::Protocol::Tcp as i32,
            },
            container_port: p.container_port,
            host_port: p.host_port.unwrap_or(0),
            host_ip: p.host_ip.clone().unwrap_or_default(),
        })
        .collect();
    let sysctls = spec
        .security_context
        .as_ref()
        .and_then(|s| s.sysctls.as_ref())
        .map(|v| {
            v.iter()
                .map(|s| (s.name.clone(), s.value.clone()))
                .collect()
        })
        .unwrap_or_default();
    api::PodSandboxConfig {
        metadata: Some(api::PodSandboxMetadata {
            name: name.to_string(),
            uid: uid.to_string(),
            namespace: namespace.to_string(),
            attempt,
        }),
        hostname,
        log_directory: cfg.pod_log_dir(namespace, name, uid).display().to_string(),
        dns_config: Some(dns_config(pod, cfg)),
        port_mappings,
        labels: labels::sandbox_labels(pod),
        annotations: labels::sandbox_annotations(pod),
        linux: Some(api::LinuxPodSandboxConfig {
            sysctls,
            security_context: Some(sandbox_security_context(pod)),
            ..Default::default()
        }),
        windows: None,
    }
}

/// DNS by `dnsPolicy`. podlapse has no cluster DNS service, so `ClusterFirst` falls back
/// to the host's resolver exactly as kubelet does when `--cluster-dns` is unset.
fn dns_config(pod: &Pod, cfg: &RuntimeConfig) -> api::DnsConfig {
    let spec = pod.spec.as_ref();
    let policy = spec
        .and_then(|s| s.dns_policy.as_deref())
        .unwrap_or("ClusterFirst");
    let mut dns = if policy == "None" {
        api::DnsConfig::default()
    } else {
        api::DnsConfig {
            servers: cfg.host_dns.servers.clone(),
            searches: cfg.host_dns.searches.clone(),
            options: cfg.host_dns.options.clone(),
        }
    };
    if let Some(extra) = spec.and_then(|s| s.dns_config.as_ref()) {
        dns.servers
            .extend(extra.nameservers.iter().flatten().cloned());
        dns.searches
            .extend(extra.searches.iter().flatten().cloned());
        dns.options
            .extend(extra.options.iter().flatten().map(|o| match &o.value {
                Some(v) => format!("{}:{v}", o.name.as_deref().unwrap_or_default()),
                None => o.name.clone().unwrap_or_default(),
            }));
    }
    dns
}

/// Creates the pod's log directory and runs the sandbox; returns its ID.
pub async fn create_pod_sandbox<R: RuntimeService>(
    cri: &R,
    config: Box<api::PodSandboxConfig>,
    runtime_handler: &str,
    touch_host: bool,
) -> Result<String, SyncError> {
    if touch_host {
        create_log_dir(&config.log_directory)?;
    }
    let req = api::RunPodSandboxRequest {
        config: Some(*config),
        runtime_handler: runtime_handler.to_string(),
    };
    // Boxed: the request lives only while the call does (see `sync_pod`).
    let resp = Box::pin(cri.run_pod_sandbox(req))
        .await
        .map_err(|e| SyncError::cri(SyncReason::CreatePodSandboxError, e))?;
    Ok(resp.pod_sandbox_id)
}

fn create_log_dir(dir: &str) -> Result<(), SyncError> {
    std::fs::create_dir_all(dir).map_err(|e| {
        SyncError::new(
            SyncReason::CreatePodSandboxError,
            format!("creating log directory {dir}: {e}"),
        )
    })
}

/// The longest hostname the kernel keeps (64 bytes with the terminating NUL).
const HOSTNAME_MAX_LEN: usize = 63;

/// A pod's hostname as kubelet gives it: at most 63 characters, and not ending in `-`
/// or `.` once cut (static pods, named `<name>-<node>`, reach the limit sooner).
fn pod_hostname(hostname: &str) -> String {
    if hostname.len() <= HOSTNAME_MAX_LEN {
        return hostname.to_string();
    }
    // Validation allows only ASCII in a pod name or hostname, so a byte cut is a
    // character cut.
    let cut = hostname.get(..HOSTNAME_MAX_LEN).unwrap_or(hostname);
    cut.trim_end_matches(['-', '.']).to_string()
}

#[cfg(test)]
mod tests {
    use super::pod_hostname;

    #[test]
    fn hostnames_are_cut_to_63_characters_without_a_trailing_dash_or_dot() {
        assert_eq!(pod_hostname("web-node-a"), "web-node-a");
        let exact = "a".repeat(63);
        assert_eq!(pod_hostname(&exact), exact);
        // A static pod whose `<name>-<node>` passes the limit at the dash.
        let long = format!("{}-{}", "a".repeat(62), "node-a");
        assert_eq!(pod_hostname(&long), "a".repeat(62));
        let dots = format!("{}.-.{}", "b".repeat(60), "c".repeat(10));
        assert_eq!(pod_hostname(&dots), "b".repeat(60));
    }
}
