//! The node's pod network, looked at beside the pods: the runtime's NetworkReady
//! condition (its CRI Status, a read), its CNI configuration directory, and host-local's
//! pool of the network it uses. A look gives a [`NodeNetworkRecord`] only when something
//! differs from the last one written, so a quiet node writes nothing.
//!
//! The pool's store is read again only when its directory changed (host-local adds or
//! removes a file per reservation). The runtime's sandboxes are listed after each read,
//! and again at every look while a reservation's sandbox is not among them: a sandbox is
//! listed only once its RunPodSandbox is done, so a reservation unknown at one look is
//! known at a later one unless it is leaked, and a leak found is looked for again until
//! it is released.

use std::collections::BTreeSet;
use std::path::PathBuf;
use std::time::{Duration, SystemTime};

use crate::cni::conf_dir::{self, ConfFile};
use crate::cni::ipam::{IpamPool, Store, is_leaked};
use crate::cri::api;
use crate::trace::{
    ConfFileRecord, HolderRecord, IpamRecord, NetworkCondition, NodeNetworkRecord, RangeSetRecord,
};

use super::RuntimeView;

/// A store read less than this after its directory changed is read again at the next look.
const SETTLE: Duration = Duration::from_secs(2);
/// containerd's status info key for its last CNI configuration load.
const LOAD_STATUS_KEY: &str = "lastCNILoadStatus";

/// What the looks remember between them.
pub struct NodeNetworkLook {
    conf_dir: Option<PathBuf>,
    bin_dirs: Vec<String>,
    last: Option<NodeNetworkRecord>,
    /// The pool's store when last read: its directory's modification time, what it held,
    /// and the runtime's sandboxes then.
    store: Option<StoreSeen>,
}

struct StoreSeen {
    dir: PathBuf,
    modified: Option<SystemTime>,
    read_at: SystemTime,
    store: Store,
    /// The runtime's sandboxes, listed after the store was read; None when the list
    /// failed: then no reservation is called leaked.
    known: Option<BTreeSet<String>>,
    /// When `known` was listed: a reservation's age is taken then.
    listed_at: SystemTime,
}

impl NodeNetworkLook {
    pub fn new(conf_dir: Option<PathBuf>, bin_dirs: Vec<String>) -> NodeNetworkLook {
        NodeNetworkLook {
            conf_dir,
            bin_dirs,
            last: None,
            store: None,
        }
    }

    /// Looks once; the record to write when anything changed.
    pub async fn look(&mut self, view: &RuntimeView, at_ns: u64) -> Option<NodeNetworkRecord> {
        let (ready, load_status) = runtime_condition(view).await;
        let mut record = NodeNetworkRecord {
            at_ns,
            ready,
            load_status,
            conf_dir: self
                .conf_dir
                .as_ref()
                .map(|d| d.display().to_string())
                .unwrap_or_default(),
            bin_dirs: self.bin_dirs.clone(),
            files: Vec::new(),
            conf_dir_error: String::new(),
            used: String::new(),
            missing_plugins: Vec::new(),
            ipam: None,
        };
        if let Some(dir) = self.conf_dir.clone() {
            match conf_dir::read(&dir) {
                Ok(files) => {
                    record.files = files.iter().map(file_record).collect();
                    if let Some(used) = conf_dir::used(&files) {
                        record.used = used.name();
                        record.missing_plugins = conf_dir::missing_plugins(used, &self.bin_dirs);
                        record.ipam = self.pool(view, used).await;
                    }
                }
                Err(e) => record.conf_dir_error = format!("{}: {e}", dir.display()),
            }
        }
        let changed = self.last.as_ref().is_none_or(|l| !l.same_as(&record));
        changed.then(|| {
            self.last = Some(record.clone());
            record
        })
    }

    /// host-local's pool of the used network, read as its store last changed.
    async fn pool(&mut self, view: &RuntimeView, used: &ConfFile) -> Option<IpamRecord> {
        let pool = IpamPool::of_conf(used.conf.as_ref()?)?;
        let modified = std::fs::metadata(&pool.dir).and_then(|m| m.modified()).ok();
        let now = SystemTime::now();
        let fresh = self.store.as_ref().is_some_and(|s| {
            s.dir == pool.dir && s.modified == modified && !settling(modified, s.read_at)
        });
        if fresh {
            let seen = self.store.as_mut()?;
            if !all_known(&seen.store, &seen.known) {
                seen.known = known_sandboxes(view).await;
                seen.listed_at = SystemTime::now();
            }
        } else {
            match pool.read_store() {
                Ok(store) => {
                    let known = if store.held.is_empty() {
                        Some(BTreeSet::new())
                    } else {
                        known_sandboxes(view).await
                    };
                    self.store = Some(StoreSeen {
                        dir: pool.dir.clone(),
                        modified,
                        read_at: now,
                        store,
                        known,
                        listed_at: SystemTime::now(),
                    })
                }
                Err(e) => {
                    self.store = None;
                    let mut r = ipam_record(&pool, &Store::default(), None, now);
                    if e.kind() != std::io::ErrorKind::NotFound {
                        r.problems.push(format!("{}: {e}", pool.dir.display()));
                    }
                    return Some(r);
                }
            }
        }
        let seen = self.store.as_ref()?;
        Some(ipam_record(
            &pool,
            &seen.store,
            seen.known.as_ref(),
            seen.listed_at,
        ))
    }
}

