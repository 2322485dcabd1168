//! podlapse's eBPF probes: classic tracepoints, and kprobes on the two kernel functions
//! that create and enter a network namespace (`netns_fn.rs`), which user space attaches
//! instead of the namespace syscall tracepoints where the kernel allows them and falls
//! back from where it does not, and the write hooks of `cni_output.rs` (a kprobe on
//! `ksys_write`, else the `sys_enter_write` tracepoint) that copy what CNI plugins print,
//! which user space attaches only while a plugin runs. Every event goes through one ring buffer;
//! a failed reservation is counted per CPU and per kind in `LOST`, so user space can
//! report every event it did not get.
//!
//! Events are submitted without waking the reader: a wakeup is IRQ work, a self-IPI
//! that costs more than the probe itself (several microseconds under a hypervisor),
//! and the reader drains the ring on a short timer anyway. Only a record that takes the
//! unread data past another eighth of the ring forces a wakeup, so a burst is read
//! long before the ring fills, and so does the exec or exit of a process of pod work,
//! which the agent shows at once (unless user space turned that off for a consumer that
//! acts on nothing at once).
//!
//! Field offsets of the tracepoints are their `format` files' (stable ABI). Offsets
//! into kernel structs are not: user space resolves them from the running kernel's BTF
//! and sets them as globals before loading.
#![no_std]
#![no_main]

mod cgroup;
mod cni;
mod cni_output;
mod filter;
mod netns;
mod netns_fn;
mod runtime;
mod sched;
mod task;

use aya_ebpf::bindings::{
    BPF_RB_AVAIL_DATA, BPF_RB_FORCE_WAKEUP, BPF_RB_NO_WAKEUP, BPF_RB_RING_SIZE,
};
use aya_ebpf::helpers::{
    bpf_get_current_cgroup_id, bpf_get_current_pid_tgid, bpf_get_smp_processor_id, bpf_ktime_get_ns,
};
use aya_ebpf::macros::map;
use aya_ebpf::maps::ring_buf::RingBufEntry;
use aya_ebpf::maps::{PerCpuArray, RingBuf};
use podlapse_ebpf_common::{CommWords, EventHeader, EventKind, ringbuf_record_bytes, wakeup_due};

/// Default size; user space sets the real one (`--ringbuf-bytes`) before loading.
#[map(name = "EVENTS")]
static EVENTS: RingBuf = RingBuf::with_byte_size(256 * 1024, 0);

#[map(name = "LOST")]
static LOST: PerCpuArray<u64> = PerCpuArray::with_max_entries(EventKind::COUNT, 0);

/// Set by user space before load (`names::WAKE_FOR_POD_WORK`): whether an urgent event
/// wakes the reader.
#[unsafe(no_mangle)]
static WAKE_FOR_POD_WORK: u32 = 1;

/// Set by user space before load (`names::WAKE_FOR_CNI`): whether a CNI plugin's exec
/// and a network namespace's creation wake the reader, which attaches the write hook
/// that captures the plugins' output.
#[unsafe(no_mangle)]
static WAKE_FOR_CNI: u32 = 1;

/// A reserved event and how to submit it.
#[must_use = "the verifier requires a reserved entry to be submitted"]
struct Reserved<T: 'static> {
    entry: RingBufEntry<T>,
    /// `BPF_RB_FORCE_WAKEUP` or `BPF_RB_NO_WAKEUP`.
    flags: u64,
}

impl<T: 'static> Reserved<T> {
    #[inline(always)]
    fn as_mut_ptr(&mut self) -> *mut T {
        self.entry.as_mut_ptr()
    }

    /// Makes the event visible to the reader, waking it only if the reservation passed
    /// a wakeup mark.
    #[inline(always)]
    fn submit(self) {
        self.entry.submit(self.flags);
    }
}

/// Reserves a `T` in the ring buffer, or counts one lost event of `kind`.
#[inline(always)]
fn reserve<T: 'static>(kind: EventKind) -> Option<Reserved<T>> {
    reserve_waking(kind, false)
}

/// [`reserve`], waking the reader on submit when user space asked to be woken for what
/// precedes a CNI plugin's output (its exec, the namespace the runtime creates first).
#[inline(always)]
fn reserve_for_cni<T: 'static>(kind: EventKind) -> Option<Reserved<T>> {
    // SAFETY: a valid static; volatile so the loader's patched value is read.
    let wake = unsafe { core::ptr::read_volatile(&WAKE_FOR_CNI) } != 0;
    reserve_with(kind, wake)
}

