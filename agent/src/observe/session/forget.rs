//! The observer forgets the pods the runtime removed (`--deleted-pod-retention` after
//! their last sandbox went, or beyond 512 such pods the longest gone), as the agent
//! forgets deleted pods: the collector drops their records, the metrics count what they
//! had not counted yet, and the export sends a startup it had not sent and lets the pod
//! go. The trace keeps every record; this bounds the memory of an observer that runs
//! for months on a busy node.

use std::sync::Arc;
use std::time::Duration;

use crate::ebpf::now_ktime_ns;
use crate::metrics::Metrics;
use crate::observe::export::ObservedExport;
use crate::timeline::Collector;

/// Between two passes: a pass builds the timeline of what it forgets.
const PERIOD: Duration = Duration::from_secs(5);

/// The forgetting task, stopped at the observer's end (before the last timeline is
/// built, so the footer and the export's close see every pod still kept).
pub(super) struct Forgetting {
    task: tokio::task::JoinHandle<()>,
}

impl Forgetting {
    pub(super) fn start(
        collector: Arc<Collector>,
        metrics: Option<Arc<Metrics>>,
        export: Option<Arc<ObservedExport>>,
        retention: Duration,
    ) -> Forgetting {
        let retention_ns = u64::try_from(retention.as_nanos()).unwrap_or(u64::MAX);
        let task = tokio::spawn(async move {
            let mut tick = tokio::time::interval(PERIOD);
            tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
            loop {
                tick.tick().await;
                let forgotten = collector.forget_deleted(now_ktime_ns(), retention_ns);
                if forgotten.uids.is_empty() {
                    continue;
                }
                tracing::debug!(pods = forgotten.uids.len(), "forgot removed pods");
                if let Some(m) = &metrics {
                    m.forget_timeline(&forgotten);
                }
                if let Some(e) = &export {
                    e.forget(&forgotten.uids, &forgotten.timeline);
                }
            }
        });
        Forgetting { task }
    }

    pub(super) async fn stop(self) {
        self.task.abort();
        let _ = self.task.await;
    }
}
