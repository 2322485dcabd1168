//! What the running agent keeps in memory to build timelines on request: the records the
//! builder reads, bounded. Pod changes, pod events, kernel events and the CRI calls that
//! change state are kept up to a cap each, oldest dropped first. Of the calls that only
//! read state (relists, status polls) only the first few per pod, sandbox and container
//! are kept: the builder reads no others, so the timeline is the same as from a full
//! trace. The runtime's Status answers are kept when they change, for `diagnose`.

use std::collections::{BTreeMap, HashMap, VecDeque};
use std::sync::Mutex;

use super::model::Timeline;
use crate::cri::CriCall;
use crate::trace::TraceRecord;

/// Caps per kind of record.
const MAX_PODS: usize = 4_096;
const MAX_CALLS: usize = 50_000;
const MAX_EVENTS: usize = 20_000;
const MAX_KERNEL: usize = 200_000;
/// State-reading calls kept per pod, sandbox and container.
pub const OBSERVATIONS_KEPT: u32 = 4;
/// Keys counted for [`OBSERVATIONS_KEPT`]; beyond this the counts start over.
const MAX_KEYS: usize = 100_000;

#[derive(Debug, Default)]
struct Kept {
    pods: VecDeque<TraceRecord>,
    calls: VecDeque<TraceRecord>,
    events: VecDeque<TraceRecord>,
    kernel: VecDeque<TraceRecord>,
    observations: HashMap<String, u32>,
    last_status: Option<BTreeMap<String, String>>,
}

/// The agent's in-memory record of a run. Cheap to share; every method takes `&self`.
#[derive(Debug, Default)]
pub struct Collector {
    kept: Mutex<Kept>,
}

impl Collector {
    pub fn new() -> Collector {
        Collector::default()
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Kept> {
        self.kept.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Keeps `record` if the builder may need it.
    pub fn push(&self, record: &TraceRecord) {
        let mut kept = self.lock();
        let (queue, cap) = match record {
            TraceRecord::Pod(_) => (&mut kept.pods, MAX_PODS),
            TraceRecord::Event(_) => (&mut kept.events, MAX_EVENTS),
            TraceRecord::Kernel(_) => (&mut kept.kernel, MAX_KERNEL),
            // The runtime's status is node-wide and polled on every sync: keep an answer
            // only when it differs from the last one kept, so a diagnosis can still show
            // when NetworkReady turned false and why.
            TraceRecord::Cri(c) if c.method == "Status" => {
                if kept.last_status.as_ref() == Some(&c.response) {
                    return;
                }
                kept.last_status = Some(c.response.clone());
                (&mut kept.calls, MAX_CALLS)
            }
            TraceRecord::Cri(c) => {
                if c.is_observation() && !keep_observation(&mut kept.observations, c) {
                    return;
                }
                (&mut kept.calls, MAX_CALLS)
            }
            // The status store holds the latest status; the builder reads none.
            TraceRecord::Header(_)
            | TraceRecord::Status(_)
            | TraceRecord::Stage(_)
            | TraceRecord::Footer(_) => return,
        };
        if queue.len() >= cap {
            queue.pop_front();
        }
        queue.push_back(record.clone());
    }

    /// Everything kept, each kind in the order it arrived.
    pub fn records(&self) -> Vec<TraceRecord> {
        let kept = self.lock();
        kept.pods
            .iter()
            .chain(&kept.calls)
            .chain(&kept.events)
            .chain(&kept.kernel)
            .cloned()
            .collect()
    }

    /// The timeline of everything kept.
    pub fn timeline(&self) -> Timeline {
        super::build(&self.records())
    }
}

/// True for the first [`OBSERVATIONS_KEPT`] state-reading calls about each pod, sandbox
/// and container the call names.
fn keep_observation(counts: &mut HashMap<String, u32>, c: &CriCall) -> bool {
    if counts.len() >= MAX_KEYS {
        counts.clear();
    }
    let mut keep = false;
    for key in [
        ("pod", &c.pod_uid),
        ("sandbox", &c.sandbox_id),
        ("container", &c.container_id),
    ]
    .into_iter()
    .filter(|(_, id)| !id.is_empty())
    .map(|(kind, id)| format!("{kind}:{id}"))
    {
        let n = counts.entry(key).or_default();
        if *n < OBSERVATIONS_KEPT {
            *n += 1;
            keep = true;
        }
    }
    keep
}
