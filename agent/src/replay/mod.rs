//! `podlapse replay`: the same reconciler as `podlapse run`, driven by a recorded trace in
//! virtual time. Pod config changes are fed at their recorded times, the runtime is the
//! recording ([`ReplayRuntime`]), and tokio's paused clock jumps over every wait, so a
//! replay takes milliseconds and gives the same output on every run and machine.

mod compare;
mod runtime;

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::time::Duration;

use tokio::sync::watch;

pub use compare::{Comparison, PodComparison, Recorded, StageLatency, Tolerance, compare};
pub use runtime::{Divergence, ReplayRuntime, Served};

use crate::clock::{install_virtual, uninstall_virtual};
use crate::config::source::PodUpdate;
use crate::cri::CriMethod;
use crate::kubelet::admission::NodeAllocatable;
use crate::kuberuntime::{HostDns, RuntimeConfig};
use crate::syncloop::{Kubelet, KubeletSettings};
use crate::trace::{PodOp, Trace, TraceRecord};

/// What to change for a what-if replay.
#[derive(Debug, Clone, Default)]
pub struct WhatIf {
    /// Latency factor per CRI method: `PullImage=0.5` makes pulls twice as fast.
    pub scale: BTreeMap<CriMethod, f64>,
    /// Override the image puller: `Some(None)` parallel without limit, `Some(Some(n))`.
    pub max_parallel_image_pulls: Option<Option<usize>>,
    /// A deliberately changed decision, for proving the CI gate bites.
    pub flip_pull_policy: bool,
}

/// What a replay produced.
#[derive(Debug, Clone)]
pub struct Replayed {
    /// The calls the replay made that the recording answered, as they were answered:
    /// each names its recorded call by its index among the trace's CRI calls.
    pub served: Vec<Served>,
    pub divergences: Vec<Divergence>,
    /// Virtual time the replay covered.
    pub virtual_ns: u64,
}

/// How long after the recording's last record the replay keeps running, so work the
/// recording cut short (cleanup, back-off) can finish.
const TAIL: Duration = Duration::from_secs(5);

fn settings_from(trace: &Trace, what_if: &WhatIf) -> KubeletSettings {
    // A trace without the agent's settings replays with the defaults.
    let c = trace.header.config.run();
    let allocatable: NodeAllocatable = c.map_or(
        NodeAllocatable {
            milli_cpu: i64::MAX / 4,
            memory_bytes: i64::MAX / 4,
            max_pods: 110,
        },
        |c| c.allocatable.clone(),
    );
    let mut s = KubeletSettings::with_allocatable(allocatable);
    if let Some(c) = c {
        s.resync_interval = Duration::from_nanos(c.resync_interval_ns);
        s.error_backoff = Duration::from_nanos(c.error_backoff_ns);
        s.backoff_initial = Duration::from_nanos(c.backoff_initial_ns);
        s.backoff_max = Duration::from_nanos(c.backoff_max_ns);
        // Exits reach the PLEG as the recording has them (`ReplayRuntime::exit_notice`),
        // as a process watcher's would, so the relist runs at its recorded period.
        s.relist_period = Duration::from_nanos(c.relist_period_ns);
    }
    s.max_parallel_image_pulls = c.map_or(Some(1), |c| c.max_parallel_image_pulls);
    if let Some(p) = what_if.max_parallel_image_pulls {
        s.max_parallel_image_pulls = p;
    }
    s.node = c.and_then(|c| c.node.clone());
    s.cgroup_root = None;
    s.secrets_dir = None;
    s.housekeeping = false;
    s.flip_pull_policy = what_if.flip_pull_policy;
    s
}

/// Replays `trace` through the reconciler in virtual time.
/// Runs on a thread of its own, so it can be called from inside another runtime and its
/// virtual clock never leaks into other work.
pub fn replay(trace: &Trace, what_if: &WhatIf) -> Replayed {
    replay_and(trace, what_if, || ()).0
}

