//! Which execs and exits reach the ring buffer. A node runs far more processes than
//! its pods: compilers, cron jobs, monitoring. Their execs and exits are reported only
//! while user space asks for the node's processes too (`NODE_PROCESSES`, set around pod
//! work by the agent, always by `kernel-events`); otherwise they are dropped here,
//! before anything is reserved or copied.
//!
//! Always reported, by identity:
//! - the runtime's programs and CNI plugins (told by comm and path at their exec), and
//!   what a tracked process execs or its children exec (`TRACKED`, by process ID);
//! - processes in a cgroup created under the configured prefixes (`POD_CGROUPS`, cgroup
//!   v2 IDs from `cgroup_mkdir`; on a v1 node a pod's processes are reached through
//!   runc, which is tracked, and what it execs).
//!
//! User space's own filter keeps the same processes (`timeline/filter.rs`).

use aya_ebpf::helpers::bpf_get_current_cgroup_id;
use aya_ebpf::macros::map;
use aya_ebpf::maps::{Array, LruHashMap};
use podtrace_ebpf_common::{MAX_POD_CGROUPS, MAX_TRACKED, NODE_PROCESSES_ON};

#[map(name = "NODE_PROCESSES")]
static NODE_PROCESSES: Array<u32> = Array::with_max_entries(1, 0);

#[map(name = "TRACKED")]
static TRACKED: LruHashMap<u32, u8> = LruHashMap::with_max_entries(MAX_TRACKED, 0);

#[map(name = "POD_CGROUPS")]
static POD_CGROUPS: LruHashMap<u64, u8> = LruHashMap::with_max_entries(MAX_POD_CGROUPS, 0);

/// True while every exec and exit on the node is reported.
#[inline(always)]
pub fn node_processes() -> bool {
    NODE_PROCESSES
        .get(0)
        .is_some_and(|v| *v == NODE_PROCESSES_ON)
}

#[inline(always)]
pub fn is_tracked(tgid: u32) -> bool {
    // SAFETY: the value is only tested for presence.
    unsafe { TRACKED.get(&tgid) }.is_some()
}

/// Tracks a process. A full map evicts its least recently used entry.
#[inline(always)]
pub fn track(tgid: u32) {
    let _ = TRACKED.insert(&tgid, &1, 0);
}

/// Stops tracking a process that exited; true when it was tracked.
#[inline(always)]
pub fn untrack(tgid: u32) -> bool {
    TRACKED.remove(&tgid).is_ok()
}

/// True when the current task is in a cgroup (v2) created under the prefixes.
#[inline(always)]
pub fn current_in_pod_cgroup() -> bool {
    // SAFETY: the helper has no preconditions; the value is only tested for presence.
    unsafe { POD_CGROUPS.get(&bpf_get_current_cgroup_id()) }.is_some()
}

#[inline(always)]
pub fn add_pod_cgroup(cgroup_id: u64) {
    let _ = POD_CGROUPS.insert(&cgroup_id, &1, 0);
}

#[inline(always)]
pub fn remove_pod_cgroup(cgroup_id: u64) {
    let _ = POD_CGROUPS.remove(&cgroup_id);
}
