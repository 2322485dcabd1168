//! The node's IPAM state, for "why has this pod no IP?" while the pod still fails: what
//! host-local's store holds when the observer is asked. host-local keeps one file per
//! address it handed out, named by the address, holding the container (sandbox) ID it
//! went to and the interface, under `<dataDir>/<network name>` (dataDir defaults to
//! `/var/lib/cni/networks`). The network is the runtime's: the first configuration in its
//! CNI conf directory, as libcni orders them (by file name), which is the one containerd
//! loads. Only host-local keeps such a store; another IPAM plugin gives no state here.
//! (libcni's result cache holds only successful ADDs, so it says nothing of a failing
//! pod.)

use std::net::Ipv4Addr;
use std::path::{Path, PathBuf};

use crate::diagnose::{Cause, Diagnosis};

/// host-local's store when the configuration names no `dataDir`.
pub const DEFAULT_DATA_DIR: &str = "/var/lib/cni/networks";

/// Where the node's host-local keeps its reservations, and how many it can make.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct IpamStore {
    pub network: String,
    pub dir: PathBuf,
    /// Addresses in its first IPv4 range (without the gateway), when the range says.
    pub capacity: Option<u64>,
}

/// One reservation: the address and the sandbox it went to.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Held {
    pub ip: String,
    pub sandbox_id: String,
}

impl IpamStore {
    /// The store of the first configuration in `conf_dir`; None when it has none, or its
    /// IPAM is not host-local.
    pub fn of_conf_dir(conf_dir: &Path) -> Option<IpamStore> {
        let mut files: Vec<PathBuf> = std::fs::read_dir(conf_dir)
            .ok()?
            .flatten()
            .map(|e| e.path())
            .filter(|p| {
                p.extension()
                    .is_some_and(|e| e == "conflist" || e == "conf" || e == "json")
            })
            .collect();
        files.sort();
        let text = std::fs::read_to_string(files.first()?).ok()?;
        IpamStore::of_conf(&serde_json::from_str(&text).ok()?)
    }

    /// From a CNI configuration (a list with `plugins`, or one plugin's).
    pub fn of_conf(conf: &serde_json::Value) -> Option<IpamStore> {
        let network = conf["name"].as_str()?.to_string();
        let plugins: Vec<&serde_json::Value> = match conf["plugins"].as_array() {
            Some(list) => list.iter().collect(),
            None => vec![conf],
        };
        let ipam = plugins
            .iter()
            .map(|p| &p["ipam"])
            .find(|i| i["type"] == "host-local")?;
        let data_dir = ipam["dataDir"].as_str().unwrap_or(DEFAULT_DATA_DIR);
        Some(IpamStore {
            dir: Path::new(data_dir).join(&network),
            network,
            capacity: capacity(ipam),
        })
    }

    /// The reservations now, by address.
    pub fn held(&self) -> std::io::Result<Vec<Held>> {
        let mut out = Vec::new();
        for entry in std::fs::read_dir(&self.dir)?.flatten() {
            let name = entry.file_name().to_string_lossy().into_owned();
            // The lock and `last_reserved_ip.<range>` share the directory.
            if name.parse::<std::net::IpAddr>().is_err() {
                continue;
            }
            let text = std::fs::read_to_string(entry.path()).unwrap_or_default();
            out.push(Held {
                ip: name,
                sandbox_id: text.lines().next().unwrap_or_default().trim().to_string(),
            });
        }
        out.sort_by(|a, b| a.ip.cmp(&b.ip));
        Ok(out)
    }
}

/// Addresses host-local can hand out from its first IPv4 range: `rangeStart` to
/// `rangeEnd` (by default the subnet's first to last host), less the gateway (by default
/// the subnet's first host) when it falls inside.
fn capacity(ipam: &serde_json::Value) -> Option<u64> {
    let range = ipam["ranges"]
        .get(0)
        .and_then(|set| set.get(0))
        .unwrap_or(ipam);
    let (net, prefix) = range["subnet"].as_str()?.split_once('/')?;
    let net: Ipv4Addr = net.parse().ok()?;
    let prefix: u32 = prefix.parse().ok()?;
    if !(1..=30).contains(&prefix) {
        return None;
    }
    let base = u32::from(net) & (u32::MAX << (32 - prefix));
    let broadcast = base | (u32::MAX >> prefix);
    let addr = |k: &str, default: u32| -> Option<u32> {
        match range[k].as_str() {
            Some(s) => s.parse::<Ipv4Addr>().ok().map(u32::from),
            None => Some(default),
        }
    };
    let start = addr("rangeStart", base + 1)?;
    let end = addr("rangeEnd", broadcast - 1)?;
    let gateway = addr("gateway", base + 1)?;
    if end < start {
        return None;
    }
    let all = u64::from(end - start) + 1;
    Some(all - u64::from((start..=end).contains(&gateway)))
}

/// The causes whose pods get the IPAM state as evidence.
fn about_addresses(cause: Cause) -> bool {
    matches!(
        cause,
        Cause::CniPluginFailed | Cause::IpamExhausted | Cause::SandboxFailed | Cause::LeakedIp
    )
}

