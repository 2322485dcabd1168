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
    fn tracepoint_ids_parse_with_their_newline() {
        assert_eq!(parse_id("1234\n").unwrap(), 1234);
        assert!(parse_id("").is_err());
        assert!(parse_id("-3").is_err());
    }
}
