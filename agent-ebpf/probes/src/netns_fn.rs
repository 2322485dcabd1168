//! Network namespace creation and entry from the kernel functions that do them, where
//! the kernel lets kprobes attach: the same [`NetnsEvent`]s as the syscall tracepoints
//! of `netns.rs`, without their cost. A syscall tracepoint, once enabled, sends every
//! syscall of every task on the node down the kernel's slow path; a kprobe costs only
//! when its function runs.
//!
//! - `unshare_nsproxy_namespaces(flags, new_nsp, ...)` is the part of unshare(2) that
//!   builds the new namespaces (`copy_net_ns` among them). Its return is reported as an
//!   unshare, with the inode of the network namespace it left in `*new_nsp`; the task
//!   switches into it right after.
//! - `netns_install(nsset, ns)` is the network namespace's `install` operation, which
//!   setns(2) calls for a network namespace fd (whatever `nstype` said) and for a pidfd
//!   with `CLONE_NEWNET`. Its return is reported as a setns into the inode of `ns`, with
//!   no fd: the function does not see one.
//!
//! clone with `CLONE_NEWNET` stays with the syscall tracepoints, on request.

use aya_ebpf::helpers::{bpf_ktime_get_ns, bpf_probe_read_kernel};
use aya_ebpf::macros::{kprobe, kretprobe, map};
use aya_ebpf::maps::LruHashMap;
use aya_ebpf::programs::{ProbeContext, RetProbeContext};
use podlapse_ebpf_common::{CLONE_NEWNET, NetnsSyscall};

use crate::netns::{Outcome, submit};
use crate::{current_tid, task};

/// A function call between entry and return.
#[repr(C)]
#[derive(Clone, Copy)]
struct Entered {
    start_ns: u64,
    flags: u64,
    /// unshare: the `struct nsproxy **` the function fills in.
    new_nsp: u64,
    syscall: u32,
    /// setns: the inode of the namespace being entered.
    netns_inum: u32,
}

// LRU, as `netns.rs`'s: a task killed inside the function leaves an entry that ages out.
#[map(name = "ENTERED")]
static ENTERED: LruHashMap<u32, Entered> = LruHashMap::with_max_entries(4096, 0);

#[kprobe]
pub fn kprobe_unshare_nsproxy_namespaces(ctx: ProbeContext) -> u32 {
    let (Some(flags), Some(new_nsp)) = (ctx.arg::<u64>(0), ctx.arg::<u64>(1)) else {
        return 1;
    };
    if flags & CLONE_NEWNET == 0 {
        return 0;
    }
    enter(Entered {
        // SAFETY: no preconditions.
        start_ns: unsafe { bpf_ktime_get_ns() },
        flags,
        new_nsp,
        syscall: NetnsSyscall::Unshare as u32,
        netns_inum: 0,
    })
}

#[kretprobe]
pub fn kretprobe_unshare_nsproxy_namespaces(ctx: RetProbeContext) -> u32 {
    let Some(entered) = take() else { return 0 };
    let ret = returned(&ctx);
    let inum = if ret == 0 {
        // SAFETY: the helper checks the address the caller passed.
        let nsproxy = unsafe { bpf_probe_read_kernel(entered.new_nsp as *const *const u8) };
        nsproxy.map_or(0, task::nsproxy_netns_inum)
    } else {
        0
    };
    report(&entered, ret, inum)
}

#[kprobe]
pub fn kprobe_netns_install(ctx: ProbeContext) -> u32 {
    let Some(ns) = ctx.arg::<u64>(1) else {
        return 1;
    };
    enter(Entered {
        // SAFETY: no preconditions.
        start_ns: unsafe { bpf_ktime_get_ns() },
        flags: CLONE_NEWNET,
        new_nsp: 0,
        syscall: NetnsSyscall::Setns as u32,
        netns_inum: task::ns_common_inum(ns as *const u8),
    })
}

#[kretprobe]
pub fn kretprobe_netns_install(ctx: RetProbeContext) -> u32 {
    let Some(entered) = take() else { return 0 };
    let ret = returned(&ctx);
    report(&entered, ret, entered.netns_inum)
}

#[inline(always)]
fn enter(entered: Entered) -> u32 {
    match ENTERED.insert(&current_tid(), &entered, 0) {
        Ok(()) => 0,
        Err(_) => 1,
    }
}

/// The current thread's entry, removed.
#[inline(always)]
fn take() -> Option<Entered> {
    let tid = current_tid();
    // SAFETY: copied out before the entry is removed.
    let entered = (unsafe { ENTERED.get(&tid) }).copied()?;
    let _ = ENTERED.remove(&tid);
    Some(entered)
}

/// Both functions return an `int`: the upper half of the register is not part of it.
#[inline(always)]
fn returned(ctx: &RetProbeContext) -> i64 {
    ctx.ret::<u64>()
        .map_or(i64::MIN, |r| i64::from(r as u32 as i32))
}

#[inline(always)]
fn report(entered: &Entered, ret: i64, inum: u32) -> u32 {
    let outcome = Outcome {
        start_ns: entered.start_ns,
        flags: entered.flags,
        ret,
        syscall: entered.syscall,
        netns_inum: inum,
        fd: -1,
        parent_pid: 0,
    };
    match submit(&outcome) {
        Ok(()) => 0,
        Err(()) => 1,
    }
}
