//! Kernel events as user space sees them: decoded from ring-buffer records into owned,
//! typed values. Decoding is pure so it is tested without a kernel.

use std::fmt;

use podtrace_ebpf_common::{
    CgroupEvent, CniExecEvent, EventHeader, EventKind, ExecEvent, ExitEvent, NetnsEvent,
    NetnsSyscall, RuntimeExecEvent, argv_flags, cni_flags,
};
use serde::Serialize;

use super::Comm;

/// Who and when: the header every kernel event carries.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, serde::Deserialize)]
pub struct EventMeta {
    /// CLOCK_MONOTONIC in nanoseconds, the clock of [`super::now_ktime_ns`].
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
    }
}

/// Why a record could not be decoded. The probes and this decoder share one layout
/// crate, so these mean a mismatched object file or a bug.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum DecodeError {
    /// The record is shorter than its header or its kind's struct.
    #[error("record of {len} bytes is shorter than the {need} its kind needs")]
    Short { len: usize, need: usize },
    /// The header's kind is not one this podtrace knows.
    #[error("record of unknown kind {kind}")]
    UnknownKind { kind: u32 },
}

/// Copies a `T` out of the start of `bytes`.
fn read<T: Copy>(bytes: &[u8]) -> Result<T, DecodeError> {
    let need = size_of::<T>();
    if bytes.len() < need {
        return Err(DecodeError::Short {
            len: bytes.len(),
            need,
        });
    }
    // SAFETY: the length is checked; T is one of the layout crate's #[repr(C)] types
    // of integers and byte arrays, valid for any bit pattern; read_unaligned because a
    // byte slice carries no alignment.
    Ok(unsafe { std::ptr::read_unaligned(bytes.as_ptr().cast::<T>()) })
}

/// The text up to the first NUL, with invalid UTF-8 replaced.
fn c_str(bytes: &[u8]) -> String {
    let end = bytes.iter().position(|b| *b == 0).unwrap_or(bytes.len());
    String::from_utf8_lossy(&bytes[..end]).into_owned()
}

fn comm(bytes: &[u8]) -> Comm {
    let end = bytes.iter().position(|b| *b == 0).unwrap_or(bytes.len());
    Comm::new(&String::from_utf8_lossy(&bytes[..end]))
}

fn meta(h: &EventHeader) -> EventMeta {
    EventMeta {
        ktime_ns: h.ktime_ns,
        cpu: h.cpu,
        pid: h.pid,
        tgid: h.tgid,
        comm: comm(&h.comm),
        cgroup_id: h.cgroup_id,
    }
}

fn cgroup(e: &CgroupEvent) -> Cgroup {
    Cgroup {
        hierarchy: e.root,
        level: e.level,
        cgroup_id: e.id,
        path: c_str(&e.path),
    }
}

