//! `cgroup:cgroup_mkdir`, `cgroup_rmdir` and `cgroup_attach_task`, kept only under the
//! cgroup roots user space configured: a node moves tasks between cgroups all the
//! time, and only pod cgroups matter here. Filtering in the kernel keeps the rest out
//! of the ring buffer. The v2 IDs of the cgroups kept are remembered, so the execs and
//! exits of the processes in them are always reported (`filter.rs`).

use aya_ebpf::helpers::bpf_probe_read_kernel_str_bytes;
use aya_ebpf::macros::{map, tracepoint};
use aya_ebpf::maps::Array;
use aya_ebpf::programs::TracePointContext;
use podlapse_ebpf_common::{
    CgroupEvent, EventKind, MAX_CGROUP_PREFIXES, PREFIX_LEN, Prefix, prefix_matches,
};

use crate::{data_loc, fill_header, filter, reserve};

#[map(name = "CGROUP_PREFIXES")]
static CGROUP_PREFIXES: Array<Prefix> = Array::with_max_entries(MAX_CGROUP_PREFIXES, 0);

// Offsets from /sys/kernel/tracing/events/cgroup/cgroup_{mkdir,rmdir}/format.
const DIR_ROOT: usize = 8;
const DIR_LEVEL: usize = 12;
const DIR_ID: usize = 16;
const DIR_PATH: usize = 24;
// /sys/kernel/tracing/events/cgroup/cgroup_attach_task/format.
const ATTACH_ROOT: usize = 8;
const ATTACH_LEVEL: usize = 12;
const ATTACH_ID: usize = 16;
const ATTACH_PID: usize = 24;
const ATTACH_PATH: usize = 28;
const ATTACH_COMM: usize = 32;

/// True when `path` lies under one of the configured prefixes.
#[inline(always)]
fn wanted(path: *const u8) -> bool {
    let mut head = [0u8; PREFIX_LEN];
    // SAFETY: the helper checks the address; `path` points into the trace record.
    if unsafe { bpf_probe_read_kernel_str_bytes(path, &mut head) }.is_err() {
        return false;
    }
    let mut i = 0;
    while i < MAX_CGROUP_PREFIXES {
        if let Some(prefix) = CGROUP_PREFIXES.get(i)
            && prefix_matches(prefix, &head)
        {
            return true;
        }
        i += 1;
    }
    false
}

#[tracepoint]
pub fn cgroup_mkdir(ctx: TracePointContext) -> u32 {
    match try_cgroup_dir(&ctx, EventKind::CgroupMkdir) {
        Ok(r) => r,
        Err(r) => r,
    }
}

#[tracepoint]
pub fn cgroup_rmdir(ctx: TracePointContext) -> u32 {
    match try_cgroup_dir(&ctx, EventKind::CgroupRmdir) {
        Ok(r) => r,
        Err(r) => r,
    }
}

fn try_cgroup_dir(ctx: &TracePointContext, kind: EventKind) -> Result<u32, u32> {
    let path = data_loc(ctx, DIR_PATH);
    if !wanted(path) {
        return Ok(0);
    }
    // SAFETY: offsets from the format file.
    let (root, level, id) = unsafe {
        (
            ctx.read_at::<i32>(DIR_ROOT).map_err(|_| 1u32)?,
            ctx.read_at::<i32>(DIR_LEVEL).map_err(|_| 1u32)?,
            ctx.read_at::<u64>(DIR_ID).map_err(|_| 1u32)?,
        )
    };
    // The v2 hierarchy's ID is 0; its cgroup IDs are what a task's cgroup ID is
    // compared with at exec and exit.
    if root == 0 {
        match kind {
            EventKind::CgroupMkdir => filter::add_pod_cgroup(id),
            _ => filter::remove_pod_cgroup(id),
        }
    }
    emit(kind, root, level, id, 0, core::ptr::null(), path)
}

#[tracepoint]
pub fn cgroup_attach_task(ctx: TracePointContext) -> u32 {
    match try_cgroup_attach_task(&ctx) {
        Ok(r) => r,
        Err(r) => r,
    }
}

fn try_cgroup_attach_task(ctx: &TracePointContext) -> Result<u32, u32> {
    let path = data_loc(ctx, ATTACH_PATH);
    if !wanted(path) {
        return Ok(0);
    }
    let comm = data_loc(ctx, ATTACH_COMM);
    // SAFETY: offsets from the format file.
    let (root, level, id, pid) = unsafe {
        (
            ctx.read_at::<i32>(ATTACH_ROOT).map_err(|_| 1u32)?,
            ctx.read_at::<i32>(ATTACH_LEVEL).map_err(|_| 1u32)?,
            ctx.read_at::<u64>(ATTACH_ID).map_err(|_| 1u32)?,
            ctx.read_at::<i32>(ATTACH_PID).map_err(|_| 1u32)?,
        )
    };
    emit(
        EventKind::CgroupAttach,
        root,
        level,
        id,
        pid as u32,
        comm,
        path,
    )
}

#[inline(always)]
fn emit(
    kind: EventKind,
    root: i32,
    level: i32,
    id: u64,
    target_pid: u32,
    target_comm: *const u8,
    path: *const u8,
) -> Result<u32, u32> {
    let Some(mut entry) = reserve::<CgroupEvent>(kind) else {
        return Err(1);
    };
    let ev = entry.as_mut_ptr();
    // SAFETY: `ev` is the reserved entry; the source pointers point into the trace
    // record and the helpers check them.
    unsafe {
        fill_header(&raw mut (*ev).header, kind);
        (*ev).id = id;
        (*ev).root = root;
        (*ev).level = level;
        (*ev).target_pid = target_pid;
        (*ev)._pad = 0;
        (*ev).target_comm[0] = 0;
        if !target_comm.is_null() {
            let _ = bpf_probe_read_kernel_str_bytes(target_comm, &mut (*ev).target_comm);
        }
        (*ev).path[0] = 0;
        let _ = bpf_probe_read_kernel_str_bytes(path, &mut (*ev).path);
    }
    entry.submit();
    Ok(0)
}
