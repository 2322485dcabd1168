//! The kernel's own cost of a syscall tracepoint, with no program behind it. Enabling any
//! one of them (`syscalls:sys_enter_unshare`, say) marks every task on the node, so that
//! every syscall of every process, whatever its number, takes the kernel's slow entry
//! and exit path and calls the tracepoint's handler, which then finds nothing to do for
//! most numbers. The namespace programs sit on such tracepoints, so that cost is part of
//! "every program attached" however cheap the programs are. Benchmark 4 measures it on
//! its own by opening the same tracepoints as counting perf events: the same
//! registration in the kernel as a program's attach, with no program and no reader.

use std::ffi::c_ulong;
use std::os::fd::{FromRawFd, OwnedFd};
use std::path::{Path, PathBuf};

use anyhow::{Context, anyhow, bail};
use perf_event_open_sys::bindings::{
    PERF_ATTR_SIZE_VER0, PERF_FLAG_FD_CLOEXEC, PERF_TYPE_TRACEPOINT, perf_event_attr,
};

/// Where tracefs is mounted: its own mount point on current kernels, else under debugfs.
const TRACEFS: [&str; 2] = ["/sys/kernel/tracing", "/sys/kernel/debug/tracing"];

/// The program names that sit on syscall tracepoints (`sys_enter_*`, `sys_exit_*`),
/// which are also the tracepoints' names in the `syscalls` group.
pub fn syscall_programs<'a>(programs: impl IntoIterator<Item = &'a str>) -> Vec<String> {
    let mut names: Vec<String> = programs
        .into_iter()
        .filter(|p| p.starts_with("sys_enter_") || p.starts_with("sys_exit_"))
        .map(str::to_string)
        .collect();
    names.sort();
    names.dedup();
    names
}

/// Syscall tracepoints enabled, on every CPU, until dropped.
pub struct SyscallTracepoints {
    _events: Vec<OwnedFd>,
}

impl SyscallTracepoints {
    /// Enables `syscalls:<name>` for each name: one counting perf event per online CPU.
    pub fn enable(names: &[String]) -> anyhow::Result<SyscallTracepoints> {
        if names.is_empty() {
            bail!("no syscall tracepoint to enable");
        }
        let tracefs = tracefs()?;
        let cpus = aya::util::online_cpus()
            .map_err(|(path, e)| anyhow!("reading the online CPUs from {path}: {e}"))?;
        let mut events = Vec::with_capacity(names.len() * cpus.len());
        for name in names {
            let id = tracepoint_id(&tracefs, name)?;
            for &cpu in &cpus {
                events.push(
                    open_counting(id, cpu)
                        .with_context(|| format!("enabling syscalls:{name} on CPU {cpu}"))?,
                );
            }
        }
        Ok(SyscallTracepoints { _events: events })
    }
}

/// Every syscall on the node, counted (`raw_syscalls:sys_enter` as a counting perf event
/// on every CPU) while this lives: it sends every syscall through the slow path itself,
/// so it counts a window of its own, never one whose cost is measured.
pub struct SyscallCount {
    events: Vec<OwnedFd>,
}

impl SyscallCount {
    pub fn start() -> anyhow::Result<SyscallCount> {
        let tracefs = tracefs()?;
        let path = tracefs.join("events/raw_syscalls/sys_enter/id");
        let text = std::fs::read_to_string(&path)
            .with_context(|| format!("reading {}", path.display()))?;
        let id = parse_id(&text)
            .with_context(|| format!("{}: {text:?} is not a tracepoint ID", path.display()))?;
        let cpus = aya::util::online_cpus()
            .map_err(|(path, e)| anyhow!("reading the online CPUs from {path}: {e}"))?;
        let events = cpus
            .iter()
            .map(|&cpu| {
                open_counting(id, cpu)
                    .with_context(|| format!("counting raw_syscalls:sys_enter on CPU {cpu}"))
            })
            .collect::<anyhow::Result<_>>()?;
        Ok(SyscallCount { events })
    }

    /// The syscalls counted so far, on every CPU.
    pub fn read(&self) -> anyhow::Result<u64> {
        let mut total = 0;
        for fd in &self.events {
            let mut count = [0u8; 8];
            let mut file = std::fs::File::from(fd.try_clone()?);
            std::io::Read::read_exact(&mut file, &mut count)
                .context("reading a counting perf event")?;
            total += u64::from_ne_bytes(count);
        }
        Ok(total)
    }
}

/// What one syscall costs on this thread, by its own CPU clock, with the syscall
/// tracepoints `names` enabled (no program) and without, in alternating rounds: the
/// kernel's slow entry and exit path, alone.
#[derive(Debug, Clone, serde::Serialize, serde::Deserialize)]
pub struct SlowPath {
    pub off_ns: Vec<f64>,
    pub on_ns: Vec<f64>,
}

