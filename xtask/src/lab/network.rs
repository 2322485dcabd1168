//! Pod networking: the CNI conflist `up` writes, and everything `down` must undo that the
//! CNI plugins did to the host (bridge, veths, iptables rules and chains, nftables tables,
//! `ip_forward`).

use std::collections::{BTreeMap, BTreeSet};
use std::fs;
use std::process::Command;
use std::time::Duration;

use serde_json::json;

use super::error::LabError;
use super::paths::LabPaths;
use super::process::{exec, exec_ok, find_program};
use super::{BRIDGE, CNI_NETWORK, POD_SUBNET};

const PART: &str = "network";
const CMD_TIMEOUT: Duration = Duration::from_secs(20);
pub(crate) const IP_FORWARD: &str = "/proc/sys/net/ipv4/ip_forward";

/// The CNI version the conflist declares; the installed plugins (1.1.1) support up to
/// 1.0.0, and containerd 1.6's libcni does too.
pub const CNI_VERSION: &str = "1.0.0";

/// The lab's conflist. containerd adds the loopback interface itself, so only the pod
/// network is listed.
pub fn conflist(paths: &LabPaths) -> serde_json::Value {
    json!({
        "cniVersion": CNI_VERSION,
        "name": CNI_NETWORK,
        "plugins": [
            {
                "type": "bridge",
                "bridge": BRIDGE,
                "isGateway": true,
                "ipMasq": true,
                "hairpinMode": true,
                "ipam": {
                    "type": "host-local",
                    "ranges": [[{ "subnet": POD_SUBNET }]],
                    "routes": [{ "dst": "0.0.0.0/0" }],
                    "dataDir": paths.ipam_dir(),
                }
            },
            {
                "type": "portmap",
                "capabilities": { "portMappings": true }
            }
        ]
    })
}

pub(crate) fn write_conflist(
    paths: &LabPaths,
    extra_plugins: &[serde_json::Value],
    max_pod_ips: Option<u8>,
) -> Result<(), LabError> {
    let dir = paths.cni_conf_dir();
    fs::create_dir_all(&dir).map_err(|e| LabError::io("cni", "create", &dir, e))?;
    fs::create_dir_all(paths.ipam_dir())
        .map_err(|e| LabError::io("cni", "create", paths.ipam_dir(), e))?;
    let mut list = conflist(paths);
    if let Some(n) = max_pod_ips {
        let (start, end) = pod_ip_range(n);
        let range = &mut list["plugins"][0]["ipam"]["ranges"][0][0];
        range["rangeStart"] = start.into();
        range["rangeEnd"] = end.into();
    }
    if let Some(plugins) = list["plugins"].as_array_mut() {
        plugins.extend(extra_plugins.iter().cloned());
    }
    let text = serde_json::to_string_pretty(&list).expect("a json! value serializes");
    let file = paths.cni_conflist();
    fs::write(&file, text + "\n").map_err(|e| LabError::io("cni", "write", &file, e))
}

/// The first and last of `n` pod IPs (at least one): from the address after the
/// gateway, which the bridge takes (the subnet's first).
pub(crate) fn pod_ip_range(n: u8) -> (String, String) {
    let net: std::net::Ipv4Addr = POD_SUBNET
        .split_once('/')
        .and_then(|(ip, _)| ip.parse().ok())
        .expect("POD_SUBNET is an IPv4 CIDR");
    let first = u32::from(net) + 2;
    let last = first + u32::from(n.max(1)) - 1;
    (
        std::net::Ipv4Addr::from(first).to_string(),
        std::net::Ipv4Addr::from(last).to_string(),
    )
}

/// IP reservations host-local holds under the lab's IPAM dir, as `<network>/<ip>`. Its
/// bookkeeping files (`lock`, `last_reserved_ip.N`) are not reservations.
pub(crate) fn ipam_reservations(paths: &LabPaths) -> Vec<String> {
    let mut out = Vec::new();
    let Ok(networks) = fs::read_dir(paths.ipam_dir()) else {
        return out;
    };
    for net in networks.flatten() {
        let Ok(entries) = fs::read_dir(net.path()) else {
            continue;
        };
        for e in entries.flatten() {
            let name = e.file_name().to_string_lossy().into_owned();
            if name.parse::<std::net::IpAddr>().is_ok() {
                out.push(format!("{}/{name}", net.file_name().to_string_lossy()));
            }
        }
    }
    out.sort();
    out
}

