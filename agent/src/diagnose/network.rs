//! The node's pod network in a diagnosis, from the recorder's looks at it
//! (`TraceRecord::Network`): findings about the node itself (its network not ready and
//! why, the network naming a plugin that is not installed, host-local's pool full or
//! holding leaked reservations), and the evidence a pod's verdict takes from the network
//! as it was when the pod failed.

use std::collections::BTreeMap;

use crate::trace::{IpamRecord, NodeNetworkRecord};

use super::model::{Cause, NodeFinding};

/// How far past a failure the look that saw it may come: the recorder looks once a
/// second.
pub(super) const LOOK_LAG_NS: u64 = 2_000_000_000;

fn short(id: &str) -> &str {
    &id[..id.len().min(12)]
}

/// The findings about the node, from its last look.
pub(super) fn node_findings(last: Option<&NodeNetworkRecord>) -> Vec<NodeFinding> {
    let Some(n) = last else {
        return Vec::new();
    };
    let mut out = Vec::new();
    if n.not_ready() {
        out.push(NodeFinding {
            cause: Cause::NetworkNotReady,
            summary: format!(
                "the node's pod network is not ready: {}; every sandbox fails until it is",
                not_ready_why(n)
            ),
            evidence: not_ready_evidence(n),
        });
    } else if !n.missing_plugins.is_empty() {
        out.push(NodeFinding {
            cause: Cause::CniPluginMissing,
            summary: format!(
                "the network {} names {} that no plugin directory has: every sandbox fails its CNI ADD",
                network_of(n),
                plugin_list(&n.missing_plugins)
            ),
            evidence: missing_evidence(n),
        });
    }
    out.extend(n.ipam.as_ref().and_then(pool_finding));
    out
}

fn plugin_list(plugins: &[String]) -> String {
    match plugins {
        [one] => format!("plugin {one}"),
        many => format!("plugins {}", many.join(", ")),
    }
}

/// The used network, for people: `lab (10-lab.conflist)`.
pub(super) fn network_of(n: &NodeNetworkRecord) -> String {
    let network = n
        .files
        .iter()
        .find(|f| f.file == n.used)
        .map(|f| f.network.as_str())
        .unwrap_or_default();
    match (network.is_empty(), n.used.is_empty()) {
        (_, true) => "?".to_string(),
        (true, false) => n.used.clone(),
        (false, false) => format!("{network} ({})", n.used),
    }
}

/// Why the network is not ready, in one phrase.
fn not_ready_why(n: &NodeNetworkRecord) -> String {
    if !n.conf_dir_error.is_empty() {
        return format!(
            "its CNI configuration directory cannot be read ({})",
            n.conf_dir_error
        );
    }
    match n.files.first() {
        None if !n.conf_dir.is_empty() => {
            format!("no network configuration in {}", n.conf_dir)
        }
        Some(first) if !first.problem.is_empty() => {
            format!("{} {}", first.file, first.problem)
        }
        _ => {
            let c = n.ready.as_ref();
            let words = c.map(|c| c.message.as_str()).filter(|m| !m.is_empty());
            words.map_or_else(|| "the runtime says so".to_string(), str::to_string)
        }
    }
}

/// The runtime's condition and words, and the configuration directory file by file.
pub(super) fn not_ready_evidence(n: &NodeNetworkRecord) -> Vec<String> {
    let mut out = Vec::new();
    if let Some(c) = &n.ready {
        let why = [c.reason.as_str(), c.message.as_str()]
            .into_iter()
            .filter(|s| !s.is_empty())
            .collect::<Vec<_>>()
            .join(": ");
        out.push(format!(
            "CRI Status: NetworkReady={}{}",
            c.status,
            if why.is_empty() {
                String::new()
            } else {
                format!(" ({why})")
            }
        ));
    }
    if !n.load_status.is_empty() {
        out.push(format!(
            "the runtime's last CNI configuration load: {}",
            n.load_status
        ));
    }
    out.extend(conf_dir_evidence(n));
    out
}

/// The configuration directory, file by file in libcni's order, saying which file the
/// runtime uses and where it stops.
pub(super) fn conf_dir_evidence(n: &NodeNetworkRecord) -> Vec<String> {
    let mut out = Vec::new();
    if !n.conf_dir_error.is_empty() {
        out.push(format!(
            "cannot read the CNI configuration directory: {}",
            n.conf_dir_error
        ));
        return out;
    }
    if n.conf_dir.is_empty() {
        return out;
    }
    if n.files.is_empty() {
        out.push(format!(
            "{} holds no network configuration (no *.conf, *.conflist or *.json file)",
            n.conf_dir
        ));
        return out;
    }
    out.push(format!(
        "{} holds {} configuration file{}, loaded in name order (libcni's): the first decides",
        n.conf_dir,
        n.files.len(),
        if n.files.len() == 1 { "" } else { "s" }
    ));
    let mut stopped = false;
    for (i, f) in n.files.iter().enumerate() {
        let what = if !f.problem.is_empty() {
            let here = if stopped {
                ""
            } else {
                stopped = true;
                "; the runtime's load stops here"
            };
            format!("{}{here}", f.problem)
        } else {
            let role = if f.file == n.used {
                "used by the runtime"
            } else if stopped {
                "not loaded: an earlier file fails"
            } else {
                "not used (the runtime uses one network)"
            };
            format!("network {} ({}): {role}", f.network, f.plugins.join(" -> "))
        };
        out.push(format!("{}. {}: {what}", i + 1, f.file));
    }
    out
}

