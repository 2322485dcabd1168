//! The records of a run, indexed: the pods the agent ran, what CRI said about which
//! sandbox and container belongs to which pod, and every source in time order.

use std::collections::BTreeMap;

use k8s_openapi::api::core::v1::Pod;

use crate::cri::CriCall;
use crate::ebpf::KernelEvent;
use crate::ebpf::event::cni_args_value;
use crate::trace::{
    Observation, ObservedRecord, PodEventRecord, PodOp, PodOpRecord, PodWaitRecord, SourcesRecord,
    TraceRecord,
};
use podlapse_core::record::RuntimeSpan;

/// A pod the agent ran.
#[derive(Debug, Clone)]
pub(super) struct PodInfo<'a> {
    pub namespace: String,
    pub name: String,
    /// The latest spec the config gave, if the records carry one.
    pub pod: Option<&'a Pod>,
    /// The first ADD.
    pub seen_ns: Option<u64>,
}

/// A container as CRI named it.
#[derive(Debug, Clone, Copy)]
pub(super) struct ContainerRef<'a> {
    pub pod_uid: &'a str,
    pub sandbox_id: &'a str,
}

pub(super) struct Index<'a> {
    /// By UID.
    pub pods: BTreeMap<String, PodInfo<'a>>,
    /// Sandbox ID to pod UID.
    pub sandboxes: BTreeMap<&'a str, &'a str>,
    pub containers: BTreeMap<&'a str, ContainerRef<'a>>,
    /// Each pod's calls, ordered by start, then end, then record order.
    cri: BTreeMap<String, Vec<&'a CriCall>>,
    /// Each pod's events, ordered by time, then record order.
    events: BTreeMap<String, Vec<&'a PodEventRecord>>,
    /// Each pod's waits, ordered by start, then record order.
    waits: BTreeMap<String, Vec<&'a PodWaitRecord>>,
    /// With their index in the input, ordered by time, then input order.
    pub kernel: Vec<(usize, &'a KernelEvent)>,
    /// Each pod's runtime spans, in record order.
    runtime: BTreeMap<String, Vec<&'a RuntimeSpan>>,
    /// Each observed pod's sandbox and container changes (`podlapse observe`), ordered
    /// by when they happened, then record order.
    observed: BTreeMap<String, Vec<&'a ObservedRecord>>,
    /// The recording's sources: the last `sources` record (the one written at its end,
    /// when it ended).
    pub sources: Option<&'a SourcesRecord>,
}

