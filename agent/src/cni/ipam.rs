//! host-local's address pool, as host-local itself keeps it: its configuration's ranges
//! and the store of reservations it writes. host-local keeps one file per address it
//! handed out, named by the address, holding the container (sandbox) ID it went to and
//! the interface, under `<dataDir>/<network name>` (`dataDir` defaults to
//! `/var/lib/cni/networks`), beside a `lock` and a `last_reserved_ip.<range set>` per
//! range set. Only host-local keeps such a store; another IPAM plugin gives no pool here.
//! (libcni's result cache holds only successful ADDs, so it says nothing of a failing
//! pod.)
//!
//! A configuration has range sets (`ranges`, one per address family a pod gets, or the
//! older single `subnet`), each a list of ranges; host-local gives a pod one address from
//! each set and reports `no IP addresses available in range set: <first>-<last>` when
//! every range of a set is used up.

use std::collections::BTreeSet;
use std::net::IpAddr;
use std::path::{Path, PathBuf};
use std::time::{Duration, SystemTime};

use serde_json::Value;

/// host-local's store when the configuration names no `dataDir`.
pub const DEFAULT_DATA_DIR: &str = "/var/lib/cni/networks";
/// A reservation younger than this may belong to a sandbox still being created (the
/// runtime lists a sandbox only once its RunPodSandbox is done, which on a busy node is
/// many seconds after the CNI ADD: the pause container is still to start), so it is not
/// called leaked. It is kubelet's default runtime request timeout: a RunPodSandbox that
/// runs longer is cancelled, and the runtime undoes a failed one's network with a DEL.
pub const LEAK_GRACE: Duration = Duration::from_secs(120);
/// At most this many files of a store are read: a node's pool is a few hundred.
const MAX_STORE_FILES: usize = 65_536;

/// One range of a range set, as host-local canonicalises it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Range {
    /// Which range set (0-based, as host-local numbers them in `last_reserved_ip.N`).
    pub set: usize,
    pub subnet: String,
    pub first: IpAddr,
    pub last: IpAddr,
    pub gateway: Option<IpAddr>,
    /// Addresses it can hand out: first to last, less the gateway when inside (at most
    /// `u64::MAX`).
    pub capacity: u64,
}

impl Range {
    pub fn contains(&self, ip: IpAddr) -> bool {
        match (ip, self.first, self.last) {
            (IpAddr::V4(ip), IpAddr::V4(a), IpAddr::V4(b)) => a <= ip && ip <= b,
            (IpAddr::V6(ip), IpAddr::V6(a), IpAddr::V6(b)) => a <= ip && ip <= b,
            _ => false,
        }
    }
}

/// A host-local pool: where its store is and what it can hand out.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct IpamPool {
    pub network: String,
    pub dir: PathBuf,
    pub ranges: Vec<Range>,
    /// Ranges the configuration has that host-local would refuse, with why.
    pub problems: Vec<String>,
}

/// One reservation: the address, the sandbox it went to, and when it was written.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Held {
    pub ip: String,
    pub sandbox_id: String,
    pub written: Option<SystemTime>,
}

/// A store as read: its reservations by address, and the files it did not recognise.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Store {
    pub held: Vec<Held>,
    pub skipped: usize,
}