impl SlowPath {
    /// `rounds` rounds of `calls` getppid(2) calls each way.
    pub fn measure(names: &[String], rounds: usize, calls: u64) -> anyhow::Result<SlowPath> {
        let (mut off_ns, mut on_ns) = (Vec::new(), Vec::new());
        for _ in 0..rounds {
            off_ns.push(ns_per_syscall(calls));
            let enabled = SyscallTracepoints::enable(names)?;
            on_ns.push(ns_per_syscall(calls));
            drop(enabled);
        }
        Ok(SlowPath { off_ns, on_ns })
    }

    /// The ns the enabled tracepoints add to a syscall: the medians' difference.
    pub fn added_ns(&self) -> f64 {
        super::stats::median(&self.on_ns) - super::stats::median(&self.off_ns)
    }
}

/// This thread's CPU time per getppid(2), in ns, over `calls` calls.
fn ns_per_syscall(calls: u64) -> f64 {
    let cpu_ns = || {
        let mut t = libc::timespec {
            tv_sec: 0,
            tv_nsec: 0,
        };
        // SAFETY: clock_gettime writes the timespec it is given.
        unsafe { libc::clock_gettime(libc::CLOCK_THREAD_CPUTIME_ID, &mut t) };
        t.tv_sec as u64 * 1_000_000_000 + t.tv_nsec as u64
    };
    let start = cpu_ns();
    for _ in 0..calls {
        // SAFETY: getppid has no arguments and cannot fail.
        unsafe { libc::syscall(libc::SYS_getppid) };
    }
    (cpu_ns() - start) as f64 / calls as f64
}

fn tracefs() -> anyhow::Result<PathBuf> {
    TRACEFS
        .iter()
        .map(PathBuf::from)
        .find(|p| p.join("events").is_dir())
        .ok_or_else(|| anyhow!("tracefs is mounted at none of {}", TRACEFS.join(", ")))
}

/// The tracepoint's ID, which perf takes as the event's config.
fn tracepoint_id(tracefs: &Path, name: &str) -> anyhow::Result<u64> {
    let path = tracefs.join("events/syscalls").join(name).join("id");
    let text = std::fs::read_to_string(&path)
        .with_context(|| format!("reading the ID of syscalls:{name} from {}", path.display()))?;
    parse_id(&text).with_context(|| format!("{}: {text:?} is not a tracepoint ID", path.display()))
}

fn parse_id(text: &str) -> anyhow::Result<u64> {
    Ok(text.trim().parse::<u64>()?)
}

/// A tracepoint perf event on `cpu` for every process, counting only: no samples, no
/// ring, no program.
fn open_counting(id: u64, cpu: u32) -> anyhow::Result<OwnedFd> {
    let mut attr = perf_event_attr {
        type_: PERF_TYPE_TRACEPOINT,
        size: PERF_ATTR_SIZE_VER0,
        config: id,
        ..Default::default()
    };
    let cpu = i32::try_from(cpu).context("CPU number")?;
    // SAFETY: `attr` is a valid, initialised attribute of the size it declares; pid -1
    // with a CPU and no group is a per-CPU event for every process.
    let fd = unsafe {
        perf_event_open_sys::perf_event_open(
            &mut attr,
            -1,
            cpu,
            -1,
            PERF_FLAG_FD_CLOEXEC as c_ulong,
        )
    };
    if fd < 0 {
        return Err(std::io::Error::last_os_error()).context("perf_event_open");
    }
    // SAFETY: a new descriptor that nothing else owns.
    Ok(unsafe { OwnedFd::from_raw_fd(fd) })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn syscall_programs_are_those_on_syscall_tracepoints() {
        let names = syscall_programs([
            "sched_process_exec",
            "sys_exit_unshare",
            "sys_enter_unshare",
            "cgroup_mkdir",
            "sys_enter_setns",
            "sys_enter_unshare",
        ]);
        assert_eq!(
            names,
            ["sys_enter_setns", "sys_enter_unshare", "sys_exit_unshare"]
        );
    }

    #[test]
    fn the_slow_path_adds_the_difference_of_the_medians() {
        let slow = SlowPath {
            off_ns: vec![90.0, 100.0, 500.0],
            on_ns: vec![160.0, 150.0, 140.0],
        };
        assert!((slow.added_ns() - 50.0).abs() < 1e-9);
    }

    #[test]
    fn a_syscall_takes_some_cpu_time_on_this_thread() {
        let ns = ns_per_syscall(10_000);
        assert!(ns > 0.0 && ns < 1_000_000.0, "{ns}");
    }

    #[test]
    fn tracepoint_ids_parse_with_their_newline() {
        assert_eq!(parse_id("1234\n").unwrap(), 1234);
        assert!(parse_id("").is_err());
        assert!(parse_id("-3").is_err());
    }
}
