//! The agent's second phase: the recording (trace, probes, exports) started, the sync
//! loop running with every CRI call recorded and every kernel-seen start and exit shown,
//! and the queue that takes config changes into it. Then [`Started::finish`] stops it
//! all in order, so what was recorded reaches the trace whole.

use std::sync::Arc;

use tokio::sync::watch;
use tokio::task::JoinHandle;

use crate::config::source::PodUpdate;
use crate::cri::Recording;
use crate::queues;
use crate::syncloop::{Kubelet, StatusStore};
use crate::trace::TraceConfig;

use super::AgentError;
use super::prepare::Prepared;
use super::recorder::{Finished, RunRecorder};

/// The agent running: its sync loop takes config changes through [`Started::send`].
pub struct Started {
    pub(super) node: String,
    pub(super) store: Arc<StatusStore>,
    pub(super) recorder: RunRecorder,
    updates: queues::Sender<PodUpdate>,
    stop: watch::Sender<bool>,
    sync_loop: JoinHandle<()>,
}

impl Prepared {
    /// Starts the recording and the sync loop. An error names what could not start;
    /// what had started is dropped with it (the probes detach, the trace file is left as
    /// far as it got, which the reader takes as an incomplete trace).
    pub async fn start(self) -> Result<Started, AgentError> {
        let node = self.cfg.node_name.clone();
        let mut recorder = RunRecorder::start(
            self.trace.as_deref().map(|p| (p, self.trace_rotation)),
            self.probes,
            self.watched_root.as_deref(),
            &self.cri,
            &node,
            TraceConfig::Run(Box::new(self.run_config)),
        )
        .await?;
        recorder.set_deleted_pod_retention(self.deleted_pod_retention);
        if let Some(endpoint) = &self.otlp_endpoint {
            recorder.start_otlp(endpoint, &node)?;
        }
        if let Some(listen) = self.runtime_otlp {
            recorder.start_runtime_receiver(listen).await?;
        }
        recorder.set_runtime_span_wait(self.runtime_span_wait);
        recorder.announce_sources();
        let cri = Recording::new(self.cri, Arc::new(recorder.sink()));
        let mut kubelet = Kubelet::new(cri, self.cfg, self.settings)?;
        kubelet.set_metrics(recorder.metrics());
        let store = kubelet.store();
        recorder.tap_events(&store);
        // Show a start as soon as the kernel execs the container's program, and its exit
        // as soon as the kernel reports it; the sync after the runtime's own account
        // publishes that.
        recorder.show_kernel_seen(kubelet.kernel_seen());
        let (updates, rx) = kubelet.pod_update_channel();
        let (stop, stop_rx) = watch::channel(false);
        let sync_loop = tokio::spawn(kubelet.run(rx, stop_rx));
        Ok(Started {
            node,
            store,
            recorder,
            updates,
            stop,
            sync_loop,
        })
    }
}

impl Started {
    /// Records the config change and hands it to the sync loop, waiting for room in its
    /// queue.
    pub async fn send(&self, update: PodUpdate) -> Result<(), AgentError> {
        self.recorder.pod_update(&update);
        self.updates
            .send(update)
            .await
            .map_err(|_| AgentError::SyncLoopStopped)
    }

    pub fn node_name(&self) -> &str {
        &self.node
    }

    /// The pods as the agent shows them.
    pub fn store(&self) -> &Arc<StatusStore> {
        &self.store
    }

    /// What the user should know that stopped nothing, once each (see
    /// [`RunRecorder::take_notes`]).
    pub fn take_notes(&mut self) -> Vec<String> {
        self.recorder.take_notes()
    }

    /// Stops the sync loop, then the recording: the probes, the exports, the trace with
    /// its footer.
    pub async fn finish(self) -> Finished {
        let _ = self.stop.send(true);
        let _ = self.sync_loop.await;
        self.recorder.finish().await
    }
}