// ---------------------------------------------------------------------------------------
// Links

/// Names of links, from `ip -o link` (`3: veth12ab@if2: <...> ...`).
pub(crate) fn parse_link_names(text: &str) -> Vec<String> {
    text.lines()
        .filter_map(|l| {
            let name = l.split(": ").nth(1)?;
            let name = name.split('@').next()?.trim();
            (!name.is_empty()).then(|| name.to_owned())
        })
        .collect()
}

pub(crate) fn link_names(args: &[&str]) -> Vec<String> {
    let mut cmd = Command::new("ip");
    cmd.arg("-o").arg("link").arg("show").args(args);
    match exec(PART, cmd, None, CMD_TIMEOUT) {
        Ok(out) if out.status.success() => parse_link_names(&String::from_utf8_lossy(&out.stdout)),
        _ => Vec::new(),
    }
}

/// Deletes the veths still enslaved to the lab bridge, then the bridge. Deleting a veth end
/// removes its peer too.
pub(crate) fn delete_links(removed: &mut Vec<String>, problems: &mut Vec<String>) {
    if !link_names(&[]).iter().any(|n| n == BRIDGE) {
        return;
    }
    for veth in link_names(&["master", BRIDGE]) {
        delete_link(&veth, removed, problems);
    }
    delete_link(BRIDGE, removed, problems);
}

fn delete_link(name: &str, removed: &mut Vec<String>, problems: &mut Vec<String>) {
    let mut cmd = Command::new("ip");
    cmd.args(["link", "del", name]);
    match exec_ok(PART, cmd, None, CMD_TIMEOUT) {
        Ok(_) => removed.push(name.to_owned()),
        Err(e) => {
            // A veth whose peer's namespace just died disappears on its own.
            if link_names(&[]).iter().any(|n| n == name) {
                problems.push(e.to_string());
            }
        }
    }
}

// ---------------------------------------------------------------------------------------
// iptables

/// IP families whose iptables state the lab snapshots.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Family {
    V4,
    V6,
}

impl Family {
    pub(crate) const ALL: [Family; 2] = [Family::V4, Family::V6];

    /// `v4` or `v6`, as the family is.
    fn pick(self, v4: &'static str, v6: &'static str) -> &'static str {
        match self {
            Family::V4 => v4,
            Family::V6 => v6,
        }
    }

    fn save(self) -> &'static str {
        self.pick("iptables-save", "ip6tables-save")
    }

    fn restore(self) -> &'static str {
        self.pick("iptables-restore", "ip6tables-restore")
    }

    pub(crate) fn label(self) -> &'static str {
        self.pick("ipv4", "ipv6")
    }

    fn nft_family(self) -> &'static str {
        self.pick("ip", "ip6")
    }

    pub(crate) fn baseline_file(self) -> &'static str {
        self.pick("iptables-save.txt", "ip6tables-save.txt")
    }
}

/// The output of `iptables-save` for one family; empty if the tool is missing, or for IPv6
/// if the kernel has no IPv6 firewall (the lab's pods are IPv4-only, so nothing of the lab
/// can be there).
pub(crate) fn save(family: Family) -> Result<String, LabError> {
    if find_program(family.save()).is_none() {
        return Ok(String::new());
    }
    match exec_ok(PART, Command::new(family.save()), None, CMD_TIMEOUT) {
        Ok(out) => Ok(String::from_utf8_lossy(&out.stdout).into_owned()),
        Err(_) if family == Family::V6 => Ok(String::new()),
        Err(e) => Err(e),
    }
}

#[derive(Debug, Default, Clone, PartialEq, Eq)]
pub(crate) struct Table {
    /// Chain name to policy; user-defined chains have policy `-`.
    pub chains: BTreeMap<String, String>,
    /// Rules as `iptables-save` prints them, `-A CHAIN ...`, in order.
    pub rules: Vec<String>,
}