impl IpamPool {
    /// From a network configuration (a list with `plugins`, or one plugin's): the first
    /// plugin whose IPAM is host-local. None when none is.
    pub fn of_conf(conf: &Value) -> Option<IpamPool> {
        let network = conf["name"].as_str()?.to_string();
        let plugins: Vec<&Value> = match conf["plugins"].as_array() {
            Some(list) => list.iter().collect(),
            None => vec![conf],
        };
        let ipam = plugins
            .iter()
            .map(|p| &p["ipam"])
            .find(|i| i["type"] == "host-local")?;
        let data_dir = ipam["dataDir"].as_str().unwrap_or(DEFAULT_DATA_DIR);
        let mut pool = IpamPool {
            dir: Path::new(data_dir).join(&network),
            network,
            ranges: Vec::new(),
            problems: Vec::new(),
        };
        let sets: Vec<Vec<&Value>> = match ipam["ranges"].as_array() {
            Some(sets) => sets
                .iter()
                .map(|s| s.as_array().map(|r| r.iter().collect()).unwrap_or_default())
                .collect(),
            // The older form: one range at the top of the IPAM configuration.
            None if ipam.get("subnet").is_some() => vec![vec![ipam]],
            None => Vec::new(),
        };
        for (set, ranges) in sets.iter().enumerate() {
            for r in ranges {
                match range(set, r) {
                    Ok(r) => pool.ranges.push(r),
                    Err(why) => pool.problems.push(format!("range set {set}: {why}")),
                }
            }
        }
        Some(pool)
    }

    /// The range sets' numbers, in order.
    pub fn sets(&self) -> BTreeSet<usize> {
        self.ranges.iter().map(|r| r.set).collect()
    }

    /// Addresses range set `set` can hand out.
    pub fn capacity(&self, set: usize) -> u64 {
        self.ranges
            .iter()
            .filter(|r| r.set == set)
            .fold(0u64, |n, r| n.saturating_add(r.capacity))
    }

    /// The range set an address is from.
    pub fn set_of(&self, ip: &str) -> Option<usize> {
        let ip: IpAddr = ip.parse().ok()?;
        self.ranges.iter().find(|r| r.contains(ip)).map(|r| r.set)
    }

    /// Range set `set` as host-local names it in its error: `<first>-<last>` of each of
    /// its ranges, joined by commas.
    pub fn set_text(&self, set: usize) -> String {
        self.ranges
            .iter()
            .filter(|r| r.set == set)
            .map(|r| format!("{}-{}", r.first, r.last))
            .collect::<Vec<_>>()
            .join(",")
    }

    /// The reservations now, by address.
    pub fn read_store(&self) -> std::io::Result<Store> {
        let mut store = Store::default();
        for entry in std::fs::read_dir(&self.dir)?
            .flatten()
            .take(MAX_STORE_FILES)
        {
            let name = entry.file_name().to_string_lossy().into_owned();
            if name == "lock" || name.starts_with("last_reserved_ip.") {
                continue;
            }
            if name.parse::<IpAddr>().is_err() {
                store.skipped += 1;
                continue;
            }
            let Ok(text) = read_small(&entry.path()) else {
                store.skipped += 1;
                continue;
            };
            let sandbox_id = text.lines().next().unwrap_or_default().trim().to_string();
            store.held.push(Held {
                ip: name,
                sandbox_id,
                written: entry.metadata().and_then(|m| m.modified()).ok(),
            });
        }
        store.held.sort_by(|a, b| {
            let key = |h: &Held| h.ip.parse::<IpAddr>().ok();
            key(a).cmp(&key(b)).then_with(|| a.ip.cmp(&b.ip))
        });
        Ok(store)
    }
}

/// A reservation file's first bytes: an ID and an interface name.
fn read_small(path: &Path) -> std::io::Result<String> {
    use std::io::Read;
    let mut buf = Vec::with_capacity(160);
    std::fs::File::open(path)?.take(512).read_to_end(&mut buf)?;
    Ok(String::from_utf8_lossy(&buf).into_owned())
}

/// Whether reservation `h` is leaked: its sandbox is not one the runtime knows (`known`),
/// and it was written at least [`LEAK_GRACE`] before `now`.
pub fn is_leaked(h: &Held, known: &BTreeSet<String>, now: SystemTime) -> bool {
    if known.contains(&h.sandbox_id) {
        return false;
    }
    match h.written {
        Some(t) => now.duration_since(t).is_ok_and(|age| age >= LEAK_GRACE),
        None => true,
    }
}

