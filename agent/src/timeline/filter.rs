//! What of the probes' stream is worth keeping. The probes report every exec and exit on
//! the node while pod work goes on (the agent's namespace gate is open), and outside it
//! only the ones they tie to pods (`agent-ebpf/probes/src/filter.rs`, the same identities
//! as here); a pod's timeline needs the ones attributable to it and, for context, the
//! node's own processes while pod work is going on. Everything the kernel ties to a pod
//! by identity is always kept; node-level execs and exits are kept only around pod work
//! and at a bounded rate, so a busy node does not fill the trace with its compilers.
//!
//! The filter decides as events arrive, with no clock but the events' own timestamps, so
//! the same stream always keeps the same events. It keeps a superset of what
//! [`super::attribute`] can attribute: it treats every cgroup the kernel filter let
//! through as a pod's, and every descendant of a CNI plugin as the plugin's.

use std::collections::{HashSet, VecDeque};

use crate::ebpf::KernelEvent;

/// Node-level events are kept until this long after the last pod-related event.
pub(super) const ACTIVE_AFTER_NS: u64 = 2_000_000_000;
/// Node-level events from at most this long before pod work starts are kept.
pub(super) const LEAD_IN_NS: u64 = 500_000_000;
/// ... and at most this many of them.
const LEAD_IN_MAX: usize = 256;
/// At most this many node-level events are kept per second of kernel time.
const NODE_EVENTS_PER_SECOND: u32 = 2_000;
/// Tracked processes whose exits were lost would otherwise accumulate.
const MAX_TRACKED: usize = 65_536;

#[derive(Debug, Default)]
pub struct KernelFilter {
    /// v2 IDs of cgroups created under the watched prefixes.
    cgroups: HashSet<u64>,
    /// CNI plugins and their descendants, by process ID.
    procs: HashSet<u32>,
    /// Node-level events are kept while their time is before this.
    active_until: u64,
    /// Recent node-level events not kept (yet), oldest first.
    lead_in: VecDeque<KernelEvent>,
    /// The second (of kernel time) the rate budget counts, and what it used.
    budget_second: u64,
    budget_used: u32,
    dropped: u64,
}

impl KernelFilter {
    pub fn new() -> KernelFilter {
        KernelFilter::default()
    }

    /// Node-level events not kept so far.
    pub fn dropped(&self) -> u64 {
        self.dropped + self.lead_in.len() as u64
    }

    /// Takes one event; appends what to keep now to `out` (possibly earlier node-level
    /// events that turned out to precede pod work, then this one).
    pub fn offer(&mut self, e: KernelEvent, out: &mut Vec<KernelEvent>) {
        let meta = e.meta();
        let (t, tgid, cgroup) = (meta.ktime_ns, meta.tgid, meta.cgroup_id);
        let pod_related = match &e {
            KernelEvent::CniExec(_) | KernelEvent::RuntimeExec(_) => {
                self.track(tgid);
                true
            }
            KernelEvent::CgroupMkdir { cgroup: cg, .. } => {
                if cg.hierarchy == 0 {
                    self.cgroups.insert(cg.cgroup_id);
                }
                true
            }
            KernelEvent::CgroupRmdir { cgroup: cg, .. } => {
                if cg.hierarchy == 0 {
                    self.cgroups.remove(&cg.cgroup_id);
                }
                true
            }
            // Kept whole: a namespace's owner is often known only later, and these are
            // rare.
            KernelEvent::CgroupAttach { .. } | KernelEvent::Netns { .. } => true,
            // A plugin's output is bounded per run in the kernel; the hook's changes are
            // a few per burst of pod work.
            KernelEvent::CniOutput(_) | KernelEvent::CniWriteHook(_) => true,
            KernelEvent::Exec { ppid, .. } => {
                let attributable = self.cgroups.contains(&cgroup)
                    || self.procs.contains(&tgid)
                    || ppid.is_some_and(|p| self.procs.contains(&p));
                if attributable && !self.cgroups.contains(&cgroup) {
                    self.track(tgid);
                }
                attributable
            }
            KernelEvent::Exit { .. } => self.procs.remove(&tgid) || self.cgroups.contains(&cgroup),
        };
        if pod_related {
            if t > self.active_until {
                self.flush_lead_in(t, out);
            }
            self.active_until = self.active_until.max(t.saturating_add(ACTIVE_AFTER_NS));
            out.push(e);
        } else if t <= self.active_until {
            self.keep_node_event(e, out);
        } else {
            self.lead_in.push_back(e);
            while self.lead_in.len() > LEAD_IN_MAX
                || self
                    .lead_in
                    .front()
                    .is_some_and(|f| f.ktime_ns().saturating_add(LEAD_IN_NS) < t)
            {
                self.lead_in.pop_front();
                self.dropped += 1;
            }
        }
    }

    fn track(&mut self, tgid: u32) {
        if self.procs.len() >= MAX_TRACKED {
            self.procs.clear();
        }
        self.procs.insert(tgid);
    }

    fn flush_lead_in(&mut self, t: u64, out: &mut Vec<KernelEvent>) {
        for e in std::mem::take(&mut self.lead_in) {
            if e.ktime_ns().saturating_add(LEAD_IN_NS) >= t {
                self.keep_node_event(e, out);
            } else {
                self.dropped += 1;
            }
        }
    }

    fn keep_node_event(&mut self, e: KernelEvent, out: &mut Vec<KernelEvent>) {
        let second = e.ktime_ns() / 1_000_000_000;
        if second != self.budget_second {
            self.budget_second = second;
            self.budget_used = 0;
        }
        if self.budget_used < NODE_EVENTS_PER_SECOND {
            self.budget_used += 1;
            out.push(e);
        } else {
            self.dropped += 1;
        }
    }
}