#[derive(Debug, Default, Clone, PartialEq, Eq)]
pub(crate) struct Dump {
    pub tables: BTreeMap<String, Table>,
}

impl Dump {
    pub(crate) fn parse(text: &str) -> Dump {
        let mut dump = Dump::default();
        let mut current: Option<String> = None;
        for line in text.lines() {
            let line = line.trim_end();
            if let Some(name) = line.strip_prefix('*') {
                dump.tables.entry(name.to_owned()).or_default();
                current = Some(name.to_owned());
            } else if line == "COMMIT" {
                current = None;
            } else if let Some(table) = current.as_ref().and_then(|t| dump.tables.get_mut(t)) {
                if let Some(decl) = line.strip_prefix(':') {
                    let mut f = decl.split_whitespace();
                    if let (Some(chain), Some(policy)) = (f.next(), f.next()) {
                        table.chains.insert(chain.to_owned(), policy.to_owned());
                    }
                } else if line.starts_with("-A ") {
                    table.rules.push(line.to_owned());
                }
            }
        }
        dump
    }

    /// Rule lines and user-chain declarations, normalized for comparison: no counters, no
    /// comments, one string per item, prefixed with the table.
    pub(crate) fn normalized(&self) -> Vec<String> {
        let mut out = Vec::new();
        for (name, table) in &self.tables {
            out.push(format!("table {name}"));
            for (chain, policy) in &table.chains {
                out.push(format!("{name}: :{chain} {policy}"));
            }
            let mut seen: BTreeMap<&str, usize> = BTreeMap::new();
            for rule in &table.rules {
                let n = seen.entry(rule).or_default();
                *n += 1;
                if *n == 1 {
                    out.push(format!("{name}: {rule}"));
                } else {
                    out.push(format!("{name}: {rule} (copy {n})"));
                }
            }
        }
        out
    }

    /// A copy without the lab's rules, used as a stand-in baseline when the real one is
    /// gone: rules that name the lab's network or subnet, and the chains only they jump to.
    pub(crate) fn without_lab_rules(&self) -> Dump {
        let subnet_prefix = POD_SUBNET
            .rsplit_once('.')
            .map(|(p, _)| p)
            .unwrap_or(POD_SUBNET);
        let network_mark = format!("\\\"{CNI_NETWORK}\\\"");
        let is_lab =
            |r: &str| r.contains(&network_mark) || r.contains(&format!("{subnet_prefix}."));
        let mut out = self.clone();
        for table in out.tables.values_mut() {
            let (lab, kept): (Vec<String>, Vec<String>) =
                table.rules.iter().cloned().partition(|r| is_lab(r));
            let mut lab_chains: BTreeSet<String> =
                lab.iter().filter_map(|r| jump_target(r)).collect();
            // Chains named only from lab rules, and everything inside them, go too.
            loop {
                let more: BTreeSet<String> = kept
                    .iter()
                    .filter(|r| lab_chains.contains(rule_chain(r)))
                    .filter_map(|r| jump_target(r))
                    .filter(|c| !lab_chains.contains(c))
                    .collect();
                if more.is_empty() {
                    break;
                }
                lab_chains.extend(more);
            }
            let kept: Vec<String> = kept
                .into_iter()
                .filter(|r| !lab_chains.contains(rule_chain(r)))
                .collect();
            lab_chains.retain(|c| {
                table.chains.get(c).is_some_and(|p| p == "-")
                    && !kept.iter().any(|r| jump_target(r).as_deref() == Some(c))
            });
            table.chains.retain(|c, _| !lab_chains.contains(c));
            table.rules = kept;
        }
        out
    }
}

fn rule_chain(rule: &str) -> &str {
    rule.split_whitespace().nth(1).unwrap_or("")
}

fn jump_target(rule: &str) -> Option<String> {
    let mut words = rule.split_whitespace();
    while let Some(w) = words.next() {
        if w == "-j" || w == "-g" || w == "--jump" || w == "--goto" {
            return words.next().map(str::to_owned);
        }
    }
    None
}

