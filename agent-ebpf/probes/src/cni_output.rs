//! What a CNI plugin writes to its standard output: its result or its error, as JSON.
//!
//! `CNI_PLUGINS` holds the process IDs (tgid) of the CNI plugin processes alive, from the
//! exec `cni.rs` reports until the leader's exit (`sched.rs`), with how much each has
//! written. The write hook copies the first [`CNI_OUTPUT_MAX`] bytes a plugin writes to
//! fd 1 into `CniOutput` records of [`CNI_OUTPUT_CHUNK`] bytes; later writes are only
//! counted, and the exit reports the total in a last record with
//! [`cni_output_flags::END`], so user space can say what was cut.
//!
//! Two hooks call [`on_write`]: a kprobe on `ksys_write` where the kernel allows
//! kprobes, else the `sys_enter_write` tracepoint (every write on the node pays for an
//! enabled syscall tracepoint, so user space attaches either only while a plugin runs).

use aya_ebpf::cty::c_void;
use aya_ebpf::helpers::bpf_get_current_pid_tgid;
use aya_ebpf::helpers::r#gen::bpf_probe_read_user;
use aya_ebpf::macros::{kprobe, map, tracepoint};
use aya_ebpf::maps::LruHashMap;
use aya_ebpf::programs::{ProbeContext, TracePointContext};
use podlapse_ebpf_common::{
    CNI_OUTPUT_CHUNK, CNI_OUTPUT_MAX, CniOutputEvent, EventKind, MAX_CNI_PLUGINS, cni_output_flags,
};

use crate::{ctx_field, fill_header, reserve};

/// A live plugin process's standard output so far.
#[repr(C)]
#[derive(Clone, Copy)]
struct Written {
    /// Bytes it asked to write to fd 1 (the sum of the writes' counts).
    bytes: u64,
    /// Bytes copied into records, at most [`CNI_OUTPUT_MAX`].
    captured: u32,
    /// Writes to fd 1.
    writes: u32,
}

// LRU: a plugin whose exit was never seen (the probes loaded while it ran) ages out.
#[map(name = "CNI_PLUGINS")]
static CNI_PLUGINS: LruHashMap<u32, Written> = LruHashMap::with_max_entries(MAX_CNI_PLUGINS, 0);

/// Chunks a write can fill: the whole bound.
const CHUNKS: u64 = (CNI_OUTPUT_MAX as u64) / (CNI_OUTPUT_CHUNK as u64);

// Offsets from /sys/kernel/tracing/events/syscalls/sys_enter_write/format.
const WRITE_FD: usize = 16;
const WRITE_BUF: usize = 24;
const WRITE_COUNT: usize = 32;

/// Starts following the current process's output: its exec was a CNI plugin's.
#[inline(always)]
pub fn plugin_started(tgid: u32) {
    let fresh = Written {
        bytes: 0,
        captured: 0,
        writes: 0,
    };
    let _ = CNI_PLUGINS.insert(&tgid, &fresh, 0);
}

/// The leader of process `tgid` exited: if it was a plugin, reports its total output
/// and stops following it. Called before its exit is reported.
#[inline(always)]
pub fn plugin_exited(tgid: u32) {
    // SAFETY: copied out before the entry is removed.
    let Some(w) = (unsafe { CNI_PLUGINS.get(&tgid) }).copied() else {
        return;
    };
    let _ = CNI_PLUGINS.remove(&tgid);
    let Some(mut entry) = reserve::<CniOutputEvent>(EventKind::CniOutput) else {
        return;
    };
    let ev = entry.as_mut_ptr();
    // SAFETY: `ev` is the reserved entry.
    unsafe {
        fill_header(&raw mut (*ev).header, EventKind::CniOutput);
        (*ev).offset = w.bytes;
        (*ev).count = 0;
        (*ev).len = 0;
        (*ev).copied = 0;
        (*ev).flags = cni_output_flags::END;
        (*ev).writes = w.writes;
        (*ev).captured = w.captured;
        (*ev)._pad = 0;
    }
    entry.submit();
}

