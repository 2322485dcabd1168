//! A kernel event as a trace records it: who and when (the header every event carries)
//! and what the probe saw. The agent's `ebpf` decodes them from the probes' ring buffer.

use std::fmt;

use podlapse_ebpf_common::{EventKind, NetnsSyscall};
use serde::Serialize;

use super::Comm;

/// Who and when: the header every kernel event carries.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, serde::Deserialize)]
pub struct EventMeta {
    /// CLOCK_MONOTONIC in nanoseconds, the clock of `bpf_ktime_get_ns`.
    pub ktime_ns: u64,
    pub cpu: u32,
    /// Thread ID.
    pub pid: u32,
    /// Process ID.
    pub tgid: u32,
    pub comm: Comm,
    /// The task's cgroup in the v2 (unified) hierarchy: matches the `cgroup_id` of a
    /// `cgroup_mkdir` in hierarchy 0.
    pub cgroup_id: u64,
}

/// Which namespace syscall a [`KernelEvent::Netns`] was.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, serde::Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum NetnsCall {
    Unshare,
    Setns,
    Clone,
    Clone3,
}

impl From<NetnsSyscall> for NetnsCall {
    fn from(s: NetnsSyscall) -> Self {
        match s {
            NetnsSyscall::Unshare => NetnsCall::Unshare,
            NetnsSyscall::Setns => NetnsCall::Setns,
            NetnsSyscall::Clone => NetnsCall::Clone,
            NetnsSyscall::Clone3 => NetnsCall::Clone3,
        }
    }
}

impl fmt::Display for NetnsCall {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            NetnsCall::Unshare => "unshare",
            NetnsCall::Setns => "setns",
            NetnsCall::Clone => "clone",
            NetnsCall::Clone3 => "clone3",
        })
    }
}

/// One event from the probes.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, serde::Deserialize)]
#[serde(tag = "kind", rename_all = "snake_case")]
pub enum KernelEvent {
    /// A process exec'd a new program (`sched_process_exec`).
    Exec {
        #[serde(flatten)]
        meta: EventMeta,
        filename: String,
        old_pid: u32,
        /// The parent's process ID, when the probes could read it.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        ppid: Option<u32>,
    },
    /// A process ended (`sched_process_exit` of its thread-group leader).
    Exit {
        #[serde(flatten)]
        meta: EventMeta,
        /// The exit status when it exited normally.
        exit_code: Option<i32>,
        /// The signal that ended it, if one did.
        signal: Option<i32>,
    },
    /// A cgroup was created (`cgroup_mkdir`), in one hierarchy.
    CgroupMkdir {
        #[serde(flatten)]
        meta: EventMeta,
        #[serde(flatten)]
        cgroup: Cgroup,
    },
    /// A cgroup was removed (`cgroup_rmdir`).
    CgroupRmdir {
        #[serde(flatten)]
        meta: EventMeta,
        #[serde(flatten)]
        cgroup: Cgroup,
    },
    /// A task was moved into a cgroup (`cgroup_attach_task`); `meta` is the mover.
    CgroupAttach {
        #[serde(flatten)]
        meta: EventMeta,
        #[serde(flatten)]
        cgroup: Cgroup,
        target_pid: u32,
        target_comm: Comm,
    },
    /// unshare, setns or clone with CLONE_NEWNET returned. `meta.ktime_ns` is the return.
    Netns {
        #[serde(flatten)]
        meta: EventMeta,
        syscall: NetnsCall,
        start_ns: u64,
        flags: u64,
        ret: i64,
        /// Inode of the network namespace the task is in after the call.
        netns_inum: Option<u32>,
        /// setns: the namespace file descriptor.
        fd: Option<i32>,
        /// clone (reported by the child): the thread that called clone.
        parent_pid: Option<u32>,
    },
    /// A CNI plugin was exec'd (`sched_process_exec` under the CNI bin dir). Boxed:
    /// its strings make it three times the size of every other kind, and agents keep
    /// many events in memory.
    CniExec(Box<CniExec>),
    /// A container runtime program (runc, crun, a containerd shim) was exec'd, with its
    /// arguments. Reported just before that exec's own [`KernelEvent::Exec`].
    RuntimeExec(Box<RuntimeExec>),
    /// A chunk of what a CNI plugin process wrote to its standard output, or (`end`) how
    /// much it wrote in all, reported at its exit.
    CniOutput(Box<CniOutput>),
    /// The agent attached or detached the write hook that captures CNI plugins' output,
    /// or failed to attach it. Not from the probes: the agent's own record, on the same
    /// clock, so a plugin run can say whether its output could have been seen.
    CniWriteHook(Box<CniWriteHook>),
}

