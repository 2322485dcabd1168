//! Finds container starts, and the exits of the processes they started, in the kernel's
//! event stream, for the agent to show at once (see [`crate::kubelet::observed_start`]
//! and [`crate::kubelet::observed_exit`]; the exit is also watched through the process's
//! pidfd, whichever reports first).
//!
//! A start is the first exec, in a container's cgroup, of a program that is not the
//! runtime's own (runc re-executes itself there while it sets the container up). Which
//! cgroup is whose comes from the cgroup_mkdir events (the runtime names a container's
//! cgroup by its ID), and which container a StartContainer call is for from the calls
//! themselves. Only containers whose StartContainer is under way are looked for, so at
//! rest an exec costs one check of an empty map.
//!
//! No clock of its own: time is the events' and the calls' (CLOCK_MONOTONIC).

use std::collections::HashMap;

use podlapse_core::record::CriMethod;

use crate::cri::CriCall;
use crate::ebpf::KernelEvent;
use crate::timeline::{cgroup_ids, is_runtime_helper_exec};

/// How long after StartContainer began its exec is looked for. The call takes
/// milliseconds; one whose exec never came (it failed inside the runtime, the event was
/// lost) stops being looked for after this.
pub const START_LIMIT_NS: u64 = 2_000_000_000;

/// Container cgroups remembered at most; more means their rmdir events were lost.
const MAX_CGROUPS: usize = 65_536;
/// Started containers' processes remembered at most; more means their exits were lost.
const MAX_RUNNING: usize = 65_536;

/// A container the kernel shows started.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ObservedStart {
    pub pod_uid: String,
    pub container_name: String,
    pub container_id: String,
    pub attempt: u32,
    /// The exec's kernel time.
    pub ktime_ns: u64,
}

/// The exit of a container's process, as the kernel reported it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ObservedExit {
    pub pod_uid: String,
    pub container_id: String,
    /// The exit code kubelet shows: the exit status, or 128 plus the signal.
    pub exit_code: i32,
    /// The exit's kernel time.
    pub ktime_ns: u64,
}

/// What one kernel event showed.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Observed {
    Start(ObservedStart),
    Exit(ObservedExit),
}

#[derive(Debug, Clone)]
struct Pending {
    pod_uid: String,
    name: String,
    attempt: u32,
    began_ns: u64,
}

#[derive(Debug, Default)]
pub struct StartWatch {
    /// cgroup v2 ID → the container ID its path names.
    cgroups: HashMap<u64, String>,
    /// StartContainer calls under way (or returned, exec not seen yet), by container ID.
    pending: HashMap<String, Pending>,
    /// Processes whose exec showed a container started, by process ID: (pod UID,
    /// container ID).
    running: HashMap<u32, (String, String)>,
}

impl StartWatch {
    pub fn new() -> StartWatch {
        StartWatch::default()
    }

    /// True while a start is looked for: events are wanted without delay.
    pub fn is_waiting(&self) -> bool {
        !self.pending.is_empty()
    }

    /// A CRI call began. True when it is a start to look for.
    pub fn call_began(&mut self, call: &CriCall) -> bool {
        if call.method != CriMethod::StartContainer || call.container_id.is_empty() {
            return false;
        }
        if call.pod_uid.is_empty() || call.container.is_empty() {
            // A container this agent did not create: nothing to show it in.
            return false;
        }
        self.pending.insert(
            call.container_id.clone(),
            Pending {
                pod_uid: call.pod_uid.clone(),
                name: call.container.clone(),
                attempt: call.attempt,
                began_ns: call.start_ns,
            },
        );
        true
    }

    /// A CRI call ended: a failed start is not looked for any more.
    pub fn call_ended(&mut self, call: &CriCall) {
        if call.method == CriMethod::StartContainer && !call.ok() {
            self.pending.remove(&call.container_id);
        }
    }