/// What `down` has to delete so that `now` looks like `baseline` again.
#[derive(Debug, Default, Clone, PartialEq, Eq)]
pub(crate) struct Cleanup {
    /// An `iptables-restore --noflush` script; empty when there is nothing to undo.
    pub script: String,
    pub rules: Vec<String>,
    pub chains: Vec<String>,
}

/// Rules in `now` beyond those in `baseline` (counting duplicates), and user chains in `now`
/// that `baseline` lacks. Rules inside added chains go with the chain's flush.
pub(crate) fn cleanup(baseline: &Dump, now: &Dump) -> Cleanup {
    let empty = Table::default();
    let mut c = Cleanup::default();
    for (name, table) in &now.tables {
        let base = baseline.tables.get(name).unwrap_or(&empty);
        let added_chains: Vec<&String> = table
            .chains
            .iter()
            .filter(|(chain, policy)| *policy == "-" && !base.chains.contains_key(*chain))
            .map(|(chain, _)| chain)
            .collect();
        let mut remaining: BTreeMap<&str, usize> = BTreeMap::new();
        for r in &base.rules {
            *remaining.entry(r).or_default() += 1;
        }
        let mut added_rules = Vec::new();
        for r in &table.rules {
            match remaining.get_mut(r.as_str()) {
                Some(n) if *n > 0 => *n -= 1,
                _ => {
                    if !added_chains.iter().any(|ch| ch.as_str() == rule_chain(r)) {
                        added_rules.push(r);
                    }
                }
            }
        }
        if added_rules.is_empty() && added_chains.is_empty() {
            continue;
        }
        c.script.push_str(&format!("*{name}\n"));
        for r in &added_rules {
            c.script.push_str(&format!("-D{}\n", &r[2..]));
            c.rules.push(format!("{name}: {r}"));
        }
        for ch in &added_chains {
            c.script.push_str(&format!("-F {ch}\n"));
        }
        for ch in &added_chains {
            c.script.push_str(&format!("-X {ch}\n"));
            c.chains.push(format!("{name}: {ch}"));
        }
        c.script.push_str("COMMIT\n");
    }
    c
}

/// Applies a cleanup script. `--noflush` keeps every other rule in the touched tables.
pub(crate) fn apply(family: Family, cleanup: &Cleanup) -> Result<(), LabError> {
    if cleanup.script.is_empty() {
        return Ok(());
    }
    let mut cmd = Command::new(family.restore());
    cmd.arg("--noflush");
    exec_ok(PART, cmd, Some(cleanup.script.as_bytes()), CMD_TIMEOUT).map(|_| ())
}

// ---------------------------------------------------------------------------------------
// nftables tables

/// `nft list tables` output as `family name` pairs; empty without nft.
pub(crate) fn nft_tables() -> Vec<String> {
    if find_program("nft").is_none() {
        return Vec::new();
    }
    let mut cmd = Command::new("nft");
    cmd.args(["list", "tables"]);
    match exec(PART, cmd, None, CMD_TIMEOUT) {
        Ok(out) if out.status.success() => parse_nft_tables(&String::from_utf8_lossy(&out.stdout)),
        _ => Vec::new(),
    }
}

pub(crate) fn parse_nft_tables(text: &str) -> Vec<String> {
    text.lines()
        .filter_map(|l| l.trim().strip_prefix("table "))
        .map(|t| t.trim().to_owned())
        .collect()
}

/// With iptables-nft, the first rule in a table creates that nftables table, and removing
/// the rules leaves it (empty) behind. Deletes such tables that did not exist at `up` and
/// hold nothing now.
pub(crate) fn delete_new_empty_tables(
    baseline_tables: &[String],
    removed: &mut Vec<String>,
    problems: &mut Vec<String>,
) {
    for family in Family::ALL {
        let Ok(text) = save(family) else {
            continue;
        };
        let dump = Dump::parse(&text);
        for (name, table) in &dump.tables {
            let id = format!("{} {name}", family.nft_family());
            let empty = table.rules.is_empty() && table.chains.values().all(|p| p != "-");
            if !empty || baseline_tables.contains(&id) || !nft_tables().contains(&id) {
                continue;
            }
            let mut cmd = Command::new("nft");
            cmd.args(["delete", "table", family.nft_family(), name]);
            match exec_ok(PART, cmd, None, CMD_TIMEOUT) {
                Ok(_) => removed.push(format!("nftables table {id}")),
                Err(e) => problems.push(e.to_string()),
            }
        }
    }
}

