//! The records a diagnosis reads, gathered per pod: its timeline, spec, CRI calls and
//! events; the runtime's Status answers; and every CNI plugin run the kernel saw, by
//! sandbox, with its exit.

use std::collections::BTreeMap;

use k8s_openapi::api::core::v1::Pod;

use podtrace_core::record::CriMethod;

use crate::cri::CriCall;
use crate::ebpf::KernelEvent;
use crate::timeline::{PodTimeline, Stage, StageKind, Timeline};
use crate::trace::{PodEventRecord, PodOp, TraceRecord};

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
    /// In start order.
    pub calls: Vec<&'a CriCall>,
    /// In time order.
    pub events: Vec<&'a PodEventRecord>,
}

impl<'a> PodFacts<'a> {
    pub fn host_network(&self) -> bool {
        self.spec
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
        let pods = timeline
            .pods
            .iter()
            .map(|t| PodFacts {
                timeline: t,
                spec: specs.get(t.uid.as_str()).copied(),
                removed_ns: removed.get(t.uid.as_str()).copied(),
                calls: calls.remove(t.uid.as_str()).unwrap_or_default(),
                events: events.remove(t.uid.as_str()).unwrap_or_default(),
            })
            .collect();
        let exits = exits(&kernel);
        Facts {
            host_ip,
            kernel: !kernel.is_empty(),
            lost_events,
            status,
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

    /// The runtime's last Status answer at or before `t` that said NetworkReady=false.
    pub fn network_not_ready_before(&self, t: u64) -> Option<&'a CriCall> {
        self.status.iter().copied().rfind(|c| {
            c.start_ns <= t && c.response.get("NetworkReady").map(String::as_str) == Some("false")
        })
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
