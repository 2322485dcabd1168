//! What the running agent keeps in memory to build timelines on request: the records the
//! builder reads, bounded. Pod changes, pod events, kernel events and the CRI calls that
//! change state are kept up to a cap each, oldest dropped first. Of the calls that only
//! read state (relists, status polls) only the first few per pod, sandbox and container
//! are kept: the builder reads no others, so the timeline is the same as from a full
//! trace. The runtime's Status answers are kept when they change, for `diagnose`.
//!
//! A deleted pod is forgotten once it has been gone for a retention the caller chooses
//! (`forget.rs` says what goes with it); its stages are handed back for the trace and
//! the metrics, and records about it that arrive later are not kept.
//!
//! A timeline is built from a snapshot that shares the kept records with the collector
//! (`chunks.rs`), so building one every few seconds neither copies them nor holds the
//! lock that every CRI call and kernel event takes.

use std::collections::{BTreeSet, HashMap, HashSet, VecDeque};
use std::sync::Mutex;
use std::sync::atomic::{AtomicU64, Ordering};

use k8s_openapi::api::core::v1::Pod;

use podlapse_core::record::CriMethod;

use super::chunks::{Chunks, Snapshot};
use super::index::{Index, Ref};
use super::model::Timeline;
use crate::cri::CriCall;
use crate::ebpf::KernelEvent;
use crate::trace::{
    Header, NodeNetworkRecord, Observation, ObservedRecord, PodEventRecord, PodOp, PodOpRecord,
    PodWaitRecord, SourcesRecord, TraceRecord,
};
use podlapse_core::record::RuntimeSpan;

/// Caps per kind of record. A pod's start leaves about 150 kernel events (runc, CNI
/// plugins, cgroups, namespaces) and 30 kept calls, each a few hundred bytes in memory,
/// so these keep the startups of several hundred pods, more than a node runs at once
/// (kubelet's default max-pods is 110), in well under 20 MiB.
const MAX_PODS: usize = 2_048;
const MAX_CALLS: usize = 20_000;
const MAX_EVENTS: usize = 20_000;
/// A pod waits a few times at most while it starts (its pulls, its back-offs).
const MAX_WAITS: usize = 4_096;
const MAX_KERNEL: usize = 50_000;
/// A pod's start leaves a few dozen runtime spans when the runtime traces.
const MAX_RUNTIME_SPANS: usize = 20_000;
/// An observed pod's start is a handful of changes (its sandbox, each container's create,
/// start and exit).
const MAX_OBSERVED: usize = 20_000;
/// The node network's changes kept (the last ones): a node's network changes with its
/// configuration and its pool's fill, a few times per pod at most.
const MAX_NETWORK: usize = 1_024;
/// State-reading calls kept per pod, sandbox and container.
pub const OBSERVATIONS_KEPT: u32 = 4;
/// Keys counted for [`OBSERVATIONS_KEPT`]; beyond this the counts start over.
const MAX_KEYS: usize = 100_000;
/// Deleted pods kept within the retention; beyond this the longest gone are forgotten
/// first, so a burst of deletions cannot hold more than this many pods' records.
pub const MAX_DELETED_KEPT: usize = 512;
/// IDs of forgotten pods, sandboxes and containers remembered to refuse their late
/// records.
const MAX_FORGOTTEN_IDS: usize = 16_384;

/// Kept records by kind, each in a queue of its own type: a `TraceRecord` is as large as
/// its largest variant, and kernel events, by far the most numerous, are about half that.
#[derive(Debug)]
struct Kept {
    pods: Chunks<PodOpRecord>,
    calls: Chunks<CriCall>,
    events: Chunks<PodEventRecord>,
    waits: Chunks<PodWaitRecord>,
    kernel: Chunks<KernelEvent>,
    runtime: Chunks<RuntimeSpan>,
    /// What `podlapse observe` saw of another client's pods.
    observed: Chunks<ObservedRecord>,
    /// The node's pod network, as each change was recorded.
    network: VecDeque<NodeNetworkRecord>,
    /// The recording's sources, as last recorded.
    sources: Option<SourcesRecord>,
    /// An observer's header: it marks the records as observed, for the builder and
    /// `diagnose`.
    observed_header: Option<Header>,
    observations: HashMap<String, u32>,
    last_status: Option<crate::cri::CriResponse>,
    /// Every pod the kept records name, by UID.
    marks: HashMap<String, PodMark>,
    forgotten: ForgottenIds,
    /// Pods forgotten so far, and of those the ones that went before their retention
    /// because more than [`MAX_DELETED_KEPT`] deleted pods were kept.
    forgotten_pods: u64,
    forgotten_early: u64,
    /// Counts the records kept: the timeline changes only when this does.
    generation: u64,
}

