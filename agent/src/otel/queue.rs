//! The export queue: pods' spans wait here, bounded, for one task that sends them in
//! batches. Pod work never waits on it: a send that finds the queue full drops the spans
//! and counts them, and so does a batch the collector refused or never answered. An
//! endpoint that fails is reported once (and again once it answers), and every later
//! batch tries it again.

use std::time::Duration;

use prometheus_client::metrics::counter::Counter;

use opentelemetry_otlp::SpanExporter;
use opentelemetry_sdk::trace::SpanData;
use opentelemetry_sdk::trace::SpanExporter as _;
use tokio::sync::mpsc;

/// Pods' span sets the queue holds before it drops.
pub const QUEUE_PODS: usize = 256;
/// Spans one export carries at most.
const BATCH_SPANS: usize = 512;

/// What the export did, as counters `/metrics` shows (clones share their values).
#[derive(Debug, Clone, Default)]
pub struct ExportStats {
    pub exported: Counter,
    pub dropped: Counter,
    pub failed_exports: Counter,
}

impl ExportStats {
    pub fn exported(&self) -> u64 {
        self.exported.get()
    }
    pub fn dropped(&self) -> u64 {
        self.dropped.get()
    }
    pub fn failed_exports(&self) -> u64 {
        self.failed_exports.get()
    }
    fn drop_spans(&self, n: usize) {
        self.dropped.inc_by(n as u64);
    }
}

pub struct ExportQueue {
    tx: mpsc::Sender<Vec<SpanData>>,
    stats: ExportStats,
    task: tokio::task::JoinHandle<()>,
}

impl ExportQueue {
    /// Starts the sending task for `exporter`, counting into `stats`; `endpoint` names
    /// it in reports.
    pub fn start(exporter: SpanExporter, endpoint: String, stats: ExportStats) -> ExportQueue {
        let (tx, rx) = mpsc::channel(QUEUE_PODS);
        let task = tokio::spawn(send_batches(exporter, endpoint, rx, stats.clone()));
        ExportQueue { tx, stats, task }
    }

    pub fn stats(&self) -> ExportStats {
        self.stats.clone()
    }

    /// Queues one pod's spans; never waits.
    pub fn send(&self, spans: Vec<SpanData>) {
        let n = spans.len();
        if n > 0 && self.tx.try_send(spans).is_err() {
            self.stats.drop_spans(n);
        }
    }

    /// Sends what is queued, for at most `deadline`; what is still queued then is
    /// dropped (and counted).
    pub async fn close(self, deadline: Duration) -> ExportStats {
        let ExportQueue { tx, stats, task } = self;
        drop(tx);
        let abort = task.abort_handle();
        if tokio::time::timeout(deadline, task).await.is_err() {
            abort.abort();
            tracing::warn!("the OTLP export did not finish in {deadline:?}");
        }
        stats
    }
}

async fn send_batches(
    exporter: SpanExporter,
    endpoint: String,
    mut rx: mpsc::Receiver<Vec<SpanData>>,
    stats: ExportStats,
) {
    let mut failing = false;
    while let Some(first) = rx.recv().await {
        let mut batch = first;
        // Whatever else is queued goes in the same export, up to the batch size.
        while batch.len() < BATCH_SPANS {
            match rx.try_recv() {
                Ok(more) => batch.extend(more),
                Err(_) => break,
            }
        }
        let n = batch.len();
        let outcome = exporter.export(batch).await;
        match outcome {
            Ok(()) => {
                stats.exported.inc_by(n as u64);
                if failing {
                    failing = false;
                    eprintln!("podtrace: the OTLP endpoint {endpoint} takes spans again");
                }
            }
            Err(e) => {
                stats.drop_spans(n);
                stats.failed_exports.inc();
                if !failing {
                    failing = true;
                    eprintln!(
                        "podtrace: exporting spans to {endpoint} failed ({e}); later spans \
                         try it again, and what is dropped is counted \
                         (podtrace_otlp_spans_dropped_total)"
                    );
                }
            }
        }
    }
    let _ = exporter.shutdown();
}
