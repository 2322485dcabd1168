//! The ring-buffer reader: waits on the map's fd with tokio, decodes every record and
//! hands it to the channel. A full channel makes the reader wait, the ring buffer then
//! fills, and the probes count what they could not reserve: slowness shows up as
//! counted losses, never as silently missing events.

use aya::maps::{MapData, RingBuf};
use podtrace_ebpf_common::names;
use tokio::io::Interest;
use tokio::io::unix::AsyncFd;
use tokio::sync::{mpsc, oneshot};

use super::error::EbpfError;
use super::event::{KernelEvent, decode};

#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct ReaderStats {
    pub events: u64,
    pub undecodable: u64,
}

/// Reads until `stop` fires (then drains what is left) or the receiver is dropped.
pub async fn read_events(
    ring: RingBuf<MapData>,
    tx: mpsc::Sender<KernelEvent>,
    mut stop: oneshot::Receiver<()>,
) -> Result<ReaderStats, EbpfError> {
    let ring_err = |source| EbpfError::RingBufRead {
        map: names::EVENTS,
        source,
    };
    // SAFETY: the ring buffer owns its map fd and never replaces it; the fd stays open
    // until the AsyncFd (which owns the ring buffer) is dropped.
    let mut fd = unsafe { AsyncFd::register_with_interest(ring, Interest::READABLE) }
        .map_err(|e| ring_err(e.into()))?;
    let mut stats = ReaderStats::default();
    loop {
        tokio::select! {
            biased;
            _ = &mut stop => {
                drain(fd.get_mut(), &tx, &mut stats).await;
                return Ok(stats);
            }
            guard = fd.readable_mut() => {
                let mut guard = guard.map_err(ring_err)?;
                if !drain(guard.get_inner_mut(), &tx, &mut stats).await {
                    return Ok(stats);
                }
                guard.clear_ready();
            }
        }
    }
}

/// Hands every record the ring buffer holds to `tx`; false when the receiver is gone.
async fn drain(
    ring: &mut RingBuf<MapData>,
    tx: &mpsc::Sender<KernelEvent>,
    stats: &mut ReaderStats,
) -> bool {
    loop {
        // The item is dropped (its space returned to the kernel) before the send waits.
        let decoded = match ring.next() {
            None => return true,
            Some(item) => decode(&item),
        };
        match decoded {
            Ok(event) => {
                stats.events += 1;
                if tx.send(event).await.is_err() {
                    return false;
                }
            }
            Err(e) => {
                if stats.undecodable == 0 {
                    tracing::warn!(
                        "a kernel event did not decode ({e}); is the probes object from another podtrace build?"
                    );
                }
                stats.undecodable += 1;
            }
        }
    }
}
