//! The export queue: pods' spans wait here, bounded, for one task that sends them in
//! batches (podlapse's own with podlapse's resource, the runtime's it forwards with the
//! runtime's). Pod work never waits on it: a send that finds the queue full drops the spans
//! and counts them, and so does a batch the collector refused or never answered. An
//! endpoint that fails is reported once (and again once it answers), and every later
//! batch tries it again.

use std::time::Duration;

use prometheus_client::metrics::counter::Counter;

use opentelemetry_otlp::SpanExporter;
use opentelemetry_sdk::Resource;
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

/// Spans that go out together, with whose resource: podlapse's own (`None`), or another
/// service's (the runtime's spans podlapse forwards), named by a key that tells two
/// resources apart.
struct Item {
    resource: Option<(String, Resource)>,
    spans: Vec<SpanData>,
}

impl Item {
    fn key(&self) -> Option<&str> {
        self.resource.as_ref().map(|(k, _)| k.as_str())
    }
}

pub struct ExportQueue {
    tx: mpsc::Sender<Item>,
    stats: ExportStats,
    task: tokio::task::JoinHandle<()>,
}

impl ExportQueue {
    /// Starts the sending task for `exporter`, counting into `stats`; `endpoint` names
    /// it in reports. `own` is the resource podlapse's spans go with (the exporter's).
    pub fn start(
        exporter: SpanExporter,
        endpoint: String,
        stats: ExportStats,
        own: Resource,
    ) -> ExportQueue {
        let (tx, rx) = mpsc::channel(QUEUE_PODS);
        let task = tokio::spawn(send_batches(exporter, endpoint, rx, stats.clone(), own));
        ExportQueue { tx, stats, task }
    }

    pub fn stats(&self) -> ExportStats {
        self.stats.clone()
    }

    /// Queues one pod's spans; never waits.
    pub fn send(&self, spans: Vec<SpanData>) {
        self.queue(Item {
            resource: None,
            spans,
        });
    }

    /// Queues spans of another service's (`resource`, told apart from others by `key`);
    /// never waits.
    pub fn send_foreign(&self, key: String, resource: Resource, spans: Vec<SpanData>) {
        self.queue(Item {
            resource: Some((key, resource)),
            spans,
        });
    }

    /// Queues spans another service sent (the runtime's, the kubelet's), as they came,
    /// batched by their sender's resource; never waits.
    pub fn forward<'a>(
        &self,
        spans: impl IntoIterator<Item = &'a super::RuntimeSpan>,
        anchor: super::ClockAnchor,
    ) {
        for (key, resource, spans) in super::runtime_span::batches(spans, anchor) {
            self.send_foreign(key, resource, spans);
        }
    }

    fn queue(&self, item: Item) {
        let n = item.spans.len();
        if n > 0 && self.tx.try_send(item).is_err() {
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
    mut exporter: SpanExporter,
    endpoint: String,
    mut rx: mpsc::Receiver<Item>,
    stats: ExportStats,
    own: Resource,
) {
    let mut failing = false;
    // The resource the exporter sends with now, by key (None: podlapse's own).
    let mut current: Option<String> = None;
    let mut held: Option<Item> = None;
    loop {
        let first = match held.take() {
            Some(item) => item,
            None => match rx.recv().await {
                Some(item) => item,
                None => break,
            },
        };
        let key = first.key().map(str::to_string);
        let resource = first.resource.map(|(_, r)| r);
        let mut batch = first.spans;
        // Whatever else is queued for the same resource goes in the same export, up to
        // the batch size; another resource's spans wait for the next.
        while batch.len() < BATCH_SPANS {
            match rx.try_recv() {
                Ok(more) if more.key() == key.as_deref() => batch.extend(more.spans),
                Ok(other) => {
                    held = Some(other);
                    break;
                }
                Err(_) => break,
            }
        }
        if key != current {
            exporter.set_resource(resource.as_ref().unwrap_or(&own));
            current = key;
        }
        let n = batch.len();
        let outcome = exporter.export(batch).await;
        match outcome {
            Ok(()) => {
                stats.exported.inc_by(n as u64);
                if failing {
                    failing = false;
                    eprintln!("podlapse: the OTLP endpoint {endpoint} takes spans again");
                }
            }
            Err(e) => {
                stats.drop_spans(n);
                stats.failed_exports.inc();
                if !failing {
                    failing = true;
                    eprintln!(
                        "podlapse: exporting spans to {endpoint} failed ({e}); later spans \
                         try it again, and what is dropped is counted \
                         (podlapse_otlp_spans_dropped_total)"
                    );
                }
            }
        }
    }
    let _ = exporter.shutdown();
}