    /// Takes one kernel event; says which container it shows started, or whose process
    /// it shows exited, if any.
    pub fn offer(&mut self, e: &KernelEvent) -> Option<Observed> {
        match e {
            KernelEvent::Exit {
                meta,
                exit_code,
                signal,
            } if !self.running.is_empty() => {
                let exit_code = match (exit_code, signal) {
                    (_, Some(signal)) => 128 + signal,
                    (Some(code), None) => *code,
                    // The kernel could not say: the pidfd watch will.
                    (None, None) => return None,
                };
                let (pod_uid, container_id) = self.running.remove(&meta.tgid)?;
                Some(Observed::Exit(ObservedExit {
                    pod_uid,
                    container_id,
                    exit_code,
                    ktime_ns: meta.ktime_ns,
                }))
            }
            KernelEvent::CgroupMkdir { cgroup, .. } if cgroup.hierarchy == 0 => {
                if let Some(id) = cgroup_ids(&cgroup.path).runtime_id {
                    if self.cgroups.len() >= MAX_CGROUPS {
                        self.cgroups.clear();
                    }
                    self.cgroups.insert(cgroup.cgroup_id, id.to_string());
                }
                None
            }
            KernelEvent::CgroupRmdir { cgroup, .. } if cgroup.hierarchy == 0 => {
                self.cgroups.remove(&cgroup.cgroup_id);
                None
            }
            KernelEvent::Exec { meta, filename, .. } if !self.pending.is_empty() => {
                let t = meta.ktime_ns;
                self.pending
                    .retain(|_, p| p.began_ns.saturating_add(START_LIMIT_NS) >= t);
                let id = self.cgroups.get(&meta.cgroup_id)?;
                if is_runtime_helper_exec(filename) {
                    return None;
                }
                let p = self.pending.get(id).filter(|p| p.began_ns <= t)?;
                let start = ObservedStart {
                    pod_uid: p.pod_uid.clone(),
                    container_name: p.name.clone(),
                    container_id: id.clone(),
                    attempt: p.attempt,
                    ktime_ns: t,
                };
                self.pending.remove(&start.container_id);
                if self.running.len() >= MAX_RUNNING {
                    self.running.clear();
                }
                self.running.insert(
                    meta.tgid,
                    (start.pod_uid.clone(), start.container_id.clone()),
                );
                Some(Observed::Start(start))
            }
            _ => None,
        }
    }
}

#[cfg(test)]
mod tests {

    use super::*;
    use crate::ebpf::{Cgroup, EventMeta};

    const POD: &str = "cfbe6c52-3f90-2c4c-3f61-9d87dd3fa8e4";
    const APP: &str = "c98b9ab4e0440ee4d8a639d8ac2c51b6cb8dfb36a688fc6ea54250c17daaee1a";
    const OTHER: &str = "0000000000000000000000000000000000000000000000000000000000000001";

    fn meta(t: u64, cgroup_id: u64) -> EventMeta {
        EventMeta {
            cpu: 0,
            pid: 10,
            tgid: 10,
            ktime_ns: t,
            cgroup_id,
            comm: "x".into(),
        }
    }

    fn mkdir(t: u64, id: u64, container: &str) -> KernelEvent {
        KernelEvent::CgroupMkdir {
            meta: meta(t, 1),
            cgroup: Cgroup {
                hierarchy: 0,
                level: 4,
                cgroup_id: id,
                path: format!("/kubepods/besteffort/pod{POD}/{container}"),
            },
        }
    }

    fn exec(t: u64, cgroup_id: u64, filename: &str) -> KernelEvent {
        KernelEvent::Exec {
            meta: meta(t, cgroup_id),
            filename: filename.into(),
            old_pid: 10,
            ppid: None,
        }
    }

    fn start_call(t: u64, container_id: &str, code: &str) -> CriCall {
        // A call under way has no code yet: `Recording` begins it as Unknown.
        let code = if code.is_empty() {
            crate::cri::GrpcCode::Unknown
        } else {
            code.parse().expect("a gRPC code")
        };
        CriCall::new(CriMethod::StartContainer)
            .with_pod_uid(POD)
            .with_container("app")
            .with_attempt(2)
            .with_container_id(container_id)
            .with_times(t, t + 5)
            .with_code(code)
    }

