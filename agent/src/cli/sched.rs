//! The agent's threads ask the scheduler for a short slice. Since Linux 6.12 the fair
//! scheduler (EEVDF) takes `sched_attr.sched_runtime` of a SCHED_OTHER thread as the slice
//! it requests: a shorter slice gives it an earlier deadline, so when it wakes (a pidfd
//! turns readable, a kernel event is due) it runs ahead of the long-running work around
//! it (runc, the runtime's shims, the pods) instead of waiting out their slices. Its share
//! of the CPU does not change; only when it gets it. Older kernels refuse or ignore the
//! field, and the thread keeps the default.

use std::time::Duration;

/// The shortest slice the kernel accepts.
pub const SLICE: Duration = Duration::from_micros(100);

/// `struct sched_attr`, its first version (`SCHED_ATTR_SIZE_VER0`).
#[repr(C)]
struct SchedAttr {
    size: u32,
    policy: u32,
    flags: u64,
    nice: i32,
    priority: u32,
    runtime: u64,
    deadline: u64,
    period: u64,
}

/// Asks for [`SLICE`] on the calling thread, keeping its policy (SCHED_OTHER) and nice
/// value. False when the kernel refused.
pub fn request_short_slice() -> bool {
    // SAFETY: getpriority has no memory arguments; for PRIO_PROCESS with 0 it reads the
    // calling thread's nice value (-1 is also a valid value, so errno is not checked:
    // a wrong value would only be refused by sched_setattr below).
    let nice = unsafe { libc::getpriority(libc::PRIO_PROCESS, 0) };
    let attr = SchedAttr {
        size: size_of::<SchedAttr>() as u32,
        policy: libc::SCHED_OTHER as u32,
        flags: 0,
        nice,
        priority: 0,
        runtime: SLICE.as_nanos() as u64,
        deadline: 0,
        period: 0,
    };
    // SAFETY: `attr` is a valid sched_attr of the size it states, alive for the call;
    // pid 0 is the calling thread.
    let rc = unsafe { libc::syscall(libc::SYS_sched_setattr, 0, &attr as *const SchedAttr, 0) };
    rc == 0
}

/// The event thread's nice value: it sleeps but for a few microseconds per kernel event
/// or exit, so its weight costs the node nothing, while it no longer queues behind the
/// runc and shim processes a burst of pod work puts on every CPU (exits shown 8.7 ms after
/// the kernel at p99 with eight crash-looping pods, 3.7 ms at -10).
pub const EVENT_THREAD_NICE: i32 = -10;

/// Sets the calling thread's nice value to [`EVENT_THREAD_NICE`] and asks for the short
/// slice. Without the privilege (CAP_SYS_NICE) the thread keeps its nice value.
pub fn prioritise_event_thread() {
    // SAFETY: setpriority has no memory arguments; for PRIO_PROCESS, 0 is the calling
    // thread.
    let rc = unsafe { libc::setpriority(libc::PRIO_PROCESS, 0, EVENT_THREAD_NICE) };
    if rc != 0 {
        tracing::debug!(
            "event thread keeps its nice value: {}",
            std::io::Error::last_os_error()
        );
    }
    request_short_slice();
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_thread_can_ask_for_a_short_slice_and_keeps_its_policy() {
        let handle = std::thread::spawn(|| {
            let ok = request_short_slice();
            // SAFETY: no arguments.
            let policy = unsafe { libc::sched_getscheduler(0) };
            let mut got = SchedAttr {
                size: 0,
                policy: 0,
                flags: 0,
                nice: 0,
                priority: 0,
                runtime: 0,
                deadline: 0,
                period: 0,
            };
            // SAFETY: the kernel writes at most the size passed into `got`.
            let rc = unsafe {
                libc::syscall(
                    libc::SYS_sched_getattr,
                    0,
                    &mut got as *mut SchedAttr,
                    size_of::<SchedAttr>() as u32,
                    0,
                )
            };
            (ok, policy, rc, got.runtime)
        });
        let (ok, policy, rc, runtime) = handle.join().unwrap();
        assert_eq!(policy, libc::SCHED_OTHER);
        if !ok {
            eprintln!("skipped: this kernel refused sched_setattr");
            return;
        }
        assert_eq!(rc, 0, "sched_getattr");
        // Kernels before 6.12 accept the call but have no slice to report.
        if runtime != 0 {
            assert_eq!(runtime, SLICE.as_nanos() as u64);
        }
    }
}