/// Decodes one ring-buffer record.
pub fn decode(bytes: &[u8]) -> Result<KernelEvent, DecodeError> {
    let header: EventHeader = read(bytes)?;
    let kind =
        EventKind::from_u32(header.kind).ok_or(DecodeError::UnknownKind { kind: header.kind })?;
    Ok(match kind {
        EventKind::Exec => {
            let e: ExecEvent = read(bytes)?;
            KernelEvent::Exec {
                meta: meta(&e.header),
                filename: c_str(&e.filename),
                old_pid: e.old_pid,
                ppid: (e.ppid != 0).then_some(e.ppid),
            }
        }
        EventKind::Exit => {
            let e: ExitEvent = read(bytes)?;
            let (exit_code, signal) = split_wait_status(e.exit_code);
            KernelEvent::Exit {
                meta: meta(&e.header),
                exit_code,
                signal,
            }
        }
        EventKind::CgroupMkdir => {
            let e: CgroupEvent = read(bytes)?;
            KernelEvent::CgroupMkdir {
                meta: meta(&e.header),
                cgroup: cgroup(&e),
            }
        }
        EventKind::CgroupRmdir => {
            let e: CgroupEvent = read(bytes)?;
            KernelEvent::CgroupRmdir {
                meta: meta(&e.header),
                cgroup: cgroup(&e),
            }
        }
        EventKind::CgroupAttach => {
            let e: CgroupEvent = read(bytes)?;
            KernelEvent::CgroupAttach {
                meta: meta(&e.header),
                cgroup: cgroup(&e),
                target_pid: e.target_pid,
                target_comm: comm(&e.target_comm),
            }
        }
        EventKind::Netns => {
            let e: NetnsEvent = read(bytes)?;
            let syscall = NetnsSyscall::from_u32(e.syscall)
                .ok_or(DecodeError::UnknownKind { kind: e.syscall })?;
            KernelEvent::Netns {
                meta: meta(&e.header),
                syscall: syscall.into(),
                start_ns: e.start_ns,
                flags: e.flags,
                ret: e.ret,
                netns_inum: (e.netns_inum != 0).then_some(e.netns_inum),
                fd: (syscall == NetnsSyscall::Setns).then_some(e.fd),
                parent_pid: (e.parent_pid != 0).then_some(e.parent_pid),
            }
        }
        EventKind::CniExec => {
            let e: CniExecEvent = read(bytes)?;
            let filename = c_str(&e.filename);
            let args = c_str(&e.args);
            let cni_arg = |key: &str| cni_args_value(&args, key);
            KernelEvent::CniExec(Box::new(CniExec {
                meta: meta(&e.header),
                plugin: filename
                    .rsplit_once('/')
                    .map_or(filename.as_str(), |(_, f)| f)
                    .to_string(),
                command: c_str(&e.command),
                container_id: c_str(&e.container_id),
                netns: c_str(&e.netns),
                ifname: c_str(&e.ifname),
                pod_namespace: cni_arg("K8S_POD_NAMESPACE"),
                pod_name: cni_arg("K8S_POD_NAME"),
                infra_container_id: cni_arg("K8S_POD_INFRA_CONTAINER_ID"),
                env_scanned: e.env_scanned,
                env_truncated: e.flags & cni_flags::ENV_TRUNCATED != 0,
                forked_ns: forked(e.forked_ns, e.header.ktime_ns),
                filename,
                args,
            }))
        }
        EventKind::RuntimeExec => {
            let e: RuntimeExecEvent = read(bytes)?;
            let filled = (e.argv_len as usize).min(e.argv.len());
            let head_cut = e.flags & argv_flags::HEAD_CUT != 0;
            // The list ends with a NUL; what follows it is unused buffer.
            let used = &e.argv[..filled];
            let end = used.iter().rposition(|b| *b != 0).map_or(0, |p| p + 1);
            let argv: Vec<String> = if end == 0 {
                Vec::new()
            } else {
                used[..end]
                    .split(|b| *b == 0)
                    .map(|a| String::from_utf8_lossy(a).into_owned())
                    .collect()
            };
            KernelEvent::RuntimeExec(Box::new(RuntimeExec {
                meta: meta(&e.header),
                argv,
                head_cut,
                unreadable: e.flags & argv_flags::UNREADABLE != 0,
                forked_ns: forked(e.forked_ns, e.header.ktime_ns),
            }))
        }
    })
}

/// A fork time as the probe read it: 0 (unknown) or later than the exec (a wrong
/// offset) is none.
fn forked(forked_ns: u64, exec_ns: u64) -> Option<u64> {
    (forked_ns != 0 && forked_ns <= exec_ns).then_some(forked_ns)
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
        }
    }
}

#[cfg(test)]
mod tests {
    use podtrace_ebpf_common::{COMM_LEN, PATH_LEN};

    use super::*;

    use crate::ebpf::fuzz_seeds::{bytes, fixed};