/// Whether the store's directory changed so shortly before it was read that a later
/// change may carry the same modification time: the kernel stamps files from a clock that
/// advances once a tick, so two files added within one tick leave one mtime.
fn settling(modified: Option<SystemTime>, read_at: SystemTime) -> bool {
    modified.is_none_or(|m| read_at.duration_since(m).is_ok_and(|d| d < SETTLE) || m > read_at)
}

/// Whether every reservation's sandbox was among the runtime's when last listed (a
/// failed list knows none).
fn all_known(store: &Store, known: &Option<BTreeSet<String>>) -> bool {
    known
        .as_ref()
        .is_some_and(|k| store.held.iter().all(|h| k.contains(&h.sandbox_id)))
}

/// The IDs of the runtime's sandboxes; None when it could not list them.
async fn known_sandboxes(view: &RuntimeView) -> Option<BTreeSet<String>> {
    view.sandboxes()
        .await
        .ok()
        .map(|list| list.into_iter().map(|s| s.id).collect())
}

/// The runtime's NetworkReady condition, and, when it is false, the runtime's own words
/// on its last CNI configuration load.
async fn runtime_condition(view: &RuntimeView) -> (Option<NetworkCondition>, String) {
    let Ok(status) = view.status(false).await else {
        return (None, String::new());
    };
    let ready = network_ready(&status);
    let load_status = if ready.as_ref().is_some_and(|c| !c.status) {
        match view.status(true).await {
            Ok(verbose) => load_status(&verbose),
            Err(_) => String::new(),
        }
    } else {
        String::new()
    };
    (ready, load_status)
}

