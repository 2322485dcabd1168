//! Execs of CNI plugins, with the `CNI_*` variables of their environment:
//! `CNI_CONTAINERID` and `CNI_ARGS` tie each plugin run to its sandbox and pod exactly.
//!
//! Reported from `sched_process_exec` (see `sched.rs`), not from `sys_enter_execve`: a
//! syscall tracepoint, once enabled, costs every execve on the node its dispatch, while
//! the exec tracepoint runs anyway. Any other exec costs one compare of the filename the
//! exec event already holds. The environment is the new program's, read through its
//! stack.

use aya_ebpf::helpers::{bpf_probe_read_kernel, bpf_probe_read_kernel_str_bytes, r#gen};
use aya_ebpf::macros::map;
use aya_ebpf::maps::{Array, PerCpuArray};
use aya_ebpf::programs::TracePointContext;
use aya_log_ebpf::warn;
use podlapse_ebpf_common::{
    CniExecEvent, ENV_HEAD, EnvHead, EventKind, MAX_ENV_SCAN, PREFIX_LEN, Prefix, cni_env_var,
    cni_flags, prefix_matches,
};

use crate::{cni_output, fill_header, reserve_for_cni, task};

#[map(name = "CNI_BIN_DIR")]
static CNI_BIN_DIR: Array<Prefix> = Array::with_max_entries(1, 0);

/// True when the exec'd file (the exec tracepoint's kernel string) is in the CNI plugin
/// directory.
#[inline(always)]
pub fn is_plugin(filename: *const u8) -> bool {
    let Some(dir) = CNI_BIN_DIR.get(0) else {
        return false;
    };
    // Most execs differ from the directory within its first eight bytes: compare those
    // first, with one fixed-size read, and copy the string only when they agree.
    // SAFETY: the helper checks the address; eight bytes of the trace record are read
    // (past a shorter name's NUL is the rest of the record, masked out below).
    let Ok(first) = (unsafe { bpf_probe_read_kernel(filename as *const u64) }) else {
        return false;
    };
    // SAFETY: PREFIX_LEN >= 8, so both words lie inside the arrays, which start at
    // 8-aligned offsets of the 8-aligned `Prefix`.
    let (want, mask) = unsafe {
        (
            (dir.bytes.as_ptr() as *const u64).read(),
            (dir.mask.as_ptr() as *const u64).read(),
        )
    };
    if (first ^ want) & mask != 0 {
        return false;
    }
    let mut head = [0u8; PREFIX_LEN];
    // SAFETY: the helper checks the address; `filename` points into the trace record.
    if unsafe { bpf_probe_read_kernel_str_bytes(filename, &mut head) }.is_err() {
        return false;
    }
    prefix_matches(dir, &head)
}

/// Reports the exec of a CNI plugin, `filename` being the exec tracepoint's (kernel)
/// string.
#[inline(always)]
pub fn report_plugin(ctx: &TracePointContext, filename: *const u8) -> Result<(), u32> {
    // Its writes to standard output are followed from here, whether or not this event
    // finds room in the ring.
    cni_output::plugin_started((aya_ebpf::helpers::bpf_get_current_pid_tgid() >> 32) as u32);
    let Some(mut entry) = reserve_for_cni::<CniExecEvent>(EventKind::CniExec) else {
        return Err(1);
    };
    let ev = entry.as_mut_ptr();
    // SAFETY: `ev` is the reserved entry; every pointer read goes through a checked
    // helper.
    let truncated = unsafe {
        fill_header(&raw mut (*ev).header, EventKind::CniExec);
        (*ev).forked_ns = task::current_start_time();
        (*ev).filename[0] = 0;
        let _ = bpf_probe_read_kernel_str_bytes(filename, &mut (*ev).filename);
        (*ev).command[0] = 0;
        (*ev).ifname[0] = 0;
        (*ev).container_id[0] = 0;
        (*ev).netns[0] = 0;
        (*ev).args[0] = 0;
        let (scanned, flags) = scan_env(task::exec_envp(), ev);
        (*ev).env_scanned = scanned;
        (*ev).flags = flags;
        flags & cni_flags::ENV_TRUNCATED != 0
    };
    entry.submit();
    if truncated {
        warn!(
            ctx,
            "CNI plugin environment has more than {} entries; CNI_* variables past them were not read",
            MAX_ENV_SCAN
        );
    }
    Ok(())
}

/// Where the environment scan reads each entry's pointer and head: map memory, not the
/// stack. The verifier tracks what every stack byte holds (zero, a value, a spilled
/// register) and keeps walking an iteration again for each path that leaves the bytes
/// differently; map memory it does not track, so the paths of one iteration meet.
#[repr(C)]
struct EnvScratch {
    ptr: u64,
    head: EnvHead,
}

#[map(name = "ENV_SCRATCH")]
static ENV_SCRATCH: PerCpuArray<EnvScratch> = PerCpuArray::with_max_entries(1, 0);

/// Walks `envp`, copying the `CNI_*` values into `ev`. Returns how many entries it
/// looked at and [`cni_flags`].
///
/// The loop keeps no state across iterations but the index: the verifier walks every
/// iteration, and any extra register that differs between paths (such as a bitmask of
/// variables found) multiplies the states it must keep.
///
/// # Safety
/// `ev` must be a reserved, writable event.
#[inline(always)]
unsafe fn scan_env(envp: *const u64, ev: *mut CniExecEvent) -> (u32, u32) {
    if envp.is_null() {
        return (0, cni_flags::ENV_UNREADABLE);
    }
    let Some(scratch) = ENV_SCRATCH.get_ptr_mut(0) else {
        return (0, cni_flags::ENV_UNREADABLE);
    };
    let mut i = 0u32;
    while i < MAX_ENV_SCAN {
        // SAFETY: `scratch` is this CPU's map slot; every read goes through a checked
        // helper, with sizes of the scratch's own fields; `i` is bounded.
        unsafe {
            let got = r#gen::bpf_probe_read_user(
                (&raw mut (*scratch).ptr).cast(),
                8,
                envp.add(i as usize).cast(),
            );
            if got != 0 {
                return (i, cni_flags::ENV_UNREADABLE);
            }
            let entry = (*scratch).ptr as *const u8;
            if entry.is_null() {
                return (i, 0);
            }
            // Not zeroed first (LLVM zeroes with a call to `memset`, a byte loop the
            // verifier walks on every entry): the string read ends in a NUL, and a name
            // matches only when every byte of it does, so what an earlier, longer entry
            // left after the NUL decides nothing.
            let read = r#gen::bpf_probe_read_user_str(
                (&raw mut (*scratch).head).cast(),
                ENV_HEAD as u32,
                entry.cast(),
            );
            if read > 0
                && let Some(var) = cni_env_var(&(*scratch).head)
            {
                // `var` names one of the event's fields and that field's size. One
                // call site for every variable: the verifier walks it once.
                let _ = r#gen::bpf_probe_read_user_str(
                    ev.cast::<u8>().add(var.field).cast(),
                    var.len,
                    entry.add(var.skip).cast(),
                );
            }
        }
        i += 1;
    }
    (i, cni_flags::ENV_TRUNCATED)
}
