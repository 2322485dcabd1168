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

/// How the event thread (the ring-buffer reader and the pidfd waits, `event_thread.rs`)
/// is scheduled.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum EventThreadPolicy {
    /// SCHED_FIFO at [`EVENT_THREAD_RT_PRIORITY`]; [`EventThreadPolicy::Nice`] where the
    /// kernel refuses it.
    Fifo,
    /// Nice [`EVENT_THREAD_NICE`] with the short slice.
    Nice,
}

impl EventThreadPolicy {
    /// What the event thread runs first, on itself, to take this policy.
    pub fn thread_start(self) -> fn() {
        match self {
            EventThreadPolicy::Fifo => prioritise_event_thread_fifo,
            EventThreadPolicy::Nice => prioritise_event_thread_nice,
        }
    }
}

/// The event thread's real-time priority: the lowest. It sleeps but for microseconds per
/// kernel event or exit, and a real-time thread is never made to wait for fair-class
/// work: at nice -10 with the short slice, the runc and shim processes a burst of pod
/// work puts on every CPU still held it off the CPU for 1 to 6 ms in the middle of a
/// drain (thread CPU time 50 µs against that wall time), which set the p99 of benchmark
/// 3 (eight crash-looping pods: 1.0 to 2.7 ms over five runs; 0.13 ms in two runs at
/// this priority). The kernel's real-time throttling (`sched_rt_runtime_us`)
/// bounds it even if it never slept.
pub const EVENT_THREAD_RT_PRIORITY: i32 = 1;

/// The event thread's nice value where it cannot be real-time: its weight costs the node
/// nothing, while it no longer queues behind the runc and shim processes of a burst of pod
/// work as it did at 0 (exits shown 8.7 ms after the kernel at p99 with eight
/// crash-looping pods, 3.7 ms at -10).
pub const EVENT_THREAD_NICE: i32 = -10;

/// How the calling thread ended up scheduled.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Applied {
    /// SCHED_FIFO at [`EVENT_THREAD_RT_PRIORITY`], reset to the fair class in any child.
    Fifo,
    /// The fair class at [`EVENT_THREAD_NICE`].
    Nice,
    /// Neither was allowed (no CAP_SYS_NICE): the thread keeps its scheduling.
    Unchanged,
}

/// SCHED_FIFO for the calling thread, else [`prioritise_event_thread_nice`]. Without
/// CAP_SYS_NICE, or in a cgroup without a real-time budget, the kernel refuses it.
pub fn prioritise_event_thread_fifo() {
    let _ = event_thread_fifo();
}

/// Nice -10 and the short slice for the calling thread.
pub fn prioritise_event_thread_nice() {
    let _ = event_thread_nice();
}

/// [`prioritise_event_thread_fifo`], saying what it applied.
pub fn event_thread_fifo() -> Applied {
    let param = libc::sched_param {
        sched_priority: EVENT_THREAD_RT_PRIORITY,
    };
    // SAFETY: `param` is a valid sched_param alive for the call; pid 0 is the calling
    // thread. SCHED_RESET_ON_FORK: nothing this thread starts inherits the class.
    let rc = unsafe {
        libc::sched_setscheduler(0, libc::SCHED_FIFO | libc::SCHED_RESET_ON_FORK, &param)
    };
    if rc == 0 {
        return Applied::Fifo;
    }
    tracing::debug!(
        "event thread is not real-time ({}); nice {EVENT_THREAD_NICE} instead",
        std::io::Error::last_os_error()
    );
    event_thread_nice()
}

/// [`prioritise_event_thread_nice`], saying what it applied.
pub fn event_thread_nice() -> Applied {
    // SAFETY: setpriority has no memory arguments; for PRIO_PROCESS, 0 is the calling
    // thread.
    let rc = unsafe { libc::setpriority(libc::PRIO_PROCESS, 0, EVENT_THREAD_NICE) };
    let applied = if rc == 0 {
        Applied::Nice
    } else {
        tracing::debug!(
            "event thread keeps its nice value: {}",
            std::io::Error::last_os_error()
        );
        Applied::Unchanged
    };
    request_short_slice();
    applied
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
        // Refused or not, the request leaves the thread's policy alone.
        assert_eq!(policy, libc::SCHED_OTHER);
        // sched_setattr with SCHED_OTHER has been in every kernel since 3.14, and the
        // agent's whole premise is a kernel newer than that (BPF ring buffers, 5.8).
        assert!(ok, "this kernel refused sched_setattr for SCHED_OTHER");
        assert_eq!(rc, 0, "sched_getattr");
        // Kernels before 6.12 accept the call but have no slice to report.
        if runtime != 0 {
            assert_eq!(runtime, SLICE.as_nanos() as u64);
        }
    }

    /// The thread's policy, real-time priority and nice value as the kernel reports them.
    fn scheduling() -> (i32, i32, i32) {
        let mut param = libc::sched_param { sched_priority: 0 };
        // SAFETY: no memory arguments / a valid sched_param for the call.
        let policy = unsafe { libc::sched_getscheduler(0) };
        // SAFETY: as above.
        unsafe { libc::sched_getparam(0, &mut param) };
        // SAFETY: no memory arguments.
        let nice = unsafe { libc::getpriority(libc::PRIO_PROCESS, 0) };
        (policy, param.sched_priority, nice)
    }

    #[test]
    fn the_event_thread_is_real_time_at_the_lowest_priority_or_falls_back_to_nice() {
        let (applied, (policy, priority, nice)) =
            std::thread::spawn(|| (event_thread_fifo(), scheduling()))
                .join()
                .unwrap();
        match applied {
            Applied::Fifo => assert_eq!(
                (policy, priority),
                (
                    libc::SCHED_FIFO | libc::SCHED_RESET_ON_FORK,
                    EVENT_THREAD_RT_PRIORITY
                )
            ),
            Applied::Nice => {
                assert_eq!((policy, nice), (libc::SCHED_OTHER, EVENT_THREAD_NICE))
            }
            Applied::Unchanged => assert_eq!(policy, libc::SCHED_OTHER),
        }
        // The test's own thread is untouched.
        assert_eq!(scheduling().0, libc::SCHED_OTHER);
    }

    #[test]
    fn a_process_started_from_the_real_time_thread_is_back_in_the_fair_class() {
        // Whatever the thread was given (real time, or the nice fallback where the kernel
        // refuses SCHED_FIFO), what it starts runs in the fair class.
        let child_policy = std::thread::spawn(|| {
            let _applied = event_thread_fifo();
            let mut child = std::process::Command::new("sleep")
                .arg("30")
                .spawn()
                .expect("starting sleep");
            // The 41st field of /proc/PID/stat is the scheduling policy; the command
            // name (field 2) is `sleep`, with no spaces to split wrongly.
            let stat = std::fs::read_to_string(format!("/proc/{}/stat", child.id()));
            let _ = child.kill();
            let _ = child.wait();
            let stat = stat.expect("the child's stat");
            let policy: i32 = stat
                .split_whitespace()
                .nth(40)
                .and_then(|f| f.parse().ok())
                .expect("field 41 of the child's stat is its policy");
            policy
        })
        .join()
        .unwrap();
        assert_eq!(child_policy, libc::SCHED_OTHER);
    }
}
