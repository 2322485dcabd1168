//! Writing a trace: records go through a channel to one writer task, so the pipeline
//! never waits on the disk; the task makes them durable in order (see [`TraceWriter::create`]).

use std::collections::BTreeMap;
use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, OnceLock};

use tokio::io::AsyncWriteExt;
use tokio::sync::mpsc;

use super::record::{Footer, Header, TraceRecord};
use crate::cri::{CallSink, CriCall};

/// The sending side, cheap to clone: hand it to everything that records.
#[derive(Clone, Debug)]
pub struct TraceSink {
    tx: mpsc::UnboundedSender<TraceRecord>,
}

impl TraceSink {
    pub fn send(&self, record: TraceRecord) {
        let _ = self.tx.send(record);
    }

    /// A sink that drops everything (no trace file requested).
    pub fn discard() -> TraceSink {
        let (tx, _rx) = mpsc::unbounded_channel();
        TraceSink { tx }
    }
}

impl CallSink for TraceSink {
    fn record(&self, call: CriCall) {
        self.send(TraceRecord::Cri(call));
    }
}

/// How often the writer makes the file durable (fdatasync) while records keep coming: a
/// power loss costs at most this much of the trace; a killed process, nothing it had sent.
pub const SYNC_EVERY: std::time::Duration = std::time::Duration::from_secs(1);
/// Records taken from the channel per write: one flush (and at most one sync) each.
const BATCH: usize = 1024;

/// What the writer could not do, shared with whoever reports it (`/metrics`, the footer).
#[derive(Debug, Default)]
pub struct WriterStats {
    unwritten: AtomicU64,
    failure: OnceLock<String>,
}

impl WriterStats {
    /// Records that reached the writer but not the file.
    pub fn unwritten(&self) -> u64 {
        self.unwritten.load(Ordering::Relaxed)
    }

    /// Why writing stopped, once it has.
    pub fn failure(&self) -> Option<&str> {
        self.failure.get().map(String::as_str)
    }
}

/// The writer task and its file.
pub struct TraceWriter {
    path: PathBuf,
    task: tokio::task::JoinHandle<BTreeMap<String, u64>>,
    sink: TraceSink,
    stats: Arc<WriterStats>,
}

impl TraceWriter {
    /// Creates `path` (0600: it holds pod specs and commands) and writes the header now;
    /// returns the writer and the sink.
    ///
    /// Durability: every batch of records is flushed to the kernel as soon as it is
    /// written, so a killed podtrace loses none of what it had recorded, and the file is
    /// fdatasync'ed at most every [`SYNC_EVERY`] and at the footer, so a power loss or a
    /// node crash costs at most the last second. A write error (a full disk) stops the
    /// writing, not the pods: it is said once, and every record from then on is counted
    /// in [`WriterStats::unwritten`].
    pub async fn create(path: &Path, header: Header) -> std::io::Result<TraceWriter> {
        let file = tokio::fs::OpenOptions::new()
            .write(true)
            .create(true)
            .truncate(true)
            .mode(0o600)
            .open(path)
            .await?;
        // An existing file keeps its mode through O_TRUNC.
        file.set_permissions(std::fs::Permissions::from_mode(0o600))
            .await?;
        let mut out = tokio::io::BufWriter::new(file);
        let (tx, rx) = mpsc::unbounded_channel::<TraceRecord>();
        write_line(&mut out, &TraceRecord::Header(header)).await?;
        out.flush().await?;
        let stats = Arc::new(WriterStats::default());
        let task = tokio::spawn(write_records(out, rx, path.to_path_buf(), stats.clone()));
        Ok(TraceWriter {
            path: path.to_path_buf(),
            task,
            sink: TraceSink { tx },
            stats,
        })
    }

    pub fn sink(&self) -> TraceSink {
        self.sink.clone()
    }

    pub fn path(&self) -> &Path {
        &self.path
    }

    pub fn stats(&self) -> Arc<WriterStats> {
        self.stats.clone()
    }

    /// Writes the footer (the writer fills in the counts of what was written and what
    /// could not be) and closes the file. Records sent after this are dropped. Returns
    /// the counts written, by type.
    pub async fn finish(self, footer: Footer) -> std::io::Result<BTreeMap<String, u64>> {
        self.sink.send(TraceRecord::Footer(footer));
        drop(self.sink);
        self.task.await.map_err(std::io::Error::other)
    }
}

async fn write_records(
    mut out: tokio::io::BufWriter<tokio::fs::File>,
    mut rx: mpsc::UnboundedReceiver<TraceRecord>,
    path: PathBuf,
    stats: Arc<WriterStats>,
) -> BTreeMap<String, u64> {
    let mut counts: BTreeMap<String, u64> = BTreeMap::new();
    let mut last_sync = tokio::time::Instant::now();
    let fail = |e: std::io::Error, lost: u64| {
        stats.unwritten.fetch_add(lost, Ordering::Relaxed);
        if stats.failure.set(e.to_string()).is_ok() {
            eprintln!(
                "podtrace: trace {}: stopped writing: {e}; the pods keep running, and the records from here on are counted, not written",
                path.display()
            );
        }
    };
    let mut batch = Vec::with_capacity(BATCH);
    loop {
        let Some(first) = rx.recv().await else { break };
        batch.push(first);
        while batch.len() < BATCH {
            match rx.try_recv() {
                Ok(r) => batch.push(r),
                Err(_) => break,
            }
        }
        let mut in_buffer = 0u64;
        let mut done = false;
        for mut record in batch.drain(..) {
            if let TraceRecord::Footer(footer) = &mut record {
                // The footer carries the counts of everything written before it.
                footer.counts = counts.clone();
                footer.unwritten_records = stats.unwritten();
                done = true;
            } else {
                *counts.entry(record.type_name().to_string()).or_default() += 1;
            }
            if stats.failure().is_some() {
                stats.unwritten.fetch_add(1, Ordering::Relaxed);
            } else if let Err(e) = write_line(&mut out, &record).await {
                fail(e, in_buffer + 1);
                in_buffer = 0;
            } else {
                in_buffer += 1;
            }
            if done {
                break;
            }
        }
        if stats.failure().is_none() {
            if let Err(e) = out.flush().await {
                fail(e, in_buffer);
            } else if (done || last_sync.elapsed() >= SYNC_EVERY)
                && let Err(e) = out.get_ref().sync_data().await
            {
                fail(e, 0);
            } else if done || last_sync.elapsed() >= SYNC_EVERY {
                last_sync = tokio::time::Instant::now();
            }
        }
        if done {
            break;
        }
    }
    // Records sent after the footer, or left when the sink closed without one.
    while let Ok(r) = rx.try_recv() {
        if !matches!(r, TraceRecord::Footer(_)) {
            stats.unwritten.fetch_add(1, Ordering::Relaxed);
        }
    }
    if stats.failure().is_none() {
        let _ = out.flush().await;
        let _ = out.get_ref().sync_data().await;
    }
    counts
}

async fn write_line<W: tokio::io::AsyncWrite + Unpin>(
    out: &mut W,
    record: &TraceRecord,
) -> std::io::Result<()> {
    let mut line = serde_json::to_vec(record).map_err(std::io::Error::other)?;
    line.push(b'\n');
    out.write_all(&line).await
}
