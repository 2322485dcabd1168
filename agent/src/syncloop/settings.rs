//! The agent's tunables, kubelet's flags where kubelet has one. Tests shorten the long
//! real-world delays (back-off caps, resync) through these.

use std::path::PathBuf;
use std::time::Duration;

use crate::kubelet::admission::NodeAllocatable;
use crate::kubelet::node_admission::NodeFacts;

#[derive(Debug, Clone)]
pub struct KubeletSettings {
    /// kubelet's --sync-frequency: how often an idle pod is synced again.
    pub resync_interval: Duration,
    /// Retry delay after a failed sync (kubelet's pod worker backOffPeriod).
    pub error_backoff: Duration,
    /// How often housekeeping runs.
    pub housekeeping_interval: Duration,
    /// The PLEG relist period: the fallback when no container exit event arrives.
    pub relist_period: Duration,
    /// Crash-loop and image-pull back-off: first delay and cap (10 s and 5 min).
    pub backoff_initial: Duration,
    pub backoff_max: Duration,
    /// None: unlimited parallel pulls; Some(1): serialized (kubelet's default).
    pub max_parallel_image_pulls: Option<usize>,
    pub allocatable: NodeAllocatable,
    /// The node's labels and what its host and runtime can enforce, for admission. None
    /// (a replay of a trace that did not record them) admits without these checks.
    pub node: Option<NodeFacts>,
    /// Root of the pod cgroups (kubelet's --cgroup-root); None leaves cgroups to the runtime.
    pub cgroup_root: Option<String>,
    /// How pod cgroups are named and made: the runtime's cgroup driver, which must match.
    pub cgroup_driver: crate::cm::CgroupDriver,
    /// Directory of image pull secrets (`<name>.json`, docker config format).
    pub secrets_dir: Option<PathBuf>,
    /// Remove runtime objects, directories and cgroups of pods that are not desired.
    pub housekeeping: bool,
    /// Test-only: pull every image as if its policy were Always. Exists to prove that
    /// replay catches a changed decision; never set in normal runs.
    pub flip_pull_policy: bool,
}

impl KubeletSettings {
    /// kubelet's defaults, with the node's allocatable given.
    pub fn with_allocatable(allocatable: NodeAllocatable) -> KubeletSettings {
        KubeletSettings {
            resync_interval: Duration::from_secs(60),
            error_backoff: Duration::from_secs(10),
            housekeeping_interval: Duration::from_secs(2),
            relist_period: Duration::from_secs(1),
            backoff_initial: Duration::from_secs(10),
            backoff_max: Duration::from_secs(300),
            max_parallel_image_pulls: Some(1),
            allocatable,
            node: None,
            cgroup_root: None,
            cgroup_driver: crate::cm::CgroupDriver::Cgroupfs,
            secrets_dir: None,
            housekeeping: true,
            flip_pull_policy: false,
        }
    }
}
