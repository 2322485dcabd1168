//! Stages split over as few tracks as keep each track's slices properly nested, which
//! both trace formats need: a track is a call stack, so a slice must end before the one
//! it started inside. A stage that overlaps another without fitting inside it (loopback
//! running beside bridge) goes on a track of its own.

use crate::timeline::Stage;

/// `stages` over lanes: a stage goes on the first lane where it fits inside the innermost
/// slice still open at its start, or starts after all of them ended. Each lane's stages
/// are in the order they open: by start, the longer first.
pub fn lanes<'a>(stages: impl IntoIterator<Item = &'a Stage>) -> Vec<Vec<&'a Stage>> {
    let mut order: Vec<&Stage> = stages.into_iter().collect();
    order.sort_by(|a, b| a.start_ns.cmp(&b.start_ns).then(b.end_ns.cmp(&a.end_ns)));
    // Per lane: its stages, and the end times of the slices open on it.
    let mut lanes: Vec<(Vec<&Stage>, Vec<u64>)> = Vec::new();
    for s in order {
        let fits = |open: &mut Vec<u64>| {
            while open.last().is_some_and(|&end| end <= s.start_ns) {
                open.pop();
            }
            open.last().is_none_or(|&end| s.end_ns <= end)
        };
        let lane = match lanes.iter_mut().position(|(_, open)| fits(open)) {
            Some(l) => l,
            None => {
                lanes.push((Vec::new(), Vec::new()));
                lanes.len() - 1
            }
        };
        lanes[lane].0.push(s);
        lanes[lane].1.push(s.end_ns);
    }
    lanes.into_iter().map(|(stages, _)| stages).collect()
}
