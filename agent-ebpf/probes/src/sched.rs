//! `sched:sched_process_exec` (with CNI plugin execs, `cni.rs`) and
//! `sched:sched_process_exit`.

use aya_ebpf::helpers::{bpf_get_current_pid_tgid, bpf_probe_read_kernel_str_bytes};
use aya_ebpf::macros::tracepoint;
use aya_ebpf::programs::TracePointContext;
use podtrace_ebpf_common::{EventKind, ExecEvent, ExitEvent, is_runtime_comm};

use crate::{Reserved, cni, data_loc, fill_header, reserve, runtime, task};

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
    let filename = data_loc(ctx, EXEC_FILENAME).map_err(|_| 1u32)?;
    // SAFETY: offset from the format file.
    let old_pid: i32 = unsafe { ctx.read_at(EXEC_OLD_PID) }.map_err(|_| 1u32)?;
    let mut entry = reserve_exec(filename, old_pid)?;
    // The CNI check reads the filename already copied into the event.
    // SAFETY: `reserve_exec` filled the entry.
    let plugin = cni::is_plugin(unsafe { &(*entry.as_mut_ptr()).filename });
    // SAFETY: as above; the header holds the new program's comm.
    let runtime = !plugin && is_runtime_comm(unsafe { &(*entry.as_mut_ptr()).header.comm });
    if runtime {
        // As for a plugin: the runtime program's arguments go first, so the reader
        // knows whose process it is by the time it reads the exec.
        entry.discard();
        let _ = runtime::report_runtime();
        reserve_exec(filename, old_pid)?.submit();
        return Ok(0);
    }
    if !plugin {
        entry.submit();
        return Ok(0);
    }
    // A plugin's CNI event goes first, so the plugin is known when its exec is read
    // (the ring is read in reservation order). Rare: the exec is reserved again.
    entry.discard();
    // A lost CNI event is counted; the exec is still reported.
    let _ = cni::report_plugin(ctx, filename);
    reserve_exec(filename, old_pid)?.submit();
    Ok(0)
}

/// Reserves and fills an exec event.
#[inline(always)]
fn reserve_exec(filename: *const u8, old_pid: i32) -> Result<Reserved<ExecEvent>, u32> {
    let Some(mut entry) = reserve::<ExecEvent>(EventKind::Exec) else {
        return Err(1);
    };
    let ev = entry.as_mut_ptr();
    // SAFETY: `ev` is the reserved entry; fields are written in place because the event
    // is larger than the BPF stack allows.
    unsafe {
        fill_header(&raw mut (*ev).header, EventKind::Exec);
        (*ev).old_pid = old_pid as u32;
        (*ev).ppid = task::current_parent_tgid();
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
    if pid_tgid as u32 != (pid_tgid >> 32) as u32 {
        return Ok(0);
    }
    let Some(mut entry) = reserve::<ExitEvent>(EventKind::Exit) else {
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