/// What the collector knows of a pod for forgetting it.
#[derive(Debug, Clone, Default)]
struct PodMark {
    /// The pod's config has it (its last change was not a removal); for another client's
    /// pod (an observer's), the runtime still has a sandbox of it.
    desired: bool,
    /// The newest time a kept record about it carries.
    last_ns: u64,
    /// Another client's pod: its sandboxes the runtime showed and has not removed, by
    /// [`id_hash`]. A pod whose old sandbox goes while a new one runs stays.
    live_sandboxes: Vec<u64>,
}

impl PodMark {
    /// What an observer's record says of the pod's sandboxes.
    fn observed(&mut self, o: &crate::trace::ObservedRecord) {
        if o.sandbox_id.is_empty() {
            return;
        }
        let h = id_hash(&o.sandbox_id);
        match o.what {
            Observation::SandboxRemoved => self.live_sandboxes.retain(|s| *s != h),
            Observation::ContainerRemoved => {}
            _ => {
                if !self.live_sandboxes.contains(&h) {
                    self.live_sandboxes.push(h);
                }
            }
        }
        self.desired = !self.live_sandboxes.is_empty();
    }
}

/// Recently forgotten IDs, oldest first, bounded. Kept as 64-bit hashes (SipHash with
/// fixed keys): a few flat arrays rather than a small string per ID, which, allocated one
/// by one among the records as pods went, kept heap pages from being returned long after
/// the records on them were freed. A false match needs a 64-bit collision.
#[derive(Debug, Default)]
struct ForgottenIds {
    order: VecDeque<u64>,
    ids: HashSet<u64>,
}

fn id_hash(id: &str) -> u64 {
    use std::hash::{Hash, Hasher};
    let mut h = std::hash::DefaultHasher::new();
    id.hash(&mut h);
    h.finish()
}

impl ForgottenIds {
    fn add(&mut self, id: &str) {
        let h = id_hash(id);
        if self.ids.insert(h) {
            self.order.push_back(h);
        }
        while self.order.len() > MAX_FORGOTTEN_IDS {
            if let Some(old) = self.order.pop_front() {
                self.ids.remove(&old);
            }
        }
    }

    fn contains(&self, id: &str) -> bool {
        !id.is_empty() && self.ids.contains(&id_hash(id))
    }

    fn remove(&mut self, id: &str) {
        let h = id_hash(id);
        if self.ids.remove(&h) {
            self.order.retain(|o| *o != h);
        }
    }
}

impl Kept {
    fn mark(&mut self, uid: &str, at_ns: u64) -> &mut PodMark {
        let mark = self.marks.entry(uid.to_string()).or_default();
        mark.last_ns = mark.last_ns.max(at_ns);
        mark
    }

    /// True for a record about a pod, sandbox or container forgotten already.
    fn is_forgotten(&self, record: &TraceRecord) -> bool {
        let f = &self.forgotten;
        match record {
            TraceRecord::Pod(p) => {
                p.op != PodOp::Add && f.contains(p.pod.metadata.uid.as_deref().unwrap_or(""))
            }
            TraceRecord::Event(e) => f.contains(&e.pod_uid),
            TraceRecord::Wait(w) => f.contains(&w.pod_uid),
            TraceRecord::Cri(c) => {
                f.contains(&c.pod_uid) || f.contains(&c.sandbox_id) || f.contains(&c.container_id)
            }
            TraceRecord::RuntimeSpan(s) => f.contains(&s.pod_uid),
            TraceRecord::Observed(o) => f.contains(o.pod_key()),
            _ => false,
        }
    }
}

impl Default for Kept {
    fn default() -> Kept {
        Kept {
            pods: Chunks::new(MAX_PODS),
            calls: Chunks::new(MAX_CALLS),
            events: Chunks::new(MAX_EVENTS),
            waits: Chunks::new(MAX_WAITS),
            kernel: Chunks::new(MAX_KERNEL),
            runtime: Chunks::new(MAX_RUNTIME_SPANS),
            observed: Chunks::new(MAX_OBSERVED),
            network: VecDeque::new(),
            sources: None,
            observed_header: None,
            observations: HashMap::new(),
            last_status: None,
            marks: HashMap::new(),
            forgotten: ForgottenIds::default(),
            forgotten_pods: 0,
            forgotten_early: 0,
            generation: 0,
        }
    }
}