/// Adds to each verdict about a pod's network what the store holds: how full it is, and
/// which of the pod's sandbox attempts (`attempts`: the pod's UID to its sandbox IDs)
/// still hold an address.
pub fn add_evidence(
    diagnosis: &mut Diagnosis,
    store: &IpamStore,
    held: &[Held],
    attempts: &dyn Fn(&str) -> Vec<String>,
) {
    for p in &mut diagnosis.pods {
        if !about_addresses(p.verdict.cause) {
            continue;
        }
        let fill = match store.capacity {
            Some(c) => format!("{} of {c} addresses held", held.len()),
            None => format!("{} addresses held", held.len()),
        };
        p.verdict.evidence.push(format!(
            "IPAM now: host-local's store for network {} ({}): {fill}",
            store.network,
            store.dir.display()
        ));
        let mine: Vec<String> = attempts(&p.uid)
            .iter()
            .filter_map(|id| {
                held.iter()
                    .find(|h| h.sandbox_id == *id)
                    .map(|h| format!("{} for sandbox {}", h.ip, &id[..id.len().min(12)]))
            })
            .collect();
        p.verdict.evidence.push(if mine.is_empty() {
            "IPAM now: none of the pod's sandbox attempts holds an address".to_string()
        } else {
            format!(
                "IPAM now: the pod's failed attempts still hold {} (released only by a CNI DEL)",
                mine.join(", ")
            )
        });
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn the_store_and_its_size_come_from_the_first_host_local_plugin() {
        let conf = json!({
            "cniVersion": "1.0.0", "name": "lab",
            "plugins": [
                {"type": "bridge", "ipam": {"type": "host-local", "dataDir": "/var/lib/lab/ipam",
                 "ranges": [[{"subnet": "10.244.77.0/24", "rangeStart": "10.244.77.10", "rangeEnd": "10.244.77.12"}]]}},
                {"type": "portmap"}
            ]
        });
        let s = IpamStore::of_conf(&conf).unwrap();
        assert_eq!(s.network, "lab");
        assert_eq!(s.dir, Path::new("/var/lib/lab/ipam/lab"));
        assert_eq!(s.capacity, Some(3));
        // A whole /24 with the default gateway (.1) inside: .1 to .254 less the gateway.
        let plain = json!({"name": "n", "type": "bridge",
            "ipam": {"type": "host-local", "subnet": "10.0.0.0/24"}});
        let s = IpamStore::of_conf(&plain).unwrap();
        assert_eq!(s.dir, Path::new(DEFAULT_DATA_DIR).join("n"));
        assert_eq!(s.capacity, Some(253));
        let other = json!({"name": "n", "plugins": [{"type": "x", "ipam": {"type": "dhcp"}}]});
        assert_eq!(IpamStore::of_conf(&other), None);
    }

    #[test]
    fn reservations_are_read_by_address_and_the_pods_attempts_named() {
        let dir = tempfile::tempdir().unwrap();
        let store = IpamStore {
            network: "lab".into(),
            dir: dir.path().to_path_buf(),
            capacity: Some(2),
        };
        std::fs::write(dir.path().join("10.0.0.3"), "aaaaaaaaaaaaaaaa\neth0").unwrap();
        std::fs::write(dir.path().join("10.0.0.2"), "bbbbbbbbbbbbbbbb\neth0").unwrap();
        std::fs::write(dir.path().join("last_reserved_ip.0"), "10.0.0.3").unwrap();
        std::fs::write(dir.path().join("lock"), "").unwrap();
        let held = store.held().unwrap();
        assert_eq!(
            held,
            vec![
                Held {
                    ip: "10.0.0.2".into(),
                    sandbox_id: "bbbbbbbbbbbbbbbb".into()
                },
                Held {
                    ip: "10.0.0.3".into(),
                    sandbox_id: "aaaaaaaaaaaaaaaa".into()
                },
            ]
        );
        let finding = |cause| crate::diagnose::Finding {
            cause,
            stage: "cni_plugin:tuning".into(),
            summary: String::new(),
            evidence: vec!["first".into()],
        };
        let pod = |uid: &str, cause| crate::diagnose::PodDiagnosis {
            namespace: "default".into(),
            name: uid.into(),
            uid: uid.into(),
            ip: None,
            running: false,
            verdict: finding(cause),
            also: Vec::new(),
        };
        let mut d = Diagnosis {
            pods: vec![
                pod("failing", Cause::CniPluginFailed),
                pod("fine", Cause::Healthy),
            ],
            notes: Vec::new(),
        };
        let attempts = |uid: &str| match uid {
            "failing" => vec!["aaaaaaaaaaaaaaaa".to_string(), "cccc".to_string()],
            _ => Vec::new(),
        };
        add_evidence(&mut d, &store, &held, &attempts);
        let ev = &d.pods[0].verdict.evidence;
        assert_eq!(ev[0], "first", "the verdict's own evidence stays first");
        assert!(ev[1].contains("2 of 2 addresses held"), "{ev:?}");
        assert!(
            ev[2].contains("10.0.0.3 for sandbox aaaaaaaaaaaa"),
            "{ev:?}"
        );
        assert_eq!(d.pods[1].verdict.evidence, vec!["first".to_string()]);
    }
}
