//! The ring-buffer reader: drains the ring every `POLL_PERIOD` (every `HURRY_PERIOD` while
//! its [`ReadPace`] says to hurry) and whenever the map's fd turns readable (tokio's
//! `AsyncFd`), decodes every record and hands the events to
//! the consumer a batch at a time. The probes submit without waking the reader and force
//! a wakeup only when the unread data passes another eighth of the ring, so in steady
//! state the timer does the reading and no record waits longer than one period. A
//! consumer that falls behind makes the reader wait, the ring buffer then fills, and the
//! probes count what they could not reserve: slowness shows up as counted losses, never
//! as silently missing events.

use std::os::fd::AsRawFd;
use std::sync::Arc;

use aya::maps::{MapData, RingBuf};
use podlapse_ebpf_common::names;
use tokio::io::Interest;
use tokio::io::unix::AsyncFd;
use tokio::sync::mpsc::error::TryRecvError;
use tokio::sync::{Semaphore, mpsc, oneshot};
use tokio::time::Instant;

use super::cni_output_gate::CniOutputGate;
use super::error::EbpfError;
use super::event::{DecodeError, KernelEvent, decode};
use super::pace::ReadPace;

#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct ReaderStats {
    pub events: u64,
    pub undecodable: u64,
}

/// Where the reader takes records from: the probes' ring buffer (a stand-in in tests).
pub trait Records: AsRawFd {
    /// Decodes the next record, if one is committed; its space goes back to the kernel
    /// before this returns.
    fn next_record(&mut self) -> Option<Result<KernelEvent, DecodeError>>;
}

impl Records for RingBuf<MapData> {
    fn next_record(&mut self) -> Option<Result<KernelEvent, DecodeError>> {
        self.next().map(|item| decode(&item))
    }
}

/// The most events handed over at once. A batch is one message, so the consumer (on
/// another thread) is woken once per drain rather than once per event: sent one by one,
/// each event's wakeup preempted the reader and the two threads took turns, several
/// context switches per drain.
const BATCH: usize = 256;

/// The reader's end of the channel to the consumer.
pub struct EventSender {
    tx: mpsc::UnboundedSender<Vec<KernelEvent>>,
    /// One permit per event the consumer may still be sent: what bounds the channel.
    room: Arc<Semaphore>,
    batch: usize,
}

impl EventSender {
    /// Waits until the consumer has room for `batch`, then hands it over; false when the
    /// receiver is gone.
    async fn send(&self, batch: Vec<KernelEvent>) -> bool {
        let Ok(n) = u32::try_from(batch.len()) else {
            return false;
        };
        match self.room.acquire_many(n).await {
            // The receiver gives the permits back as it takes the events out.
            Ok(permits) => permits.forget(),
            Err(_) => return false,
        }
        self.tx.send(batch).is_ok()
    }
}

impl EventSender {
    /// A way for the agent to put records of its own into the stream (the write hook's
    /// attaches and detaches), beside the probes' events.
    pub fn injector(&self) -> EventInjector {
        EventInjector {
            tx: self.tx.downgrade(),
            room: self.room.clone(),
        }
    }
}

/// Puts the agent's own records into the event stream: a few per burst of pod work. It
/// does not keep the stream open: once the reader has ended, the consumer sees the end
/// and injected records go nowhere.
#[derive(Clone)]
pub struct EventInjector {
    tx: mpsc::WeakUnboundedSender<Vec<KernelEvent>>,
    room: Arc<Semaphore>,
}

impl EventInjector {
    /// Sends `event` without waiting: taken from the channel's room when there is some,
    /// else sent beyond it (the receiver then gives back one permit more than was taken,
    /// a channel one event larger per such record, rather than losing the record).
    pub fn inject(&self, event: KernelEvent) {
        let Some(tx) = self.tx.upgrade() else { return };
        if let Ok(permit) = self.room.try_acquire() {
            permit.forget();
        }
        let _ = tx.send(vec![event]);
    }
}