/// What a [`KernelEvent::CniOutput`] says.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, serde::Deserialize)]
pub struct CniOutput {
    #[serde(flatten)]
    pub meta: EventMeta,
    /// Where the chunk starts in the process's standard output (the counts of its
    /// earlier writes, plus the chunk's place in its write); with `end`, the total.
    pub offset: u64,
    /// The whole write's byte count (0 with `end`).
    pub count: u64,
    /// Bytes of the output the chunk stands for.
    pub len: u32,
    /// The bytes copied, as text: invalid UTF-8 as `\xNN`, a backslash as `\\`
    /// ([`super::escaped`]). Empty when `unreadable` or `end`.
    pub data: String,
    /// The bytes could not be read from the plugin's memory.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub unreadable: bool,
    /// The process exited: `offset` is everything it wrote.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub end: bool,
    /// With `end`: its writes to standard output, and the bytes the probes copied.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub writes: Option<u32>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub captured: Option<u32>,
}

impl CniOutput {
    /// The bytes of the chunk.
    pub fn bytes(&self) -> Vec<u8> {
        super::escaped::unescape(&self.data)
    }
}

/// What happened to the write hook.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, serde::Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum WriteHookChange {
    Attached,
    Detached,
    /// The attach failed: `reason` says why.
    Refused,
}

/// What a [`KernelEvent::CniWriteHook`] says.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, serde::Deserialize)]
pub struct CniWriteHook {
    #[serde(flatten)]
    pub meta: EventMeta,
    pub change: WriteHookChange,
    /// `kprobe:ksys_write` or `tracepoint:syscalls:sys_enter_write`.
    pub hook: String,
    /// What made it change: the CRI call or kernel event that needed it, the idle
    /// linger, or the kernel's refusal.
    pub reason: String,
}

/// What a [`KernelEvent::RuntimeExec`] says.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, serde::Deserialize)]
pub struct RuntimeExec {
    #[serde(flatten)]
    pub meta: EventMeta,
    /// The arguments, `argv[0]` first (or, when `head_cut`, the last ones that fit).
    pub argv: Vec<String>,
    /// The argument list was longer than the probe keeps: its first part is missing.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub head_cut: bool,
    /// The arguments could not be read.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub unreadable: bool,
    /// When the process was forked (the clock of `meta.ktime_ns`): what it took the
    /// runtime to get from starting the process to its exec.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub forked_ns: Option<u64>,
}

/// What a [`KernelEvent::CniExec`] says.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, serde::Deserialize)]
pub struct CniExec {
    #[serde(flatten)]
    pub meta: EventMeta,
    /// The plugin's file name: `bridge`, `host-local`, ...
    pub plugin: String,
    pub filename: String,
    pub command: String,
    pub container_id: String,
    pub netns: String,
    pub ifname: String,
    pub args: String,
    pub pod_namespace: Option<String>,
    pub pod_name: Option<String>,
    /// `K8S_POD_INFRA_CONTAINER_ID`: the sandbox ID as the runtime passed it.
    pub infra_container_id: Option<String>,
    pub env_scanned: u32,
    /// The environment was longer than the probe looks; CNI_* values may be missing.
    pub env_truncated: bool,
    /// When the plugin's process was forked (the clock of `meta.ktime_ns`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub forked_ns: Option<u64>,
}

/// The cgroup a cgroup event is about.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, serde::Deserialize)]
pub struct Cgroup {
    /// Hierarchy ID (cgroup v1 has one per controller).
    pub hierarchy: i32,
    pub level: i32,
    /// The created (or target) cgroup's ID. Named apart from the task's own
    /// `cgroup_id` in the event header, which sits beside it in the JSON.
    #[serde(rename = "target_cgroup_id")]
    pub cgroup_id: u64,
    pub path: String,
}

impl KernelEvent {
    pub fn meta(&self) -> &EventMeta {
        match self {
            KernelEvent::Exec { meta, .. }
            | KernelEvent::Exit { meta, .. }
            | KernelEvent::CgroupMkdir { meta, .. }
            | KernelEvent::CgroupRmdir { meta, .. }
            | KernelEvent::CgroupAttach { meta, .. }
            | KernelEvent::Netns { meta, .. } => meta,
            KernelEvent::CniExec(c) => &c.meta,
            KernelEvent::RuntimeExec(r) => &r.meta,
            KernelEvent::CniOutput(o) => &o.meta,
            KernelEvent::CniWriteHook(h) => &h.meta,
        }
    }

    pub fn ktime_ns(&self) -> u64 {
        self.meta().ktime_ns
    }

    pub fn kind(&self) -> EventKind {
        match self {
            KernelEvent::Exec { .. } => EventKind::Exec,
            KernelEvent::Exit { .. } => EventKind::Exit,
            KernelEvent::CgroupMkdir { .. } => EventKind::CgroupMkdir,
            KernelEvent::CgroupRmdir { .. } => EventKind::CgroupRmdir,
            KernelEvent::CgroupAttach { .. } => EventKind::CgroupAttach,
            KernelEvent::Netns { .. } => EventKind::Netns,
            KernelEvent::CniExec(_) => EventKind::CniExec,
            KernelEvent::RuntimeExec(_) => EventKind::RuntimeExec,
            KernelEvent::CniOutput(_) => EventKind::CniOutput,
            KernelEvent::CniWriteHook(_) => EventKind::CniWriteHook,
        }
    }
}