    #[test]
    fn the_first_program_exec_in_the_containers_cgroup_is_its_start() {
        let mut w = StartWatch::new();
        assert_eq!(w.offer(&mkdir(10, 77, APP)), None);
        assert_eq!(w.offer(&mkdir(11, 78, OTHER)), None);
        assert!(!w.is_waiting());
        assert_eq!(w.offer(&exec(15, 77, "/bin/sleep")), None, "no start asked");
        assert!(w.call_began(&start_call(20, APP, "")));
        assert!(w.is_waiting());
        assert_eq!(w.offer(&exec(21, 78, "/bin/sleep")), None, "another cgroup");
        assert_eq!(w.offer(&exec(22, 77, "/proc/self/exe")), None, "runc's own");
        let seen = w.offer(&exec(23, 77, "/bin/sleep")).expect("the start");
        assert_eq!(
            seen,
            Observed::Start(ObservedStart {
                pod_uid: POD.into(),
                container_name: "app".into(),
                container_id: APP.into(),
                attempt: 2,
                ktime_ns: 23,
            })
        );
        assert!(!w.is_waiting());
        assert_eq!(w.offer(&exec(24, 77, "/bin/sh")), None, "only the first");
    }

    fn exit(t: u64, tgid: u32, exit_code: Option<i32>, signal: Option<i32>) -> KernelEvent {
        let mut m = meta(t, 77);
        (m.pid, m.tgid) = (tgid, tgid);
        KernelEvent::Exit {
            meta: m,
            exit_code,
            signal,
        }
    }

    #[test]
    fn the_exit_of_the_process_a_start_was_seen_in_is_the_containers() {
        let mut w = StartWatch::new();
        w.offer(&mkdir(1, 77, APP));
        assert_eq!(
            w.offer(&exit(5, 10, Some(0), None)),
            None,
            "nothing started"
        );
        w.call_began(&start_call(10, APP, ""));
        assert!(matches!(
            w.offer(&exec(11, 77, "/bin/sh")),
            Some(Observed::Start(_))
        ));
        // Another process of the pod (the start's exec was pid 10).
        assert_eq!(w.offer(&exit(12, 11, Some(0), None)), None);
        assert_eq!(
            w.offer(&exit(13, 10, Some(1), None)),
            Some(Observed::Exit(ObservedExit {
                pod_uid: POD.into(),
                container_id: APP.into(),
                exit_code: 1,
                ktime_ns: 13,
            }))
        );
        assert_eq!(w.offer(&exit(14, 10, Some(1), None)), None, "once");

        // Killed by a signal: 128 plus it, as kubelet shows it.
        w.call_began(&start_call(20, APP, ""));
        w.offer(&exec(21, 77, "/bin/sh"));
        let Some(Observed::Exit(killed)) = w.offer(&exit(22, 10, None, Some(9))) else {
            panic!("the kill");
        };
        assert_eq!(killed.exit_code, 137);
    }

    #[test]
    fn failed_or_stale_starts_and_removed_cgroups_are_forgotten() {
        let mut w = StartWatch::new();
        w.offer(&mkdir(1, 77, APP));
        w.call_began(&start_call(10, APP, ""));
        w.call_ended(&start_call(10, APP, "Unknown"));
        assert!(!w.is_waiting());
        assert_eq!(w.offer(&exec(12, 77, "/bin/sleep")), None);

        w.call_began(&start_call(20, APP, ""));
        assert_eq!(w.offer(&exec(20 + START_LIMIT_NS + 1, 5, "/x")), None);
        assert!(!w.is_waiting(), "given up after the limit");

        w.offer(&KernelEvent::CgroupRmdir {
            meta: meta(30, 1),
            cgroup: Cgroup {
                hierarchy: 0,
                level: 4,
                cgroup_id: 77,
                path: String::new(),
            },
        });
        w.call_began(&start_call(40, APP, ""));
        assert_eq!(w.offer(&exec(41, 77, "/bin/sleep")), None, "cgroup gone");
        // Calls for containers this agent did not create are not looked for.
        let mut foreign = start_call(50, OTHER, "");
        foreign.container.clear();
        assert!(!w.call_began(&foreign));
    }
}
