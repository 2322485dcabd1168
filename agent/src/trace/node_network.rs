//! The node's pod network as the recorder saw it: the runtime's NetworkReady condition,
//! its CNI configuration directory as libcni orders it (which file the runtime uses, why
//! any file does not load, which plugin of the used network has no executable), and
//! host-local's pool (its range sets, how full each is, and, when the pool is nearly
//! full or holds leaked reservations, every holder). Written when any of it changes, so
//! `diagnose` on the trace says afterwards what `diagnose --live` said while it was so.

use serde::{Deserialize, Serialize};

/// One look at the node's network, written when it differs from the last one.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct NodeNetworkRecord {
    /// CLOCK_MONOTONIC ns, the trace's clock.
    pub at_ns: u64,
    /// The runtime's NetworkReady condition; None when its Status had none or failed.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub ready: Option<NetworkCondition>,
    /// What the runtime said of its last load of the CNI configuration (containerd's
    /// status info `lastCNILoadStatus`), when it says and it is not "OK".
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub load_status: String,
    /// The runtime's CNI configuration directory; empty when it names none.
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub conf_dir: String,
    /// Where the runtime looks for CNI plugins, in its order.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub bin_dirs: Vec<String>,
    /// The directory's configuration files, in libcni's order (by name).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub files: Vec<ConfFileRecord>,
    /// The directory could not be read: why.
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub conf_dir_error: String,
    /// The file the runtime uses (the first, when it loads).
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub used: String,
    /// Plugins of the used network (and their IPAM plugins) with no executable in any
    /// of `bin_dirs`.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub missing_plugins: Vec<String>,
    /// host-local's pool of the used network, when its IPAM is host-local.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub ipam: Option<IpamRecord>,
}

/// The runtime's NetworkReady condition.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct NetworkCondition {
    pub status: bool,
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub reason: String,
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub message: String,
}

/// One configuration file.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ConfFileRecord {
    pub file: String,
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub network: String,
    /// The chain's plugin types, in order.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub plugins: Vec<String>,
    /// Why it does not load; empty when it does.
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub problem: String,
}

/// host-local's pool.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct IpamRecord {
    pub network: String,
    /// Its store of reservations.
    pub dir: String,
    pub sets: Vec<RangeSetRecord>,
    /// Reservations in the store, in all.
    pub held: u64,
    /// Every reservation, when a set is nearly full or any is leaked; else empty.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub holders: Vec<HolderRecord>,
    /// Reservations whose sandbox the runtime does not know.
    #[serde(default, skip_serializing_if = "is_zero")]
    pub leaked: u64,
    /// Files in the store that are not reservations host-local writes, skipped.
    #[serde(default, skip_serializing_if = "is_zero")]
    pub skipped: u64,
    /// The store could not be read, or the ranges not taken: why.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub problems: Vec<String>,
}

/// One range set: `first-last` of each range, as host-local names it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct RangeSetRecord {
    pub set: u32,
    pub ranges: String,
    pub capacity: u64,
    pub held: u64,
}

impl RangeSetRecord {
    pub fn full(&self) -> bool {
        self.held >= self.capacity
    }
}

/// One reservation.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct HolderRecord {
    pub ip: String,
    pub sandbox_id: String,
    /// The runtime knows no sandbox of this ID (and the reservation is older than a
    /// sandbox's creation takes).
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub leaked: bool,
}

fn is_zero(n: &u64) -> bool {
    *n == 0
}

impl NodeNetworkRecord {
    /// Whether the network of pods is ready by the runtime's word.
    pub fn not_ready(&self) -> bool {
        self.ready.as_ref().is_some_and(|c| !c.status)
    }

    /// The same look, ignoring when it was taken.
    pub fn same_as(&self, other: &NodeNetworkRecord) -> bool {
        NodeNetworkRecord {
            at_ns: 0,
            ..self.clone()
        } == NodeNetworkRecord {
            at_ns: 0,
            ..other.clone()
        }
    }
}