    fn header(kind: EventKind, comm: &str) -> EventHeader {
        EventHeader {
            kind: kind as u32,
            cpu: 1,
            pid: 4242,
            tgid: 4242,
            ktime_ns: 1_234_567_890_123,
            cgroup_id: 5,
            comm: fixed::<COMM_LEN>(comm),
        }
    }

    #[test]
    fn a_runtime_exec_carries_its_arguments() {
        let mut argv = [0u8; podtrace_ebpf_common::ARGV_LEN];
        let raw = b"runc\0--root\0/run/runc\0start\0abc\0";
        argv[..raw.len()].copy_from_slice(raw);
        let ev = RuntimeExecEvent {
            header: header(EventKind::RuntimeExec, "runc"),
            argv_len: raw.len() as u32,
            flags: 0,
            forked_ns: 7,
            argv,
        };
        let KernelEvent::RuntimeExec(r) = decode(&bytes(&ev)).unwrap() else {
            panic!("not a runtime exec");
        };
        assert_eq!(r.argv, ["runc", "--root", "/run/runc", "start", "abc"]);
        assert!(!r.head_cut && !r.unreadable);
        assert_eq!(r.forked_ns, Some(7));
        // A fork after the exec is a misread, not a time.
        let later = RuntimeExecEvent {
            forked_ns: ev.header.ktime_ns + 1,
            ..ev
        };
        let KernelEvent::RuntimeExec(r) = decode(&bytes(&later)).unwrap() else {
            panic!("not a runtime exec");
        };
        assert_eq!(r.forked_ns, None);
        // A length past the buffer (a corrupt record) is cut to it, not trusted.
        let cut = RuntimeExecEvent {
            argv_len: u32::MAX,
            flags: argv_flags::HEAD_CUT,
            ..ev
        };
        let KernelEvent::RuntimeExec(r) = decode(&bytes(&cut)).unwrap() else {
            panic!("not a runtime exec");
        };
        assert!(r.head_cut);
        assert_eq!(r.argv.len(), 5, "{:?}", r.argv);
        let unreadable = RuntimeExecEvent {
            argv_len: 0,
            flags: argv_flags::UNREADABLE,
            ..ev
        };
        let e = decode(&bytes(&unreadable)).unwrap();
        assert!(e.to_string().ends_with("(arguments unreadable)"), "{e}");
    }

    #[test]
    fn a_cni_exec_carries_its_pod_and_sandbox() {
        let sandbox = "a".repeat(64);
        let ev = CniExecEvent {
            header: header(EventKind::CniExec, "containerd"),
            env_scanned: 47,
            flags: 0,
            forked_ns: 0,
            filename: fixed::<PATH_LEN>("/usr/lib/cni/host-local"),
            command: fixed("ADD"),
            ifname: fixed("eth0"),
            container_id: fixed(&sandbox),
            netns: fixed("/var/run/netns/cni-1234"),
            args: fixed(&format!(
                "IgnoreUnknown=1;K8S_POD_NAMESPACE=default;K8S_POD_NAME=web;K8S_POD_INFRA_CONTAINER_ID={sandbox};K8S_POD_UID=u1"
            )),
        };
        let KernelEvent::CniExec(c) = decode(&bytes(&ev)).unwrap() else {
            panic!("not a CNI exec");
        };
        let CniExec {
            plugin,
            command,
            container_id,
            pod_namespace,
            pod_name,
            infra_container_id,
            env_truncated,
            meta,
            ..
        } = *c;
        assert_eq!(plugin, "host-local");
        assert_eq!(command, "ADD");
        assert_eq!(container_id, sandbox);
        assert_eq!(pod_namespace.as_deref(), Some("default"));
        assert_eq!(pod_name.as_deref(), Some("web"));
        assert_eq!(infra_container_id.as_deref(), Some(sandbox.as_str()));
        assert!(!env_truncated);
        assert_eq!(meta.comm, "containerd");
        assert_eq!(meta.ktime_ns, 1_234_567_890_123);
    }