pub(crate) fn read_ip_forward() -> Option<String> {
    fs::read_to_string(IP_FORWARD)
        .ok()
        .map(|s| s.trim().to_owned())
}

/// The bridge plugin turns on forwarding for its gateway; put the old value back.
pub(crate) fn restore_ip_forward(
    baseline: Option<&str>,
    removed: &mut Vec<String>,
    problems: &mut Vec<String>,
) {
    let (Some(before), Some(now)) = (baseline, read_ip_forward()) else {
        return;
    };
    if before == now {
        return;
    }
    match fs::write(IP_FORWARD, before) {
        Ok(()) => removed.push(format!("net.ipv4.ip_forward={now} (restored to {before})")),
        Err(e) => problems.push(format!("restore {IP_FORWARD} to {before}: {e}")),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const BASE: &str = "\
# Generated by iptables-nft-save v1.8.9 (nf_tables) on Sat Nov 22 07:20:00 2025
*filter
:INPUT ACCEPT [10:600]
:FORWARD ACCEPT [0:0]
:OUTPUT ACCEPT [0:0]
-A INPUT -i lo -j ACCEPT
COMMIT
# Completed on Sat Nov 22 07:20:00 2025
";

    const NOW: &str = r#"# Generated by iptables-nft-save v1.8.9 (nf_tables) on Sat Nov 22 07:25:00 2025
*filter
:INPUT ACCEPT [99:6000]
:FORWARD ACCEPT [0:0]
:OUTPUT ACCEPT [0:0]
-A INPUT -i lo -j ACCEPT
-A INPUT -i lo -j ACCEPT
COMMIT
*nat
:PREROUTING ACCEPT [0:0]
:INPUT ACCEPT [0:0]
:OUTPUT ACCEPT [0:0]
:POSTROUTING ACCEPT [0:0]
:CNI-HOSTPORT-DNAT - [0:0]
:CNI-0123abcd - [0:0]
-A PREROUTING -m addrtype --dst-type LOCAL -j CNI-HOSTPORT-DNAT
-A POSTROUTING -s 10.244.77.2/32 -m comment --comment "name: \"podlapse-lab\" id: \"0123\"" -j CNI-0123abcd
-A CNI-0123abcd -d 10.244.77.0/24 -m comment --comment "name: \"podlapse-lab\" id: \"0123\"" -j ACCEPT
-A CNI-0123abcd ! -d 224.0.0.0/4 -m comment --comment "name: \"podlapse-lab\" id: \"0123\"" -j MASQUERADE
COMMIT
"#;

    #[test]
    fn parses_tables_chains_rules() {
        let d = Dump::parse(NOW);
        assert_eq!(d.tables.len(), 2);
        let nat = &d.tables["nat"];
        assert_eq!(nat.chains["CNI-0123abcd"], "-");
        assert_eq!(nat.chains["POSTROUTING"], "ACCEPT");
        assert_eq!(nat.rules.len(), 4);
        assert_eq!(d.tables["filter"].rules.len(), 2);
    }

    #[test]
    fn cleanup_deletes_added_rules_and_chains_only() {
        let c = cleanup(&Dump::parse(BASE), &Dump::parse(NOW));
        // The duplicate INPUT rule is new; the original stays.
        assert!(
            c.script
                .contains("*filter\n-D INPUT -i lo -j ACCEPT\nCOMMIT\n"),
            "{}",
            c.script
        );
        assert!(
            c.script
                .contains("-D PREROUTING -m addrtype --dst-type LOCAL -j CNI-HOSTPORT-DNAT\n")
        );
        assert!(c.script.contains(r#"-D POSTROUTING -s 10.244.77.2/32 -m comment --comment "name: \"podlapse-lab\" id: \"0123\"" -j CNI-0123abcd"#));
        // Rules inside added chains go with the flush, before the chains are deleted.
        assert!(!c.script.contains("-D CNI-0123abcd"));
        let flush = c.script.find("-F CNI-0123abcd").unwrap();
        let delete = c.script.find("-X CNI-0123abcd").unwrap();
        let flush_other = c.script.find("-F CNI-HOSTPORT-DNAT").unwrap();
        assert!(flush < delete && flush_other < delete);
        assert_eq!(c.chains.len(), 2);
        assert_eq!(c.rules.len(), 3);
    }

    #[test]
    fn nothing_to_do_when_unchanged() {
        let c = cleanup(&Dump::parse(NOW), &Dump::parse(NOW));
        assert!(c.script.is_empty());
        assert_eq!(Dump::parse(NOW).normalized(), Dump::parse(NOW).normalized());
    }

    #[test]
    fn normalized_ignores_counters_and_comments() {
        let a = Dump::parse(BASE).normalized();
        let b = Dump::parse(
            &BASE
                .replace("[10:600]", "[11:700]")
                .replace("07:20", "08:00"),
        )
        .normalized();
        assert_eq!(a, b);
        assert!(a.contains(&"filter: :INPUT ACCEPT".to_owned()), "{a:?}");
    }

    #[test]
    fn fallback_finds_lab_rules_by_name_and_subnet() {
        let now = Dump::parse(NOW);
        let guess = now.without_lab_rules();
        let c = cleanup(&guess, &now);
        assert_eq!(c.chains, vec!["nat: CNI-0123abcd".to_owned()]);
        assert_eq!(c.rules.len(), 1, "{:?}", c.rules);
        // Shared portmap chains and unrelated rules are left alone without a baseline.
        assert!(!c.script.contains("HOSTPORT"));
        assert!(!c.script.contains("INPUT"));
    }

    #[test]
    fn link_names_strip_peer_suffix() {
        let text = "1: lo: <LOOPBACK,UP,LOWER_UP> mtu 65536 qdisc noqueue state UNKNOWN mode DEFAULT group default qlen 1000\\    link/loopback 00:00:00:00:00:00 brd 00:00:00:00:00:00
7: veth0a1b2c3d@if2: <BROADCAST,MULTICAST,UP,LOWER_UP> mtu 1500 qdisc noqueue master ptlab0 state UP mode DEFAULT group default \\    link/ether 5a:aa:bb:cc:dd:ee brd ff:ff:ff:ff:ff:ff link-netns cni-1
";
        assert_eq!(parse_link_names(text), vec!["lo", "veth0a1b2c3d"]);
    }

    #[test]
    fn conflist_shape() {
        let paths = LabPaths::new("/var/lib/podlapse-lab");
        let c = conflist(&paths);
        assert_eq!(c["cniVersion"], "1.0.0");
        assert_eq!(c["name"], "podlapse-lab");
        let bridge = &c["plugins"][0];
        assert_eq!(bridge["type"], "bridge");
        assert_eq!(bridge["bridge"], "ptlab0");
        assert_eq!(bridge["isGateway"], true);
        assert_eq!(bridge["ipMasq"], true);
        assert_eq!(bridge["ipam"]["type"], "host-local");
        assert_eq!(bridge["ipam"]["ranges"][0][0]["subnet"], "10.244.77.0/24");
        assert_eq!(bridge["ipam"]["dataDir"], "/var/lib/podlapse-lab/cni/ipam");
        assert_eq!(c["plugins"][1]["type"], "portmap");
        assert_eq!(c["plugins"][1]["capabilities"]["portMappings"], true);
        assert_eq!(c["plugins"].as_array().unwrap().len(), 2);
    }

    #[test]
    fn a_pod_ip_limit_ends_host_locals_range_after_the_gateway() {
        assert_eq!(
            pod_ip_range(2),
            ("10.244.77.2".to_owned(), "10.244.77.3".to_owned())
        );
        assert_eq!(
            pod_ip_range(0),
            ("10.244.77.2".to_owned(), "10.244.77.2".to_owned())
        );
    }

    #[test]
    fn nft_tables_parse() {
        assert_eq!(
            parse_nft_tables("table ip nat\ntable ip filter\ntable inet x\n"),
            vec!["ip nat", "ip filter", "inet x"]
        );
    }
}