/// The used network's plugins and which of them no plugin directory has.
pub(super) fn missing_evidence(n: &NodeNetworkRecord) -> Vec<String> {
    let chain = n
        .files
        .iter()
        .find(|f| f.file == n.used)
        .map(|f| f.plugins.join(" -> "))
        .unwrap_or_default();
    vec![
        format!("the runtime uses network {}: {chain}", network_of(n)),
        format!(
            "no executable for {} in the runtime's plugin directories [{}]",
            plugin_list(&n.missing_plugins),
            n.bin_dirs.join(" ")
        ),
    ]
}

/// A range set used up, or reservations held by sandboxes the runtime does not know.
fn pool_finding(ipam: &IpamRecord) -> Option<NodeFinding> {
    let full: Vec<_> = ipam.sets.iter().filter(|s| s.full()).collect();
    if full.is_empty() && ipam.leaked == 0 {
        return None;
    }
    let evidence = pool_evidence(ipam, &[], &BTreeMap::new());
    if let Some(set) = full.first() {
        Some(NodeFinding {
            cause: Cause::IpamExhausted,
            summary: format!(
                "host-local's range set {} of network {} is used up: {} of {} addresses held{}",
                set.ranges,
                ipam.network,
                set.held,
                set.capacity,
                if ipam.leaked > 0 {
                    format!(
                        ", {} by sandboxes the runtime does not know (leaked)",
                        ipam.leaked
                    )
                } else {
                    String::new()
                }
            ),
            evidence,
        })
    } else {
        Some(NodeFinding {
            cause: Cause::LeakedIp,
            summary: format!(
                "{} of host-local's reservations in network {} are held by sandboxes the runtime does not know (leaked)",
                ipam.leaked, ipam.network
            ),
            evidence,
        })
    }
}