    #[test]
    fn netns_events_keep_their_syscall_and_inode() {
        let ev = NetnsEvent {
            header: header(EventKind::Netns, "containerd"),
            start_ns: 1_234_567_000_000,
            flags: podtrace_ebpf_common::CLONE_NEWNET,
            ret: 0,
            syscall: NetnsSyscall::Unshare as u32,
            netns_inum: 4026532500,
            fd: -1,
            parent_pid: 0,
        };
        let decoded = decode(&bytes(&ev)).unwrap();
        let json = serde_json::to_value(&decoded).unwrap();
        assert_eq!(json["kind"], "netns");
        assert_eq!(json["syscall"], "unshare");
        assert_eq!(json["netns_inum"], 4026532500u32);
        assert_eq!(json["fd"], serde_json::Value::Null);
        assert_eq!(json["comm"], "containerd");
        assert_eq!(json["ktime_ns"], 1_234_567_890_123u64);
        let line = decoded.to_string();
        assert!(
            line.contains("unshare(CLONE_NEWNET) = 0 in 890 us netns 4026532500"),
            "{line}"
        );
    }

    #[test]
    fn exit_status_splits_into_code_or_signal() {
        assert_eq!(split_wait_status(0), (Some(0), None));
        assert_eq!(split_wait_status(3 << 8), (Some(3), None));
        assert_eq!(split_wait_status(9), (None, Some(9)));
        assert_eq!(split_wait_status(i32::MIN), (None, None));
        let ev = ExitEvent {
            header: header(EventKind::Exit, "bridge"),
            exit_code: 1 << 8,
            _pad: 0,
        };
        assert!(matches!(
            decode(&bytes(&ev)).unwrap(),
            KernelEvent::Exit {
                exit_code: Some(1),
                signal: None,
                ..
            }
        ));
    }

    #[test]
    fn cgroup_paths_stop_at_the_nul() {
        let ev = CgroupEvent {
            header: header(EventKind::CgroupAttach, "runc:[2:INIT]"),
            id: 77,
            root: 3,
            level: 2,
            target_pid: 99,
            _pad: 0,
            target_comm: fixed("pause"),
            path: fixed("/k8s.io/abc"),
        };
        let KernelEvent::CgroupAttach {
            cgroup,
            target_pid,
            target_comm,
            ..
        } = decode(&bytes(&ev)).unwrap()
        else {
            panic!("not an attach");
        };
        assert_eq!(cgroup.path, "/k8s.io/abc");
        assert_eq!(cgroup.hierarchy, 3);
        assert_eq!((target_pid, target_comm.as_str()), (99, "pause"));
    }

    #[test]
    fn short_and_unknown_records_are_errors() {
        let ev = ExecEvent {
            header: header(EventKind::Exec, "sh"),
            old_pid: 1,
            ppid: 77,
            filename: fixed::<PATH_LEN>("/bin/true"),
        };
        let b = bytes(&ev);
        assert!(matches!(
            decode(&b),
            Ok(KernelEvent::Exec { ppid: Some(77), .. })
        ));
        assert_eq!(
            decode(&b[..100]),
            Err(DecodeError::Short {
                len: 100,
                need: size_of::<ExecEvent>()
            })
        );
        assert!(matches!(decode(&b[..10]), Err(DecodeError::Short { .. })));
        let mut h = header(EventKind::Exec, "sh");
        h.kind = 99;
        assert_eq!(
            decode(&bytes(&h)),
            Err(DecodeError::UnknownKind { kind: 99 })
        );
    }

    #[test]
    fn cni_args_values_are_found_by_exact_key() {
        let a = "K8S_POD_NAMESPACE=ns;K8S_POD_NAME=p;K8S_POD_NAME_X=q";
        assert_eq!(cni_args_value(a, "K8S_POD_NAME").as_deref(), Some("p"));
        assert_eq!(cni_args_value(a, "K8S_POD_UID"), None);
        assert_eq!(cni_args_value("", "K8S_POD_NAME"), None);
    }
}