pub fn network_ready(status: &api::StatusResponse) -> Option<NetworkCondition> {
    let c = status
        .status
        .as_ref()?
        .conditions
        .iter()
        .find(|c| c.r#type == "NetworkReady")?;
    Some(NetworkCondition {
        status: c.status,
        reason: c.reason.clone(),
        message: c.message.clone(),
    })
}

/// containerd's `lastCNILoadStatus` (a JSON string in the status info), unless "OK".
fn load_status(status: &api::StatusResponse) -> String {
    let Some(raw) = status.info.get(LOAD_STATUS_KEY) else {
        return String::new();
    };
    let text = serde_json::from_str::<String>(raw).unwrap_or_else(|_| raw.clone());
    if text == "OK" { String::new() } else { text }
}

fn file_record(f: &ConfFile) -> ConfFileRecord {
    ConfFileRecord {
        file: f.name(),
        network: f.network.clone(),
        plugins: f.plugins.clone(),
        problem: f.problem.clone().unwrap_or_default(),
    }
}

/// The pool as recorded: each range set's fill, and every holder when a set is nearly
/// full (at most a tenth, or two addresses, free) or any reservation is leaked. Without
/// the runtime's sandboxes (`known` None) none is called leaked.
pub fn ipam_record(
    pool: &IpamPool,
    store: &Store,
    known: Option<&BTreeSet<String>>,
    now: SystemTime,
) -> IpamRecord {
    let sets: Vec<RangeSetRecord> = pool
        .sets()
        .into_iter()
        .map(|set| RangeSetRecord {
            set: set as u32,
            ranges: pool.set_text(set),
            capacity: pool.capacity(set),
            held: store
                .held
                .iter()
                .filter(|h| pool.set_of(&h.ip) == Some(set))
                .count() as u64,
        })
        .collect();
    let leaked: Vec<bool> = store
        .held
        .iter()
        .map(|h| known.is_some_and(|k| is_leaked(h, k, now)))
        .collect();
    let n_leaked = leaked.iter().filter(|l| **l).count() as u64;
    let nearly_full = sets
        .iter()
        .any(|s| s.capacity.saturating_sub(s.held) <= (s.capacity / 10).max(2));
    let holders = if nearly_full || n_leaked > 0 {
        store
            .held
            .iter()
            .zip(&leaked)
            .map(|(h, l)| HolderRecord {
                ip: h.ip.clone(),
                sandbox_id: h.sandbox_id.clone(),
                leaked: *l,
            })
            .collect()
    } else {
        Vec::new()
    };
    IpamRecord {
        network: pool.network.clone(),
        dir: pool.dir.display().to_string(),
        sets,
        held: store.held.len() as u64,
        holders,
        leaked: n_leaked,
        skipped: store.skipped as u64,
        problems: pool.problems.clone(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::cni::ipam::{Held, LEAK_GRACE};

    fn pool() -> IpamPool {
        IpamPool::of_conf(&serde_json::json!({"name": "lab", "type": "bridge",
            "ipam": {"type": "host-local", "dataDir": "/d",
              "ranges": [[{"subnet": "10.0.0.0/24", "rangeStart": "10.0.0.2", "rangeEnd": "10.0.0.3"}]]}}))
        .unwrap()
    }

    fn held(ip: &str, id: &str, written: SystemTime) -> Held {
        Held {
            ip: ip.into(),
            sandbox_id: id.into(),
            written: Some(written),
        }
    }

    #[test]
    fn a_full_set_lists_its_holders_and_which_the_runtime_does_not_know() {
        let t = SystemTime::UNIX_EPOCH + Duration::from_secs(1_000_000);
        let store = Store {
            held: vec![held("10.0.0.2", "gone", t), held("10.0.0.3", "alive", t)],
            skipped: 1,
        };
        let known: BTreeSet<String> = ["alive".to_string()].into();
        let r = ipam_record(&pool(), &store, Some(&known), t + LEAK_GRACE);
        assert_eq!(
            r.sets,
            [RangeSetRecord {
                set: 0,
                ranges: "10.0.0.2-10.0.0.3".into(),
                capacity: 2,
                held: 2
            }]
        );
        assert!(r.sets[0].full());
        assert_eq!((r.held, r.leaked, r.skipped), (2, 1, 1));
        assert_eq!(
            r.holders,
            [
                HolderRecord {
                    ip: "10.0.0.2".into(),
                    sandbox_id: "gone".into(),
                    leaked: true
                },
                HolderRecord {
                    ip: "10.0.0.3".into(),
                    sandbox_id: "alive".into(),
                    leaked: false
                }
            ]
        );
        // Too young to call leaked: the sandbox may still be being created.
        let r = ipam_record(&pool(), &store, Some(&known), t + Duration::from_secs(1));
        assert_eq!(r.leaked, 0);
        // Nor without the runtime's list.
        let r = ipam_record(&pool(), &store, None, t + LEAK_GRACE);
        assert_eq!(r.leaked, 0);
        // Every sandbox gone: every old reservation is leaked.
        let r = ipam_record(&pool(), &store, Some(&BTreeSet::new()), t + LEAK_GRACE);
        assert_eq!(r.leaked, 2);
    }

    #[test]
    fn a_reservation_not_among_the_listed_sandboxes_is_listed_for_again() {
        let t = SystemTime::UNIX_EPOCH;
        let store = Store {
            held: vec![held("10.0.0.2", "a", t), held("10.0.0.3", "b", t)],
            skipped: 0,
        };
        let both: BTreeSet<String> = ["a".to_string(), "b".to_string()].into();
        assert!(all_known(&store, &Some(both)));
        // A sandbox still in its RunPodSandbox, or leaked: the next look lists again.
        let one: BTreeSet<String> = ["a".to_string()].into();
        assert!(!all_known(&store, &Some(one)));
        // A failed list knows none.
        assert!(!all_known(&store, &None));
        assert!(all_known(&Store::default(), &Some(BTreeSet::new())));
    }

    #[test]
    fn a_roomy_pool_records_only_its_counts() {
        let big = IpamPool::of_conf(&serde_json::json!({"name": "lab", "type": "bridge",
            "ipam": {"type": "host-local", "subnet": "10.0.0.0/24"}}))
        .unwrap();
        let t = SystemTime::UNIX_EPOCH;
        let store = Store {
            held: vec![held("10.0.0.2", "a", t)],
            skipped: 0,
        };
        let known: BTreeSet<String> = ["a".to_string()].into();
        let r = ipam_record(&big, &store, Some(&known), t + LEAK_GRACE);
        assert_eq!((r.held, r.sets[0].held, r.sets[0].capacity), (1, 1, 253));
        assert!(r.holders.is_empty());
    }

    #[test]
    fn the_load_status_is_the_runtimes_words_unless_ok() {
        let mut s = api::StatusResponse::default();
        s.info.insert(
            LOAD_STATUS_KEY.into(),
            "\"cni config load failed: no network config found in /etc/cni/net.d: cni plugin not initialized\"".into(),
        );
        assert!(load_status(&s).starts_with("cni config load failed: no network config"));
        s.info.insert(LOAD_STATUS_KEY.into(), "\"OK\"".into());
        assert_eq!(load_status(&s), "");
    }
}