/// The consumer's end: kernel events one at a time, in ring-buffer order.
pub struct EventReceiver {
    rx: mpsc::UnboundedReceiver<Vec<KernelEvent>>,
    room: Arc<Semaphore>,
    batch: std::vec::IntoIter<KernelEvent>,
    /// Events taken out of the current batch whose room is not given back yet: it goes
    /// back a batch at a time (one semaphore release, which takes a lock, per batch
    /// rather than per event).
    taken: usize,
}

impl EventReceiver {
    /// The next event, waiting for one; `None` once the reader has ended and every event
    /// it read was received. Cancel-safe, like [`mpsc::Receiver::recv`].
    pub async fn recv(&mut self) -> Option<KernelEvent> {
        loop {
            if let Some(event) = self.next_received() {
                return Some(event);
            }
            self.batch = self.rx.recv().await?.into_iter();
        }
    }

    /// The next event if one has arrived.
    pub fn try_recv(&mut self) -> Result<KernelEvent, TryRecvError> {
        loop {
            if let Some(event) = self.next_received() {
                return Ok(event);
            }
            self.batch = self.rx.try_recv()?.into_iter();
        }
    }

    fn next_received(&mut self) -> Option<KernelEvent> {
        let event = self.batch.next();
        if event.is_some() {
            self.taken += 1;
        }
        if self.batch.len() == 0 && self.taken > 0 {
            self.room.add_permits(std::mem::take(&mut self.taken));
        }
        event
    }
}

impl Drop for EventReceiver {
    fn drop(&mut self) {
        // A reader waiting for room gives up.
        self.room.close();
    }
}

/// A channel that holds at most `capacity` events the consumer has not taken (the
/// reader holds at most one more batch while it waits for room).
pub fn channel(capacity: usize) -> (EventSender, EventReceiver) {
    let capacity = capacity.clamp(1, Semaphore::MAX_PERMITS);
    let (tx, rx) = mpsc::unbounded_channel();
    let room = Arc::new(Semaphore::new(capacity));
    (
        EventSender {
            tx,
            room: room.clone(),
            batch: capacity.min(BATCH),
        },
        EventReceiver {
            rx,
            room,
            batch: Vec::new().into_iter(),
            taken: 0,
        },
    )
}

/// Reads until `stop` fires (then drains what is left) or the receiver is dropped, at
/// the pace `pace` sets.
pub async fn read_events<R: Records>(
    ring: R,
    tx: EventSender,
    mut stop: oneshot::Receiver<()>,
    pace: ReadPace,
    gate: Option<CniOutputGate>,
) -> Result<ReaderStats, EbpfError> {
    let ring_err = |source| EbpfError::RingBufRead {
        map: names::EVENTS,
        source,
    };
    // SAFETY: the ring buffer owns its map fd and never replaces it; the fd stays open
    // until the AsyncFd (which owns the ring buffer) is dropped.
    let mut fd = unsafe { AsyncFd::register_with_interest(ring, Interest::READABLE) }
        .map_err(|e| ring_err(e.into()))?;
    // The first drain is at once; each next one a period after the last ended, so a
    // drain that took long (a full channel) is not followed by a burst of catch-up ones.
    let mut next = Instant::now();
    let mut stats = ReaderStats::default();
    // Drains in a row that found nothing: the period backs off while the ring is idle.
    let mut empty = 0u32;
    loop {
        let read_before = stats.events + stats.undecodable;
        tokio::select! {
            biased;
            _ = &mut stop => {
                drain(fd.get_mut(), &tx, &mut stats, gate.as_ref()).await;
                return Ok(stats);
            }
            guard = fd.readable_mut() => {
                let mut guard = guard.map_err(ring_err)?;
                if !drain(guard.get_inner_mut(), &tx, &mut stats, gate.as_ref()).await {
                    return Ok(stats);
                }
                // A wakeup that came during the drain keeps the fd ready.
                guard.clear_ready();
                empty = idle_count(empty, read_before, &stats);
                next = Instant::now() + pace.period_after(empty);
            }
            _ = pace.hurried() => {
                next = next.min(Instant::now() + pace.period());
            }
            _ = tokio::time::sleep_until(next) => {
                if !drain(fd.get_mut(), &tx, &mut stats, gate.as_ref()).await {
                    return Ok(stats);
                }
                empty = idle_count(empty, read_before, &stats);
                next = Instant::now() + pace.period_after(empty);
            }
        }
    }
}