/// One range of `set`, canonicalised as host-local does: `rangeStart` defaults to the
/// subnet's first address after the network's, `rangeEnd` to its last (less the
/// broadcast address in IPv4), the gateway to the first after the network's.
fn range(set: usize, r: &Value) -> Result<Range, String> {
    let subnet = r["subnet"]
        .as_str()
        .ok_or_else(|| "a range without a \"subnet\"".to_string())?;
    let (net, prefix) = subnet
        .split_once('/')
        .ok_or_else(|| format!("subnet {subnet} has no prefix length"))?;
    let net: IpAddr = net
        .parse()
        .map_err(|_| format!("subnet {subnet} is not an address"))?;
    let prefix: u32 = prefix
        .parse()
        .map_err(|_| format!("subnet {subnet} has no prefix length"))?;
    let bits = if net.is_ipv4() { 32 } else { 128 };
    if prefix > bits - 2 {
        return Err(format!("subnet {subnet} is too small to allocate from"));
    }
    let mask = u128::MAX.checked_shl(bits - prefix).unwrap_or(0) & (u128::MAX >> (128 - bits));
    let base = to_int(net) & mask;
    let top = base | (!mask & (u128::MAX >> (128 - bits)));
    let addr = |k: &str, default: u128| -> Result<u128, String> {
        match r[k].as_str() {
            None => Ok(default),
            Some(s) => {
                let a: IpAddr = s
                    .parse()
                    .map_err(|_| format!("{k} {s} is not an address"))?;
                if a.is_ipv4() != net.is_ipv4() || to_int(a) & mask != base {
                    return Err(format!("{k} {s} is not in subnet {subnet}"));
                }
                Ok(to_int(a))
            }
        }
    };
    let first = addr("rangeStart", base + 1)?;
    let last = addr("rangeEnd", if net.is_ipv4() { top - 1 } else { top })?;
    let gateway = addr("gateway", base + 1)?;
    if last < first {
        return Err(format!("rangeEnd is before rangeStart in {subnet}"));
    }
    let all = (last - first).saturating_add(1);
    let inside = u128::from((first..=last).contains(&gateway));
    Ok(Range {
        set,
        subnet: subnet.to_string(),
        first: from_int(first, net.is_ipv4()),
        last: from_int(last, net.is_ipv4()),
        gateway: Some(from_int(gateway, net.is_ipv4())),
        capacity: u64::try_from(all - inside).unwrap_or(u64::MAX),
    })
}

fn to_int(ip: IpAddr) -> u128 {
    match ip {
        IpAddr::V4(a) => u128::from(u32::from(a)),
        IpAddr::V6(a) => u128::from(a),
    }
}

