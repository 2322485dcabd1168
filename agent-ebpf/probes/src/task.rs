//! Reads from the current `task_struct` at offsets user space resolved from the running
//! kernel's BTF. The offsets differ between kernel builds, so none is compiled in.

use aya_ebpf::helpers::{
    bpf_get_current_comm, bpf_get_current_task, bpf_probe_read_kernel, bpf_probe_read_user,
};
use podlapse_ebpf_common::{COMM_LEN, CommWords, comm_words};

// Set by user space with `EbpfLoader::set_global` before load; 0 means "not resolved"
// and turns the read off rather than reading a wrong field.
#[unsafe(no_mangle)]
static TASK_NSPROXY_OFFSET: u32 = 0;
#[unsafe(no_mangle)]
static NSPROXY_NET_NS_OFFSET: u32 = 0;
#[unsafe(no_mangle)]
static NET_INUM_OFFSET: u32 = 0;
#[unsafe(no_mangle)]
static NS_COMMON_INUM_OFFSET: u32 = 0;
#[unsafe(no_mangle)]
static TASK_EXIT_CODE_OFFSET: u32 = 0;
#[unsafe(no_mangle)]
static TASK_REAL_PARENT_OFFSET: u32 = 0;
#[unsafe(no_mangle)]
static TASK_TGID_OFFSET: u32 = 0;
#[unsafe(no_mangle)]
static TASK_MM_OFFSET: u32 = 0;
#[unsafe(no_mangle)]
static MM_START_STACK_OFFSET: u32 = 0;
#[unsafe(no_mangle)]
static MM_ARG_START_OFFSET: u32 = 0;
#[unsafe(no_mangle)]
static MM_ARG_END_OFFSET: u32 = 0;
#[unsafe(no_mangle)]
static TASK_START_TIME_OFFSET: u32 = 0;
#[unsafe(no_mangle)]
static TASK_COMM_OFFSET: u32 = 0;

/// Reads a global set at load time. `read_volatile` keeps the compiler from folding the
/// compile-time 0 into the code: the loader patches the value in `.rodata`.
#[inline(always)]
fn global(g: &'static u32) -> usize {
    // SAFETY: `g` is a valid static.
    unsafe { core::ptr::read_volatile(g) as usize }
}

/// Inode number of the current task's network namespace; 0 when unknown (offsets not
/// resolved, or the task has no nsproxy any more because it is exiting).
#[inline(always)]
pub fn current_netns_inum() -> u32 {
    let nsproxy_off = global(&TASK_NSPROXY_OFFSET);
    if nsproxy_off == 0 {
        return 0;
    }
    // SAFETY: bpf_probe_read_kernel checks every address; a bad one is an error, not a
    // fault.
    let nsproxy = unsafe {
        let task = bpf_get_current_task() as *const u8;
        bpf_probe_read_kernel(task.add(nsproxy_off) as *const *const u8)
    };
    nsproxy.map_or(0, nsproxy_netns_inum)
}

/// Inode number of the network namespace of `nsproxy`; 0 when unknown or null.
#[inline(always)]
pub fn nsproxy_netns_inum(nsproxy: *const u8) -> u32 {
    let (net_ns_off, inum_off) = (global(&NSPROXY_NET_NS_OFFSET), global(&NET_INUM_OFFSET));
    if inum_off == 0 || nsproxy.is_null() {
        return 0;
    }
    // SAFETY: as above, the helper checks every address.
    unsafe {
        let Ok(net) = bpf_probe_read_kernel(nsproxy.add(net_ns_off) as *const *const u8) else {
            return 0;
        };
        if net.is_null() {
            return 0;
        }
        bpf_probe_read_kernel(net.add(inum_off) as *const u32).unwrap_or(0)
    }
}

/// Inode number of the namespace whose `struct ns_common` is at `ns`; 0 when unknown.
#[inline(always)]
pub fn ns_common_inum(ns: *const u8) -> u32 {
    let off = global(&NS_COMMON_INUM_OFFSET);
    if off == 0 || ns.is_null() {
        return 0;
    }
    // SAFETY: as above, the helper checks the address.
    unsafe { bpf_probe_read_kernel(ns.add(off) as *const u32).unwrap_or(0) }
}

/// The current task's `exit_code`, or `i32::MIN` when unknown.
#[inline(always)]
pub fn current_exit_code() -> i32 {
    let off = global(&TASK_EXIT_CODE_OFFSET);
    if off == 0 {
        return i32::MIN;
    }
    // SAFETY: as above, the helper checks the address.
    unsafe {
        let task = bpf_get_current_task() as *const u8;
        bpf_probe_read_kernel(task.add(off) as *const i32).unwrap_or(i32::MIN)
    }
}

