//! Time for the shell. The core never reads a clock; the shell passes it `now` from here.

use crate::kubelet::runtime_pod::Nanos;

/// Wall-clock nanoseconds since the epoch: the clock the CRI reports container times on.
pub fn wall_now() -> Nanos {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_nanos() as Nanos)
        .unwrap_or(0)
}

/// A `tokio::time::Instant` for a wall-clock deadline.
pub fn instant_at(deadline: Nanos) -> tokio::time::Instant {
    let now = wall_now();
    let ahead = std::time::Duration::from_nanos(deadline.saturating_sub(now).max(0) as u64);
    tokio::time::Instant::now() + ahead
}
