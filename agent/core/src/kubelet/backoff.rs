//! kubelet's flowcontrol.Backoff: per-key exponential back-off, with time as an argument.
//! Used for crash loops (key: pod and container) and image pulls (key: pod and image).

use std::collections::BTreeMap;

use serde::Serialize;

use super::runtime_pod::Nanos;

/// kubelet's defaults: 10 s doubling to 5 min.
pub const DEFAULT_INITIAL: Nanos = 10_000_000_000;
pub const DEFAULT_MAX: Nanos = 300_000_000_000;

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
struct Entry {
    backoff: Nanos,
    last_update: Nanos,
}

/// Back-off state for many keys. Deterministic: every method takes the time it acts at.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Backoff {
    initial: Nanos,
    max: Nanos,
    entries: BTreeMap<String, Entry>,
}

impl Default for Backoff {
    fn default() -> Self {
        Backoff::new(DEFAULT_INITIAL, DEFAULT_MAX)
    }
}

impl Backoff {
    pub fn new(initial: Nanos, max: Nanos) -> Backoff {
        Backoff {
            initial,
            max: max.max(initial),
            entries: BTreeMap::new(),
        }
    }

    /// An entry unused for twice the maximum is forgotten: a container that ran that long
    /// starts its next crash loop from the initial delay again.
    fn expired(&self, e: &Entry, at: Nanos) -> bool {
        at - e.last_update > 2 * self.max
    }

    /// Records a failure at `at`: the first (or the first after expiry) waits `initial`,
    /// each further one twice the previous, up to `max`.
    pub fn next(&mut self, key: &str, at: Nanos) {
        let fresh = match self.entries.get(key) {
            Some(e) if !self.expired(e, at) => Entry {
                backoff: (e.backoff * 2).min(self.max),
                last_update: at,
            },
            _ => Entry {
                backoff: self.initial,
                last_update: at,
            },
        };
        self.entries.insert(key.to_string(), fresh);
    }

    /// The current delay for `key`, if it has one.
    pub fn get(&self, key: &str) -> Option<Nanos> {
        self.entries.get(key).map(|e| e.backoff)
    }

    /// kubelet's IsInBackOffSince: true while `now` is within the key's delay after
    /// `event_time` (for a crash loop, the time the container last finished).
    pub fn is_in_backoff_since(&self, key: &str, event_time: Nanos, now: Nanos) -> bool {
        match self.entries.get(key) {
            Some(e) if !self.expired(e, now) => now - event_time < e.backoff,
            _ => false,
        }
    }

    /// kubelet's IsInBackOffSinceUpdate: within the delay after the last recorded failure.
    /// Returns when that delay ends.
    pub fn in_backoff_since_update(&self, key: &str, now: Nanos) -> Option<Nanos> {
        let e = self.entries.get(key)?;
        (!self.expired(e, now) && now - e.last_update < e.backoff)
            .then_some(e.last_update + e.backoff)
    }

    /// When the back-off that started at `event_time` ends.
    pub fn until(&self, key: &str, event_time: Nanos) -> Option<Nanos> {
        self.entries.get(key).map(|e| event_time + e.backoff)
    }

    /// Drops entries that have expired.
    pub fn gc(&mut self, now: Nanos) {
        let max = self.max;
        self.entries.retain(|_, e| now - e.last_update <= 2 * max);
    }

