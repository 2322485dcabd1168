//! How long the agent took to see a container's state change: from the kernel event that
//! changed it (the container's first exec, its main process's exit) to the first status
//! the agent published with the change (a `status` record whose container state is
//! running, or terminated). Both ends are CLOCK_MONOTONIC, so the difference needs no
//! conversion. Pure: the same records always give the same samples.

use std::collections::BTreeMap;

use k8s_openapi::api::core::v1::ContainerStatus;
use serde::Serialize;

use podlapse_core::record::CriMethod;

use super::attribution::{Rule, attribute};
use super::ids::is_runtime_helper_exec;
use super::index::Index;
use crate::ebpf::KernelEvent;
use crate::kubelet::status::runtime_container_id;
use crate::trace::TraceRecord;

/// Which state change a sample measures.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Change {
    /// The container's process exec'd its program; seen when a status shows it running.
    Started,
    /// The container's process exited; seen when a status shows it terminated, as its
    /// state or, when it restarts, as its last state.
    Exited,
}

/// One container state change: when the kernel made it, and when the agent showed it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct SeenSample {
    pub pod_uid: String,
    pub container_id: String,
    pub change: Change,
    pub kernel_ns: u64,
    pub seen_ns: u64,
    /// For a start: when the runtime's StartContainer returned, the time a runtime-driven
    /// agent could have shown it at the earliest (the agent shows it from the exec).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub runtime_done_ns: Option<u64>,
}

impl SeenSample {
    pub fn latency_ns(&self) -> i64 {
        self.seen_ns as i64 - self.kernel_ns as i64
    }
}

/// What [`seen_latencies`] found.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize)]
pub struct Seeing {
    /// Ordered by container ID, then change.
    pub samples: Vec<SeenSample>,
    /// Kernel changes no status ever showed (the run ended first, or the status skipped
    /// the state: a container that ran and exited between two syncs shows only its exit).
    pub unseen: Vec<SeenSample>,
}

/// The container's main process: its first exec that is not the runtime's own.
struct Main {
    pod_uid: String,
    tgid: u32,
    exec_ns: u64,
    exit_ns: Option<u64>,
}

/// Pairs each container's kernel exec and exit with the first status showing it.
pub fn seen_latencies(records: &[TraceRecord]) -> Seeing {
    let index = Index::new(records);
    let attribution = attribute(&index);
    let mut mains: BTreeMap<&str, Main> = BTreeMap::new();
    for &(i, e) in &index.kernel {
        let Some(owner) = attribution.owner(i) else {
            continue;
        };
        let Some(cid) = owner.container_id.as_deref() else {
            continue;
        };
        match e {
            KernelEvent::Exec { filename, .. }
                if owner.rule == Rule::CgroupId && !is_runtime_helper_exec(filename) =>
            {
                mains.entry(cid).or_insert_with(|| Main {
                    pod_uid: owner.pod_uid.clone(),
                    tgid: e.meta().tgid,
                    exec_ns: e.ktime_ns(),
                    exit_ns: None,
                });
            }
            KernelEvent::Exit { .. } => {
                if let Some(m) = mains.get_mut(cid)
                    && m.tgid == e.meta().tgid
                    && m.exit_ns.is_none()
                {
                    m.exit_ns = Some(e.ktime_ns());
                }
            }
            _ => {}
        }
    }
    // First status showing each container running, and terminated.
    let mut running: BTreeMap<String, u64> = BTreeMap::new();
    let mut terminated: BTreeMap<String, u64> = BTreeMap::new();
    for r in records {
        let TraceRecord::Status(s) = r else { continue };
        let statuses = s
            .status
            .container_statuses
            .iter()
            .flatten()
            .chain(s.status.init_container_statuses.iter().flatten());
        for cs in statuses {
            let Some(id) = container_id(cs) else { continue };
            let state = cs.state.as_ref();
            if state.is_some_and(|st| st.running.is_some()) {
                running.entry(id.to_string()).or_insert(s.at_ns);
            }
            if state.is_some_and(|st| st.terminated.is_some()) {
                terminated.entry(id.to_string()).or_insert(s.at_ns);
            }
            // A container that will restart shows its exit as the last state, with the
            // state waiting (back-off) or running (its successor).
            let last = cs.last_state.as_ref().and_then(|st| st.terminated.as_ref());
            if let Some(id) = last.and_then(|t| t.container_id.as_deref()) {
                terminated
                    .entry(runtime_container_id(id).to_string())
                    .or_insert(s.at_ns);
            }
        }
    }
    let started_by_runtime: BTreeMap<&str, u64> = records
        .iter()
        .filter_map(|r| match r {
            TraceRecord::Cri(c) if c.method == CriMethod::StartContainer && c.ok() => {
                Some((c.container_id.as_str(), c.end_ns))
            }
            _ => None,
        })
        .collect();
    let mut out = Seeing::default();
    for (cid, m) in &mains {
        let changes = [
            (Change::Started, Some(m.exec_ns), &running),
            (Change::Exited, m.exit_ns, &terminated),
        ];
        for (change, kernel_ns, seen) in changes {
            let Some(kernel_ns) = kernel_ns else { continue };
            let mut sample = SeenSample {
                pod_uid: m.pod_uid.clone(),
                container_id: cid.to_string(),
                change,
                kernel_ns,
                seen_ns: 0,
                runtime_done_ns: match change {
                    Change::Started => started_by_runtime.get(*cid).copied(),
                    Change::Exited => None,
                },
            };
            match seen.get(*cid) {
                Some(&at) => {
                    sample.seen_ns = at;
                    out.samples.push(sample);
                }
                None => out.unseen.push(sample),
            }
        }
    }
    out
}

/// The runtime's container ID of a status.
fn container_id(cs: &ContainerStatus) -> Option<&str> {
    cs.container_id.as_deref().map(runtime_container_id)
}