/// Empty drains in a row after one that read `stats` from `read_before` records.
fn idle_count(empty: u32, read_before: u64, stats: &ReaderStats) -> u32 {
    if stats.events + stats.undecodable == read_before {
        empty.saturating_add(1)
    } else {
        0
    }
}

/// Hands every record the ring buffer holds to `tx`; false when the receiver is gone. A
/// plugin exec or a new network namespace attaches the write hook at once, before the
/// batch goes out: the plugin writes its result at the end of its run.
async fn drain<R: Records>(
    ring: &mut R,
    tx: &EventSender,
    stats: &mut ReaderStats,
    gate: Option<&CniOutputGate>,
) -> bool {
    loop {
        // Decoded first, then sent: each record's space goes back to the kernel at once.
        let mut batch = Vec::new();
        while batch.len() < tx.batch {
            match ring.next_record() {
                None => break,
                Some(Ok(event)) => {
                    if let Some(gate) = gate
                        && let Some(why) = CniOutputGate::wanted_for(&event)
                    {
                        gate.poke(&why);
                    }
                    batch.push(event);
                }
                Some(Err(e)) => {
                    if stats.undecodable == 0 {
                        tracing::warn!(
                            "a kernel event did not decode ({e}); is the probes object from another podlapse build?"
                        );
                    }
                    stats.undecodable += 1;
                }
            }
        }
        if batch.is_empty() {
            return true;
        }
        let n = batch.len() as u64;
        if !tx.send(batch).await {
            return false;
        }
        stats.events += n;
    }
}

#[cfg(test)]
mod tests {
    use std::collections::VecDeque;
    use std::io::Write;
    use std::os::fd::RawFd;
    use std::os::unix::net::UnixStream;
    use std::sync::{Arc, Mutex};

    use podlapse_ebpf_common::{COMM_LEN, EventHeader, EventKind, ExitEvent};
    use std::time::Duration;

    use tokio::time::Instant;

    use super::super::pace::{HURRY_PERIOD, IDLE_PERIOD, POLL_PERIOD};
    use super::*;

    /// Records pushed by the test; its fd turns readable only when the test writes to
    /// the other end of the socket pair, as the ring's fd does only when the kernel
    /// wakes its reader.
    struct FakeRing {
        socket: UnixStream,
        records: Arc<Mutex<VecDeque<Vec<u8>>>>,
    }

    impl AsRawFd for FakeRing {
        fn as_raw_fd(&self) -> RawFd {
            self.socket.as_raw_fd()
        }
    }

    impl Records for FakeRing {
        fn next_record(&mut self) -> Option<Result<KernelEvent, DecodeError>> {
            let bytes = self.records.lock().unwrap().pop_front()?;
            Some(decode(&bytes))
        }
    }

    fn exit_record(pid: u32) -> Vec<u8> {
        let ev = ExitEvent {
            header: EventHeader {
                kind: EventKind::Exit as u32,
                cpu: 0,
                pid,
                tgid: pid,
                ktime_ns: 1_000,
                cgroup_id: 1,
                comm: [0; COMM_LEN],
            },
            exit_code: 0,
            _pad: 0,
        };
        // SAFETY: ExitEvent is #[repr(C)] with explicit padding (the layout crate
        // asserts its size), so all its bytes are initialised.
        unsafe { std::slice::from_raw_parts((&raw const ev).cast::<u8>(), size_of::<ExitEvent>()) }
            .to_vec()
    }

    struct Running {
        records: Arc<Mutex<VecDeque<Vec<u8>>>>,
        wake: UnixStream,
        rx: EventReceiver,
        stop: oneshot::Sender<()>,
        reader: tokio::task::JoinHandle<Result<ReaderStats, EbpfError>>,
        pace: ReadPace,
    }

    fn start() -> Running {
        start_with(16)
    }

