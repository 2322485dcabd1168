//! The records a diagnosis reads, gathered per pod: its timeline, spec, CRI calls and
//! events; the runtime's Status answers; and every CNI plugin run the kernel saw, by
//! sandbox, with its exit.

use std::collections::BTreeMap;

use k8s_openapi::api::core::v1::Pod;

use podlapse_core::record::CriMethod;

use crate::cri::CriCall;
use crate::ebpf::KernelEvent;
use crate::timeline::{PodTimeline, Stage, StageKind, Timeline};
use crate::trace::{NodeNetworkRecord, Observation, PodEventRecord, PodOp, TraceRecord};

use super::network::LOOK_LAG_NS;

/// One CNI plugin exec the kernel saw.
#[derive(Debug, Clone)]
pub(super) struct CniRun {
    pub command: String,
    pub plugin: String,
    pub at_ns: u64,
}

pub(super) struct PodFacts<'a> {
    pub timeline: &'a PodTimeline,
    pub spec: Option<&'a Pod>,
    pub removed_ns: Option<u64>,
    /// Another client's pod whose every sandbox the runtime removed: when the last went.
    pub sandboxes_removed_ns: Option<u64>,
    /// In start order.
    pub calls: Vec<&'a CriCall>,
    /// In time order.
    pub events: Vec<&'a PodEventRecord>,
    /// An observer saw the pod's sandbox on the node's network.
    pub observed_host_network: bool,
    /// An observer found the pod's sandbox already there when it started: its startup
    /// (and so its `running` stage) was not seen.
    pub before_start: bool,
}

/// When the last of a pod's sandboxes was removed, if every one was.
fn all_removed(sandboxes: &BTreeMap<&str, Option<u64>>) -> Option<u64> {
    sandboxes
        .values()
        .try_fold(None, |last: Option<u64>, r| Some(last.max(Some((*r)?))))
        .flatten()
}

impl<'a> PodFacts<'a> {
    /// On the host's network: by its spec, or, for another client's pod, by its sandbox
    /// (network namespace mode NODE), as kubelet tells it.
    pub fn host_network(&self) -> bool {
        self.observed_host_network
            || self
                .spec
                .and_then(|p| p.spec.as_ref())
                .and_then(|s| s.host_network)
                .unwrap_or(false)
    }

    pub fn calls_named<'s>(&'s self, method: CriMethod) -> impl Iterator<Item = &'a CriCall> + 's {
        self.calls
            .iter()
            .copied()
            .filter(move |c| c.method == method)
    }

    pub fn events_named<'s>(
        &'s self,
        reason: &'s str,
    ) -> impl Iterator<Item = &'a PodEventRecord> + 's {
        self.events
            .iter()
            .copied()
            .filter(move |e| e.event.reason == reason)
    }

    /// The pod's stages of `kind`, in timeline order.
    pub fn stages(&self, kind: StageKind) -> impl Iterator<Item = &'a Stage> {
        self.timeline
            .stages
            .iter()
            .filter(move |s| *s.kind() == kind)
    }

    /// Milliseconds after pod_seen, for evidence lines.
    pub fn at(&self, t: u64) -> String {
        match self.timeline.seen_ns {
            Some(seen) if t >= seen => format!("+{:.0} ms", (t - seen) as f64 / 1e6),
            Some(seen) => format!("-{:.0} ms", (seen - t) as f64 / 1e6),
            None => format!("at {:.3} s", t as f64 / 1e9),
        }
    }
}

pub(super) struct Facts<'a> {
    /// The node's IP, as the recording agent knew it.
    pub host_ip: Option<String>,
    /// Whether the probes reported anything: without them, absence proves nothing.
    pub kernel: bool,
    pub lost_events: u64,
    /// The runtime's Status answers (NetworkReady, RuntimeReady), in time order.
    pub status: Vec<&'a CriCall>,
    /// The pod of each sandbox the records know, as `namespace/name`.
    pub owners: BTreeMap<String, String>,
    /// The node's pod network as each change was recorded, in time order.
    pub network: Vec<&'a NodeNetworkRecord>,
    /// CNI runs by the sandbox ID they were given (`CNI_CONTAINERID`), in time order.
    pub cni: BTreeMap<&'a str, Vec<CniRun>>,
    /// Process exits by PID: (time, exit code, signal), in time order.
    exits: Exits,
    pub pods: Vec<PodFacts<'a>>,
}