fn from_int(n: u128, v4: bool) -> IpAddr {
    if v4 {
        IpAddr::V4(std::net::Ipv4Addr::from(n as u32))
    } else {
        IpAddr::V6(std::net::Ipv6Addr::from(n))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn every_range_of_every_set_counts_in_both_families() {
        let conf = json!({
            "cniVersion": "1.0.0", "name": "lab",
            "plugins": [
                {"type": "bridge", "ipam": {"type": "host-local", "dataDir": "/var/lib/lab/ipam",
                 "ranges": [
                    [{"subnet": "10.244.77.0/24", "rangeStart": "10.244.77.10", "rangeEnd": "10.244.77.12"},
                     {"subnet": "10.244.78.0/30"}],
                    [{"subnet": "fd00:10::/120", "rangeStart": "fd00:10::2", "rangeEnd": "fd00:10::3"}]
                 ]}},
                {"type": "portmap"}
            ]
        });
        let p = IpamPool::of_conf(&conf).unwrap();
        assert_eq!(p.network, "lab");
        assert_eq!(p.dir, Path::new("/var/lib/lab/ipam/lab"));
        assert!(p.problems.is_empty(), "{:?}", p.problems);
        // .10-.12 (the gateway .1 outside); a /30 gives .1-.2, less its gateway .1.
        assert_eq!(p.capacity(0), 4);
        assert_eq!(
            p.set_text(0),
            "10.244.77.10-10.244.77.12,10.244.78.1-10.244.78.2"
        );
        assert_eq!(p.capacity(1), 2);
        assert_eq!(p.set_text(1), "fd00:10::2-fd00:10::3");
        assert_eq!(p.set_of("10.244.78.2"), Some(0));
        assert_eq!(p.set_of("fd00:10::3"), Some(1));
        assert_eq!(p.set_of("10.0.0.1"), None);
    }

    #[test]
    fn defaults_are_host_locals_and_bad_ranges_are_named() {
        // A whole /24 with the default gateway (.1) inside: .1 to .254 less the gateway.
        let plain = json!({"name": "n", "type": "bridge",
            "ipam": {"type": "host-local", "subnet": "10.0.0.0/24"}});
        let p = IpamPool::of_conf(&plain).unwrap();
        assert_eq!(p.dir, Path::new(DEFAULT_DATA_DIR).join("n"));
        assert_eq!(p.capacity(0), 253);
        assert_eq!(p.set_text(0), "10.0.0.1-10.0.0.254");
        // IPv6 keeps the subnet's last address.
        let v6 = json!({"name": "n", "type": "bridge",
            "ipam": {"type": "host-local", "ranges": [[{"subnet": "fd00::/64"}]]}});
        let p = IpamPool::of_conf(&v6).unwrap();
        assert_eq!(p.set_text(0), "fd00::1-fd00::ffff:ffff:ffff:ffff");
        assert_eq!(p.capacity(0), u64::MAX - 1);
        let bad = json!({"name": "n", "type": "bridge", "ipam": {"type": "host-local",
            "ranges": [[{"subnet": "10.0.0.0/31"}], [{"subnet": "10.1.0.0/24", "rangeStart": "10.2.0.1"}]]}});
        let p = IpamPool::of_conf(&bad).unwrap();
        assert_eq!(
            p.problems,
            [
                "range set 0: subnet 10.0.0.0/31 is too small to allocate from",
                "range set 1: rangeStart 10.2.0.1 is not in subnet 10.1.0.0/24"
            ]
        );
        let other = json!({"name": "n", "plugins": [{"type": "x", "ipam": {"type": "dhcp"}}]});
        assert_eq!(IpamPool::of_conf(&other), None);
    }

    #[test]
    fn the_store_is_read_by_address_unknown_files_counted_and_leaks_told_by_age() {
        let dir = tempfile::tempdir().unwrap();
        let pool = IpamPool {
            network: "lab".into(),
            dir: dir.path().to_path_buf(),
            ranges: Vec::new(),
            problems: Vec::new(),
        };
        std::fs::write(dir.path().join("10.0.0.10"), "aaaa\r\neth0").unwrap();
        std::fs::write(dir.path().join("10.0.0.9"), "bbbb\r\neth0").unwrap();
        std::fs::write(dir.path().join("last_reserved_ip.0"), "10.0.0.10").unwrap();
        std::fs::write(dir.path().join("lock"), "").unwrap();
        std::fs::write(dir.path().join("notes.bak"), "?").unwrap();
        std::fs::create_dir(dir.path().join("10.0.0.11")).unwrap();
        let store = pool.read_store().unwrap();
        let ips: Vec<(&str, &str)> = store
            .held
            .iter()
            .map(|h| (h.ip.as_str(), h.sandbox_id.as_str()))
            .collect();
        // In address order, not the names' (".9" before ".10").
        assert_eq!(ips, [("10.0.0.9", "bbbb"), ("10.0.0.10", "aaaa")]);
        assert_eq!(store.skipped, 2, "the unknown file and the directory");
        let known: BTreeSet<String> = ["aaaa".to_string()].into();
        let h = &store.held[0];
        let written = h.written.unwrap();
        assert!(!is_leaked(h, &known, written + Duration::from_secs(1)));
        assert!(is_leaked(h, &known, written + LEAK_GRACE));
        assert!(!is_leaked(&store.held[1], &known, written + LEAK_GRACE));
    }
}