    fn start_with(capacity: usize) -> Running {
        let (socket, wake) = UnixStream::pair().unwrap();
        socket.set_nonblocking(true).unwrap();
        let records = Arc::new(Mutex::new(VecDeque::new()));
        let ring = FakeRing {
            socket,
            records: records.clone(),
        };
        let (tx, rx) = channel(capacity);
        let (stop, stop_rx) = oneshot::channel();
        let pace = ReadPace::new();
        let reader = tokio::spawn(read_events(ring, tx, stop_rx, pace.clone(), None));
        Running {
            records,
            wake,
            rx,
            stop,
            reader,
            pace,
        }
    }

    fn pid(e: &KernelEvent) -> u32 {
        e.meta().pid
    }

    #[tokio::test]
    async fn injected_records_arrive_and_do_not_keep_the_stream_open() {
        let (tx, mut rx) = channel(4);
        let inject = tx.injector();
        let record = decode(&exit_record(7)).unwrap();
        inject.inject(record.clone());
        assert_eq!(rx.recv().await, Some(record.clone()));
        // The reader's sender gone, the stream ends though an injector is still held.
        drop(tx);
        assert_eq!(rx.recv().await, None);
        inject.inject(record);
    }

    #[tokio::test(start_paused = true)]
    async fn records_are_read_without_a_wakeup_within_a_poll_period_while_they_flow() {
        let mut r = start();
        // Let the reader start and take its first (immediate) tick.
        tokio::time::sleep(Duration::from_millis(1)).await;
        for round in 0..3u32 {
            let pushed = Instant::now();
            r.records
                .lock()
                .unwrap()
                .push_back(exit_record(100 + round));
            let e = tokio::time::timeout(2 * IDLE_PERIOD, r.rx.recv())
                .await
                .expect("a record pushed without a wakeup was never read")
                .unwrap();
            assert_eq!(pid(&e), 100 + round);
            // The first after an empty drain waits out a longer period; the next ones,
            // each after a drain that found one, a poll period at most.
            let bound = if round == 0 { IDLE_PERIOD } else { POLL_PERIOD };
            assert!(pushed.elapsed() <= bound, "{round}: {:?}", pushed.elapsed());
            // Read on a tick, not as soon as it was pushed.
            assert!(pushed.elapsed() > Duration::ZERO, "{:?}", pushed.elapsed());
        }
        // Idle for a second: the period has backed off, and stays bounded.
        tokio::time::sleep(Duration::from_secs(1)).await;
        let pushed = Instant::now();
        r.records.lock().unwrap().push_back(exit_record(200));
        r.rx.recv().await.unwrap();
        let waited = pushed.elapsed();
        assert!(waited <= IDLE_PERIOD && waited > POLL_PERIOD, "{waited:?}");
        r.stop.send(()).unwrap();
        let stats = r.reader.await.unwrap().unwrap();
        assert_eq!(stats.events, 4);
    }

    #[tokio::test(start_paused = true)]
    async fn a_hurried_reader_drains_every_hurry_period_until_relaxed() {
        let mut r = start();
        tokio::time::sleep(Duration::from_millis(1)).await;
        // Asked mid-period: the reader does not sleep out the rest of its 10 ms.
        tokio::time::sleep(Duration::from_millis(2)).await;
        r.pace.hurry_for(Duration::from_secs(1));
        for round in 0..3u32 {
            let pushed = Instant::now();
            r.records.lock().unwrap().push_back(exit_record(7 + round));
            let e = tokio::time::timeout(POLL_PERIOD, r.rx.recv())
                .await
                .unwrap()
                .unwrap();
            assert_eq!(pid(&e), 7 + round);
            assert!(pushed.elapsed() <= HURRY_PERIOD, "{:?}", pushed.elapsed());
            tokio::time::sleep(Duration::from_micros(300)).await;
        }
        r.pace.relax();
        // The drain already scheduled runs, then the period is back to POLL_PERIOD.
        tokio::time::sleep(2 * HURRY_PERIOD).await;
        let pushed = Instant::now();
        r.records.lock().unwrap().push_back(exit_record(99));
        r.rx.recv().await.unwrap();
        assert!(pushed.elapsed() > HURRY_PERIOD, "{:?}", pushed.elapsed());
        r.stop.send(()).unwrap();
        assert_eq!(r.reader.await.unwrap().unwrap().events, 4);
    }

