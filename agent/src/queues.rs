//! The sync loop's inbound queues, each bounded as kubelet bounds the channel it stands
//! for. A sender that finds its queue full waits for room (nothing is lost), except the
//! relist's PLEG events, which kubelet discards at a full channel because the relist runs
//! on the loop that drains it: a pod whose event was discarded is synced at its next
//! resync. Both are counted, for `/metrics`.

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};

use tokio::sync::mpsc;
use tokio::sync::mpsc::error::TrySendError;

/// One of the sync loop's queues.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Queue {
    /// Config changes (kubelet's config channel holds 50).
    PodUpdates,
    /// Pod lifecycle events (kubelet's plegChannelCapacity, 1000).
    Pleg,
    /// Probe results (kubelet's results manager holds 20; podlapse's workers also send
    /// each container's initial results from a call that cannot wait, hence more room).
    ProbeResults,
    /// Pod workers reporting a unit of work done: at most one each at a time.
    WorkDone,
}

impl Queue {
    pub const ALL: [Queue; 4] = [
        Queue::PodUpdates,
        Queue::Pleg,
        Queue::ProbeResults,
        Queue::WorkDone,
    ];

    /// How many items the queue holds.
    pub const fn capacity(self) -> usize {
        match self {
            Queue::PodUpdates => 50,
            Queue::Pleg => 1000,
            Queue::ProbeResults => 256,
            Queue::WorkDone => 1024,
        }
    }

    /// The name `/metrics` gives it.
    pub const fn name(self) -> &'static str {
        match self {
            Queue::PodUpdates => "pod_updates",
            Queue::Pleg => "pleg",
            Queue::ProbeResults => "probe_results",
            Queue::WorkDone => "work_done",
        }
    }

    fn index(self) -> usize {
        self as usize
    }
}

/// What hitting each queue's bound cost so far.
#[derive(Debug, Default)]
pub struct QueueStats {
    waits: [AtomicU64; 4],
    pleg_discarded: AtomicU64,
}

impl QueueStats {
    /// Sends that found `queue` full and waited for room.
    pub fn waits(&self, queue: Queue) -> u64 {
        self.waits[queue.index()].load(Ordering::Relaxed)
    }

    /// PLEG events the relist discarded at a full queue.
    pub fn pleg_discarded(&self) -> u64 {
        self.pleg_discarded.load(Ordering::Relaxed)
    }
}

/// The sending end of one bounded queue.
#[derive(Debug)]
pub struct Sender<T> {
    tx: mpsc::Sender<T>,
    queue: Queue,
    stats: Arc<QueueStats>,
}

impl<T> Clone for Sender<T> {
    fn clone(&self) -> Self {
        Sender {
            tx: self.tx.clone(),
            queue: self.queue,
            stats: self.stats.clone(),
        }
    }
}

/// The receiver is gone: the loop has stopped.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
#[error("the sync loop has stopped")]
pub struct Stopped;

impl<T> Sender<T> {
    /// Sends `item`, waiting for room if the queue is full (counted once per send).
    pub async fn send(&self, item: T) -> Result<(), Stopped> {
        match self.tx.try_send(item) {
            Ok(()) => Ok(()),
            Err(TrySendError::Closed(_)) => Err(Stopped),
            Err(TrySendError::Full(item)) => {
                self.count_wait();
                self.tx.send(item).await.map_err(|_| Stopped)
            }
        }
    }

    /// Sends `item` if there is room; a full queue hands it back, counted as a wait the
    /// caller must then make (with [`Sender::send_counted`]) outside whatever it holds.
    pub fn try_send(&self, item: T) -> Result<(), Full<T>> {
        match self.tx.try_send(item) {
            Ok(()) => Ok(()),
            // A stopped loop wants nothing more.
            Err(TrySendError::Closed(_)) => Ok(()),
            Err(TrySendError::Full(item)) => {
                self.count_wait();
                Err(Full(item))
            }
        }
    }

    /// Sends an item [`Sender::try_send`] handed back, waiting for room.
    pub async fn send_counted(&self, Full(item): Full<T>) -> Result<(), Stopped> {
        self.tx.send(item).await.map_err(|_| Stopped)
    }

    /// Sends `item` if there is room, else discards it and counts it (the PLEG relist).
    pub fn send_or_discard(&self, item: T) -> bool {
        match self.tx.try_send(item) {
            Ok(()) => true,
            Err(TrySendError::Closed(_)) => false,
            Err(TrySendError::Full(_)) => {
                self.stats.pleg_discarded.fetch_add(1, Ordering::Relaxed);
                false
            }
        }
    }

    fn count_wait(&self) {
        self.stats.waits[self.queue.index()].fetch_add(1, Ordering::Relaxed);
    }
}

/// An item a full queue handed back.
#[derive(Debug)]
pub struct Full<T>(pub T);

/// A bounded queue of `queue`'s capacity whose bound hits are counted in `stats`.
pub fn channel<T>(queue: Queue, stats: &Arc<QueueStats>) -> (Sender<T>, mpsc::Receiver<T>) {
    let (tx, rx) = mpsc::channel(queue.capacity());
    (
        Sender {
            tx,
            queue,
            stats: stats.clone(),
        },
        rx,
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn a_full_queue_makes_senders_wait_and_counts_them() {
        let stats = Arc::new(QueueStats::default());
        let (tx, mut rx) = channel::<usize>(Queue::ProbeResults, &stats);
        let cap = Queue::ProbeResults.capacity();
        for i in 0..cap {
            tx.send(i).await.unwrap();
        }
        assert_eq!(stats.waits(Queue::ProbeResults), 0);
        let late = tokio::spawn({
            let tx = tx.clone();
            async move { tx.send(cap).await }
        });
        // The late send runs, finds the queue full and waits until an item is taken.
        tokio::task::yield_now().await;
        assert!(!late.is_finished());
        assert_eq!(stats.waits(Queue::ProbeResults), 1);
        let Full(back) = tx.try_send(cap + 1).unwrap_err();
        assert_eq!(back, cap + 1);
        assert_eq!(rx.recv().await, Some(0));
        late.await.unwrap().unwrap();
        let got: Vec<usize> = std::iter::from_fn(|| rx.try_recv().ok()).collect();
        assert_eq!(got, (1..=cap).collect::<Vec<_>>(), "nothing lost, in order");
        assert_eq!(stats.waits(Queue::ProbeResults), 2);
        assert_eq!(stats.waits(Queue::WorkDone), 0);
    }

    #[tokio::test]
    async fn the_relist_discards_at_a_full_queue_and_counts_what_it_discarded() {
        let stats = Arc::new(QueueStats::default());
        let (tx, mut rx) = channel::<usize>(Queue::Pleg, &stats);
        let cap = Queue::Pleg.capacity();
        let sent = (0..cap + 5).filter(|i| tx.send_or_discard(*i)).count();
        assert_eq!(sent, cap);
        assert_eq!(stats.pleg_discarded(), 5);
        assert_eq!(rx.recv().await, Some(0));
        drop(rx);
        assert!(!tx.send_or_discard(0));
        assert_eq!(tx.send(0).await, Err(Stopped));
        assert_eq!(
            stats.pleg_discarded(),
            5,
            "a stopped loop is not a full queue"
        );
    }
}
