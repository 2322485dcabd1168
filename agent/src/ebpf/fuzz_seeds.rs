//! The probes' layout written from decoded events (shared with the decoder's tests), and
//! the eBPF decoder's fuzz seeds (`agent/fuzz/seeds/ebpf_event/`): real kernel records
//! from the committed traces, written back in the probes' ring-buffer layout. The test
//! checks that every seed still decodes to the record it came from, so a change of the
//! layout shows here; `PODLAPSE_WRITE_FUZZ_SEEDS=1` rewrites them
//! (`cargo xtask fuzz --refresh-seeds`).

use std::collections::BTreeSet;
use std::path::{Path, PathBuf};

use podlapse_ebpf_common::{
    CNI_OUTPUT_CHUNK, CgroupEvent, CniExecEvent, CniOutputEvent, EventHeader, EventKind, ExecEvent,
    ExitEvent, NetnsEvent, NetnsSyscall, RuntimeExecEvent, argv_flags, cni_flags, cni_output_flags,
};

use super::event::{EventMeta, KernelEvent, NetnsCall, decode};
use crate::trace::{TraceRecord, read_trace};

/// Kernel records kept per kind and trace: enough to seed every branch of the decoder.
const PER_KIND: usize = 3;

/// The bytes of a layout struct, as the probes write it.
pub(super) fn bytes<T: Copy>(v: &T) -> Vec<u8> {
    // SAFETY: T is a #[repr(C)] layout type without hidden padding (the layout crate
    // asserts its sizes), so all its bytes are initialised.
    unsafe { std::slice::from_raw_parts((v as *const T).cast::<u8>(), size_of::<T>()) }.to_vec()
}

/// `s` NUL-padded into `N` bytes, cut to leave the NUL.
pub(super) fn fixed<const N: usize>(s: &str) -> [u8; N] {
    let mut b = [0u8; N];
    let n = s.len().min(N - 1);
    b[..n].copy_from_slice(&s.as_bytes()[..n]);
    b
}

fn header(kind: EventKind, m: &EventMeta) -> EventHeader {
    EventHeader {
        kind: kind as u32,
        cpu: m.cpu,
        pid: m.pid,
        tgid: m.tgid,
        ktime_ns: m.ktime_ns,
        cgroup_id: m.cgroup_id,
        comm: fixed(m.comm.as_str()),
    }
}

/// The ring-buffer record the probes write for `e`; the agent's own records (which
/// never pass through the ring) write nothing.
fn encode(e: &KernelEvent) -> Vec<u8> {
    match e {
        KernelEvent::CniOutput(o) => {
            let raw = o.bytes();
            let mut data = [0u8; CNI_OUTPUT_CHUNK];
            let n = raw.len().min(CNI_OUTPUT_CHUNK);
            data[..n].copy_from_slice(&raw[..n]);
            let mut flags = 0;
            if o.unreadable {
                flags |= cni_output_flags::UNREADABLE;
            }
            if o.end {
                flags |= cni_output_flags::END;
            }
            bytes(&CniOutputEvent {
                header: header(EventKind::CniOutput, &o.meta),
                offset: o.offset,
                count: o.count,
                len: o.len,
                copied: n as u32,
                flags,
                writes: o.writes.unwrap_or(0),
                captured: o.captured.unwrap_or(0),
                _pad: 0,
                data,
            })
        }
        KernelEvent::CniWriteHook(_) => Vec::new(),
        KernelEvent::Exec {
            meta,
            filename,
            old_pid,
            ppid,
        } => bytes(&ExecEvent {
            header: header(EventKind::Exec, meta),
            old_pid: *old_pid,
            ppid: ppid.unwrap_or(0),
            filename: fixed(filename),
        }),
        KernelEvent::Exit {
            meta,
            exit_code,
            signal,
        } => bytes(&ExitEvent {
            header: header(EventKind::Exit, meta),
            exit_code: match (exit_code, signal) {
                (Some(c), _) => c << 8,
                (_, Some(s)) => *s,
                _ => i32::MIN,
            },
            _pad: 0,
        }),
        KernelEvent::CgroupMkdir { meta, cgroup }
        | KernelEvent::CgroupRmdir { meta, cgroup }
        | KernelEvent::CgroupAttach { meta, cgroup, .. } => {
            let (kind, target_pid, target_comm) = match e {
                KernelEvent::CgroupMkdir { .. } => (EventKind::CgroupMkdir, 0, ""),
                KernelEvent::CgroupRmdir { .. } => (EventKind::CgroupRmdir, 0, ""),
                KernelEvent::CgroupAttach {
                    target_pid,
                    target_comm,
                    ..
                } => (EventKind::CgroupAttach, *target_pid, target_comm.as_str()),
                _ => unreachable!("matched above"),
            };
            bytes(&CgroupEvent {
                header: header(kind, meta),
                id: cgroup.cgroup_id,
                root: cgroup.hierarchy,
                level: cgroup.level,
                target_pid,
                _pad: 0,
                target_comm: fixed(target_comm),
                path: fixed(&cgroup.path),
            })
        }
        KernelEvent::Netns {
            meta,
            syscall,
            start_ns,
            flags,
            ret,
            netns_inum,
            fd,
            parent_pid,
        } => bytes(&NetnsEvent {
            header: header(EventKind::Netns, meta),
            start_ns: *start_ns,
            flags: *flags,
            ret: *ret,
            syscall: match syscall {
                NetnsCall::Unshare => NetnsSyscall::Unshare,
                NetnsCall::Setns => NetnsSyscall::Setns,
                NetnsCall::Clone => NetnsSyscall::Clone,
                NetnsCall::Clone3 => NetnsSyscall::Clone3,
            } as u32,
            netns_inum: netns_inum.unwrap_or(0),
            fd: fd.unwrap_or(-1),
            parent_pid: parent_pid.unwrap_or(0),
        }),
        KernelEvent::CniExec(c) => bytes(&CniExecEvent {
            header: header(EventKind::CniExec, &c.meta),
            env_scanned: c.env_scanned,
            flags: if c.env_truncated {
                cni_flags::ENV_TRUNCATED
            } else {
                0
            },
            forked_ns: c.forked_ns.unwrap_or(0),
            filename: fixed(&c.filename),
            command: fixed(&c.command),
            ifname: fixed(&c.ifname),
            container_id: fixed(&c.container_id),
            netns: fixed(&c.netns),
            args: fixed(&c.args),
        }),
        KernelEvent::RuntimeExec(r) => {
            let mut argv = [0u8; podlapse_ebpf_common::ARGV_LEN];
            let mut n = 0;
            for a in &r.argv {
                let end = (n + a.len()).min(argv.len() - 1);
                argv[n..end].copy_from_slice(&a.as_bytes()[..end - n]);
                n = end + 1;
                if n >= argv.len() {
                    break;
                }
            }
            let n = n.min(argv.len());
            let flags = if r.unreadable {
                argv_flags::UNREADABLE
            } else if r.head_cut {
                argv_flags::HEAD_CUT
            } else {
                0
            };
            bytes(&RuntimeExecEvent {
                header: header(EventKind::RuntimeExec, &r.meta),
                argv_len: if r.unreadable { 0 } else { n as u32 },
                flags,
                forked_ns: r.forked_ns.unwrap_or(0),
                argv,
            })
        }
    }
}

