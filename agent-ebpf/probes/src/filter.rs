//! Which execs and exits reach the ring buffer. A node runs far more processes than
//! its pods: compilers, cron jobs, monitoring. Their execs and exits are reported only
//! while user space asks for the node's processes too (`NODE_PROCESSES`, set around pod
//! work by the agent, always by `kernel-events`); otherwise they are dropped here,
//! before anything is reserved or copied.
//!
//! Always reported, by identity:
//! - the runtime's programs and CNI plugins (told by comm and path at their exec), and
//!   what a tracked process or a child of one execs (`TRACKED`, by process ID);
//! - processes in a cgroup created under the configured prefixes (`POD_CGROUPS`, cgroup
//!   v2 IDs from `cgroup_mkdir`; on a v1 node a pod's processes are reached through
//!   runc, which is tracked, and what it execs).
//!
//! User space's own filter keeps the same processes (`timeline/filter.rs`).

use aya_ebpf::helpers::bpf_get_current_cgroup_id;
use aya_ebpf::macros::map;
use aya_ebpf::maps::{Array, LruHashMap};
use podlapse_ebpf_common::{DEFAULT_PID_MAX, MAX_POD_CGROUPS, NODE_PROCESSES_ON};

#[map(name = "NODE_PROCESSES")]
static NODE_PROCESSES: Array<u32> = Array::with_max_entries(1, 0);

/// One byte per process ID, non-zero while the process is tracked: an array, so a lookup
/// is a load the verifier inlines rather than a hash, and each byte is written only by
/// its own process's exec and exit, so no two CPUs race on one. User space sizes it to
/// the node's `pid_max` before loading.
#[map(name = "TRACKED")]
static TRACKED: Array<u8> = Array::with_max_entries(DEFAULT_PID_MAX, 0);

#[map(name = "POD_CGROUPS")]
static POD_CGROUPS: LruHashMap<u64, u8> = LruHashMap::with_max_entries(MAX_POD_CGROUPS, 0);

/// True while every exec and exit on the node is reported.
#[inline(always)]
pub fn node_processes() -> bool {
    NODE_PROCESSES
        .get(0)
        .is_some_and(|v| *v == NODE_PROCESSES_ON)
}

/// True when `pid` is tracked, or beyond the map (`pid_max` raised after loading): such
/// a process is reported rather than risk dropping a pod's.
#[inline(always)]
pub fn is_tracked(pid: u32) -> bool {
    TRACKED.get(pid).is_none_or(|t| *t != 0)
}

/// Tracks a process (a no-op beyond the map: it is reported anyway).
#[inline(always)]
pub fn track(pid: u32) {
    if let Some(t) = TRACKED.get_ptr_mut(pid) {
        // SAFETY: an array slot; only this process's own events write it.
        unsafe { *t = 1 };
    }
}

/// Stops tracking a process that exited; true when it was tracked (or is beyond the
/// map).
#[inline(always)]
pub fn untrack(pid: u32) -> bool {
    match TRACKED.get_ptr_mut(pid) {
        // SAFETY: as in `track`.
        Some(t) => unsafe {
            let was = *t != 0;
            if was {
                *t = 0;
            }
            was
        },
        None => true,
    }
}

/// Non-zero once a cgroup was added to `POD_CGROUPS`: until then (always, on a node
/// without cgroup v2 pods) every exec and exit is spared the hash lookup.
#[map(name = "POD_CGROUPS_USED")]
static POD_CGROUPS_USED: Array<u32> = Array::with_max_entries(1, 0);

/// True when the current task is in a cgroup (v2) created under the prefixes.
#[inline(always)]
pub fn current_in_pod_cgroup() -> bool {
    if POD_CGROUPS_USED.get(0).is_none_or(|used| *used == 0) {
        return false;
    }
    // SAFETY: the helper has no preconditions; the value is only tested for presence.
    unsafe { POD_CGROUPS.get(&bpf_get_current_cgroup_id()) }.is_some()
}

#[inline(always)]
pub fn add_pod_cgroup(cgroup_id: u64) {
    let _ = POD_CGROUPS.insert(&cgroup_id, &1, 0);
    if let Some(used) = POD_CGROUPS_USED.get_ptr_mut(0) {
        // SAFETY: an array slot; every writer stores the same value.
        unsafe { *used = 1 };
    }
}

#[inline(always)]
pub fn remove_pod_cgroup(cgroup_id: u64) {
    let _ = POD_CGROUPS.remove(&cgroup_id);
}
