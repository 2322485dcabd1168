//! The long-running agent's third phase: follow the manifests until SIGINT or SIGTERM,
//! with the local API and `/metrics` served and freed heap handed back as it goes.

use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use tokio::signal::unix::{SignalKind, signal};
use tokio::task::JoinHandle;

use crate::config::source;
use crate::syncloop::api::{ApiState, serve as serve_api};

use super::AgentError;
use super::malloc::{TRIM_PERIOD, trim_every};
use super::start::Started;

/// How often the probes' loss counters reach the metrics.
const METRICS_REFRESH: Duration = Duration::from_secs(5);

/// Where the long-running agent reads and serves.
pub struct ServeOptions {
    pub manifests: Vec<PathBuf>,
    pub api_socket: PathBuf,
    /// `/metrics`' address, or `off`.
    pub metrics_addr: String,
}

impl Started {
    /// Follows the manifests until a signal. `on_metrics` is told where `/metrics` is
    /// served, once it is.
    pub async fn serve(
        &self,
        opts: &ServeOptions,
        on_metrics: impl FnOnce(SocketAddr),
    ) -> Result<(), AgentError> {
        let api = ApiState::new(self.store.clone(), self.recorder.collector());
        let server = serve_api(&opts.api_socket, api)?;
        let trimmer = tokio::spawn(trim_every(TRIM_PERIOD));
        let result = self.follow(opts, on_metrics).await;
        trimmer.abort();
        server.abort();
        let _ = server.await;
        result
    }

    async fn follow(
        &self,
        opts: &ServeOptions,
        on_metrics: impl FnOnce(SocketAddr),
    ) -> Result<(), AgentError> {
        let mut updates =
            source::watch(opts.manifests.clone(), self.node.clone()).map_err(|source| {
                AgentError::WatchManifests {
                    paths: opts.manifests.clone(),
                    source,
                }
            })?;
        let mut sigterm = signal(SignalKind::terminate()).map_err(AgentError::Signals)?;
        let metrics_server = self.start_metrics(&opts.metrics_addr, on_metrics).await?;
        // Loss counters live in the kernel; fold them into the metrics now and then.
        let mut refresh = tokio::time::interval(METRICS_REFRESH);
        let result = loop {
            tokio::select! {
                u = updates.recv() => match u {
                    // While the sync loop's queue is full this waits, still answering
                    // signals.
                    Some(u) => tokio::select! {
                        sent = self.send(u) => if let Err(e) = sent { break Err(e) },
                        _ = tokio::signal::ctrl_c() => break Ok(()),
                        _ = sigterm.recv() => break Ok(()),
                    },
                    None => break Err(AgentError::WatchEnded(opts.manifests.clone())),
                },
                _ = refresh.tick() => self.recorder.refresh_metrics(),
                _ = tokio::signal::ctrl_c() => break Ok(()),
                _ = sigterm.recv() => break Ok(()),
            }
        };
        if let Some(server) = metrics_server {
            server.abort();
        }
        result
    }

    /// Serves `/metrics` on `addr` unless it is `off`.
    async fn start_metrics(
        &self,
        addr: &str,
        on_metrics: impl FnOnce(SocketAddr),
    ) -> Result<Option<JoinHandle<()>>, AgentError> {
        if addr == "off" {
            return Ok(None);
        }
        let parsed = crate::metrics::parse_addr(addr)?;
        let (metrics, collector) = (self.recorder.metrics(), self.recorder.collector());
        let before = {
            let (metrics, netns) = (metrics.clone(), self.recorder.netns_refresher());
            Arc::new(move || {
                metrics.observe_collector(&collector);
                metrics.refresh_diagnosis(&collector);
                netns();
            })
        };
        let (bound, task) = crate::metrics::serve(parsed, metrics, before).await?;
        on_metrics(bound);
        Ok(Some(task))
    }
}
