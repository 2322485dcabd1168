//! What a pod worker does after a sync: kubelet's podWorkerLoop, which after syncPod
//! either waits for the next resync, retries after the error back-off, or comes back when
//! a back-off it is waiting on ends.

use super::pod_workers::WorkOutcome;
use super::runtime_pod::Nanos;

/// What one sync came to, as far as the worker's next step goes.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct SyncSummary {
    /// An image pull failed in this sync (ErrImagePull).
    pub image_pull_failed: bool,
    /// A step failed outright, not a back-off wait (a sandbox, a container's creation).
    pub failed: bool,
    /// When the earliest back-off something waits on ends (CrashLoopBackOff,
    /// ImagePullBackOff).
    pub retry_at: Option<Nanos>,
}

/// The worker's next step after a sync that came to `s`, at `now`.
pub fn outcome_after_sync(s: SyncSummary, now: Nanos) -> WorkOutcome {
    if s.image_pull_failed {
        // kubelet shows ErrImagePull for the failed attempt and ImagePullBackOff while it
        // waits; sync again at once so the wait is published as such.
        WorkOutcome::RetryAt(now)
    } else if s.failed {
        WorkOutcome::Failed
    } else if let Some(at) = s.retry_at {
        WorkOutcome::RetryAt(at)
    } else {
        WorkOutcome::Synced
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn each_kind_of_sync_leads_the_worker_where_kubelets_does() {
        const NOW: Nanos = 1_000;
        let rows: &[(&str, SyncSummary, WorkOutcome)] = &[
            ("all started", SyncSummary::default(), WorkOutcome::Synced),
            (
                "waiting on a back-off",
                SyncSummary {
                    retry_at: Some(5_000),
                    ..SyncSummary::default()
                },
                WorkOutcome::RetryAt(5_000),
            ),
            (
                "a step failed",
                SyncSummary {
                    failed: true,
                    ..SyncSummary::default()
                },
                WorkOutcome::Failed,
            ),
            (
                "a step failed while another waits",
                SyncSummary {
                    failed: true,
                    retry_at: Some(5_000),
                    ..SyncSummary::default()
                },
                WorkOutcome::Failed,
            ),
            (
                "a pull failed: the back-off is published at once",
                SyncSummary {
                    image_pull_failed: true,
                    retry_at: Some(5_000),
                    ..SyncSummary::default()
                },
                WorkOutcome::RetryAt(NOW),
            ),
            (
                "a pull failed beside another failure",
                SyncSummary {
                    image_pull_failed: true,
                    failed: true,
                    retry_at: None,
                },
                WorkOutcome::RetryAt(NOW),
            ),
        ];
        for (what, summary, want) in rows {
            assert_eq!(outcome_after_sync(*summary, NOW), *want, "{what}");
        }
    }
}
