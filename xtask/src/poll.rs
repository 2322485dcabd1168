//! Bounded polling: check a condition every so often until it holds, and give up once a
//! bound has passed. The workflows wait this way for daemons to answer, processes to exit
//! and the agent to reach a state; one loop here instead of one per wait keeps the order
//! of probe, bound and sleep the same everywhere, and a timeout names what was waited for.

use std::convert::Infallible;
use std::time::{Duration, Instant};

/// A wait for `what`: a probe every `every`, for at most `bound` from `start`.
#[derive(Debug, Clone)]
pub struct Poll {
    what: String,
    bound: Duration,
    every: Duration,
    start: Instant,
}

/// The condition a [`Poll`] waited for did not hold within its bound.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("timed out after {bound:?} waiting for {what}")]
pub struct TimedOut {
    /// What was waited for, as the [`Poll`] was told.
    pub what: String,
    /// How long was waited.
    pub bound: Duration,
}

impl Poll {
    /// A wait for `what` (said in a timeout: "the pods' removal") of at most `bound`,
    /// counted from now, probing every `every`.
    pub fn new(what: impl Into<String>, bound: Duration, every: Duration) -> Poll {
        Poll {
            what: what.into(),
            bound,
            every,
            start: Instant::now(),
        }
    }

    /// The same wait with its bound counted from `start`, for a wait that began before
    /// the poll was made (a daemon spawned earlier, say).
    pub fn since(mut self, start: Instant) -> Poll {
        self.start = start;
        self
    }

    /// Time since the wait's start.
    pub fn elapsed(&self) -> Duration {
        self.start.elapsed()
    }

    /// Probes until `probe` gives a value; `Ok(None)` once the bound has passed without
    /// one. Each round probes first, then gives up if the bound has passed, else sleeps
    /// `every`: the condition is always checked at least once, and once more after the
    /// last sleep. An error from `probe` ends the wait at once.
    pub fn within<T, E>(
        &self,
        mut probe: impl FnMut() -> Result<Option<T>, E>,
    ) -> Result<Option<T>, E> {
        loop {
            if let Some(value) = probe()? {
                return Ok(Some(value));
            }
            if self.start.elapsed() >= self.bound {
                return Ok(None);
            }
            std::thread::sleep(self.every);
        }
    }

    /// As [`Poll::within`], with a [`TimedOut`] naming what was waited for once the bound
    /// has passed.
    pub fn until<T, E: From<TimedOut>>(
        &self,
        probe: impl FnMut() -> Result<Option<T>, E>,
    ) -> Result<T, E> {
        self.within(probe)?.ok_or_else(|| E::from(self.timed_out()))
    }

    /// As [`Poll::within`] for a condition that cannot fail: whether it held in time.
    pub fn holds(&self, mut condition: impl FnMut() -> bool) -> bool {
        let held = self.within(|| Ok::<_, Infallible>(condition().then_some(())));
        matches!(held, Ok(Some(())))
    }

    /// The error for this wait's bound having passed.
    pub fn timed_out(&self) -> TimedOut {
        TimedOut {
            what: self.what.clone(),
            bound: self.bound,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const TICK: Duration = Duration::from_millis(1);

    #[test]
    fn a_condition_that_holds_at_once_is_probed_once() {
        let mut probes = 0;
        let got = Poll::new("x", Duration::ZERO, TICK).within(|| {
            probes += 1;
            Ok::<_, Infallible>(Some(7))
        });
        assert_eq!(got, Ok(Some(7)));
        assert_eq!(probes, 1);
    }

    #[test]
    fn a_zero_bound_still_probes_once() {
        let mut probes = 0;
        let held = Poll::new("x", Duration::ZERO, TICK).holds(|| {
            probes += 1;
            false
        });
        assert!(!held);
        assert_eq!(probes, 1);
    }

    #[test]
    fn the_value_comes_from_the_first_probe_that_gives_one() {
        let mut probes = 0;
        let got = Poll::new("x", Duration::from_secs(10), TICK).within(|| {
            probes += 1;
            Ok::<_, Infallible>((probes == 3).then_some(probes))
        });
        assert_eq!(got, Ok(Some(3)));
    }

    #[test]
    fn a_timeout_names_what_was_waited_for_and_the_bound() {
        let e: TimedOut = Poll::new("the pods' removal", Duration::from_millis(5), TICK)
            .until(|| Ok::<Option<()>, TimedOut>(None))
            .unwrap_err();
        assert_eq!(
            e.to_string(),
            "timed out after 5ms waiting for the pods' removal"
        );
        let e: anyhow::Error = Poll::new("the agent", Duration::ZERO, TICK)
            .until(|| Ok::<Option<()>, anyhow::Error>(None))
            .unwrap_err();
        assert_eq!(e.to_string(), "timed out after 0ns waiting for the agent");
    }

    #[test]
    fn a_probe_error_ends_the_wait_at_once() {
        let mut probes = 0;
        let got: Result<Option<()>, &str> =
            Poll::new("x", Duration::from_secs(10), TICK).within(|| {
                probes += 1;
                Err("broken")
            });
        assert_eq!(got, Err("broken"));
        assert_eq!(probes, 1);
    }

    #[test]
    fn the_bound_counts_from_an_earlier_start() {
        let start = Instant::now() - Duration::from_secs(60);
        let poll = Poll::new("x", Duration::from_secs(30), Duration::from_secs(3600)).since(start);
        assert!(poll.elapsed() >= Duration::from_secs(60));
        // Past its bound already: one probe, no sleep.
        assert!(!poll.holds(|| false));
    }
}