    /// Drops every key that starts with `prefix` (a removed pod's entries).
    pub fn forget_prefix(&mut self, prefix: &str) {
        self.entries.retain(|k, _| !k.starts_with(prefix));
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const S: Nanos = 1_000_000_000;

    #[test]
    fn doubles_to_the_cap() {
        let mut b = Backoff::default();
        let mut seen = Vec::new();
        for i in 0..7 {
            b.next("k", i * S);
            seen.push(b.get("k").unwrap() / S);
        }
        assert_eq!(seen, [10, 20, 40, 80, 160, 300, 300]);
    }

    #[test]
    fn in_backoff_until_the_delay_passes() {
        let mut b = Backoff::default();
        b.next("k", 100 * S);
        assert!(b.is_in_backoff_since("k", 100 * S, 105 * S));
        assert!(!b.is_in_backoff_since("k", 100 * S, 110 * S));
        assert!(!b.is_in_backoff_since("other", 100 * S, 105 * S));
        assert_eq!(b.until("k", 100 * S), Some(110 * S));
    }

    #[test]
    fn resets_after_ten_minutes_without_failure() {
        let mut b = Backoff::default();
        for i in 0..5 {
            b.next("k", i * S);
        }
        assert_eq!(b.get("k"), Some(160 * S));
        b.next("k", 4 * S + 601 * S);
        assert_eq!(b.get("k"), Some(10 * S));
    }

    #[test]
    fn gc_and_forget() {
        let mut b = Backoff::new(S, 2 * S);
        b.next("pod1/a", 0);
        b.next("pod2/a", 10 * S);
        b.gc(5 * S);
        assert_eq!(b.get("pod1/a"), None);
        b.forget_prefix("pod2/");
        assert_eq!(b.get("pod2/a"), None);
    }
}

/// The back-off key of a container: pod UID, container name and spec hash, so a changed
/// spec starts without the old crash loop's delay.
pub fn container_key(pod_uid: &str, container: &str, hash: &str) -> String {
    format!("{pod_uid}/{container}/{hash}")
}

/// The back-off key of an image pull for a pod.
pub fn image_key(pod_uid: &str, image: &str) -> String {
    format!("{pod_uid}/image/{image}")
}

/// kubelet's doBackOff for a container about to be (re)started: if its last run ended
/// less than the current delay ago, it stays down (`Some((message, until))`); otherwise the
/// failure is recorded, growing the next delay, and it may start.
pub fn do_backoff(
    backoff: &mut Backoff,
    pod_uid: &str,
    pod_name: &str,
    container: &str,
    hash: &str,
    last_finished_at: Option<Nanos>,
    now: Nanos,
) -> Option<(String, Nanos)> {
    let finished = last_finished_at?;
    let key = container_key(pod_uid, container, hash);
    if backoff.is_in_backoff_since(&key, finished, now) {
        let delay = backoff.get(&key).unwrap_or(backoff.initial);
        let until = finished + delay;
        return Some((
            format!(
                "back-off {} restarting failed container={container} pod={pod_name}",
                format_delay(delay)
            ),
            until,
        ));
    }
    backoff.next(&key, finished);
    None
}

/// Go's duration formatting for whole seconds and minutes, as kubelet's messages show them.
fn format_delay(ns: Nanos) -> String {
    let s = ns / 1_000_000_000;
    match (s / 60, s % 60) {
        (0, s) => format!("{s}s"),
        (m, 0) => format!("{m}m0s"),
        (m, s) => format!("{m}m{s}s"),
    }
}

#[cfg(test)]
mod crash_loop_tests {
    use super::*;

    const S: Nanos = 1_000_000_000;

    #[test]
    fn first_exit_restarts_at_once_then_delays_grow() {
        let mut b = Backoff::default();
        // Never exited: start.
        assert_eq!(do_backoff(&mut b, "u", "p", "c", "h", None, 0), None);
        // First exit at t=100: restart right away, next delay 10 s.
        assert_eq!(
            do_backoff(&mut b, "u", "p", "c", "h", Some(100 * S), 100 * S),
            None
        );
        // Second exit at t=101: held for 10 s from its finish... but this finish opens a
        // new back-off window only when it is recorded, which happens once the window of
        // the previous finish has passed.
        let held = do_backoff(&mut b, "u", "p", "c", "h", Some(101 * S), 105 * S).unwrap();
        assert_eq!(
            held,
            (
                "back-off 10s restarting failed container=c pod=p".to_string(),
                111 * S
            )
        );
        assert_eq!(
            do_backoff(&mut b, "u", "p", "c", "h", Some(101 * S), 111 * S),
            None
        );
        let held = do_backoff(&mut b, "u", "p", "c", "h", Some(112 * S), 113 * S).unwrap();
        assert_eq!(held.1, 132 * S, "20 s after the third exit");
    }

    #[test]
    fn a_changed_spec_has_its_own_backoff() {
        let mut b = Backoff::default();
        do_backoff(&mut b, "u", "p", "c", "h1", Some(0), 0);
        assert!(do_backoff(&mut b, "u", "p", "c", "h1", Some(1), 2).is_some());
        assert!(do_backoff(&mut b, "u", "p", "c", "h2", Some(1), 2).is_none());
    }

    #[test]
    fn formats_like_go() {
        assert_eq!(format_delay(10 * S), "10s");
        assert_eq!(format_delay(160 * S), "2m40s");
        assert_eq!(format_delay(300 * S), "5m0s");
    }
}
