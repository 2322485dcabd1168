//! Kernel events as user space sees them: decoded from ring-buffer records into the
//! core's owned, typed records. Decoding is pure so it is tested without a kernel.

use podlapse_core::record::escaped;
pub use podlapse_core::record::{
    Cgroup, CniExec, CniOutput, CniWriteHook, Comm, EventMeta, KernelEvent, NetnsCall, RuntimeExec,
    WriteHookChange, cni_args_value, kind_name, split_wait_status,
};
use podlapse_ebpf_common::{
    CgroupEvent, CniExecEvent, CniOutputEvent, EventHeader, EventKind, ExecEvent, ExitEvent,
    NetnsEvent, NetnsSyscall, RuntimeExecEvent, argv_flags, cni_flags, cni_output_flags,
};

/// Why a record could not be decoded. The probes and this decoder share one layout
/// crate, so these mean a mismatched object file or a bug.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum DecodeError {
    /// The record is shorter than its header or its kind's struct.
    #[error("record of {len} bytes is shorter than the {need} its kind needs")]
    Short { len: usize, need: usize },
    /// The header's kind is not one this podlapse knows.
    #[error("record of unknown kind {kind}")]
    UnknownKind { kind: u32 },
    /// A kind only user space makes, in the ring buffer.
    #[error("record of kind {kind}, which the probes never write")]
    NotFromProbes { kind: u32 },
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
                fd: (syscall == NetnsSyscall::Setns && e.fd >= 0).then_some(e.fd),
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
        EventKind::CniOutput => KernelEvent::CniOutput(Box::new(cni_output(&read(bytes)?))),
        EventKind::CniWriteHook => return Err(DecodeError::NotFromProbes { kind: header.kind }),
    })
}

/// A chunk of a plugin's output (or its total): the bytes copied, never more than the
/// record holds whatever its lengths say.
fn cni_output(e: &CniOutputEvent) -> CniOutput {
    let end = e.flags & cni_output_flags::END != 0;
    let copied = (e.copied as usize).min(e.data.len());
    CniOutput {
        meta: meta(&e.header),
        offset: e.offset,
        count: e.count,
        len: e.len.min(e.data.len() as u32),
        data: escaped::escape(&e.data[..copied]),
        unreadable: e.flags & cni_output_flags::UNREADABLE != 0,
        end,
        writes: end.then_some(e.writes),
        captured: end.then_some(e.captured),
    }
}

/// A fork time as the probe read it: 0 (unknown) or later than the exec (a wrong
/// offset) is none.
fn forked(forked_ns: u64, exec_ns: u64) -> Option<u64> {
    (forked_ns != 0 && forked_ns <= exec_ns).then_some(forked_ns)
}

#[cfg(test)]
mod tests {
    use podlapse_ebpf_common::{COMM_LEN, PATH_LEN};

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
        let mut argv = [0u8; podlapse_ebpf_common::ARGV_LEN];
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
    fn a_cni_output_chunk_carries_its_bytes_escaped_and_bounded() {
        let mut data = [0u8; podlapse_ebpf_common::CNI_OUTPUT_CHUNK];
        let raw = b"{\"code\": 11, \"msg\": \"no\\addr\"}\xff";
        data[..raw.len()].copy_from_slice(raw);
        let ev = CniOutputEvent {
            header: header(EventKind::CniOutput, "host-local"),
            offset: 256,
            count: 700,
            len: raw.len() as u32,
            copied: raw.len() as u32,
            flags: 0,
            writes: 0,
            captured: 0,
            _pad: 0,
            data,
        };
        let KernelEvent::CniOutput(o) = decode(&bytes(&ev)).unwrap() else {
            panic!("not a CNI output");
        };
        assert_eq!((o.offset, o.count, o.len), (256, 700, raw.len() as u32));
        assert_eq!(o.data, "{\"code\": 11, \"msg\": \"no\\\\addr\"}\\xff");
        assert_eq!(o.bytes(), raw);
        assert!(!o.end && !o.unreadable && o.writes.is_none());
        let json = serde_json::to_value(KernelEvent::CniOutput(o)).unwrap();
        assert_eq!(json["kind"], "cni_output");
        // Lengths past the chunk (a corrupt record) are cut to it.
        let corrupt = CniOutputEvent {
            len: u32::MAX,
            copied: u32::MAX,
            ..ev
        };
        let KernelEvent::CniOutput(o) = decode(&bytes(&corrupt)).unwrap() else {
            panic!("not a CNI output");
        };
        assert_eq!(o.bytes().len(), podlapse_ebpf_common::CNI_OUTPUT_CHUNK);
        assert_eq!(o.len as usize, podlapse_ebpf_common::CNI_OUTPUT_CHUNK);
        let total = CniOutputEvent {
            offset: 5000,
            count: 0,
            len: 0,
            copied: 0,
            flags: cni_output_flags::END,
            writes: 9,
            captured: 1024,
            ..ev
        };
        let e = decode(&bytes(&total)).unwrap();
        assert!(
            e.to_string()
                .ends_with("wrote 5000 bytes to stdout in 9 writes (1024 captured)"),
            "{e}"
        );
        let KernelEvent::CniOutput(o) = e else {
            panic!()
        };
        assert!(o.end && o.data.is_empty());
        assert_eq!((o.writes, o.captured), (Some(9), Some(1024)));
        // The agent's own kind never comes from the ring.
        let mut h = header(EventKind::CniWriteHook, "x");
        h.kind = EventKind::CniWriteHook as u32;
        assert!(matches!(
            decode(&bytes(&h)),
            Err(DecodeError::NotFromProbes { .. })
        ));
    }

    #[test]
    fn netns_events_keep_their_syscall_and_inode() {
        let ev = NetnsEvent {
            header: header(EventKind::Netns, "containerd"),
            start_ns: 1_234_567_000_000,
            flags: podlapse_ebpf_common::CLONE_NEWNET,
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
