//! `sched:sched_process_exec` (with CNI plugin execs, `cni.rs`, and the runtime's,
//! `runtime.rs`) and `sched:sched_process_exit`, filtered as `filter.rs` says.

use aya_ebpf::helpers::{bpf_get_current_pid_tgid, bpf_probe_read_kernel_str_bytes};
use aya_ebpf::macros::tracepoint;
use aya_ebpf::programs::TracePointContext;
use podlapse_ebpf_common::{CommWords, EventKind, ExecEvent, ExitEvent, is_runtime_comm};

use crate::{
    Reserved, cni, cni_output, ctx_field, data_loc, fill_header, fill_header_with, filter,
    reserve_waking, runtime, task,
};

// Offsets from /sys/kernel/tracing/events/sched/sched_process_exec/format.
const EXEC_FILENAME: usize = 8;
const EXEC_OLD_PID: usize = 16;

#[tracepoint]
pub fn sched_process_exec(ctx: TracePointContext) -> u32 {
    match try_sched_process_exec(&ctx) {
        Ok(r) => r,
        Err(r) => r,
    }
}

fn try_sched_process_exec(ctx: &TracePointContext) -> Result<u32, u32> {
    let filename = data_loc(ctx, EXEC_FILENAME);
    // SAFETY: an aligned i32 offset from the format file.
    let old_pid: i32 = unsafe { ctx_field(ctx, EXEC_OLD_PID) };
    let tgid = (bpf_get_current_pid_tgid() >> 32) as u32;
    let plugin = cni::is_plugin(filename);
    let comm = task::current_comm();
    let runtime = !plugin && is_runtime_comm(&comm);
    let ppid = task::current_parent_tgid();
    let spawned = plugin || runtime || (ppid != 0 && filter::is_tracked(ppid));
    if spawned {
        filter::track(tgid);
    }
    let pod_work = spawned || filter::is_tracked(tgid) || filter::current_in_pod_cgroup();
    // An unknown parent (0: no offsets for it) could be a tracked one: keep.
    if !pod_work && ppid != 0 && !filter::node_processes() {
        // A node process: nothing reserved, nothing copied.
        return Ok(0);
    }
    if runtime {
        // The runtime program's arguments go first, so the reader knows whose process
        // it is by the time it reads the exec.
        let _ = runtime::report_runtime();
    } else if plugin {
        // Likewise a plugin's CNI event. A lost CNI event is counted; the exec is
        // still reported.
        let _ = cni::report_plugin(ctx, filename);
    }
    reserve_exec(filename, old_pid, ppid, comm, pod_work)?.submit();
    Ok(0)
}

/// Reserves and fills an exec event; one of pod work wakes the reader.
#[inline(always)]
fn reserve_exec(
    filename: *const u8,
    old_pid: i32,
    ppid: u32,
    comm: CommWords,
    pod_work: bool,
) -> Result<Reserved<ExecEvent>, u32> {
    let Some(mut entry) = reserve_waking::<ExecEvent>(EventKind::Exec, pod_work) else {
        return Err(1);
    };
    let ev = entry.as_mut_ptr();
    // SAFETY: `ev` is the reserved entry; fields are written in place because the event
    // is larger than the BPF stack allows.
    unsafe {
        fill_header_with(&raw mut (*ev).header, EventKind::Exec, comm);
        (*ev).old_pid = old_pid as u32;
        (*ev).ppid = ppid;
        (*ev).filename[0] = 0;
        let _ = bpf_probe_read_kernel_str_bytes(filename, &mut (*ev).filename);
    }
    Ok(entry)
}

#[tracepoint]
pub fn sched_process_exit(ctx: TracePointContext) -> u32 {
    match try_sched_process_exit(&ctx) {
        Ok(r) => r,
        Err(r) => r,
    }
}

fn try_sched_process_exit(_ctx: &TracePointContext) -> Result<u32, u32> {
    // The tracepoint fires once per thread; a process has exited when its leader has.
    let pid_tgid = bpf_get_current_pid_tgid();
    let tgid = (pid_tgid >> 32) as u32;
    if pid_tgid as u32 != tgid {
        return Ok(0);
    }
    let pod_work = filter::untrack(tgid) || filter::current_in_pod_cgroup();
    if pod_work {
        // A CNI plugin's output total goes before its exit. Only the leader's exit ends
        // a process's output: a Go plugin's other threads come and go.
        cni_output::plugin_exited(tgid);
    }
    if !pod_work && !filter::node_processes() {
        return Ok(0);
    }
    let Some(mut entry) = reserve_waking::<ExitEvent>(EventKind::Exit, pod_work) else {
        return Err(1);
    };
    let ev = entry.as_mut_ptr();
    // SAFETY: `ev` is the reserved entry.
    unsafe {
        fill_header(&raw mut (*ev).header, EventKind::Exit);
        (*ev).exit_code = task::current_exit_code();
        (*ev)._pad = 0;
    }
    entry.submit();
    Ok(0)
}
