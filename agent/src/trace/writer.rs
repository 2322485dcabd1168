//! Writing a trace: records go through a channel to one writer thread, so the pipeline
//! never waits on the disk; the thread makes them durable in order (see
//! [`TraceWriter::create`]).
//!
//! The writer is an OS thread with a plain file, not a task on the async runtime: an
//! async file hands every write and flush to the runtime's blocking pool and back, two
//! thread switches per batch, which were most of `observe`'s CPU time while pods started
//! (its kernel events arrive in bursts of a few at a time).

use std::collections::BTreeMap;
use std::fs::File;
use std::io::{BufWriter, Write};
use std::os::unix::fs::{OpenOptionsExt, PermissionsExt};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, OnceLock};
use std::time::Instant;

use tokio::sync::{mpsc, oneshot};

use super::record::{Footer, Header, TracePart, TraceRecord};
use super::rotation::Rotation;
use crate::cri::{CallSink, CriCall};

/// Records waiting for the writer, at most. A writer that falls this far behind (a disk
/// slower than a burst of events) drops what comes next, and counts it.
pub const QUEUE_RECORDS: usize = 16_384;

/// The sending side, cheap to clone: hand it to everything that records. Sending never
/// waits: the pipeline does not slow down for the disk.
#[derive(Clone, Debug)]
pub struct TraceSink {
    tx: mpsc::Sender<TraceRecord>,
    stats: Arc<WriterStats>,
}

impl TraceSink {
    /// A sink for `path` and the receiving end the writer takes from.
    fn channel(path: &Path, capacity: usize) -> (TraceSink, mpsc::Receiver<TraceRecord>) {
        let (tx, rx) = mpsc::channel(capacity);
        let stats = Arc::new(WriterStats {
            path: path.to_path_buf(),
            ..WriterStats::default()
        });
        (TraceSink { tx, stats }, rx)
    }

    pub fn send(&self, record: TraceRecord) {
        if let Err(mpsc::error::TrySendError::Full(_)) = self.tx.try_send(record)
            && self.stats.dropped.fetch_add(1, Ordering::Relaxed) == 0
        {
            eprintln!(
                "podlapse: trace {}: the writer is {QUEUE_RECORDS} records behind; records are dropped, and counted, until it catches up",
                self.stats.path.display()
            );
        }
    }

    /// Sends, waiting for room: for tests that send faster than any node.
    #[cfg(test)]
    pub(crate) async fn send_waiting(&self, record: TraceRecord) {
        let _ = self.tx.send(record).await;
    }

