//! The counters a trace's node track carries: how many of something were under way at
//! each instant (pods starting, CRI calls in flight, pods in each kind of wait: the
//! depth of the queue behind the image puller, the pod workers, back-off, ...) and the
//! kernel events the probes lost.

use std::collections::BTreeMap;

use crate::timeline::{PodTimeline, StageKind};
use crate::trace::TraceRecord;

/// One counter: its name and its value from each instant it changed.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Series {
    pub name: String,
    pub points: Vec<(u64, i64)>,
}

/// The counters of one trace, all starting at 0 at `start_ns` (the trace's first event).
pub fn series(start_ns: u64, pods: &[PodTimeline], records: &[TraceRecord]) -> Vec<Series> {
    let mut steps: BTreeMap<String, Vec<(u64, i64)>> = BTreeMap::new();
    let mut step = |name: &str, at: u64, delta: i64| {
        steps.entry(name.to_string()).or_default().push((at, delta));
    };
    for p in pods {
        if let Some(seen) = p.seen_ns {
            step("pods starting", seen, 1);
            if let Some(running) = p.stage(StageKind::Running) {
                step("pods starting", running.start_ns.max(seen), -1);
            }
        }
        for s in &p.stages {
            let kind = s.kind();
            if kind.is_wait() {
                let name = format!("pods in {kind}");
                step(&name, s.start_ns, 1);
                step(&name, s.end_ns, -1);
            }
        }
    }
    let mut lost = None;
    for r in records {
        match r {
            TraceRecord::Cri(c) => {
                step("CRI calls in flight", c.start_ns, 1);
                step("CRI calls in flight", c.end_ns.max(c.start_ns), -1);
            }
            TraceRecord::Footer(f) => lost = Some((f.ended_ns, f.lost_events)),
            _ => {}
        }
    }
    let mut out: Vec<Series> = steps
        .into_iter()
        .map(|(name, mut deltas)| {
            deltas.sort_unstable();
            let mut points = vec![(start_ns, 0)];
            let mut value = 0;
            for (at, delta) in deltas {
                value += delta;
                match points.last_mut() {
                    Some(last) if last.0 == at => last.1 = value,
                    _ => points.push((at, value)),
                }
            }
            Series { name, points }
        })
        .collect();
    if let Some((ended, lost)) = lost {
        out.push(Series {
            name: "kernel events lost".into(),
            points: vec![(start_ns, 0), (ended.max(start_ns), lost as i64)],
        });
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::timeline::{Stage, StageSource};

    fn pod(uid: &str, seen: u64, running: Option<u64>, waits: &[(&str, u64, u64)]) -> PodTimeline {
        let mut stages = Vec::new();
        for (name, start, end) in waits {
            stages.push(Stage::new(
                uid,
                "ns",
                uid,
                (*name).into(),
                *start,
                *end,
                StageSource::Agent,
            ));
        }
        if let Some(at) = running {
            stages.push(Stage::new(
                uid,
                "ns",
                uid,
                "running".into(),
                at,
                at,
                StageSource::Cri,
            ));
        }
        PodTimeline {
            uid: uid.into(),
            namespace: "ns".into(),
            name: uid.into(),
            seen_ns: Some(seen),
            sandbox_ids: Vec::new(),
            containers: BTreeMap::new(),
            ip: None,
            stages,
            kernel_events: BTreeMap::new(),
            notes: Vec::new(),
            sources: None,
        }
    }

    #[test]
    fn counters_rise_and_fall_with_what_is_under_way() {
        let pods = [
            pod("a", 10, Some(50), &[("image_puller_wait:app", 20, 40)]),
            pod("b", 12, None, &[("image_puller_wait:app", 30, 40)]),
        ];
        let got = series(5, &pods, &[]);
        assert_eq!(
            got,
            vec![
                Series {
                    name: "pods in image_puller_wait".into(),
                    points: vec![(5, 0), (20, 1), (30, 2), (40, 0)],
                },
                Series {
                    name: "pods starting".into(),
                    points: vec![(5, 0), (10, 1), (12, 2), (50, 1)],
                },
            ]
        );
    }
}