/// The pool's fill per range set, its holders (the pod's own `attempts` marked), and
/// its leaks, with whether they are why it is full.
/// `owners` names the pod of each sandbox the records know.
pub(super) fn pool_evidence(
    ipam: &IpamRecord,
    attempts: &[&str],
    owners: &BTreeMap<String, String>,
) -> Vec<String> {
    let mut out = Vec::new();
    for s in &ipam.sets {
        out.push(format!(
            "host-local's store for network {} ({}): range set {} ({}) has {} of {} addresses held{}",
            ipam.network,
            ipam.dir,
            s.set,
            s.ranges,
            s.held,
            s.capacity,
            if s.full() { ": none free" } else { "" }
        ));
    }
    if !ipam.holders.is_empty() {
        let holders: Vec<String> = ipam
            .holders
            .iter()
            .map(|h| {
                let whose = if attempts.contains(&h.sandbox_id.as_str()) {
                    " (this pod's attempt)".to_string()
                } else if h.leaked {
                    " (leaked: the runtime knows no such sandbox)".to_string()
                } else {
                    owners
                        .get(&h.sandbox_id)
                        .map(|pod| format!(" (pod {pod})"))
                        .unwrap_or_default()
                };
                format!("{} by sandbox {}{whose}", h.ip, short(&h.sandbox_id))
            })
            .collect();
        out.push(format!("held: {}", holders.join(", ")));
    }
    if ipam.leaked > 0 {
        let leaked: Vec<String> = ipam
            .holders
            .iter()
            .filter(|h| h.leaked)
            .map(|h| format!("{} ({})", h.ip, h.sandbox_id))
            .collect();
        let full = ipam.sets.iter().any(|s| s.full());
        let unleaked_would_fit = ipam
            .sets
            .iter()
            .any(|s| s.full() && s.held.saturating_sub(ipam.leaked) < s.capacity);
        out.push(format!(
            "leaked: {} reservation{} of sandboxes the runtime does not know: {}{}",
            ipam.leaked,
            if ipam.leaked == 1 { "" } else { "s" },
            leaked.join(", "),
            if full && unleaked_would_fit {
                "; the leaks are why the range is full (release them, or remove their files once no such sandbox exists)"
            } else {
                ""
            }
        ));
    }
    if ipam.skipped > 0 {
        out.push(format!(
            "{} file{} in the store that host-local does not write, skipped",
            ipam.skipped,
            if ipam.skipped == 1 { "" } else { "s" }
        ));
    }
    out.extend(
        ipam.problems
            .iter()
            .map(|p| format!("the pool's configuration: {p}")),
    );
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::trace::{ConfFileRecord, HolderRecord, NetworkCondition, RangeSetRecord};

    fn record() -> NodeNetworkRecord {
        NodeNetworkRecord {
            at_ns: 1,
            ready: Some(NetworkCondition {
                status: true,
                reason: String::new(),
                message: String::new(),
            }),
            load_status: String::new(),
            conf_dir: "/etc/cni/net.d".into(),
            bin_dirs: vec!["/opt/cni/bin".into()],
            files: vec![ConfFileRecord {
                file: "10-lab.conflist".into(),
                network: "lab".into(),
                plugins: vec!["bridge".into(), "portmap".into()],
                problem: String::new(),
            }],
            conf_dir_error: String::new(),
            used: "10-lab.conflist".into(),
            missing_plugins: Vec::new(),
            ipam: None,
        }
    }

    #[test]
    fn a_healthy_network_has_no_finding() {
        assert!(node_findings(Some(&record())).is_empty());
        assert!(node_findings(None).is_empty());
    }

    #[test]
    fn not_ready_says_which_file_breaks_the_load_in_libcnis_order() {
        let mut n = record();
        n.ready = Some(NetworkCondition {
            status: false,
            reason: "NetworkPluginNotReady".into(),
            message: "Network plugin returns error: cni plugin not initialized".into(),
        });
        n.load_status = "cni config load failed: failed to load CNI config list file /etc/cni/net.d/05-x.conflist: error parsing configuration list: unexpected end of JSON input".into();
        n.files.insert(
            0,
            ConfFileRecord {
                file: "05-x.conflist".into(),
                network: String::new(),
                plugins: Vec::new(),
                problem: "is not valid JSON: EOF while parsing an object at line 1 column 9".into(),
            },
        );
        n.used = String::new();
        let f = node_findings(Some(&n));
        assert_eq!(f.len(), 1);
        assert_eq!(f[0].cause, Cause::NetworkNotReady);
        assert!(
            f[0].summary.contains("05-x.conflist is not valid JSON"),
            "{}",
            f[0].summary
        );
        let ev = &f[0].evidence;
        assert!(
            ev[0].starts_with("CRI Status: NetworkReady=false (NetworkPluginNotReady: "),
            "{ev:?}"
        );
        assert!(ev[1].contains("unexpected end of JSON input"), "{ev:?}");
        assert!(
            ev[3].starts_with("1. 05-x.conflist: is not valid JSON")
                && ev[3].ends_with("the runtime's load stops here"),
            "{ev:?}"
        );
        assert_eq!(
            ev[4],
            "2. 10-lab.conflist: network lab (bridge -> portmap): not loaded: an earlier file fails"
        );
        // An empty directory.
        n.files.clear();
        let f = node_findings(Some(&n));
        assert!(
            f[0].summary
                .contains("no network configuration in /etc/cni/net.d"),
            "{}",
            f[0].summary
        );
        assert!(f[0].evidence.iter().any(|e| e == "/etc/cni/net.d holds no network configuration (no *.conf, *.conflist or *.json file)"));
    }

    #[test]
    fn a_missing_plugin_names_itself_and_the_directories() {
        let mut n = record();
        n.missing_plugins = vec!["flannel".into()];
        let f = node_findings(Some(&n));
        assert_eq!(f[0].cause, Cause::CniPluginMissing);
        assert_eq!(
            f[0].evidence[1],
            "no executable for plugin flannel in the runtime's plugin directories [/opt/cni/bin]"
        );
    }

    #[test]
    fn a_full_pool_names_its_holders_and_says_when_leaks_fill_it() {
        let mut n = record();
        n.ipam = Some(IpamRecord {
            network: "lab".into(),
            dir: "/var/lib/cni/networks/lab".into(),
            sets: vec![RangeSetRecord {
                set: 0,
                ranges: "10.0.0.2-10.0.0.3".into(),
                capacity: 2,
                held: 2,
            }],
            held: 2,
            holders: vec![
                HolderRecord {
                    ip: "10.0.0.2".into(),
                    sandbox_id: "aaaaaaaaaaaaaaaaaaaa".into(),
                    leaked: true,
                },
                HolderRecord {
                    ip: "10.0.0.3".into(),
                    sandbox_id: "bbbbbbbbbbbbbbbbbbbb".into(),
                    leaked: false,
                },
            ],
            leaked: 1,
            skipped: 0,
            problems: Vec::new(),
        });
        let f = node_findings(Some(&n));
        assert_eq!(f[0].cause, Cause::IpamExhausted);
        assert!(f[0].summary.contains("10.0.0.2-10.0.0.3 of network lab is used up: 2 of 2 addresses held, 1 by sandboxes the runtime does not know"), "{}", f[0].summary);
        let ev = pool_evidence(
            n.ipam.as_ref().unwrap(),
            &["bbbbbbbbbbbbbbbbbbbb"],
            &BTreeMap::new(),
        );
        assert!(
            ev[1].contains(
                "10.0.0.2 by sandbox aaaaaaaaaaaa (leaked: the runtime knows no such sandbox)"
            ),
            "{ev:?}"
        );
        assert!(
            ev[1].contains("10.0.0.3 by sandbox bbbbbbbbbbbb (this pod's attempt)"),
            "{ev:?}"
        );
        assert!(ev[2].starts_with("leaked: 1 reservation of sandboxes the runtime does not know: 10.0.0.2 (aaaaaaaaaaaaaaaaaaaa); the leaks are why the range is full"), "{ev:?}");
    }
}