/// A record the builder reads, borrowed from wherever it is kept.
#[derive(Debug, Clone, Copy)]
pub(super) enum Ref<'a> {
    Pod(&'a PodOpRecord),
    Cri(&'a CriCall),
    Event(&'a PodEventRecord),
    Wait(&'a PodWaitRecord),
    Kernel(&'a KernelEvent),
    RuntimeSpan(&'a RuntimeSpan),
    Observed(&'a ObservedRecord),
    Sources(&'a SourcesRecord),
}

impl<'a> Index<'a> {
    pub fn new(records: &'a [TraceRecord]) -> Index<'a> {
        let observed = records
            .iter()
            .any(|r| matches!(r, TraceRecord::Header(h) if h.observed.is_some()));
        let mut index = Index::of(records.iter().enumerate().filter_map(|(i, r)| {
            let r = match r {
                TraceRecord::Pod(p) => Ref::Pod(p),
                TraceRecord::Cri(c) => Ref::Cri(c),
                TraceRecord::Event(e) => Ref::Event(e),
                TraceRecord::Wait(w) => Ref::Wait(w),
                TraceRecord::Kernel(k) => Ref::Kernel(k),
                TraceRecord::RuntimeSpan(s) => Ref::RuntimeSpan(s),
                TraceRecord::Observed(o) => Ref::Observed(o),
                TraceRecord::Sources(s) => Ref::Sources(s),
                TraceRecord::Header(_)
                | TraceRecord::Status(_)
                | TraceRecord::Stage(_)
                | TraceRecord::Network(_)
                | TraceRecord::Footer(_) => return None,
            };
            Some((i, r))
        }));
        if observed {
            index.learn_cni_pods();
        }
        index
    }

    /// In an observed trace, the pods the kernel saw CNI plugins run for, by the
    /// `K8S_POD_*` arguments the runtime passes them: a pod whose every RunPodSandbox
    /// failed has no sandbox the runtime kept, so nothing else names it. (In a trace of
    /// podlapse's own pods, another client's pods stay out.)
    pub(super) fn learn_cni_pods(&mut self) {
        for (_, e) in &self.kernel {
            let KernelEvent::CniExec(c) = e else {
                continue;
            };
            let Some(uid) = cni_args_value(&c.args, "K8S_POD_UID") else {
                continue;
            };
            self.pods.entry(uid).or_insert_with(|| PodInfo {
                namespace: c.pod_namespace.clone().unwrap_or_default(),
                name: c.pod_name.clone().unwrap_or_default(),
                pod: None,
                seen_ns: None,
            });
        }
    }

    /// The index of `records`, each with its position in the run's records (what an
    /// [`super::Attribution`] names a kernel event by), in record order.
    pub fn of(records: impl IntoIterator<Item = (usize, Ref<'a>)>) -> Index<'a> {
        let mut index = Index {
            pods: BTreeMap::new(),
            sandboxes: BTreeMap::new(),
            containers: BTreeMap::new(),
            cri: BTreeMap::new(),
            events: BTreeMap::new(),
            waits: BTreeMap::new(),
            kernel: Vec::new(),
            runtime: BTreeMap::new(),
            observed: BTreeMap::new(),
            sources: None,
        };
        let mut cri: Vec<&'a CriCall> = Vec::new();
        let mut observed: Vec<&'a ObservedRecord> = Vec::new();
        let mut events: Vec<&'a PodEventRecord> = Vec::new();
        for (i, r) in records {
            match r {
                Ref::Pod(p) => index.pod_op(p.op, p.at_ns, &p.pod),
                Ref::Cri(c) => cri.push(c),
                Ref::Event(e) => events.push(e),
                Ref::Wait(w) => index.waits.entry(w.pod_uid.clone()).or_default().push(w),
                Ref::Kernel(k) => index.kernel.push((i, k)),
                Ref::RuntimeSpan(s) => index.runtime.entry(s.pod_uid.clone()).or_default().push(s),
                Ref::Observed(o) => observed.push(o),
                Ref::Sources(s) => index.sources = Some(s),
            }
        }
        observed.sort_by_key(|o| o.happened_ns());
        for o in observed {
            index.learn_observed(o);
        }
        // Stable sorts keep record order among equal times, so the result does not
        // depend on how the sort breaks ties.
        cri.sort_by_key(|c| (c.start_ns, c.end_ns));
        events.sort_by_key(|e| e.at_ns);
        for waits in index.waits.values_mut() {
            waits.sort_by_key(|w| w.start_ns);
        }
        index.kernel.sort_by_key(|(_, k)| k.ktime_ns());
        for c in cri {
            index.learn_ids(c);
            if !c.pod_uid.is_empty() {
                index.cri.entry(c.pod_uid.clone()).or_default().push(c);
            }
        }
        for e in events {
            let info = index
                .pods
                .entry(e.pod_uid.clone())
                .or_insert_with(|| PodInfo {
                    namespace: String::new(),
                    name: String::new(),
                    pod: None,
                    seen_ns: None,
                });
            if info.name.is_empty() {
                info.namespace = e.namespace.clone();
                info.name = e.name.clone();
            }
            index.events.entry(e.pod_uid.clone()).or_default().push(e);
        }
        index
    }

    fn pod_op(&mut self, op: PodOp, at_ns: u64, pod: &'a Pod) {
        let Some(uid) = pod.metadata.uid.clone() else {
            return;
        };
        let info = self.pods.entry(uid).or_insert_with(|| PodInfo {
            namespace: pod
                .metadata
                .namespace
                .clone()
                .unwrap_or_else(|| "default".into()),
            name: pod.metadata.name.clone().unwrap_or_default(),
            pod: None,
            seen_ns: None,
        });
        if op != PodOp::Remove {
            info.pod = Some(pod);
        }
        if op == PodOp::Add && info.seen_ns.is_none_or(|t| at_ns < t) {
            info.seen_ns = Some(at_ns);
        }
    }

    /// What the runtime reported to an observer: the pod (by kubelet's labels, else by
    /// its sandbox) and which sandbox and container are its.
    fn learn_observed(&mut self, o: &'a ObservedRecord) {
        let key = o.pod_key();
        let info = self.pods.entry(key.to_string()).or_insert_with(|| PodInfo {
            namespace: String::new(),
            name: String::new(),
            pod: None,
            seen_ns: None,
        });
        if info.name.is_empty() {
            info.namespace = o.namespace.clone();
            info.name = o.name.clone();
        }
        // A sandbox without kubelet's labels is keyed by itself, so its kernel events
        // reach it through its ID like any pod's.
        let owner = key;
        if !o.sandbox_id.is_empty() {
            self.sandboxes.entry(o.sandbox_id.as_str()).or_insert(owner);
        }
        if !o.container_id.is_empty() && o.what != Observation::SandboxReady {
            self.containers
                .entry(o.container_id.as_str())
                .or_insert(ContainerRef {
                    pod_uid: owner,
                    sandbox_id: o.sandbox_id.as_str(),
                });
        }
        self.observed.entry(key.to_string()).or_default().push(o);
    }

    /// What a call says about which pod a sandbox or container belongs to. Only the
    /// runtime's own answers count: the ID a create returned, or a status naming the pod.
    fn learn_ids(&mut self, c: &'a CriCall) {
        if c.pod_uid.is_empty() {
            return;
        }
        if !self.pods.contains_key(&c.pod_uid) {
            self.pods.insert(
                c.pod_uid.clone(),
                PodInfo {
                    namespace: String::new(),
                    name: String::new(),
                    pod: None,
                    seen_ns: None,
                },
            );
        }
        if !c.sandbox_id.is_empty() {
            self.sandboxes
                .entry(c.sandbox_id.as_str())
                .or_insert(c.pod_uid.as_str());
        }
        if !c.container_id.is_empty() && !c.container.is_empty() {
            self.containers
                .entry(c.container_id.as_str())
                .or_insert(ContainerRef {
                    pod_uid: c.pod_uid.as_str(),
                    sandbox_id: c.sandbox_id.as_str(),
                });
        }
    }

    /// The pod's CRI calls, in order.
    pub fn calls_of(&self, uid: &str) -> impl Iterator<Item = &'a CriCall> + '_ {
        self.cri.get(uid).into_iter().flatten().copied()
    }

    /// The pod's waits, in order of their start.
    pub fn waits_of(&self, uid: &str) -> impl Iterator<Item = &'a PodWaitRecord> + '_ {
        self.waits.get(uid).into_iter().flatten().copied()
    }

    /// The spans the runtime sent about the pod, in record order.
    pub fn runtime_spans_of(&self, uid: &str) -> &[&'a RuntimeSpan] {
        self.runtime.get(uid).map_or(&[], Vec::as_slice)
    }

    /// The observed pod's sandbox and container changes, in the order they happened.
    pub fn observed_of(&self, uid: &str) -> &[&'a ObservedRecord] {
        self.observed.get(uid).map_or(&[], Vec::as_slice)
    }

    /// The pod's events, in order.
    pub fn events_of(&self, uid: &str) -> impl Iterator<Item = &'a PodEventRecord> + '_ {
        self.events.get(uid).into_iter().flatten().copied()
    }
}