#[kprobe]
pub fn kprobe_ksys_write(ctx: ProbeContext) -> u32 {
    let (Some(fd), Some(buf), Some(count)) =
        (ctx.arg::<u64>(0), ctx.arg::<u64>(1), ctx.arg::<u64>(2))
    else {
        return 1;
    };
    // `fd` is an unsigned int: the register's upper half is not part of it.
    on_write(fd as u32, buf, count)
}

#[tracepoint]
pub fn sys_enter_write(ctx: TracePointContext) -> u32 {
    // SAFETY: aligned u64 offsets from the format file.
    let (fd, buf, count): (u64, u64, u64) = unsafe {
        (
            ctx_field(&ctx, WRITE_FD),
            ctx_field(&ctx, WRITE_BUF),
            ctx_field(&ctx, WRITE_COUNT),
        )
    };
    on_write(fd as u32, buf, count)
}

/// A write of `count` bytes at `buf` to `fd` by the current task.
#[inline(always)]
fn on_write(fd: u32, buf: u64, count: u64) -> u32 {
    if fd != 1 {
        return 0;
    }
    let tgid = (bpf_get_current_pid_tgid() >> 32) as u32;
    let Some(w) = CNI_PLUGINS.get_ptr_mut(&tgid) else {
        return 0;
    };
    // SAFETY: a map value of this process; another of its threads writing at the same
    // moment can make both see the same offset, which user space reads as overlapping
    // chunks, not as memory unsafety.
    let (offset, captured) = unsafe {
        let seen = *w;
        (*w).bytes = seen.bytes.saturating_add(count);
        (*w).writes = seen.writes.saturating_add(1);
        (seen.bytes, seen.captured)
    };
    let budget = u64::from(CNI_OUTPUT_MAX.saturating_sub(captured));
    let want = if count < budget { count } else { budget };
    if want == 0 {
        // Past the bound (or an empty write): counted only.
        return 0;
    }
    // SAFETY: as above; `want` is at most the budget left.
    unsafe { (*w).captured = captured + want as u32 };
    let mut i = 0u64;
    while i < CHUNKS {
        let at = i * CNI_OUTPUT_CHUNK as u64;
        if at >= want {
            break;
        }
        let left = want - at;
        report_chunk(buf + at, left, offset + at, count);
        i += 1;
    }
    0
}

/// One record: up to a chunk of the `left` bytes at `src`, which start at `offset` of
/// the process's output, in a write of `count`.
#[inline(always)]
fn report_chunk(src: u64, left: u64, offset: u64, count: u64) {
    let Some(mut entry) = reserve::<CniOutputEvent>(EventKind::CniOutput) else {
        return;
    };
    let ev = entry.as_mut_ptr();
    // SAFETY: `ev` is the reserved entry; the helper checks the user address and the
    // size is a constant or masked below the chunk, so the copy stays inside `data`.
    unsafe {
        fill_header(&raw mut (*ev).header, EventKind::CniOutput);
        let dst = (&raw mut (*ev).data) as *mut c_void;
        let read = if left >= CNI_OUTPUT_CHUNK as u64 {
            let r = bpf_probe_read_user(dst, CNI_OUTPUT_CHUNK as u32, src as *const c_void);
            (r, CNI_OUTPUT_CHUNK as u32)
        } else {
            let n = (left as u32) & (CNI_OUTPUT_CHUNK as u32 - 1);
            (bpf_probe_read_user(dst, n, src as *const c_void), n)
        };
        (*ev).offset = offset;
        (*ev).count = count;
        let (ret, n) = read;
        (*ev).len = n;
        if ret == 0 {
            (*ev).copied = n;
            (*ev).flags = 0;
        } else {
            (*ev).copied = 0;
            (*ev).flags = cni_output_flags::UNREADABLE;
        }
        (*ev).writes = 0;
        (*ev).captured = 0;
        (*ev)._pad = 0;
    }
    entry.submit();
}
