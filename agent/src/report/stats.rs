//! Per-stage latency statistics across pods: count, failures, p50, p90, p99 and max of
//! each stage's recorded duration. Percentiles are nearest-rank, so every figure is a
//! duration that was actually recorded, never an interpolation.

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};

use crate::timeline::{PodTimeline, Stage, StageKind, StageName, StageSource};

/// Stage kinds that are points in time: their duration is always zero, so a latency
/// distribution of them says nothing. Their timing shows in the breakdown instead.
const POINTS: &[StageKind] = &[
    StageKind::PodSeen,
    StageKind::Admitted,
    StageKind::PauseExec,
    StageKind::AppFirstExec,
    StageKind::InitRun,
    StageKind::Running,
    StageKind::Ready,
];

/// The derived row for pod_seen -> running.
pub const STARTUP: &str = "pod_startup";
/// The derived row for pod_seen -> ready.
pub const TO_READY: &str = "pod_ready";

/// One row of the stage table.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct StageStats {
    /// A stage kind (`image_pull` for every container's pull), a CNI plugin
    /// (`cni_plugin:bridge`), a runtime step (`runtime:task_start`), or a derived span
    /// ([`STARTUP`], [`TO_READY`]).
    pub stage: String,
    pub count: usize,
    /// How many of them failed (a CRI error, a plugin that exited non-zero).
    pub failed: usize,
    pub p50_ns: u64,
    pub p90_ns: u64,
    pub p99_ns: u64,
    pub max_ns: u64,
}

/// The nearest-rank `p`th percentile of `sorted` (ascending): the smallest recorded value
/// with at least `p`% of the values at or below it.
pub fn percentile(sorted: &[u64], p: u32) -> u64 {
    if sorted.is_empty() {
        return 0;
    }
    let n = sorted.len() as u64;
    // ceil(p * n / 100), at least rank 1.
    let rank = (u64::from(p) * n).div_ceil(100).max(1);
    sorted[(rank - 1) as usize]
}

/// Which row a stage counts in, if any. An agent's mark without a span (an image that was
/// already present) measured nothing, so it is no sample.
fn group(s: &Stage) -> Option<String> {
    if s.duration_ns == 0 && s.source == StageSource::Agent {
        return None;
    }
    match s.kind() {
        k if POINTS.contains(k) => None,
        StageKind::CniPlugin => Some(s.stage.to_string()),
        // The runtime's own steps, pooled by step (`runtime:task_start` for every
        // container's).
        StageKind::Runtime => Some(s.stage.kind_and_step()),
        k => Some(k.to_string()),
    }
}

/// Row order: the pipeline's, then the derived rows; groups it does not list sort after
/// these, by name.
fn rank(group: &str) -> usize {
    let known = StageKind::PIPELINE.len();
    match group {
        STARTUP => known + 1,
        TO_READY => known + 2,
        _ => match StageName::parse(group).kind().rank() {
            r if r == known => known + 3,
            r => r,
        },
    }
}

/// Every recorded duration per row of the stage table, each with whether the stage
/// succeeded, in the order the pods and their stages come.
pub fn samples<'a>(
    pods: impl IntoIterator<Item = &'a PodTimeline>,
) -> BTreeMap<String, Vec<(u64, bool)>> {
    let mut samples: BTreeMap<String, Vec<(u64, bool)>> = BTreeMap::new();
    let mut add = |name: String, ns: u64, ok: bool| samples.entry(name).or_default().push((ns, ok));
    for p in pods {
        for s in &p.stages {
            if let Some(g) = group(s) {
                add(g, s.duration_ns, s.ok);
            }
        }
        if let Some(seen) = p.seen_ns {
            if let Some(r) = p.stage(StageKind::Running) {
                add(STARTUP.into(), r.start_ns.saturating_sub(seen), true);
            }
            if let Some(r) = p.stage(StageKind::Ready) {
                add(TO_READY.into(), r.start_ns.saturating_sub(seen), true);
            }
        }
    }
    samples
}

/// Row names in the table's order: the pipeline's.
pub fn in_pipeline_order(names: &mut [String]) {
    names.sort_by(|a, b| (rank(a), a).cmp(&(rank(b), b)));
}

/// The stage table over every pod given.
pub fn stage_stats<'a>(pods: impl IntoIterator<Item = &'a PodTimeline>) -> Vec<StageStats> {
    let mut rows: Vec<StageStats> = samples(pods)
        .into_iter()
        .map(|(stage, v)| {
            let failed = v.iter().filter(|(_, ok)| !ok).count();
            let mut v: Vec<u64> = v.into_iter().map(|(ns, _)| ns).collect();
            v.sort_unstable();
            StageStats {
                count: v.len(),
                failed,
                p50_ns: percentile(&v, 50),
                p90_ns: percentile(&v, 90),
                p99_ns: percentile(&v, 99),
                max_ns: v.last().copied().unwrap_or(0),
                stage,
            }
        })
        .collect();
    rows.sort_by(|a, b| (rank(&a.stage), &a.stage).cmp(&(rank(&b.stage), &b.stage)));
    rows
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn nearest_rank_percentiles_are_recorded_values() {
        let v: Vec<u64> = (1..=10).collect();
        assert_eq!(percentile(&v, 50), 5);
        assert_eq!(percentile(&v, 90), 9);
        assert_eq!(percentile(&v, 99), 10);
        assert_eq!(percentile(&[7], 50), 7);
        assert_eq!(percentile(&[7], 99), 7);
        assert_eq!(percentile(&[], 50), 0);
        let v = [10, 20, 30];
        assert_eq!(percentile(&v, 50), 20);
        assert_eq!(percentile(&v, 90), 30);
    }
}