    /// A sink that drops everything (no trace file requested).
    pub fn discard() -> TraceSink {
        let (tx, _rx) = mpsc::channel(1);
        TraceSink {
            tx,
            stats: Arc::new(WriterStats::default()),
        }
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
/// The file's buffer: a batch of kernel events is one write.
const BUFFER_BYTES: usize = 64 * 1024;

/// What the writer could not do, shared with whoever reports it (`/metrics`, the footer).
#[derive(Debug, Default)]
pub struct WriterStats {
    path: PathBuf,
    unwritten: AtomicU64,
    dropped: AtomicU64,
    failure: OnceLock<String>,
}

impl WriterStats {
    /// Records dropped because the writer's queue was full.
    pub fn dropped(&self) -> u64 {
        self.dropped.load(Ordering::Relaxed)
    }

    /// Records that reached the writer but not the file.
    pub fn unwritten(&self) -> u64 {
        self.unwritten.load(Ordering::Relaxed)
    }

    /// Why writing stopped, once it has.
    pub fn failure(&self) -> Option<&str> {
        self.failure.get().map(String::as_str)
    }
}

/// The writer thread and its file.
pub struct TraceWriter {
    path: PathBuf,
    done: oneshot::Receiver<BTreeMap<String, u64>>,
    sink: TraceSink,
    stats: Arc<WriterStats>,
}

impl TraceWriter {
    /// Creates `path` (0600: it holds pod specs and commands), writes the header now, and
    /// starts the writer thread; returns the writer and the sink.
    ///
    /// Durability: every batch of records is flushed to the kernel as soon as it is
    /// written, so a killed podlapse loses none of what it had recorded, and the file is
    /// fdatasync'ed at most every [`SYNC_EVERY`] and at the footer, so a power loss or a
    /// node crash costs at most the last second. A write error (a full disk) stops the
    /// writing, not the pods: it is said once, and every record from then on is counted
    /// in [`WriterStats::unwritten`].
    pub fn create(path: &Path, header: Header) -> std::io::Result<TraceWriter> {
        TraceWriter::create_rotating(path, header, None)
    }

    /// [`TraceWriter::create`], in files of at most `rotation`'s size when given (see
    /// [`super::rotation`]): each file is a whole trace, the header's `part` says which.
    pub fn create_rotating(
        path: &Path,
        mut header: Header,
        rotation: Option<Rotation>,
    ) -> std::io::Result<TraceWriter> {
        let rotating = rotation.map(|rotation| {
            header.part = Some(TracePart {
                rotation: format!("{:x}-{:x}", header.started_wall_ns, std::process::id()),
                index: 0,
            });
            Rotating {
                path: path.to_path_buf(),
                rotation,
                header: header.clone(),
            }
        });
        let out = open(path, &header)?;
        let (sink, rx) = TraceSink::channel(path, QUEUE_RECORDS);
        TraceWriter::start(out, rx, sink, rotating)
    }

    fn start(
        out: BufWriter<File>,
        rx: mpsc::Receiver<TraceRecord>,
        sink: TraceSink,
        rotating: Option<Rotating>,
    ) -> std::io::Result<TraceWriter> {
        let stats = sink.stats.clone();
        let path = stats.path.clone();
        let (done_tx, done) = oneshot::channel();
        let thread_stats = stats.clone();
        std::thread::Builder::new()
            .name("podlapse-trace".into())
            .spawn(move || {
                let counts = write_records(out, rx, &thread_stats, rotating);
                let _ = done_tx.send(counts);
            })?;
        Ok(TraceWriter {
            path,
            done,
            sink,
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
        // Waits for room: the footer is never dropped.
        let _ = self.sink.tx.send(TraceRecord::Footer(footer)).await;
        drop(self.sink);
        self.done
            .await
            .map_err(|_| std::io::Error::other("the trace writer thread ended without a footer"))
    }
}

/// What a rotating writer needs to start the next file.
struct Rotating {
    path: PathBuf,
    rotation: Rotation,
    /// The first file's header; each next file's says its own index.
    header: Header,
}

/// The state a new file starts with, so it reads alone: the recording's sources and the
/// node's network as last written.
#[derive(Default)]
struct Carried {
    sources: Option<TraceRecord>,
    network: Option<TraceRecord>,
}

impl Carried {
    fn note(&mut self, record: &TraceRecord) {
        match record {
            TraceRecord::Sources(_) => self.sources = Some(record.clone()),
            TraceRecord::Network(_) => self.network = Some(record.clone()),
            _ => {}
        }
    }
}

/// The file being written, and what it holds so far.
struct Part {
    out: BufWriter<File>,
    index: u64,
    bytes: u64,
    counts: BTreeMap<String, u64>,
    /// The newest time among its records: the `continued` footer's end.
    last_ns: u64,
}

impl Part {
    fn write(&mut self, line: &mut Vec<u8>, record: &TraceRecord) -> std::io::Result<()> {
        self.bytes += write_line(&mut self.out, line, record)? as u64;
        if !matches!(record, TraceRecord::Header(_) | TraceRecord::Footer(_)) {
            *self
                .counts
                .entry(record.type_name().to_string())
                .or_default() += 1;
            self.last_ns = self.last_ns.max(record.at_ns().unwrap_or(0));
        }
        Ok(())
    }

    /// Ends this file with a footer of its own, moves it aside and starts the next.
    fn rotate(
        &mut self,
        r: &Rotating,
        carried: &Carried,
        line: &mut Vec<u8>,
        stats: &WriterStats,
    ) -> std::io::Result<()> {
        let footer = Footer {
            ended_ns: self.last_ns,
            counts: std::mem::take(&mut self.counts),
            unwritten_records: stats.unwritten(),
            dropped_records: stats.dropped(),
            continued: true,
            ..Footer::default()
        };
        write_line(&mut self.out, line, &TraceRecord::Footer(footer))?;
        self.out.flush()?;
        self.out.get_ref().sync_data()?;
        super::rotation::shift(&r.path, r.rotation.keep)?;
        let mut header = r.header.clone();
        self.index += 1;
        if let Some(part) = header.part.as_mut() {
            part.index = self.index;
        }
        self.out = open(&r.path, &header)?;
        self.bytes = 0;
        for record in [&carried.sources, &carried.network].into_iter().flatten() {
            self.write(line, record)?;
        }
        Ok(())
    }
}

/// The file, private and locked, with the header written and flushed. The lock (an
/// exclusive `flock`, held while the file is open) is taken before the file is emptied, so
/// a second podlapse given the same path (two observers on one node in a rollout) is
/// refused without touching the trace the first is writing.
fn open(path: &Path, header: &Header) -> std::io::Result<BufWriter<File>> {
    let file = std::fs::OpenOptions::new()
        .write(true)
        .create(true)
        .truncate(false)
        .mode(0o600)
        .open(path)?;
    match file.try_lock() {
        Ok(()) => {}
        Err(std::fs::TryLockError::WouldBlock) => {
            return Err(std::io::Error::new(
                std::io::ErrorKind::ResourceBusy,
                "another podlapse is writing this trace (it holds the file's lock)",
            ));
        }
        Err(std::fs::TryLockError::Error(e)) => return Err(e),
    }
    file.set_len(0)?;
    // An existing file keeps its mode when emptied.
    file.set_permissions(std::fs::Permissions::from_mode(0o600))?;
    let mut out = BufWriter::with_capacity(BUFFER_BYTES, file);
    write_line(
        &mut out,
        &mut Vec::new(),
        &TraceRecord::Header(header.clone()),
    )?;
    out.flush()?;
    Ok(out)
}

fn write_records(
    out: BufWriter<File>,
    mut rx: mpsc::Receiver<TraceRecord>,
    stats: &WriterStats,
    rotating: Option<Rotating>,
) -> BTreeMap<String, u64> {
    // Every record written, by type, across the files (what `finish` returns); each
    // file's footer holds its own.
    let mut counts: BTreeMap<String, u64> = BTreeMap::new();
    let mut part = Part {
        out,
        index: 0,
        bytes: 0,
        counts: BTreeMap::new(),
        last_ns: 0,
    };
    let mut carried = Carried::default();
    let mut last_sync = Instant::now();
    let fail = |e: std::io::Error, lost: u64| {
        stats.unwritten.fetch_add(lost, Ordering::Relaxed);
        if stats.failure.set(e.to_string()).is_ok() {
            eprintln!(
                "podlapse: trace {}: stopped writing: {e}; the pods keep running, and the records from here on are counted, not written",
                stats.path.display()
            );
        }
    };
    let mut batch = Vec::with_capacity(BATCH);
    let mut line = Vec::new();
    while let Some(first) = rx.blocking_recv() {
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
                // The footer carries the counts of everything written before it, in
                // its file.
                footer.counts = part.counts.clone();
                footer.unwritten_records = stats.unwritten();
                footer.dropped_records = stats.dropped();
                done = true;
            } else {
                *counts.entry(record.type_name().to_string()).or_default() += 1;
                carried.note(&record);
            }
            if stats.failure().is_some() {
                stats.unwritten.fetch_add(1, Ordering::Relaxed);
            } else if let Err(e) = part.write(&mut line, &record) {
                fail(e, in_buffer + 1);
                in_buffer = 0;
            } else {
                in_buffer += 1;
            }
            if done {
                break;
            }
            if let Some(r) = &rotating
                && stats.failure().is_none()
                && part.bytes >= r.rotation.max_bytes
            {
                match part.rotate(r, &carried, &mut line, stats) {
                    Ok(()) => {
                        in_buffer = 0;
                        last_sync = Instant::now();
                    }
                    // What was in the buffer may not have reached the file.
                    Err(e) => fail(e, 0),
                }
            }
        }
        if stats.failure().is_none() {
            let sync = done || last_sync.elapsed() >= SYNC_EVERY;
            if let Err(e) = part.out.flush() {
                fail(e, in_buffer);
            } else if sync && let Err(e) = part.out.get_ref().sync_data() {
                fail(e, 0);
            } else if sync {
                last_sync = Instant::now();
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
        let _ = part.out.flush();
        let _ = part.out.get_ref().sync_data();
    }
    counts
}

/// One record as a line. It is serialized whole before any of it reaches the file, so a
/// record that cannot be serialized leaves no part of itself behind.
fn write_line(
    out: &mut BufWriter<File>,
    line: &mut Vec<u8>,
    record: &TraceRecord,
) -> std::io::Result<usize> {
    line.clear();
    serde_json::to_writer(&mut *line, record).map_err(std::io::Error::other)?;
    line.push(b'\n');
    out.write_all(line)?;
    Ok(line.len())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::cri::{CriCall, CriMethod};

    fn header() -> Header {
        Header {
            schema_version: super::super::SCHEMA_VERSION,
            podlapse_version: "test".into(),
            node: "n".into(),
            kernel: "k".into(),
            runtime_name: "r".into(),
            runtime_version: "1".into(),
            config: super::super::TraceConfig::empty(),
            started_wall_ns: 0,
            started_ns: 1,
            observed: None,
            part: None,
        }
    }

    fn call(i: u64) -> TraceRecord {
        TraceRecord::Cri(
            CriCall::new(CriMethod::Version)
                .with_times(i, i)
                .with_code(crate::cri::GrpcCode::Ok),
        )
    }

    #[tokio::test(flavor = "current_thread")]
    async fn the_file_is_private_and_every_record_is_counted() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("t.jsonl");
        // An existing, world-readable file is made private too.
        std::fs::write(&path, "old").unwrap();
        std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o644)).unwrap();
        let w = TraceWriter::create(&path, header()).unwrap();
        let mode = std::fs::metadata(&path).unwrap().permissions().mode() & 0o777;
        assert_eq!(mode, 0o600);
        let sink = w.sink();
        for i in 0..10 {
            sink.send(call(i));
        }
        let stats = w.stats();
        let counts = w.finish(Footer::default()).await.unwrap();
        assert_eq!(counts["cri"], 10);
        assert_eq!((stats.unwritten(), stats.dropped()), (0, 0));
        let trace = super::super::read_trace(&path).unwrap();
        assert!(trace.is_complete());
        assert_eq!(trace.records.len(), 10);
    }

    #[tokio::test(flavor = "current_thread")]
    async fn a_writer_that_falls_behind_drops_and_counts_but_keeps_the_footer() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("t.jsonl");
        let out = open(&path, &header()).unwrap();
        let (sink, rx) = TraceSink::channel(&path, QUEUE_RECORDS);
        // The writer has not started: the queue fills.
        let sent = QUEUE_RECORDS as u64 + 100;
        for i in 0..sent {
            sink.send(call(i));
        }
        let w = TraceWriter::start(out, rx, sink, None).unwrap();
        let stats = w.stats();
        assert_eq!(stats.dropped(), 100);
        w.finish(Footer::default()).await.unwrap();
        let trace = super::super::read_trace(&path).unwrap();
        let footer = trace.footer.expect("the footer is never dropped");
        assert_eq!(footer.dropped_records, 100);
        assert_eq!(footer.counts["cri"], QUEUE_RECORDS as u64);
        assert_eq!(trace.records.len(), QUEUE_RECORDS);
    }

