//! Which kept records go when the collector forgets deleted pods. A pod's own records
//! (its changes, events and calls, and the kernel events attributed to it) go with it.
//! Kernel events with no pod of the agent's (the node's own, another kubelet's pods) go
//! once they are older than the retention and lie outside every remaining pod's work,
//! widened as the kernel filter widens it: kept, they would only say what the node did
//! while pods that are gone started.

use std::collections::{BTreeSet, HashSet};

use super::Attribution;
use super::filter::{ACTIVE_AFTER_NS, LEAD_IN_NS};
use super::index::Index;
use super::model::Timeline;
use super::stages;

/// What forgetting `gone` drops from one snapshot of the kept records.
pub(super) struct Plan {
    /// The forgotten pods' timeline: their stages go to the trace and the metrics.
    pub timeline: Timeline,
    /// The sandboxes and containers the runtime named for the forgotten pods.
    pub sandboxes: HashSet<String>,
    pub containers: HashSet<String>,
    /// One flag per kernel event of the snapshot, in its queue's order: true to drop it.
    pub drop_kernel: Vec<bool>,
}

/// Plans forgetting `gone`. The snapshot's kernel events are at positions `kernel_base`
/// onwards, `kernel_len` of them; events older than `old_before` with no remaining pod
/// may go.
pub(super) fn plan(
    index: &Index<'_>,
    attribution: &Attribution,
    kernel_base: usize,
    kernel_len: usize,
    gone: &BTreeSet<String>,
    old_before: u64,
) -> Plan {
    let timeline = stages::build(index, attribution, &|uid| gone.contains(uid));
    let of_gone = |uid: &&str| gone.contains(*uid);
    let sandboxes = index
        .sandboxes
        .iter()
        .filter(|(_, uid)| of_gone(uid))
        .map(|(id, _)| id.to_string())
        .collect();
    let containers = index
        .containers
        .iter()
        .filter(|(_, c)| of_gone(&c.pod_uid))
        .map(|(id, _)| id.to_string())
        .collect();
    let remaining = |uid: &str| index.pods.contains_key(uid) && !gone.contains(uid);
    let windows = Windows::of_remaining(index, attribution, &remaining);
    let mut drop_kernel = vec![false; kernel_len];
    for (pos, event) in &index.kernel {
        let Some(k) = pos.checked_sub(kernel_base).filter(|k| *k < kernel_len) else {
            continue;
        };
        let owner = attribution.owner(*pos).map(|o| o.pod_uid.as_str());
        drop_kernel[k] = match owner {
            Some(uid) if gone.contains(uid) => true,
            Some(uid) if remaining(uid) => false,
            _ => event.ktime_ns() < old_before && !windows.contains(event.ktime_ns()),
        };
    }
    Plan {
        timeline,
        sandboxes,
        containers,
        drop_kernel,
    }
}

/// The times around the remaining pods' work, merged, in order.
struct Windows(Vec<(u64, u64)>);

impl Windows {
    fn of_remaining(
        index: &Index<'_>,
        attribution: &Attribution,
        remaining: &dyn Fn(&str) -> bool,
    ) -> Windows {
        let mut spans: std::collections::HashMap<String, (u64, u64)> = Default::default();
        let mut widen = |uid: &str, lo: u64, hi: u64| match spans.get_mut(uid) {
            Some(span) => *span = (span.0.min(lo), span.1.max(hi)),
            None => {
                spans.insert(uid.to_string(), (lo, hi));
            }
        };
        for (uid, info) in index.pods.iter().filter(|(uid, _)| remaining(uid)) {
            if let Some(seen) = info.seen_ns {
                widen(uid, seen, seen);
            }
            for c in index.calls_of(uid) {
                widen(uid, c.start_ns, c.end_ns.max(c.start_ns));
            }
            for e in index.events_of(uid) {
                widen(uid, e.at_ns, e.at_ns);
            }
        }
        for (pos, event) in &index.kernel {
            if let Some(owner) = attribution.owner(*pos)
                && remaining(&owner.pod_uid)
            {
                let t = event.ktime_ns();
                widen(&owner.pod_uid, t, t);
            }
        }
        let mut windows: Vec<(u64, u64)> = spans
            .into_values()
            .map(|(lo, hi)| {
                (
                    lo.saturating_sub(LEAD_IN_NS),
                    hi.saturating_add(ACTIVE_AFTER_NS),
                )
            })
            .collect();
        windows.sort_unstable();
        let mut merged: Vec<(u64, u64)> = Vec::with_capacity(windows.len());
        for (lo, hi) in windows {
            match merged.last_mut() {
                Some(last) if lo <= last.1 => last.1 = last.1.max(hi),
                _ => merged.push((lo, hi)),
            }
        }
        Windows(merged)
    }

    fn contains(&self, t: u64) -> bool {
        let after = self.0.partition_point(|(lo, _)| *lo <= t);
        after > 0 && t <= self.0[after - 1].1
    }
}

#[cfg(test)]
mod tests {
    use super::Windows;

    #[test]
    fn windows_hold_their_ends_and_nothing_between() {
        let w = Windows(vec![(10, 20), (30, 40)]);
        for (t, inside) in [
            (9, false),
            (10, true),
            (20, true),
            (21, false),
            (30, true),
            (40, true),
            (41, false),
        ] {
            assert_eq!(w.contains(t), inside, "{t}");
        }
        assert!(!Windows(Vec::new()).contains(0));
    }
}