fn repo() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("..")
}

/// The first few kernel records of each kind in every committed trace, by file name.
fn seeds() -> Vec<(String, KernelEvent)> {
    let mut traces: Vec<PathBuf> = std::fs::read_dir(repo().join("traces"))
        .expect("traces/ is readable")
        .filter_map(|e| Some(e.ok()?.path()))
        .filter(|p| p.extension().is_some_and(|e| e == "jsonl"))
        .collect();
    traces.sort();
    let mut out = Vec::new();
    for path in traces {
        let trace = read_trace(&path).expect("a committed trace reads");
        let stem = path.file_stem().unwrap().to_string_lossy().into_owned();
        let mut taken: Vec<(String, usize)> = Vec::new();
        for r in &trace.records {
            let TraceRecord::Kernel(e) = r else { continue };
            if matches!(e, KernelEvent::CniWriteHook(_)) {
                continue;
            }
            let kind = super::event::kind_name(e.kind()).to_string();
            let n = match taken.iter_mut().find(|(k, _)| *k == kind) {
                Some((_, n)) => n,
                None => {
                    taken.push((kind.clone(), 0));
                    &mut taken.last_mut().unwrap().1
                }
            };
            if *n < PER_KIND {
                *n += 1;
                out.push((format!("{stem}-{kind}-{n}"), e.clone()));
            }
        }
    }
    out
}

#[test]
fn the_committed_fuzz_seeds_are_real_records_in_the_current_layout() {
    let dir = repo().join("agent/fuzz/seeds/ebpf_event");
    let seeds = seeds();
    let kinds: BTreeSet<&str> = seeds
        .iter()
        .map(|(_, e)| super::event::kind_name(e.kind()))
        .collect();
    assert!(kinds.len() >= 5, "the traces hold too few kinds: {kinds:?}");
    if std::env::var_os("PODLAPSE_WRITE_FUZZ_SEEDS").is_some() {
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).unwrap();
        for (name, e) in &seeds {
            std::fs::write(dir.join(name), encode(e)).unwrap();
        }
    }
    for (name, e) in &seeds {
        let file = dir.join(name);
        let seed = std::fs::read(&file).unwrap_or_else(|err| {
            panic!(
                "{}: {err} (run `cargo xtask fuzz --refresh-seeds`)",
                file.display()
            )
        });
        assert_eq!(
            seed,
            encode(e),
            "{name} is stale: run `cargo xtask fuzz --refresh-seeds`"
        );
        assert_eq!(&decode(&seed).unwrap(), e, "{name} decodes to its record");
    }
}
