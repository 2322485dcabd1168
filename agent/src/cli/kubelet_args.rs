//! Flags for the agent's tunables (kubelet's names where kubelet has the flag).

use std::path::PathBuf;
use std::time::Duration;

use crate::cm::CgroupDriver;
use crate::kubelet::admission::NodeAllocatable;
use crate::syncloop::KubeletSettings;

fn duration(s: &str) -> Result<Duration, String> {
    humantime::parse_duration(s).map_err(|e| format!("{s:?}: {e} (examples: 500ms, 10s, 5m)"))
}

#[derive(Debug, Clone, clap::Args)]
pub struct KubeletArgs {
    /// How often an idle pod is synced again (kubelet's --sync-frequency).
    #[arg(long, default_value = "60s", value_parser = duration, value_name = "DURATION")]
    pub sync_frequency: Duration,
    /// Retry delay after a failed sync.
    #[arg(long, default_value = "10s", value_parser = duration, value_name = "DURATION")]
    pub error_backoff: Duration,
    /// First crash-loop / image-pull back-off delay.
    #[arg(long, default_value = "10s", value_parser = duration, value_name = "DURATION")]
    pub backoff_initial: Duration,
    /// Cap of the crash-loop / image-pull back-off.
    #[arg(long, default_value = "5m", value_parser = duration, value_name = "DURATION")]
    pub backoff_max: Duration,
    /// How often housekeeping removes orphaned pods, directories and cgroups.
    #[arg(long, default_value = "2s", value_parser = duration, value_name = "DURATION")]
    pub housekeeping_interval: Duration,
    /// PLEG relist period, the fallback to container exit events.
    #[arg(long, default_value = "1s", value_parser = duration, value_name = "DURATION")]
    pub relist_period: Duration,
    /// Pull images one at a time (kubelet's default); false allows parallel pulls.
    #[arg(long, default_value_t = true, action = clap::ArgAction::Set, value_name = "BOOL")]
    pub serialize_image_pulls: bool,
    /// With --serialize-image-pulls=false: at most this many pulls at once (0: no limit).
    #[arg(long, default_value_t = 0, value_name = "N")]
    pub max_parallel_image_pulls: usize,
    /// Allocatable CPU in millicores. Default: every CPU of the host.
    #[arg(long, value_name = "MILLICORES")]
    pub node_cpu: Option<i64>,
    /// Allocatable memory in bytes. Default: the host's memory.
    #[arg(long, value_name = "BYTES")]
    pub node_memory: Option<i64>,
    /// Maximum number of pods (kubelet's --max-pods).
    #[arg(long, default_value_t = 110, value_name = "N")]
    pub max_pods: usize,
    /// Root of the pod cgroups (kubelet's --cgroup-root); "" leaves them to the runtime.
    #[arg(long, default_value = "/podlapse", value_name = "PATH")]
    pub cgroup_root: String,
    /// The cgroup driver (kubelet's --cgroup-driver), used only when the runtime does not
    /// say which it uses (CRI RuntimeConfig, else its status info).
    #[arg(long, value_name = "systemd|cgroupfs")]
    pub cgroup_driver: Option<CgroupDriver>,
    /// Directory of image pull secrets: <secret name>.json in docker config format.
    #[arg(long, value_name = "DIR")]
    pub pull_secrets_dir: Option<PathBuf>,
    /// Labels the node has besides kubelet's own (kubelet's --node-labels): what
    /// `nodeSelector` and required node affinity are matched against.
    #[arg(long, value_delimiter = ',', value_parser = label, value_name = "KEY=VALUE,...")]
    pub node_labels: Vec<(String, String)>,
    /// Do not remove runtime objects, directories or cgroups of undesired pods.
    #[arg(long)]
    pub no_housekeeping: bool,
}

fn label(s: &str) -> Result<(String, String), String> {
    match s.split_once('=') {
        Some((k, v)) if !k.is_empty() => Ok((k.to_string(), v.to_string())),
        _ => Err(format!("{s:?} is not KEY=VALUE")),
    }
}

impl KubeletArgs {
    /// `--node-labels` as a map; a key given twice keeps its last value.
    pub fn node_labels(&self) -> std::collections::BTreeMap<String, String> {
        self.node_labels.iter().cloned().collect()
    }

    pub fn settings(&self) -> KubeletSettings {
        let allocatable = NodeAllocatable {
            milli_cpu: self.node_cpu.unwrap_or_else(host_milli_cpu),
            memory_bytes: self.node_memory.unwrap_or_else(host_memory),
            max_pods: self.max_pods,
        };
        let mut s = KubeletSettings::with_allocatable(allocatable);
        s.resync_interval = self.sync_frequency;
        s.error_backoff = self.error_backoff;
        s.backoff_initial = self.backoff_initial;
        s.backoff_max = self.backoff_max;
        s.housekeeping_interval = self.housekeeping_interval;
        s.relist_period = self.relist_period;
        s.max_parallel_image_pulls =
            match (self.serialize_image_pulls, self.max_parallel_image_pulls) {
                (true, _) => Some(1),
                (false, 0) => None,
                (false, n) => Some(n),
            };
        s.cgroup_root = Some(self.cgroup_root.clone()).filter(|r| !r.is_empty());
        s.secrets_dir = self.pull_secrets_dir.clone();
        s.housekeeping = !self.no_housekeeping;
        s
    }
}

fn host_milli_cpu() -> i64 {
    std::thread::available_parallelism()
        .map(|n| n.get() as i64 * 1000)
        .unwrap_or(1000)
}

fn host_memory() -> i64 {
    std::fs::read_to_string("/proc/meminfo")
        .ok()
        .and_then(|m| {
            m.lines()
                .find(|l| l.starts_with("MemTotal:"))
                .and_then(|l| l.split_whitespace().nth(1))
                .and_then(|kb| kb.parse::<i64>().ok())
        })
        .map(|kb| kb * 1024)
        .unwrap_or(i64::MAX)
}