impl<'a> Facts<'a> {
    pub fn new(records: &'a [TraceRecord], timeline: &'a Timeline) -> Facts<'a> {
        let mut host_ip = None;
        let mut lost_events = 0;
        let mut specs: BTreeMap<&str, &Pod> = BTreeMap::new();
        let mut removed: BTreeMap<&str, u64> = BTreeMap::new();
        let mut calls: BTreeMap<&str, Vec<&CriCall>> = BTreeMap::new();
        let mut events: BTreeMap<&str, Vec<&PodEventRecord>> = BTreeMap::new();
        let mut status = Vec::new();
        let mut kernel: Vec<&KernelEvent> = Vec::new();
        let mut network = Vec::new();
        let mut host_network: std::collections::BTreeSet<&str> = Default::default();
        let mut before_start: std::collections::BTreeSet<&str> = Default::default();
        // By observed pod, each sandbox the runtime showed and when it was removed.
        let mut sandboxes: BTreeMap<&str, BTreeMap<&str, Option<u64>>> = BTreeMap::new();
        for r in records {
            match r {
                TraceRecord::Header(h) => {
                    host_ip = h.config.node_ip().map(str::to_string);
                }
                TraceRecord::Footer(f) => lost_events = f.lost_events,
                TraceRecord::Pod(p) => {
                    let Some(uid) = p.pod.metadata.uid.as_deref() else {
                        continue;
                    };
                    match p.op {
                        PodOp::Remove => {
                            removed.entry(uid).or_insert(p.at_ns);
                        }
                        PodOp::Add | PodOp::Update => {
                            specs.insert(uid, &p.pod);
                        }
                    }
                }
                TraceRecord::Cri(c) if c.method == CriMethod::Status => status.push(c),
                TraceRecord::Cri(c) if !c.pod_uid.is_empty() => {
                    calls.entry(c.pod_uid.as_str()).or_default().push(c);
                }
                TraceRecord::Event(e) => events.entry(e.pod_uid.as_str()).or_default().push(e),
                TraceRecord::Kernel(k) => kernel.push(k),
                TraceRecord::Network(n) => network.push(&**n),
                TraceRecord::Observed(o) => {
                    if o.host_network {
                        host_network.insert(o.pod_key());
                    }
                    if o.before_start && o.what == Observation::SandboxReady {
                        before_start.insert(o.pod_key());
                    }
                    let removed = sandboxes
                        .entry(o.pod_key())
                        .or_default()
                        .entry(o.sandbox_id.as_str())
                        .or_default();
                    match o.what {
                        Observation::SandboxRemoved => *removed = Some(o.at_ns),
                        Observation::SandboxReady => *removed = None,
                        _ => {}
                    }
                }
                _ => {}
            }
        }
        status.sort_by_key(|c| c.start_ns);
        for v in calls.values_mut() {
            v.sort_by_key(|c| (c.start_ns, c.end_ns));
        }
        for v in events.values_mut() {
            v.sort_by_key(|e| e.at_ns);
        }
        kernel.sort_by_key(|k| k.ktime_ns());
        network.sort_by_key(|n| n.at_ns);
        let pods = timeline
            .pods
            .iter()
            .map(|t| PodFacts {
                timeline: t,
                spec: specs.get(t.uid.as_str()).copied(),
                removed_ns: removed.get(t.uid.as_str()).copied(),
                sandboxes_removed_ns: sandboxes.get(t.uid.as_str()).and_then(all_removed),
                calls: calls.remove(t.uid.as_str()).unwrap_or_default(),
                events: events.remove(t.uid.as_str()).unwrap_or_default(),
                observed_host_network: host_network.contains(t.uid.as_str()),
                before_start: before_start.contains(t.uid.as_str()),
            })
            .collect();
        let exits = exits(&kernel);
        let owners = timeline
            .pods
            .iter()
            .flat_map(|t| {
                let name = format!("{}/{}", t.namespace, t.name);
                t.sandbox_ids
                    .iter()
                    .map(move |id| (id.clone(), name.clone()))
            })
            .collect();
        Facts {
            owners,
            host_ip,
            kernel: !kernel.is_empty(),
            lost_events,
            status,
            network,
            cni: cni_runs(&kernel),
            exits,
            pods,
        }
    }

    /// The first exit of process `pid` at or after `t`: (time, exit code, signal).
    pub fn exit_of(&self, pid: u32, t: u64) -> Option<(u64, Option<i32>, Option<i32>)> {
        self.exits
            .get(&pid)?
            .iter()
            .find(|(at, _, _)| *at >= t)
            .copied()
    }

    /// The looks at the node's network that can tell how it was at `t`: the last one at
    /// or before it, then those up to [`LOOK_LAG_NS`] after it (looks come once a second,
    /// so a change just before `t` shows in the next). The first of them that shows
    /// `what` is the one to quote; else the one at `t`.
    pub fn network_near(
        &self,
        t: u64,
        what: impl Fn(&NodeNetworkRecord) -> bool,
    ) -> Option<&'a NodeNetworkRecord> {
        let until = t.saturating_add(LOOK_LAG_NS);
        let before = self.network.iter().copied().rfind(|n| n.at_ns <= t);
        let after = self
            .network
            .iter()
            .copied()
            .filter(move |n| n.at_ns > t && n.at_ns <= until);
        let mut near = before.into_iter().chain(after);
        let first = before.or_else(|| self.network.iter().copied().find(|n| n.at_ns > t));
        near.find(|n| what(n)).or(first)
    }

    /// The node's network as last recorded.
    pub fn network_last(&self) -> Option<&'a NodeNetworkRecord> {
        self.network.last().copied()
    }

    /// Whether a CNI DEL ran for sandbox `id` after its last ADD: the runtime tore the
    /// attempt's network down (it does when RunPodSandbox fails after the ADD).
    pub fn deleted_after_add(&self, id: &str) -> bool {
        let Some(runs) = self.cni.get(id) else {
            return false;
        };
        let Some(add) = runs.iter().rfind(|r| r.command == "ADD") else {
            return false;
        };
        runs.iter()
            .any(|r| r.command == "DEL" && r.at_ns >= add.at_ns)
    }

    /// The runtime's last Status answer at or before `t` that said NetworkReady=false.
    pub fn network_not_ready_before(&self, t: u64) -> Option<&'a CriCall> {
        self.status
            .iter()
            .copied()
            .rfind(|c| c.start_ns <= t && c.response.network_ready().is_some_and(|n| !n.status))
    }
}

type Exits = BTreeMap<u32, Vec<(u64, Option<i32>, Option<i32>)>>;

fn exits(kernel: &[&KernelEvent]) -> Exits {
    let mut exits = Exits::new();
    for e in kernel {
        if let KernelEvent::Exit {
            meta,
            exit_code,
            signal,
        } = e
        {
            exits
                .entry(meta.tgid)
                .or_default()
                .push((meta.ktime_ns, *exit_code, *signal));
        }
    }
    exits
}

/// Plugin runs by the sandbox ID they were given. (Their exits are in the timeline's
/// `cni_plugin` stages.)
fn cni_runs<'a>(kernel: &[&'a KernelEvent]) -> BTreeMap<&'a str, Vec<CniRun>> {
    let mut out: BTreeMap<&str, Vec<CniRun>> = BTreeMap::new();
    for e in kernel {
        let KernelEvent::CniExec(c) = e else {
            continue;
        };
        if c.container_id.is_empty() {
            continue;
        }
        out.entry(c.container_id.as_str())
            .or_default()
            .push(CniRun {
                command: c.command.clone(),
                plugin: c.plugin.clone(),
                at_ns: c.meta.ktime_ns,
            });
    }
    out
}
