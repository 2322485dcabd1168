//! How often the reader drains the ring. At rest it drains every [`POLL_PERIOD`]; while
//! the agent waits for an event it needs at once (a container's first exec, which shows
//! the container running) it is told to hurry and drains every [`HURRY_PERIOD`] until
//! told to relax, or for at most the time it was asked to hurry.
//!
//! Hurrying costs one timer wakeup a millisecond, and only while a start is under way;
//! the probes are not involved, so nothing changes in the kernel's cost per event.

use std::sync::{Arc, Mutex};
use std::time::Duration;

use tokio::sync::Notify;
use tokio::time::Instant;

/// How often the reader drains the ring without being woken. Delivery waits at most
/// this long; no event's time changes (it is taken in the kernel). 100 drains a second
/// cost an idle reader under 1% of one CPU (measured in a VM, where a timer wakeup is
/// dearest; a shorter period costs proportionally more), and with the default ring it
/// takes a sustained 6 MB/s of events (over 15,000 execs a second) to reach the first
/// wakeup mark between two drains.
pub const POLL_PERIOD: Duration = Duration::from_millis(10);

/// The period while hurrying: tokio's timer resolution.
pub const HURRY_PERIOD: Duration = Duration::from_millis(1);

/// The longest period, an idle reader's: each drain that finds the ring empty doubles the
/// period up to this; the first that finds events brings it back to [`POLL_PERIOD`]. A
/// node between pods sends nothing the reader must see soon (the probes wake it for the
/// execs and exits of pod work, and at each eighth of the ring), so an idle reader wakes
/// 12 times a second rather than 100.
pub const IDLE_PERIOD: Duration = Duration::from_millis(80);

/// [`IDLE_PERIOD`] as a multiple of [`POLL_PERIOD`], which holds for any period.
const IDLE_BACKOFF: u32 = (IDLE_PERIOD.as_millis() / POLL_PERIOD.as_millis()) as u32;

/// Shared between the reader and whoever waits for events; cloning shares it.
#[derive(Clone, Default)]
pub struct ReadPace {
    inner: Arc<Inner>,
}

struct Inner {
    hurry_until: Mutex<Option<Instant>>,
    changed: Notify,
    /// The period while events flow; an idle reader backs off to
    /// [`IDLE_PERIOD`]` / `[`POLL_PERIOD`] times it.
    period: Duration,
}

impl Default for Inner {
    fn default() -> Inner {
        Inner {
            hurry_until: Mutex::new(None),
            changed: Notify::new(),
            period: POLL_PERIOD,
        }
    }
}

impl ReadPace {
    pub fn new() -> ReadPace {
        ReadPace::default()
    }

    /// Drains every `period` (at least [`HURRY_PERIOD`]) while events flow instead of
    /// [`POLL_PERIOD`]: for a consumer that acts on nothing at once, fewer wakeups.
    pub fn with_period(period: Duration) -> ReadPace {
        ReadPace {
            inner: Arc::new(Inner {
                period: period.max(HURRY_PERIOD),
                ..Inner::default()
            }),
        }
    }

    /// Drain every [`HURRY_PERIOD`] for the next `limit` (or until [`ReadPace::relax`]).
    pub fn hurry_for(&self, limit: Duration) {
        let until = Instant::now() + limit;
        {
            let mut h = self.lock();
            *h = Some(h.map_or(until, |u| u.max(until)));
        }
        // The reader may be sleeping out a whole POLL_PERIOD: shorten it now.
        self.inner.changed.notify_one();
    }

    /// Back to [`POLL_PERIOD`]: what the hurry was for has arrived.
    pub fn relax(&self) {
        *self.lock() = None;
    }

    /// The period to wait before the next drain.
    pub fn period(&self) -> Duration {
        self.period_after(0)
    }

    /// The period to wait after `empty` drains in a row found nothing.
    pub fn period_after(&self, empty: u32) -> Duration {
        match *self.lock() {
            Some(until) if until > Instant::now() => HURRY_PERIOD,
            _ => {
                let idle = self.inner.period.saturating_mul(IDLE_BACKOFF);
                self.inner
                    .period
                    .saturating_mul(1 << empty.min(16))
                    .min(idle)
            }
        }
    }

    /// Resolves when someone asked to hurry since the last call.
    pub async fn hurried(&self) {
        self.inner.changed.notified().await;
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Option<Instant>> {
        self.inner
            .hurry_until
            .lock()
            .unwrap_or_else(|e| e.into_inner())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test(start_paused = true)]
    async fn hurrying_lasts_until_relaxed_or_its_limit() {
        let pace = ReadPace::new();
        assert_eq!(pace.period(), POLL_PERIOD);
        pace.hurry_for(Duration::from_millis(50));
        assert_eq!(pace.period(), HURRY_PERIOD);
        // A shorter request does not cut a longer one short.
        pace.hurry_for(Duration::from_millis(5));
        tokio::time::sleep(Duration::from_millis(20)).await;
        assert_eq!(pace.period(), HURRY_PERIOD);
        tokio::time::sleep(Duration::from_millis(31)).await;
        assert_eq!(pace.period(), POLL_PERIOD, "the limit passed");
        pace.hurry_for(Duration::from_secs(1));
        pace.relax();
        assert_eq!(pace.period(), POLL_PERIOD);
    }

    #[tokio::test(start_paused = true)]
    async fn empty_drains_back_off_to_a_bound_but_never_while_hurrying() {
        let pace = ReadPace::new();
        let ms = |empty| pace.period_after(empty).as_millis();
        assert_eq!(
            [ms(0), ms(1), ms(2), ms(3), ms(4), ms(1000)],
            [10, 20, 40, 80, 80, 80]
        );
        pace.hurry_for(Duration::from_millis(50));
        assert_eq!(pace.period_after(1000), HURRY_PERIOD);
    }

    #[tokio::test(start_paused = true)]
    async fn a_longer_period_backs_off_in_the_same_proportion() {
        let pace = ReadPace::with_period(Duration::from_millis(100));
        let ms = |empty| pace.period_after(empty).as_millis();
        assert_eq!([ms(0), ms(1), ms(3), ms(1000)], [100, 200, 800, 800]);
        pace.hurry_for(Duration::from_millis(50));
        assert_eq!(pace.period(), HURRY_PERIOD, "hurrying still wins");
    }
}
