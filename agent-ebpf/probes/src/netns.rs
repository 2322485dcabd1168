//! Network namespace creation and entry: unshare, setns and clone (clone3) with
//! `CLONE_NEWNET`. The flags are only visible at syscall entry and the result only at
//! exit, so entry parks what it saw in `PENDING` under the thread's ID and exit reports
//! both, with the netns inode the task is in afterwards.
//!
//! clone is reported by the child: the parent's exit sees only the child's pid, while
//! the child's first return to user space runs in the new namespace. `sched_process_fork`
//! hands the parent's pending entry to the child's thread ID.

use aya_ebpf::helpers::{bpf_ktime_get_ns, bpf_probe_read_user};
use aya_ebpf::macros::{map, tracepoint};
use aya_ebpf::maps::LruHashMap;
use aya_ebpf::programs::TracePointContext;
use aya_log_ebpf::debug;
use podlapse_ebpf_common::{CLONE_NEWNET, EventKind, NetnsEvent, NetnsSyscall};

use crate::{current_tid, fill_header, reserve, reserve_for_cni, task};

/// A namespace syscall between entry and exit.
#[repr(C)]
#[derive(Clone, Copy)]
struct Pending {
    start_ns: u64,
    flags: u64,
    syscall: u32,
    fd: i32,
    /// clone: set on the entry handed to the child; the thread that called clone.
    parent_pid: u32,
    _pad: u32,
}

// LRU: a task killed inside the syscall never reaches the exit probe; its entry ages out
// instead of filling the map.
#[map(name = "PENDING")]
static PENDING: LruHashMap<u32, Pending> = LruHashMap::with_max_entries(4096, 0);

// Offsets from the syscalls' format files.
const UNSHARE_FLAGS: usize = 16;
const SETNS_FD: usize = 16;
const SETNS_FLAGS: usize = 24;
const CLONE_FLAGS: usize = 16;
const CLONE3_UARGS: usize = 16;
const EXIT_RET: usize = 16;
// sched_process_fork.
const FORK_PARENT_PID: usize = 12;
const FORK_CHILD_PID: usize = 20;

#[inline(always)]
fn park(syscall: NetnsSyscall, flags: u64, fd: i32) -> Result<u32, u32> {
    if flags & CLONE_NEWNET == 0 {
        return Ok(0);
    }
    let pending = Pending {
        // SAFETY: no preconditions.
        start_ns: unsafe { bpf_ktime_get_ns() },
        flags,
        syscall: syscall as u32,
        fd,
        parent_pid: 0,
        _pad: 0,
    };
    PENDING
        .insert(&current_tid(), &pending, 0)
        .map(|_| 0)
        .map_err(|_| 1)
}

#[tracepoint]
pub fn sys_enter_unshare(ctx: TracePointContext) -> u32 {
    match try_enter(&ctx, NetnsSyscall::Unshare) {
        Ok(r) => r,
        Err(r) => r,
    }
}

#[tracepoint]
pub fn sys_enter_setns(ctx: TracePointContext) -> u32 {
    match try_enter(&ctx, NetnsSyscall::Setns) {
        Ok(r) => r,
        Err(r) => r,
    }
}

#[tracepoint]
pub fn sys_enter_clone(ctx: TracePointContext) -> u32 {
    match try_enter(&ctx, NetnsSyscall::Clone) {
        Ok(r) => r,
        Err(r) => r,
    }
}

#[tracepoint]
pub fn sys_enter_clone3(ctx: TracePointContext) -> u32 {
    match try_enter(&ctx, NetnsSyscall::Clone3) {
        Ok(r) => r,
        Err(r) => r,
    }
}

fn try_enter(ctx: &TracePointContext, syscall: NetnsSyscall) -> Result<u32, u32> {
    // SAFETY: offsets from the format files; clone3's flags are the first u64 of the
    // user's `struct clone_args`, read through the checked helper.
    let (flags, fd) = unsafe {
        match syscall {
            NetnsSyscall::Unshare => (ctx.read_at::<u64>(UNSHARE_FLAGS).map_err(|_| 1u32)?, -1),
            NetnsSyscall::Setns => (
                ctx.read_at::<u64>(SETNS_FLAGS).map_err(|_| 1u32)?,
                ctx.read_at::<u64>(SETNS_FD).map_err(|_| 1u32)? as i32,
            ),
            NetnsSyscall::Clone => (ctx.read_at::<u64>(CLONE_FLAGS).map_err(|_| 1u32)?, -1),
            NetnsSyscall::Clone3 => {
                let uargs = ctx.read_at::<u64>(CLONE3_UARGS).map_err(|_| 1u32)?;
                (
                    bpf_probe_read_user(uargs as *const u64).map_err(|_| 1u32)?,
                    -1,
                )
            }
        }
    };
    park(syscall, flags, fd)
}

