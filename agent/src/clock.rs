//! Time for the shell. The core never reads a clock; the shell passes it `now` from here.
//! [`now_ktime_ns`] is the real clock the kernel's events are stamped with; [`mono_now`]
//! and [`wall_now`] are the shell's, virtual in replay.
//!
//! Replay runs the same shell in virtual time: on its (single) thread it installs a
//! virtual clock anchored to the trace's start and driven by tokio's paused clock, so
//! every `now` the reconciler sees advances only as the replayed runtime's calls take
//! their recorded time.

use std::cell::Cell;

use crate::kubelet::runtime_pod::Nanos;

#[derive(Clone, Copy)]
struct Virtual {
    wall: Nanos,
    mono: u64,
    at: tokio::time::Instant,
}

thread_local! {
    static VIRTUAL: Cell<Option<Virtual>> = const { Cell::new(None) };
}

/// Makes this thread's clocks virtual: from now on they read `wall` and `mono` plus the
/// (paused, auto-advancing) tokio time elapsed since this call.
pub fn install_virtual(wall: Nanos, mono: u64) {
    VIRTUAL.with(|v| {
        v.set(Some(Virtual {
            wall,
            mono,
            at: tokio::time::Instant::now(),
        }))
    });
}

/// Back to the real clocks on this thread.
pub fn uninstall_virtual() {
    VIRTUAL.with(|v| v.set(None));
}

/// CLOCK_MONOTONIC in nanoseconds: the clock of `bpf_ktime_get_ns()`, so a time taken
/// here and a kernel event's `ktime_ns` are on one timeline.
pub fn now_ktime_ns() -> u64 {
    let ts = nix::time::clock_gettime(nix::time::ClockId::CLOCK_MONOTONIC)
        .expect("CLOCK_MONOTONIC is always available on Linux");
    ts.tv_sec() as u64 * 1_000_000_000 + ts.tv_nsec() as u64
}

fn elapsed(v: &Virtual) -> u64 {
    tokio::time::Instant::now().duration_since(v.at).as_nanos() as u64
}

/// Wall-clock nanoseconds since the epoch: the clock the CRI reports container times on.
pub fn wall_now() -> Nanos {
    if let Some(v) = VIRTUAL.with(|v| v.get()) {
        return v.wall + elapsed(&v) as Nanos;
    }
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_nanos() as Nanos)
        .unwrap_or(0)
}

/// CLOCK_MONOTONIC nanoseconds, the clock of CRI spans and kernel events.
pub fn mono_now() -> u64 {
    if let Some(v) = VIRTUAL.with(|v| v.get()) {
        return v.mono + elapsed(&v);
    }
    now_ktime_ns()
}

/// A `tokio::time::Instant` for a wall-clock deadline.
pub fn instant_at(deadline: Nanos) -> tokio::time::Instant {
    let now = wall_now();
    let ahead = std::time::Duration::from_nanos(deadline.saturating_sub(now).max(0) as u64);
    tokio::time::Instant::now() + ahead
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_ktime_clock_is_monotonic_and_matches_std_instant() {
        // std's Instant is CLOCK_MONOTONIC on Linux: the two advance together.
        let a = now_ktime_ns();
        let i = std::time::Instant::now();
        std::thread::sleep(std::time::Duration::from_millis(20));
        let b = now_ktime_ns();
        let elapsed = i.elapsed().as_nanos() as u64;
        assert!(b > a);
        assert!(
            (b - a).abs_diff(elapsed) < 5_000_000,
            "{} vs {elapsed}",
            b - a
        );
    }
}