/// Short, stable names of event kinds, as in the JSON `kind` field.
pub fn kind_name(kind: EventKind) -> &'static str {
    match kind {
        EventKind::Exec => "exec",
        EventKind::Exit => "exit",
        EventKind::CgroupMkdir => "cgroup_mkdir",
        EventKind::CgroupRmdir => "cgroup_rmdir",
        EventKind::CgroupAttach => "cgroup_attach",
        EventKind::Netns => "netns",
        EventKind::CniExec => "cni_exec",
        EventKind::RuntimeExec => "runtime_exec",
        EventKind::CniOutput => "cni_output",
        EventKind::CniWriteHook => "cni_write_hook",
    }
}

/// Splits a `wait(2)` status into (exit code, signal). `i32::MIN` is the probes'
/// "unknown".
pub fn split_wait_status(status: i32) -> (Option<i32>, Option<i32>) {
    if status == i32::MIN {
        return (None, None);
    }
    let signal = status & 0x7f;
    if signal == 0 {
        (Some((status >> 8) & 0xff), None)
    } else {
        (None, Some(signal))
    }
}

/// The value of `key` in a `CNI_ARGS` string (`K1=v1;K2=v2`).
pub fn cni_args_value(args: &str, key: &str) -> Option<String> {
    args.split(';').find_map(|kv| {
        let (k, v) = kv.split_once('=')?;
        (k == key).then(|| v.to_string())
    })
}

impl fmt::Display for KernelEvent {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let m = self.meta();
        write!(
            f,
            "{}.{:06} {:<13} {:>7} {:<15} ",
            m.ktime_ns / 1_000_000_000,
            (m.ktime_ns % 1_000_000_000) / 1000,
            kind_name(self.kind()),
            m.tgid,
            m.comm
        )?;
        match self {
            KernelEvent::Exec {
                filename,
                old_pid,
                ppid,
                ..
            } => {
                write!(f, "{filename}")?;
                if let Some(p) = ppid {
                    write!(f, " (parent {p})")?;
                }
                if *old_pid != m.pid {
                    write!(f, " (old pid {old_pid})")?;
                }
                Ok(())
            }
            KernelEvent::Exit {
                exit_code, signal, ..
            } => match (exit_code, signal) {
                (Some(c), _) => write!(f, "exit code {c}"),
                (_, Some(s)) => write!(f, "killed by signal {s}"),
                _ => write!(f, "exit status unknown"),
            },
            KernelEvent::CgroupMkdir { cgroup, .. } | KernelEvent::CgroupRmdir { cgroup, .. } => {
                write!(f, "{} (hierarchy {})", cgroup.path, cgroup.hierarchy)
            }
            KernelEvent::CgroupAttach {
                cgroup,
                target_pid,
                target_comm,
                ..
            } => write!(
                f,
                "pid {target_pid} ({target_comm}) -> {} (hierarchy {})",
                cgroup.path, cgroup.hierarchy
            ),
            KernelEvent::Netns {
                syscall,
                start_ns,
                ret,
                netns_inum,
                fd,
                parent_pid,
                ..
            } => {
                write!(
                    f,
                    "{syscall}(CLONE_NEWNET) = {ret} in {} us",
                    m.ktime_ns.saturating_sub(*start_ns) / 1000
                )?;
                if let Some(i) = netns_inum {
                    write!(f, " netns {i}")?;
                }
                if let Some(fd) = fd {
                    write!(f, " fd {fd}")?;
                }
                if let Some(p) = parent_pid {
                    write!(f, " (child of {p})")?;
                }
                Ok(())
            }
            KernelEvent::CniExec(c) => {
                write!(
                    f,
                    "{} {} container {} if {}",
                    c.plugin, c.command, c.container_id, c.ifname
                )?;
                if let (Some(ns), Some(name)) = (&c.pod_namespace, &c.pod_name) {
                    write!(f, " pod {ns}/{name}")?;
                }
                if c.env_truncated {
                    write!(f, " (environment truncated)")?;
                }
                Ok(())
            }
            KernelEvent::RuntimeExec(r) => {
                if r.unreadable {
                    return write!(f, "(arguments unreadable)");
                }
                if r.head_cut {
                    write!(f, "... ")?;
                }
                write!(f, "{}", r.argv.join(" "))
            }
            KernelEvent::CniOutput(o) if o.end => write!(
                f,
                "wrote {} bytes to stdout in {} writes ({} captured)",
                o.offset,
                o.writes.unwrap_or(0),
                o.captured.unwrap_or(0)
            ),
            KernelEvent::CniOutput(o) if o.unreadable => {
                write!(f, "stdout @{} +{}: unreadable", o.offset, o.len)
            }
            KernelEvent::CniOutput(o) => {
                write!(f, "stdout @{} +{}: {:?}", o.offset, o.len, o.data)
            }
            KernelEvent::CniWriteHook(h) => {
                write!(f, "write hook {:?} {}: {}", h.change, h.hook, h.reason)
            }
        }
    }
}
