//! Writing a trace: records go through a channel to one writer task, so the pipeline
//! never waits on the disk.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

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

/// The writer task and its file.
pub struct TraceWriter {
    path: PathBuf,
    task: tokio::task::JoinHandle<std::io::Result<BTreeMap<String, u64>>>,
    sink: TraceSink,
}

impl TraceWriter {
    /// Creates `path` and writes the header now; returns the writer and the sink.
    pub async fn create(path: &Path, header: Header) -> std::io::Result<TraceWriter> {
        let file = tokio::fs::File::create(path).await?;
        let mut out = tokio::io::BufWriter::new(file);
        let (tx, mut rx) = mpsc::unbounded_channel::<TraceRecord>();
        write_line(&mut out, &TraceRecord::Header(header)).await?;
        let task = tokio::spawn(async move {
            let mut counts: BTreeMap<String, u64> = BTreeMap::new();
            while let Some(mut record) = rx.recv().await {
                if let TraceRecord::Footer(footer) = &mut record {
                    // The footer carries the counts of everything written before it.
                    footer.counts = counts.clone();
                    write_line(&mut out, &record).await?;
                    break;
                }
                *counts.entry(record.type_name().to_string()).or_default() += 1;
                write_line(&mut out, &record).await?;
            }
            out.flush().await?;
            Ok(counts)
        });
        Ok(TraceWriter {
            path: path.to_path_buf(),
            task,
            sink: TraceSink { tx },
        })
    }

    pub fn sink(&self) -> TraceSink {
        self.sink.clone()
    }

    pub fn path(&self) -> &Path {
        &self.path
    }

    /// Writes the footer (the writer fills in the counts of what was written) and
    /// closes the file. Records sent after this are dropped.
    pub async fn finish(self, footer: Footer) -> std::io::Result<BTreeMap<String, u64>> {
        self.sink.send(TraceRecord::Footer(footer));
        drop(self.sink);
        self.task.await.map_err(std::io::Error::other)?
    }
}

async fn write_line<W: tokio::io::AsyncWrite + Unpin>(
    out: &mut W,
    record: &TraceRecord,
) -> std::io::Result<()> {
    let mut line = serde_json::to_vec(record).map_err(std::io::Error::other)?;
    line.push(b'\n');
    out.write_all(&line).await
}
