//! What the running agent keeps in memory to build timelines on request: the records the
//! builder reads, bounded. Pod changes, pod events, kernel events and the CRI calls that
//! change state are kept up to a cap each, oldest dropped first. Of the calls that only
//! read state (relists, status polls) only the first few per pod, sandbox and container
//! are kept: the builder reads no others, so the timeline is the same as from a full
//! trace. The runtime's Status answers are kept when they change, for `diagnose`.
//!
//! A timeline is built from a snapshot that shares the kept records with the collector
//! (`chunks.rs`), so building one every few seconds neither copies them nor holds the
//! lock that every CRI call and kernel event takes.

use std::collections::{BTreeMap, HashMap};
use std::sync::Mutex;
use std::sync::atomic::{AtomicU64, Ordering};

use k8s_openapi::api::core::v1::Pod;

use super::chunks::{Chunks, Snapshot};
use super::index::{Index, Ref};
use super::model::Timeline;
use crate::cri::CriCall;
use crate::ebpf::KernelEvent;
use crate::trace::{PodEventRecord, PodOp, PodOpRecord, TraceRecord};

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
/// its largest variant, and kernel events, by far the most numerous, are about half that.
#[derive(Debug)]
struct Kept {
    pods: Chunks<PodOpRecord>,
    calls: Chunks<CriCall>,
    events: Chunks<PodEventRecord>,
    kernel: Chunks<KernelEvent>,
    observations: HashMap<String, u32>,
    last_status: Option<BTreeMap<String, String>>,
    /// Counts the records kept: the timeline changes only when this does.
    generation: u64,
}

impl Default for Kept {
    fn default() -> Kept {
        Kept {
            pods: Chunks::new(MAX_PODS),
            calls: Chunks::new(MAX_CALLS),
            events: Chunks::new(MAX_EVENTS),
            kernel: Chunks::new(MAX_KERNEL),
            observations: HashMap::new(),
            last_status: None,
            generation: 0,
        }
    }
}

/// What was kept at one moment, built into a timeline without holding the collector.
struct Frozen {
    pods: Snapshot<PodOpRecord>,
    calls: Snapshot<CriCall>,
    events: Snapshot<PodEventRecord>,
    kernel: Snapshot<KernelEvent>,
}

impl Frozen {
    fn of(kept: &Kept) -> Frozen {
        Frozen {
            pods: kept.pods.snapshot(),
            calls: kept.calls.snapshot(),
            events: kept.events.snapshot(),
            kernel: kept.kernel.snapshot(),
        }
    }

    fn timeline(&self, wanted: &dyn Fn(&str) -> bool) -> Timeline {
        // Positions as in `Collector::records`.
        let refs = self
            .pods
            .iter()
            .map(Ref::Pod)
            .chain(self.calls.iter().map(Ref::Cri))
            .chain(self.events.iter().map(Ref::Event))
            .chain(self.kernel.iter().map(Ref::Kernel))
            .enumerate();
        super::build_index(&Index::of(refs), wanted)
    }
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
            TraceRecord::Pod(p) => kept.pods.push(kept_pod_op(p)),
            TraceRecord::Event(e) => kept.events.push(e.clone()),
            TraceRecord::Kernel(e) => kept.kernel.push(e.clone()),
            // The runtime's status is node-wide and polled on every sync: keep an answer
            // only when it differs from the last one kept, so a diagnosis can still show
            // when NetworkReady turned false and why.
            TraceRecord::Cri(c) if c.method == "Status" => {
                if kept.last_status.as_ref() == Some(&c.response) {
                    return;
                }
                kept.last_status = Some(c.response.clone());
                kept.calls.push(c.clone());
            }
            TraceRecord::Cri(c) => {
                if c.is_observation() && !keep_observation(&mut kept.observations, c) {
                    return;
                }
                kept.calls.push(c.clone());
            }
            // The status store holds the latest status; the builder reads none.
            TraceRecord::Header(_)
            | TraceRecord::Status(_)
            | TraceRecord::Stage(_)
            | TraceRecord::Footer(_) => return,
        }
        kept.generation += 1;
    }

    /// Everything kept, each kind in the order it arrived.
    pub fn records(&self) -> Vec<TraceRecord> {
        let kept = self.lock();
        let len = kept.pods.len() + kept.calls.len() + kept.events.len() + kept.kernel.len();
        let mut out = Vec::with_capacity(len);
        out.extend(kept.pods.iter().cloned().map(TraceRecord::Pod));
        out.extend(kept.calls.iter().cloned().map(TraceRecord::Cri));
        out.extend(kept.events.iter().cloned().map(TraceRecord::Event));
        out.extend(kept.kernel.iter().cloned().map(TraceRecord::Kernel));
        out
    }

    /// The timeline of everything kept.
    pub fn timeline(&self) -> Timeline {
        let frozen = Frozen::of(&self.lock());
        frozen.timeline(&|_| true)
    }

    /// The timeline of the pods `wanted` picks by UID, unless nothing was kept since
    /// the one built when `seen` was last updated (the same records give the same
    /// timeline); `seen` then holds this one's generation. For callers that poll and
    /// need only some pods: a pod's stages are most of what a build allocates.
    pub fn timeline_if_changed(
        &self,
        seen: &AtomicU64,
        wanted: impl Fn(&str) -> bool,
    ) -> Option<Timeline> {
        let frozen = {
            let kept = self.lock();
            if seen.swap(kept.generation, Ordering::Relaxed) == kept.generation {
                return None;
            }
            Frozen::of(&kept)
        };
        Some(frozen.timeline(&wanted))
    }
}

/// A pod change as kept: of a removal, the builder and `diagnose` read only which pod
/// and when, so its spec (a few KiB per pod) is left to the trace.
fn kept_pod_op(p: &PodOpRecord) -> PodOpRecord {
    if p.op != PodOp::Remove {
        return p.clone();
    }
    PodOpRecord {
        at_ns: p.at_ns,
        op: p.op,
        pod: Box::new(Pod {
            metadata: p.pod.metadata.clone(),
            ..Pod::default()
        }),
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