/// What was kept at one moment, built into a timeline without holding the collector.
struct Frozen {
    pods: Snapshot<PodOpRecord>,
    calls: Snapshot<CriCall>,
    events: Snapshot<PodEventRecord>,
    waits: Snapshot<PodWaitRecord>,
    kernel: Snapshot<KernelEvent>,
    runtime: Snapshot<RuntimeSpan>,
    observed: Snapshot<ObservedRecord>,
    sources: Option<SourcesRecord>,
    /// The records are an observer's (the pods are another client's).
    observing: bool,
}

impl Frozen {
    fn of(kept: &Kept) -> Frozen {
        Frozen {
            pods: kept.pods.snapshot(),
            calls: kept.calls.snapshot(),
            events: kept.events.snapshot(),
            waits: kept.waits.snapshot(),
            kernel: kept.kernel.snapshot(),
            runtime: kept.runtime.snapshot(),
            observed: kept.observed.snapshot(),
            sources: kept.sources.clone(),
            observing: kept.observed_header.is_some(),
        }
    }

    fn index(&self) -> Index<'_> {
        // Positions as in `Collector::records`.
        let refs = self
            .pods
            .iter()
            .map(Ref::Pod)
            .chain(self.calls.iter().map(Ref::Cri))
            .chain(self.events.iter().map(Ref::Event))
            .chain(self.waits.iter().map(Ref::Wait))
            .chain(self.kernel.iter().map(Ref::Kernel))
            .chain(self.runtime.iter().map(Ref::RuntimeSpan))
            .chain(self.observed.iter().map(Ref::Observed))
            .chain(self.sources.iter().map(Ref::Sources))
            .enumerate();
        let mut index = Index::of(refs);
        if self.observing {
            index.learn_cni_pods();
        }
        index
    }

    fn timeline(&self, wanted: &dyn Fn(&str) -> bool) -> Timeline {
        super::build_index(&self.index(), wanted)
    }

    /// Where the kernel events start among the positions, and how many there are.
    fn kernel_range(&self) -> (usize, usize) {
        let base = self.pods.len() + self.calls.len() + self.events.len() + self.waits.len();
        (base, self.kernel.len())
    }
}