#[tracepoint]
pub fn sched_process_fork(ctx: TracePointContext) -> u32 {
    match try_sched_process_fork(&ctx) {
        Ok(r) => r,
        Err(r) => r,
    }
}

fn try_sched_process_fork(ctx: &TracePointContext) -> Result<u32, u32> {
    // SAFETY: offsets from the format file.
    let (parent, child) = unsafe {
        (
            ctx.read_at::<i32>(FORK_PARENT_PID).map_err(|_| 1u32)? as u32,
            ctx.read_at::<i32>(FORK_CHILD_PID).map_err(|_| 1u32)? as u32,
        )
    };
    // SAFETY: the value is copied out before anything else touches the map entry.
    let Some(pending) = (unsafe { PENDING.get(&parent) }).copied() else {
        return Ok(0);
    };
    if pending.syscall != NetnsSyscall::Clone as u32
        && pending.syscall != NetnsSyscall::Clone3 as u32
    {
        return Ok(0);
    }
    let mut handed = pending;
    handed.parent_pid = parent;
    PENDING.insert(&child, &handed, 0).map(|_| 0).map_err(|_| 1)
}

#[tracepoint]
pub fn sys_exit_unshare(ctx: TracePointContext) -> u32 {
    match try_exit(&ctx) {
        Ok(r) => r,
        Err(r) => r,
    }
}

#[tracepoint]
pub fn sys_exit_setns(ctx: TracePointContext) -> u32 {
    match try_exit(&ctx) {
        Ok(r) => r,
        Err(r) => r,
    }
}

#[tracepoint]
pub fn sys_exit_clone(ctx: TracePointContext) -> u32 {
    match try_exit(&ctx) {
        Ok(r) => r,
        Err(r) => r,
    }
}

#[tracepoint]
pub fn sys_exit_clone3(ctx: TracePointContext) -> u32 {
    match try_exit(&ctx) {
        Ok(r) => r,
        Err(r) => r,
    }
}

fn try_exit(ctx: &TracePointContext) -> Result<u32, u32> {
    let tid = current_tid();
    // SAFETY: copied out before the entry is removed.
    let Some(pending) = (unsafe { PENDING.get(&tid) }).copied() else {
        return Ok(0);
    };
    let _ = PENDING.remove(&tid);
    // SAFETY: offset from the format file.
    let ret: i64 = unsafe { ctx.read_at(EXIT_RET) }.map_err(|_| 1u32)?;
    let is_clone = pending.syscall == NetnsSyscall::Clone as u32
        || pending.syscall == NetnsSyscall::Clone3 as u32;
    // A successful clone is reported by the child (parent_pid set), where the new
    // namespace is current; the parent reports only a failure.
    if is_clone && pending.parent_pid == 0 && ret >= 0 {
        return Ok(0);
    }
    if is_clone && pending.parent_pid != 0 {
        debug!(
            ctx,
            "clone(CLONE_NEWNET) child {} of {}", tid, pending.parent_pid
        );
    }
    let inum = task::current_netns_inum();
    submit(&Outcome {
        start_ns: pending.start_ns,
        flags: pending.flags,
        ret,
        syscall: pending.syscall,
        netns_inum: inum,
        fd: pending.fd,
        parent_pid: pending.parent_pid,
    })
    .map(|_| 0)
    .map_err(|_| 1)
}

/// What a [`NetnsEvent`] reports beyond its header.
pub(crate) struct Outcome {
    pub start_ns: u64,
    pub flags: u64,
    pub ret: i64,
    pub syscall: u32,
    pub netns_inum: u32,
    pub fd: i32,
    pub parent_pid: u32,
}

/// Reserves and submits a [`NetnsEvent`] for the current task (the tracepoints here and
/// the kernel-function hooks of `netns_fn.rs`); `Err` when the ring buffer was full.
#[inline(always)]
pub(crate) fn submit(o: &Outcome) -> Result<(), ()> {
    // A new namespace: the runtime runs the CNI plugins in it next.
    let created = o.syscall == NetnsSyscall::Unshare as u32 && o.ret == 0;
    let reserved = if created {
        reserve_for_cni::<NetnsEvent>(EventKind::Netns)
    } else {
        reserve::<NetnsEvent>(EventKind::Netns)
    };
    let Some(mut entry) = reserved else {
        return Err(());
    };
    let ev = entry.as_mut_ptr();
    // SAFETY: `ev` is the reserved entry.
    unsafe {
        fill_header(&raw mut (*ev).header, EventKind::Netns);
        (*ev).start_ns = o.start_ns;
        (*ev).flags = o.flags;
        (*ev).ret = o.ret;
        (*ev).syscall = o.syscall;
        (*ev).netns_inum = o.netns_inum;
        (*ev).fd = o.fd;
        (*ev).parent_pid = o.parent_pid;
    }
    entry.submit();
    Ok(())
}
