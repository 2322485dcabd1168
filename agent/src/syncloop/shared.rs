//! State the sync loop and the pod workers' tasks share: back-off, kubelet's reason cache,
//! probe results, the image pull limiter and the status store.

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex, MutexGuard};

use crate::cm::PodContainerManager;
use crate::kubelet::backoff::Backoff;
use crate::kubelet::probe_results::ProbeResults;
use crate::kubelet::status::WaitingReasons;
use crate::kuberuntime::{PullLimiter, RuntimeConfig};

use super::actuated::ActuatedResources;
use super::settings::KubeletSettings;
use super::status_store::StatusStore;

pub struct Shared {
    pub cfg: RuntimeConfig,
    pub settings: KubeletSettings,
    pub backoff: Mutex<Backoff>,
    /// kubelet's reasonCache: why each container last failed to start, by pod UID.
    pub reasons: Mutex<BTreeMap<String, WaitingReasons>>,
    pub probes: Mutex<BTreeMap<String, ProbeResults>>,
    pub limiter: PullLimiter,
    pub store: Arc<StatusStore>,
    /// Pod cgroups under the configured root; None leaves cgroups to the runtime.
    pub pcm: Option<PodContainerManager>,
    /// kubelet's runtimeState, network part: when (CLOCK_MONOTONIC ns) the runtime last
    /// said its network was ready.
    pub network_ready_at: Mutex<Option<u64>>,
    /// What the runtime applied to each container, for in-place resize.
    pub actuated: ActuatedResources,
    /// Pods whose resize is pending: kubelet's PodResizePending (reason, message).
    pub resize_pending: Mutex<BTreeMap<String, (String, String)>>,
    /// Pods held at the network-readiness gate: since when (CLOCK_MONOTONIC ns), and why.
    pub network_waits: Mutex<BTreeMap<String, (u64, String)>>,
}

pub fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|e| e.into_inner())
}

impl Shared {
    pub fn new(
        cfg: RuntimeConfig,
        settings: KubeletSettings,
        pcm: Option<PodContainerManager>,
    ) -> Shared {
        let ns = |d: std::time::Duration| d.as_nanos() as i64;
        Shared {
            backoff: Mutex::new(Backoff::new(
                ns(settings.backoff_initial),
                ns(settings.backoff_max),
            )),
            reasons: Mutex::new(BTreeMap::new()),
            probes: Mutex::new(BTreeMap::new()),
            limiter: PullLimiter::new(settings.max_parallel_image_pulls),
            store: Arc::new(StatusStore::default()),
            pcm,
            network_ready_at: Mutex::new(None),
            resize_pending: Mutex::new(BTreeMap::new()),
            network_waits: Mutex::new(BTreeMap::new()),
            actuated: ActuatedResources::new(cfg.touch_host.then(|| cfg.root_dir.join("pods"))),
            cfg,
            settings,
        }
    }

    pub fn reasons_of(&self, uid: &str) -> WaitingReasons {
        lock(&self.reasons).get(uid).cloned().unwrap_or_default()
    }

    pub fn probes_of(&self, uid: &str) -> ProbeResults {
        lock(&self.probes).get(uid).cloned().unwrap_or_default()
    }

    /// Drops everything kept for a pod that is gone.
    pub fn forget_pod(&self, uid: &str) {
        lock(&self.reasons).remove(uid);
        lock(&self.probes).remove(uid);
        self.actuated.forget(uid);
        lock(&self.resize_pending).remove(uid);
        lock(&self.network_waits).remove(uid);
        lock(&self.backoff).forget_prefix(&format!("{uid}/"));
    }
}