/// [`reserve`], waking the reader on submit when `urgent`: the exec or exit of a process
/// of pod work (a container's first exec shows it running, its exit terminated), which
/// the agent shows as soon as it reads it. Such events are a few per pod, so their
/// wakeups cost little; everything else waits for the reader's next drain.
#[inline(always)]
fn reserve_waking<T: 'static>(kind: EventKind, urgent: bool) -> Option<Reserved<T>> {
    // SAFETY: a valid static; volatile so the loader's patched value is read.
    let wake_for_pod_work = unsafe { core::ptr::read_volatile(&WAKE_FOR_POD_WORK) } != 0;
    reserve_with(kind, urgent && wake_for_pod_work)
}

/// Reserves a `T`, to be submitted with a forced wakeup when `urgent` or when it passes a
/// wakeup mark.
#[inline(always)]
fn reserve_with<T: 'static>(kind: EventKind, urgent: bool) -> Option<Reserved<T>> {
    let Some(entry) = EVENTS.reserve::<T>(0) else {
        if let Some(counter) = LOST.get_ptr_mut(kind as u32) {
            // SAFETY: a per-CPU array slot is only touched by this CPU, and BPF programs
            // do not preempt each other on one CPU for tracepoints.
            unsafe { *counter += 1 };
        }
        return None;
    };
    // Right after the reservation, so the unread data counted ends with this record.
    // Another CPU reserving in between can move a wakeup to another record or skip a
    // mark; the reader's timer drains the ring regardless.
    let avail = EVENTS.query(BPF_RB_AVAIL_DATA as u64);
    let ring_size = EVENTS.query(BPF_RB_RING_SIZE as u64);
    let flags = if urgent || wakeup_due(avail, ringbuf_record_bytes(size_of::<T>()), ring_size) {
        BPF_RB_FORCE_WAKEUP
    } else {
        BPF_RB_NO_WAKEUP
    };
    Some(Reserved {
        entry,
        flags: flags as u64,
    })
}

/// Fills the header at the start of a reserved event.
///
/// # Safety
/// `header` must point at writable memory of a reserved ring-buffer entry.
#[inline(always)]
unsafe fn fill_header(header: *mut EventHeader, kind: EventKind) {
    // SAFETY: passed on from the caller.
    unsafe { fill_header_with(header, kind, task::current_comm()) }
}

/// [`fill_header`] with the current task's comm already read.
///
/// # Safety
/// As [`fill_header`].
#[inline(always)]
unsafe fn fill_header_with(header: *mut EventHeader, kind: EventKind, comm: CommWords) {
    let pid_tgid = bpf_get_current_pid_tgid();
    // SAFETY: the caller guarantees `header` is writable; the comm is at an 8-aligned
    // offset of the 8-aligned entry, so it is stored as its two words; the helpers have
    // no preconditions.
    unsafe {
        (*header).kind = kind as u32;
        (*header).cpu = bpf_get_smp_processor_id();
        (*header).pid = pid_tgid as u32;
        (*header).tgid = (pid_tgid >> 32) as u32;
        (*header).ktime_ns = bpf_ktime_get_ns();
        (*header).cgroup_id = bpf_get_current_cgroup_id();
        ((&raw mut (*header).comm) as *mut CommWords).write(comm);
    }
}

/// The kernel's pid of the current task (the thread ID).
#[inline(always)]
fn current_tid() -> u32 {
    bpf_get_current_pid_tgid() as u32
}

/// Reads a field of the tracepoint's record at a fixed offset. A tracepoint program may
/// load from its context directly (the verifier checks the offset is constant, aligned
/// and inside the record), which costs a load where `read_at`'s `bpf_probe_read` costs a
/// helper call.
///
/// # Safety
/// `field` must be the offset of a `T` in the tracepoint's format file, aligned to
/// `T`'s size.
#[inline(always)]
unsafe fn ctx_field<T: Copy>(ctx: &aya_ebpf::programs::TracePointContext, field: usize) -> T {
    // SAFETY: the caller guarantees the offset; the verifier checks it.
    unsafe {
        core::ptr::read_volatile(
            (aya_ebpf::EbpfContext::as_ptr(ctx) as *const u8).add(field) as *const T
        )
    }
}

/// Reads a `__data_loc` field: the low 16 bits are the offset of the data from the
/// start of the record, the high 16 its length.
#[inline(always)]
fn data_loc(ctx: &aya_ebpf::programs::TracePointContext, field: usize) -> *const u8 {
    // SAFETY: `field` is a `__data_loc` (u32) offset from the tracepoint's format file.
    let loc: u32 = unsafe { ctx_field(ctx, field) };
    let offset = (loc & 0xffff) as usize;
    // SAFETY: the offset points inside the same trace record.
    unsafe { (aya_ebpf::EbpfContext::as_ptr(ctx) as *const u8).add(offset) }
}

#[cfg(not(test))]
#[panic_handler]
fn panic(_info: &core::panic::PanicInfo) -> ! {
    // The verifier rejects a program that can reach this; it exists for the linker.
    loop {}
}
