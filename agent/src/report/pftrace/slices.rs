//! Stages as slices: a begin and an end event per stage on its lane's track, and the
//! flows that lead from a CRI call to the kernel stages and the runtime's own stages
//! that happened inside it.

use std::collections::BTreeMap;

use crate::timeline::{Stage, StageSource};

/// Flow IDs by stage (its index in the pod's stages): the flows a CRI call starts, and
/// the one a kernel stage ends.
#[derive(Debug, Default)]
pub struct Flows {
    pub out: BTreeMap<usize, Vec<u64>>,
    pub into: BTreeMap<usize, u64>,
}

/// A flow from each kernel (or runtime) stage's CRI call to it: the innermost call of the same
/// container (or of the pod, for a pod-level stage) that was under way when the kernel
/// stage began. Flow IDs count up from `*next`.
pub fn flows(stages: &[Stage], next: &mut u64) -> Flows {
    let mut flows = Flows::default();
    for (k, kernel) in stages.iter().enumerate() {
        if !matches!(kernel.source, StageSource::Kernel | StageSource::Runtime) {
            continue;
        }
        let call = stages
            .iter()
            .enumerate()
            .filter(|(_, c)| {
                c.source == StageSource::Cri
                    && c.duration_ns > 0
                    && c.container == kernel.container
                    && c.start_ns <= kernel.start_ns
                    && kernel.start_ns <= c.end_ns
            })
            .min_by_key(|(i, c)| (c.duration_ns, *i));
        if let Some((c, _)) = call {
            *next += 1;
            flows.out.entry(c).or_default().push(*next);
            flows.into.insert(k, *next);
        }
    }
    flows
}

/// One end of a slice, in the order a track must carry them.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Edge<'a> {
    Begin(&'a Stage),
    End(u64),
}

impl Edge<'_> {
    pub fn at_ns(&self) -> u64 {
        match self {
            Edge::Begin(s) => s.start_ns,
            Edge::End(at) => *at,
        }
    }
}

/// The begins and ends of one lane's stages (as `lanes` made it: properly nested, in
/// opening order), each slice closed before the next one that starts at or after its
/// end opens, as the lanes were cut.
pub fn edges<'a>(lane: &[&'a Stage]) -> Vec<Edge<'a>> {
    let mut out = Vec::with_capacity(lane.len() * 2);
    let mut open: Vec<u64> = Vec::new();
    for s in lane {
        while let Some(&end) = open.last().filter(|&&end| end <= s.start_ns) {
            out.push(Edge::End(end));
            open.pop();
        }
        out.push(Edge::Begin(s));
        open.push(s.end_ns);
    }
    while let Some(end) = open.pop() {
        out.push(Edge::End(end));
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn stage(name: &str, start: u64, end: u64, source: StageSource, c: Option<&str>) -> Stage {
        let mut s = Stage::new("u", "ns", "p", name.into(), start, end, source);
        s.container = c.map(str::to_string);
        s
    }

    #[test]
    fn a_kernel_stage_flows_from_the_innermost_call_of_its_container() {
        let stages = vec![
            stage("sandbox_requested", 10, 100, StageSource::Cri, None),
            stage("netns_created", 20, 30, StageSource::Kernel, None),
            stage(
                "container_start:app",
                110,
                200,
                StageSource::Cri,
                Some("app"),
            ),
            // Inside the sandbox call by time, but of a container: not its flow.
            stage(
                "container_cgroup:app",
                120,
                130,
                StageSource::Kernel,
                Some("app"),
            ),
            stage(
                "container_start:other",
                115,
                125,
                StageSource::Cri,
                Some("other"),
            ),
            // After every call: no flow.
            stage(
                "app_first_exec:app",
                300,
                300,
                StageSource::Kernel,
                Some("app"),
            ),
        ];
        let mut next = 7;
        let f = flows(&stages, &mut next);
        assert_eq!(f.into, BTreeMap::from([(1, 8), (3, 9)]));
        assert_eq!(f.out, BTreeMap::from([(0, vec![8]), (2, vec![9])]));
        assert_eq!(next, 9);
    }

    #[test]
    fn edges_nest_and_close_a_slice_before_one_that_starts_at_its_end() {
        let parent = stage("a", 0, 10, StageSource::Cri, None);
        let child = stage("b", 2, 4, StageSource::Kernel, None);
        let point = stage("c", 10, 10, StageSource::Cri, None);
        let got: Vec<(char, u64)> = edges(&[&parent, &child, &point])
            .iter()
            .map(|e| match e {
                Edge::Begin(s) => (s.stage.to_string().chars().next().unwrap(), e.at_ns()),
                Edge::End(at) => ('/', *at),
            })
            .collect();
        assert_eq!(
            got,
            vec![
                ('a', 0),
                ('b', 2),
                ('/', 4),
                ('/', 10),
                ('c', 10),
                ('/', 10)
            ]
        );
    }
}
