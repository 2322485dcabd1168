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
use crate::ebpf::KernelEvent;
use crate::trace::TraceRecord;

/// Caps per kind of record. A pod's start leaves about 150 kernel events (runc, CNI
/// plugins, cgroups, namespaces) and 30 kept calls, each a few hundred bytes in memory,
/// so these keep the startups of several hundred pods, more than a node runs at once
/// (kubelet's default max-pods is 110), in well under 20 MiB.
const MAX_PODS: usize = 2_048;
const MAX_CALLS: usize = 20_000;
const MAX_EVENTS: usize = 20_000;
const MAX_KERNEL: usize = 50_000;
/// State-reading calls kept per pod, sandbox and container.
pub const OBSERVATIONS_KEPT: u32 = 4;
/// Keys counted for [`OBSERVATIONS_KEPT`]; beyond this the counts start over.
const MAX_KEYS: usize = 100_000;

/// Kept records by kind, each in a queue of its own type: a `TraceRecord` is as large as
/// its largest variant, and kernel events, by far the most numerous, are a third of that.
#[derive(Debug, Default)]
struct Kept {
    pods: VecDeque<TraceRecord>,
    calls: VecDeque<CriCall>,
    events: VecDeque<TraceRecord>,
    kernel: VecDeque<KernelEvent>,
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
        match record {
            TraceRecord::Pod(_) => bounded_push(&mut kept.pods, MAX_PODS, record.clone()),
            TraceRecord::Event(_) => bounded_push(&mut kept.events, MAX_EVENTS, record.clone()),
            TraceRecord::Kernel(e) => bounded_push(&mut kept.kernel, MAX_KERNEL, e.clone()),
            // The runtime's status is node-wide and polled on every sync: keep an answer
            // only when it differs from the last one kept, so a diagnosis can still show
            // when NetworkReady turned false and why.
            TraceRecord::Cri(c) if c.method == "Status" => {
                if kept.last_status.as_ref() == Some(&c.response) {
                    return;
                }
                kept.last_status = Some(c.response.clone());
                bounded_push(&mut kept.calls, MAX_CALLS, c.clone());
            }
            TraceRecord::Cri(c) => {
                if c.is_observation() && !keep_observation(&mut kept.observations, c) {
                    return;
                }
                bounded_push(&mut kept.calls, MAX_CALLS, c.clone());
            }
            // The status store holds the latest status; the builder reads none.
            TraceRecord::Header(_)
            | TraceRecord::Status(_)
            | TraceRecord::Stage(_)
            | TraceRecord::Footer(_) => {}
        }
    }

    /// Everything kept, each kind in the order it arrived.
    pub fn records(&self) -> Vec<TraceRecord> {
        let kept = self.lock();
        kept.pods
            .iter()
            .cloned()
            .chain(kept.calls.iter().cloned().map(TraceRecord::Cri))
            .chain(kept.events.iter().cloned())
            .chain(kept.kernel.iter().cloned().map(TraceRecord::Kernel))
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

/// Appends `item`, dropping the oldest first when `queue` holds `cap`.
fn bounded_push<T>(queue: &mut VecDeque<T>, cap: usize, item: T) {
    if queue.len() >= cap {
        queue.pop_front();
    }
    queue.push_back(item);
}

#[cfg(test)]
mod tmp_sizes {
    #[test]
    fn tmp_sizes() {
        use k8s_openapi::api::core::v1::*;
        eprintln!(
            "KernelEvent {} EventMeta {} CriCall {} TraceRecord {} Pod {} PodSpec {} Container {} PodStatus {} Owner {} CniExec {}",
            size_of::<crate::ebpf::KernelEvent>(),
            size_of::<crate::ebpf::EventMeta>(),
            size_of::<crate::cri::CriCall>(),
            size_of::<crate::trace::TraceRecord>(),
            size_of::<Pod>(),
            size_of::<PodSpec>(),
            size_of::<Container>(),
            size_of::<PodStatus>(),
            size_of::<crate::timeline::Owner>(),
            size_of::<crate::ebpf::event::CniExec>(),
        );
    }
}