    #[tokio::test(start_paused = true)]
    async fn more_records_than_a_batch_and_the_channel_hold_are_all_read_in_order() {
        let mut r = start();
        tokio::time::sleep(Duration::from_millis(1)).await;
        let n = 2 * BATCH as u32 + 5;
        let pushed = Instant::now();
        r.records
            .lock()
            .unwrap()
            .extend((0..n).map(|i| exit_record(1000 + i)));
        let mut got = Vec::new();
        while got.len() < n as usize {
            let e = tokio::time::timeout(2 * POLL_PERIOD, r.rx.recv())
                .await
                .expect("records were left in the ring")
                .unwrap();
            got.push(pid(&e));
        }
        assert_eq!(got, (1000..1000 + n).collect::<Vec<_>>());
        // One drain takes them all, batch after batch: the one after the first, empty,
        // drain.
        assert!(
            pushed.elapsed() <= 2 * POLL_PERIOD,
            "{:?}",
            pushed.elapsed()
        );
        r.stop.send(()).unwrap();
        assert_eq!(r.reader.await.unwrap().unwrap().events, u64::from(n));
    }

    #[tokio::test(start_paused = true)]
    async fn a_wakeup_is_read_at_once_and_stopping_drains_the_rest() {
        let mut r = start();
        tokio::time::sleep(Duration::from_millis(1)).await;
        r.records
            .lock()
            .unwrap()
            .extend([exit_record(1), exit_record(2)]);
        let pushed = Instant::now();
        r.wake.write_all(b"x").unwrap();
        for want in [1, 2] {
            let e = tokio::time::timeout(POLL_PERIOD, r.rx.recv())
                .await
                .unwrap()
                .unwrap();
            assert_eq!(pid(&e), want);
        }
        assert_eq!(pushed.elapsed(), Duration::ZERO);

        // Stopping reads what is left before the next tick would have.
        r.records
            .lock()
            .unwrap()
            .extend([exit_record(3), vec![0; 8], exit_record(4)]);
        r.stop.send(()).unwrap();
        let stats = r.reader.await.unwrap().unwrap();
        let rest: Vec<u32> = std::iter::from_fn(|| r.rx.try_recv().ok())
            .map(|e| pid(&e))
            .collect();
        assert_eq!(rest, [3, 4]);
        assert_eq!((stats.events, stats.undecodable), (4, 1));
    }

    #[tokio::test(start_paused = true)]
    async fn the_reader_takes_no_more_than_the_channel_holds_and_one_batch() {
        let mut r = start_with(4);
        tokio::time::sleep(Duration::from_millis(1)).await;
        r.records
            .lock()
            .unwrap()
            .extend((0..10).map(|i| exit_record(10 + i)));
        // Nobody receives: four events wait in the channel, the reader holds four more
        // while it waits for room, and the rest stay in the ring for the kernel to count
        // losses against.
        tokio::time::sleep(5 * POLL_PERIOD).await;
        assert_eq!(r.records.lock().unwrap().len(), 2);
        let mut got = Vec::new();
        while got.len() < 10 {
            let e = tokio::time::timeout(2 * POLL_PERIOD, r.rx.recv())
                .await
                .expect("an event was held back")
                .unwrap();
            got.push(pid(&e));
        }
        assert_eq!(got, (10..20).collect::<Vec<_>>());
        assert!(matches!(r.rx.try_recv(), Err(TryRecvError::Empty)));
        r.stop.send(()).unwrap();
        assert_eq!(r.reader.await.unwrap().unwrap().events, 10);
        assert!(matches!(r.rx.try_recv(), Err(TryRecvError::Disconnected)));
    }

    #[tokio::test(start_paused = true)]
    async fn a_reader_waiting_for_room_ends_when_the_receiver_is_dropped() {
        let r = start_with(2);
        r.records
            .lock()
            .unwrap()
            .extend((0..6).map(|i| exit_record(i + 1)));
        tokio::time::sleep(3 * POLL_PERIOD).await;
        drop(r.rx);
        let stats = tokio::time::timeout(POLL_PERIOD, r.reader)
            .await
            .expect("the reader kept waiting for room")
            .unwrap()
            .unwrap();
        // Only what the receiver could have had counts as handed over.
        assert_eq!(stats.events, 2);
    }
}