    #[tokio::test(flavor = "current_thread")]
    async fn records_sent_are_on_disk_before_the_footer() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("t.jsonl");
        let w = TraceWriter::create(&path, header()).unwrap();
        let sink = w.sink();
        sink.send(call(5));
        // Let the writer take the batch and flush it, as it does while the run goes on:
        // it writes on a thread of its own, so this polls the file (bounded).
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(10);
        while std::fs::read_to_string(&path).unwrap().lines().count() < 2
            && std::time::Instant::now() < deadline
        {
            tokio::time::sleep(std::time::Duration::from_millis(10)).await;
        }
        // Read as a killed writer would have left it: complete records, no footer.
        let trace = super::super::read_trace(&path).unwrap();
        assert!(!trace.is_complete());
        assert_eq!(trace.records.len(), 1);
        w.finish(Footer::default()).await.unwrap();
    }

    /// Two writers given one path (two observers on a node during a rollout): the second
    /// is refused, and the first's trace is whole.
    #[tokio::test]
    async fn a_second_writer_of_the_same_trace_is_refused_and_the_first_keeps_it() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("node.jsonl");
        let first = TraceWriter::create(&path, header()).unwrap();
        let before = std::fs::read(&path).unwrap();
        assert!(!before.is_empty());
        let err = TraceWriter::create(&path, header()).err().expect("refused");
        assert_eq!(err.kind(), std::io::ErrorKind::ResourceBusy, "{err}");
        assert!(
            err.to_string()
                .contains("another podlapse is writing this trace")
        );
        assert_eq!(
            std::fs::read(&path).unwrap(),
            before,
            "the first trace was touched"
        );
        first.finish(Footer::default()).await.unwrap();
        let text = std::fs::read_to_string(&path).unwrap();
        assert!(
            text.lines().last().unwrap().contains("\"type\":\"footer\""),
            "{text}"
        );
        // Once the first is done, the path is free again.
        assert!(TraceWriter::create(&path, header()).is_ok());
    }
}