/// [`replay`], with `meanwhile` run on the calling thread while the replay runs on its
/// own: work that needs the trace but not the replay (what a comparison takes from the
/// recording) is then done by the time the replay is.
pub fn replay_and<T>(
    trace: &Trace,
    what_if: &WhatIf,
    meanwhile: impl FnOnce() -> T,
) -> (Replayed, T) {
    std::thread::scope(|s| {
        let replaying = s.spawn(|| {
            let rt = tokio::runtime::Builder::new_current_thread()
                .enable_time()
                .start_paused(true)
                .build()
                .expect("a current-thread runtime with time builds");
            rt.block_on(run(trace, what_if))
        });
        let other = meanwhile();
        let replayed = replaying.join().expect("the replay thread does not panic");
        (replayed, other)
    })
}

async fn run(trace: &Trace, what_if: &WhatIf) -> Replayed {
    let h = &trace.header;
    install_virtual(h.started_wall_ns, h.started_ns);
    let calls = trace.cri_calls();
    let runtime = ReplayRuntime::new(
        &calls,
        &h.runtime_name,
        &h.runtime_version,
        what_if.scale.clone(),
    );
    let cfg = RuntimeConfig {
        node_name: h.node.clone(),
        node_ip: String::new(),
        root_dir: PathBuf::from("/nonexistent/podlapse-replay"),
        pod_logs_dir: PathBuf::from("/nonexistent/podlapse-replay/logs"),
        host_dns: HostDns::default(),
        runtime_handlers: BTreeMap::new(),
        touch_host: false,
        user_namespace_handlers: None,
        allocatable: None,
    };
    let settings = settings_from(trace, what_if);
    let cfg = RuntimeConfig {
        allocatable: Some(settings.allocatable.clone()),
        ..cfg
    };
    let kubelet = Kubelet::new(runtime.clone(), cfg, settings).expect("replay uses no cgroups");
    let (tx, rx) = kubelet.pod_update_channel();
    let (stop_tx, stop_rx) = watch::channel(false);
    let agent = tokio::spawn(kubelet.run(rx, stop_rx));
    let start = tokio::time::Instant::now();
    let mut last_ns = h.started_ns;
    let mut ready_sent = false;
    for r in &trace.records {
        let TraceRecord::Pod(p) = r else { continue };
        let at = start + Duration::from_nanos(p.at_ns.saturating_sub(h.started_ns));
        tokio::time::sleep_until(at).await;
        let pods = vec![p.pod.clone()];
        let update = match p.op {
            PodOp::Add => PodUpdate::Add(pods),
            PodOp::Update => PodUpdate::Update(pods),
            PodOp::Remove => PodUpdate::Remove(pods),
        };
        let _ = tx.send(update).await;
        if !ready_sent {
            let _ = tx.send(PodUpdate::SourcesReady).await;
            ready_sent = true;
        }
        last_ns = last_ns.max(p.at_ns);
    }
    let end_ns = trace.ended_ns().max(last_ns);
    let end = start + Duration::from_nanos(end_ns.saturating_sub(h.started_ns)) + TAIL;
    tokio::time::sleep_until(end).await;
    let _ = stop_tx.send(true);
    let _ = agent.await;
    let virtual_ns = tokio::time::Instant::now().duration_since(start).as_nanos() as u64;
    uninstall_virtual();
    let (served, divergences) = runtime.take_results();
    Replayed {
        served,
        divergences,
        virtual_ns,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Where a replay would write if it touched the host: its `RuntimeConfig`'s paths.
    const ROOT: &str = "/nonexistent/podlapse-replay";

    #[test]
    fn a_replay_touches_no_file() {
        let root = std::path::Path::new(ROOT);
        // Something else may have made it; then there is nothing this test can tell.
        let existed = root.exists();
        let fixture = std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
            .join("../traces/multi-container.jsonl");
        let trace = crate::trace::read_trace(&fixture).expect("the fixture reads");
        let replayed = replay(&trace, &WhatIf::default());
        assert!(
            replayed.divergences.is_empty(),
            "{:?}",
            replayed.divergences
        );
        assert!(
            existed || !root.exists(),
            "the replay created {ROOT} on this host"
        );
    }
}
