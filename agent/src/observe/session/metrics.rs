//! The observer's `/metrics`: served from a listener bound before anything started,
//! brought up to date before each scrape (the timeline's stages, the live diagnosis,
//! the trace's and the write hook's state) and every second while observing (what the
//! probes lost, which only their maps hold).

use std::future::Future;
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use crate::ebpf::KernelProbes;
use crate::metrics::Metrics;
use crate::trace::TraceWriter;

use super::outputs::Outputs;

/// Between two reads of the probes' loss counters while observing.
const LOST_PERIOD: Duration = Duration::from_secs(1);

pub(super) struct ServedMetrics {
    pub(super) addr: SocketAddr,
    metrics: Arc<Metrics>,
    server: tokio::task::JoinHandle<()>,
}

impl ServedMetrics {
    pub(super) fn start(
        listener: tokio::net::TcpListener,
        metrics: Arc<Metrics>,
        out: &Outputs,
        writer: &TraceWriter,
        probes: Option<&KernelProbes>,
    ) -> ServedMetrics {
        let addr = listener
            .local_addr()
            .unwrap_or_else(|_| SocketAddr::from(([127, 0, 0, 1], 0)));
        let collector = out.collector.clone();
        let trace = writer.stats();
        let cni = probes.and_then(KernelProbes::cni_output_gate);
        let netns = probes.and_then(KernelProbes::netns_gate);
        metrics.set_probes_loaded(probes.is_some());
        let before = {
            let metrics = metrics.clone();
            Arc::new(move || {
                metrics.observe_collector(&collector);
                metrics.refresh_diagnosis(&collector);
                metrics.set_collector(&collector.stats());
                metrics.set_trace_losses(trace.unwritten(), trace.dropped());
                if let Some(gate) = &cni {
                    metrics.set_cni_write_hook(gate.is_attached(), gate.attaches());
                }
                if let Some(gate) = &netns {
                    metrics.set_netns_probes(gate.is_attached(), gate.attaches());
                }
            })
        };
        let server = crate::metrics::serve_on(listener, metrics.clone(), before);
        ServedMetrics {
            addr,
            metrics,
            server,
        }
    }

    /// The metrics served.
    pub(super) fn metrics(&self) -> Arc<Metrics> {
        self.metrics.clone()
    }

    /// Runs `observing` to its end, reading the probes' loss counters meanwhile.
    pub(super) async fn refreshed_while<T>(
        &self,
        observing: impl Future<Output = T>,
        probes: Option<&KernelProbes>,
    ) -> T {
        let lost = async {
            let mut tick = tokio::time::interval(LOST_PERIOD);
            tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
            loop {
                tick.tick().await;
                if let Some(lost) = probes.and_then(|p| p.lost().ok()) {
                    let by_kind = lost
                        .by_kind
                        .iter()
                        .map(|(k, v)| (k.to_string(), *v))
                        .collect();
                    self.metrics.set_lost(&by_kind);
                }
            }
        };
        tokio::pin!(observing);
        tokio::select! {
            biased;
            out = &mut observing => out,
            () = lost => unreachable!("the loss counters are read until the observing ends"),
        }
    }

    /// Stops serving.
    pub(super) async fn stop(self) {
        self.server.abort();
        let _ = self.server.await;
    }
}