/// The agent's in-memory record of a run. Cheap to share; every method takes `&self`.
#[derive(Debug, Default)]
pub struct Collector {
    kept: Mutex<Kept>,
    /// Held for a whole [`Collector::forget_deleted`]: one pass at a time.
    forgetting: Mutex<()>,
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
        if kept.is_forgotten(record) {
            return;
        }
        match record {
            TraceRecord::Pod(p) => {
                if let Some(uid) = p.pod.metadata.uid.as_deref() {
                    if p.op == PodOp::Add {
                        // The same pod again (a manifest put back): no longer forgotten.
                        kept.forgotten.remove(uid);
                    }
                    kept.mark(uid, p.at_ns).desired = p.op != PodOp::Remove;
                }
                kept.pods.push(kept_pod_op(p))
            }
            TraceRecord::Event(e) => {
                kept.mark(&e.pod_uid, e.at_ns);
                kept.events.push(e.clone())
            }
            TraceRecord::Wait(w) => {
                kept.mark(&w.pod_uid, w.end_ns);
                kept.waits.push(w.clone())
            }
            TraceRecord::Kernel(e) => kept.kernel.push(kept_kernel_event(e)),
            TraceRecord::RuntimeSpan(s) => kept.runtime.push((**s).clone()),
            TraceRecord::Observed(o) => {
                kept.mark(o.pod_key(), o.at_ns).observed(o);
                kept.observed.push(o.clone())
            }
            TraceRecord::Network(n) => {
                if kept.network.len() == MAX_NETWORK {
                    kept.network.pop_front();
                }
                kept.network.push_back((**n).clone());
            }
            TraceRecord::Sources(s) => kept.sources = Some(s.clone()),
            TraceRecord::Header(h) if h.observed.is_some() => {
                kept.observed_header = Some(h.clone())
            }
            // The runtime's status is node-wide and polled on every sync: keep an answer
            // only when it differs from the last one kept, so a diagnosis can still show
            // when NetworkReady turned false and why.
            TraceRecord::Cri(c) if c.method == CriMethod::Status => {
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
                if !c.pod_uid.is_empty() {
                    kept.mark(&c.pod_uid, c.end_ns.max(c.start_ns));
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

    /// Everything kept, each kind in the order it arrived (an observer's header first).
    pub fn records(&self) -> Vec<TraceRecord> {
        let kept = self.lock();
        let len = usize::from(kept.observed_header.is_some())
            + usize::from(kept.sources.is_some())
            + kept.observed.len()
            + kept.pods.len()
            + kept.calls.len()
            + kept.events.len()
            + kept.waits.len()
            + kept.kernel.len()
            + kept.runtime.len()
            + kept.network.len();
        let mut out = Vec::with_capacity(len);
        out.extend(
            kept.observed_header
                .iter()
                .cloned()
                .map(TraceRecord::Header),
        );
        out.extend(kept.pods.iter().cloned().map(TraceRecord::Pod));
        out.extend(kept.calls.iter().cloned().map(TraceRecord::Cri));
        out.extend(kept.events.iter().cloned().map(TraceRecord::Event));
        out.extend(kept.waits.iter().cloned().map(TraceRecord::Wait));
        out.extend(kept.kernel.iter().cloned().map(TraceRecord::Kernel));
        out.extend(
            kept.runtime
                .iter()
                .cloned()
                .map(|s| TraceRecord::RuntimeSpan(Box::new(s))),
        );
        out.extend(kept.observed.iter().cloned().map(TraceRecord::Observed));
        out.extend(
            kept.network
                .iter()
                .cloned()
                .map(|n| TraceRecord::Network(Box::new(n))),
        );
        out.extend(kept.sources.iter().cloned().map(TraceRecord::Sources));
        out
    }

    /// Grows with every record kept or let go: unchanged, the same timeline.
    pub fn generation(&self) -> u64 {
        self.lock().generation
    }

    /// The recording's sources, as last recorded.
    pub fn sources(&self) -> Option<SourcesRecord> {
        self.lock().sources.clone()
    }

    /// The node's pod network as last recorded.
    pub fn last_network(&self) -> Option<NodeNetworkRecord> {
        self.lock().network.back().cloned()
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

impl Collector {
    /// Forgets the pods that left the config (or were only ever named by the runtime)
    /// and have had no record for `retention_ns` before `now_ns`, and, beyond
    /// [`MAX_DELETED_KEPT`] such pods, the longest gone. Returns their timeline, built
    /// before they went, and their UIDs. Kernel events owned by no remaining pod go too once older than
    /// the retention, unless they fall around a remaining pod's work.
    ///
    /// The timeline is built outside the lock, from a snapshot; records kept meanwhile
    /// stay unless they name a forgotten pod.
    pub fn forget_deleted(&self, now_ns: u64, retention_ns: u64) -> Forgotten {
        let _one_pass = self.forgetting.lock().unwrap_or_else(|e| e.into_inner());
        let old_before = now_ns.saturating_sub(retention_ns);
        let (frozen, gone, popped, early) = {
            let kept = self.lock();
            let mut undesired: Vec<(u64, &String)> = kept
                .marks
                .iter()
                .filter(|(_, m)| !m.desired)
                .map(|(uid, m)| (m.last_ns, uid))
                .collect();
            undesired.sort_unstable();
            let over = undesired.len().saturating_sub(MAX_DELETED_KEPT);
            let early = undesired
                .iter()
                .take(over)
                .filter(|(last, _)| *last >= old_before)
                .count();
            let gone: BTreeSet<String> = undesired
                .iter()
                .enumerate()
                .filter(|(i, (last, _))| *i < over || *last < old_before)
                .map(|(_, (_, uid))| (*uid).clone())
                .collect();
            if gone.is_empty() {
                return Forgotten::default();
            }
            (Frozen::of(&kept), gone, kept.kernel.popped(), early)
        };
        let index = frozen.index();
        let attribution = super::attribution::attribute(&index);
        let (base, len) = frozen.kernel_range();
        let plan = super::forget::plan(&index, &attribution, base, len, &gone, old_before);
        // The snapshot goes before the queues are filtered: while it shares their chunks,
        // each would be copied rather than filtered in place.
        drop(index);
        drop(attribution);
        drop(frozen);
        let mut kept = self.lock();
        // A pod added again since the snapshot stays, and so does every kernel event this
        // pass: the plan counted it as gone.
        let revived = gone
            .iter()
            .any(|uid| kept.marks.get(uid).is_some_and(|m| m.desired));
        let gone: BTreeSet<String> = gone
            .into_iter()
            .filter(|uid| kept.marks.get(uid).is_none_or(|m| !m.desired))
            .collect();
        let named = |c: &CriCall| {
            gone.contains(&c.pod_uid)
                || plan.sandboxes.contains(&c.sandbox_id)
                || plan.containers.contains(&c.container_id)
        };
        kept.pods.retain(|_, p| {
            !p.pod
                .metadata
                .uid
                .as_ref()
                .is_some_and(|uid| gone.contains(uid))
        });
        kept.calls.retain(|_, c| !named(c));
        kept.events.retain(|_, e| !gone.contains(&e.pod_uid));
        kept.waits.retain(|_, w| !gone.contains(&w.pod_uid));
        kept.runtime.retain(|_, s| !gone.contains(&s.pod_uid));
        kept.observed.retain(|_, o| !gone.contains(o.pod_key()));
        if !revived {
            let shift = (kept.kernel.popped() - popped) as usize;
            kept.kernel
                .retain(|i, _| !plan.drop_kernel.get(i + shift).copied().unwrap_or(false));
        }
        kept.observations.retain(|key, _| {
            let id = key.split_once(':').map_or("", |(_, id)| id);
            !(gone.contains(id) || plan.sandboxes.contains(id) || plan.containers.contains(id))
        });
        for uid in &gone {
            kept.marks.remove(uid);
            kept.forgotten.add(uid);
        }
        for id in plan.sandboxes.iter().chain(&plan.containers) {
            kept.forgotten.add(id);
        }
        // The maps held an entry per pod at the churn's height: give the space back.
        kept.marks.shrink_to_fit();
        kept.observations.shrink_to_fit();
        kept.forgotten_pods += gone.len() as u64;
        kept.forgotten_early += early as u64;
        kept.generation += 1;
        let mut timeline = plan.timeline;
        timeline.pods.retain(|p| gone.contains(&p.uid));
        Forgotten {
            uids: gone.into_iter().collect(),
            timeline,
        }
    }

    /// How many pods the kept records name, and how many of those left the config.
    pub fn pods_kept(&self) -> (usize, usize) {
        let stats = self.stats();
        (stats.pods, stats.deleted_pods)
    }

    /// What is kept and what went, for `/metrics`.
    pub fn stats(&self) -> CollectorStats {
        let kept = self.lock();
        CollectorStats {
            pods: kept.marks.len(),
            deleted_pods: kept.marks.values().filter(|m| !m.desired).count(),
            forgotten_pods: kept.forgotten_pods,
            forgotten_early: kept.forgotten_early,
            evicted: [
                ("pod", kept.pods.popped()),
                ("cri", kept.calls.popped()),
                ("event", kept.events.popped()),
                ("wait", kept.waits.popped()),
                ("kernel", kept.kernel.popped()),
                ("runtime_span", kept.runtime.popped()),
                ("observed", kept.observed.popped()),
            ],
        }
    }
}

/// The pods one [`Collector::forget_deleted`] forgot.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Forgotten {
    pub uids: Vec<String>,
    /// Their timeline as it was, for the pods that had stages.
    pub timeline: Timeline,
}

/// Counts of what the collector keeps and what it let go.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CollectorStats {
    /// Pods the kept records name.
    pub pods: usize,
    /// Of those, the ones no longer in the config, kept for the retention.
    pub deleted_pods: usize,
    /// Deleted pods forgotten so far.
    pub forgotten_pods: u64,
    /// Of those, the ones forgotten before their retention ended, at the bound.
    pub forgotten_early: u64,
    /// Records dropped at each kind's cap, oldest first, by record kind.
    pub evicted: [(&'static str, u64); 7],
}

/// A pod change as kept: of a removal, the builder and `diagnose` read only which pod
/// and when, so its spec (a few KiB per pod) is left to the trace.
/// A kernel event as the collector keeps it: a runtime program's arguments only as far
/// as the builder reads them (its command and ID), which for runc is a tenth of them.
fn kept_kernel_event(e: &KernelEvent) -> KernelEvent {
    match e {
        KernelEvent::RuntimeExec(r) => match super::runtime_args::compact(&r.argv, r.head_cut) {
            Some(argv) => KernelEvent::RuntimeExec(Box::new(crate::ebpf::event::RuntimeExec {
                meta: r.meta.clone(),
                argv,
                head_cut: false,
                unreadable: r.unreadable,
                forked_ns: r.forked_ns,
            })),
            None => e.clone(),
        },
        _ => e.clone(),
    }
}

fn kept_pod_op(p: &PodOpRecord) -> PodOpRecord {
    if p.op != PodOp::Remove {
        return p.clone();
    }
    PodOpRecord {
        at_ns: p.at_ns,
        op: p.op,
        pod: std::sync::Arc::new(Pod {
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