/// When the current task was forked (`task_struct.start_time`, CLOCK_MONOTONIC ns like
/// `bpf_ktime_get_ns`), or 0 when unknown. At `sched_process_exec` of a new process the
/// task is the one its parent forked, so this is the fork that led to the exec.
#[inline(always)]
pub fn current_start_time() -> u64 {
    let off = global(&TASK_START_TIME_OFFSET);
    if off == 0 {
        return 0;
    }
    // SAFETY: as above, the helper checks the address.
    unsafe {
        let task = bpf_get_current_task() as *const u8;
        bpf_probe_read_kernel(task.add(off) as *const u64).unwrap_or(0)
    }
}

/// The current task's `comm`, as words. Read from the task directly, a fixed 16-byte
/// copy, where `bpf_get_current_comm` copies it as a string (about 180 ns more per exec
/// here, on every exec of the node); through the helper when the offset is unknown.
#[inline(always)]
pub fn current_comm() -> CommWords {
    let off = global(&TASK_COMM_OFFSET);
    if off == 0 {
        return comm_words(&bpf_get_current_comm().unwrap_or([0; COMM_LEN]));
    }
    // SAFETY: as above, the helper checks the address.
    unsafe {
        let task = bpf_get_current_task() as *const u8;
        bpf_probe_read_kernel(task.add(off) as *const CommWords).unwrap_or([0; 2])
    }
}

/// The process ID of the current task's parent, or 0 when unknown.
#[inline(always)]
pub fn current_parent_tgid() -> u32 {
    let (parent_off, tgid_off) = (global(&TASK_REAL_PARENT_OFFSET), global(&TASK_TGID_OFFSET));
    if parent_off == 0 || tgid_off == 0 {
        return 0;
    }
    // SAFETY: as above, the helper checks every address.
    unsafe {
        let task = bpf_get_current_task() as *const u8;
        let Ok(parent) = bpf_probe_read_kernel(task.add(parent_off) as *const *const u8) else {
            return 0;
        };
        if parent.is_null() {
            return 0;
        }
        bpf_probe_read_kernel(parent.add(tgid_off) as *const i32).map_or(0, |t| t as u32)
    }
}

/// Where the `envp` array of the program the current task has just exec'd starts, or
/// null when unknown. Valid at `sched_process_exec`: the ELF loader has set
/// `mm->start_stack` to the new stack's `argc`, followed by `argc` argument pointers, a
/// NULL, then the environment pointers.
#[inline(always)]
pub fn exec_envp() -> *const u64 {
    let (mm_off, stack_off) = (global(&TASK_MM_OFFSET), global(&MM_START_STACK_OFFSET));
    if mm_off == 0 || stack_off == 0 {
        return core::ptr::null();
    }
    // SAFETY: the helpers check every address, kernel and user.
    unsafe {
        let task = bpf_get_current_task() as *const u8;
        let Ok(mm) = bpf_probe_read_kernel(task.add(mm_off) as *const *const u8) else {
            return core::ptr::null();
        };
        if mm.is_null() {
            return core::ptr::null();
        }
        let Ok(stack) = bpf_probe_read_kernel(mm.add(stack_off) as *const u64) else {
            return core::ptr::null();
        };
        let Ok(argc) = bpf_probe_read_user(stack as *const u64) else {
            return core::ptr::null();
        };
        // argc, argv[argc], NULL: the arithmetic wraps on a nonsense argc, and the
        // checked reads of the scan then fail instead of faulting.
        stack.wrapping_add(argc.wrapping_add(2).wrapping_mul(8)) as *const u64
    }
}

/// Where the arguments of the program the current task has just exec'd lie:
/// `(mm->arg_start, mm->arg_end)`, or `None` when unknown. Valid at
/// `sched_process_exec`: the ELF loader has copied the argument strings to the new stack.
#[inline(always)]
pub fn exec_args() -> Option<(u64, u64)> {
    let (mm_off, start_off, end_off) = (
        global(&TASK_MM_OFFSET),
        global(&MM_ARG_START_OFFSET),
        global(&MM_ARG_END_OFFSET),
    );
    if mm_off == 0 || start_off == 0 || end_off == 0 {
        return None;
    }
    // SAFETY: the helpers check every address.
    unsafe {
        let task = bpf_get_current_task() as *const u8;
        let mm = bpf_probe_read_kernel(task.add(mm_off) as *const *const u8).ok()?;
        if mm.is_null() {
            return None;
        }
        let start = bpf_probe_read_kernel(mm.add(start_off) as *const u64).ok()?;
        let end = bpf_probe_read_kernel(mm.add(end_off) as *const u64).ok()?;
        (end > start).then_some((start, end))
    }
}
