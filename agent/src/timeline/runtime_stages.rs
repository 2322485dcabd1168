//! The runtime's own steps inside RunPodSandbox and StartContainer, from the kernel:
//! the shim's start, the new shim daemon until it ran runc, `runc create` (with
//! `runc init`, the container's first process, inside it) and `runc start`. Each is a
//! process the probes saw exec'd, with the sandbox or container ID in its arguments
//! (`runc init` by its parent), timed from its exec to its exit; the shim daemon, which
//! lives on, from its exec until it ran `runc create`. A process the runtime forked for
//! the step (the shim's start, runc create and start) is timed from that fork, read from
//! the task's start time at its exec.

use super::runtime_args::{self, Program};
use super::stage_kind::StageKind;
use crate::ebpf::KernelEvent;

/// One runtime step of a sandbox or container.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RuntimeStep {
    /// `shim_start`, `shim_create`, `runc_create`, `runc_init` or `runc_start`: the order
    /// the runtime runs them in is their order in [`StageKind::PIPELINE`].
    pub kind: StageKind,
    pub start_ns: u64,
    /// The process's exit (for `runc_init`, `runc create`'s); `None` when not seen.
    pub end_ns: Option<u64>,
    pub pid: u32,
    pub exit_code: Option<i32>,
    pub signal: Option<i32>,
    pub detail: String,
}

/// The steps for sandbox or container `id`, from the kernel events attributed to its
/// pod (in time order).
pub fn runtime_steps<'e>(
    events: impl Iterator<Item = &'e KernelEvent> + Clone,
    id: &str,
) -> Vec<RuntimeStep> {
    let mut steps: Vec<RuntimeStep> = Vec::new();
    for e in events.clone() {
        let KernelEvent::RuntimeExec(r) = e else {
            continue;
        };
        let Some(run) = runtime_args::parse(&r.argv, r.head_cut) else {
            continue;
        };
        if run.id != Some(id) {
            continue;
        }
        let kind = match (run.program, run.command) {
            (Program::Shim, "start") => StageKind::ShimStart,
            (Program::Shim, "") => StageKind::ShimCreate,
            (Program::Oci, "create") => StageKind::RuncCreate,
            (Program::Oci, "start") => StageKind::RuncStart,
            _ => continue,
        };
        if steps.iter().any(|s| s.kind == kind) {
            continue;
        }
        let (pid, at) = (r.meta.tgid, r.meta.ktime_ns);
        let exit = if kind == StageKind::ShimCreate {
            // It serves until the sandbox goes; its end is set below.
            None
        } else {
            exit_of(events.clone(), pid, at)
        };
        let program = match (r.head_cut, run.program) {
            (true, Program::Shim) => "containerd-shim",
            (true, Program::Oci) => "runc",
            (false, _) => r
                .argv
                .first()
                .map_or("runc", |a| a.rsplit('/').next().unwrap_or(a)),
        };
        // The shim's start and runc's runs are spawned by the runtime (containerd, the
        // shim): their step starts at that fork, so the time the runtime took from
        // starting the process to its exec is the step's, not the call's remainder. The
        // shim daemon is forked by `shim start`, inside that step already.
        let forked = r
            .forked_ns
            .filter(|_| kind != StageKind::ShimCreate)
            .and_then(|f| spawned_at(f, at));
        let mut step = RuntimeStep {
            kind: kind.clone(),
            start_ns: forked.unwrap_or(at),
            end_ns: exit.map(|x| x.0),
            pid,
            exit_code: exit.and_then(|x| x.1),
            signal: exit.and_then(|x| x.2),
            detail: format!("{program} {}", run.command),
        };
        if kind == StageKind::ShimCreate {
            step.detail =
                "the new shim daemon: its start-up and the Create request, until it ran runc create"
                    .into();
        } else if exit.is_none() {
            step.detail.push_str(", exit not seen");
        }
        if let Some(f) = forked {
            step.detail.push_str(&format!(", {}", forked_detail(f, at)));
        }
        if kind == StageKind::RuncCreate
            && let Some(init) = init_of(events.clone(), pid, at, step.end_ns)
        {
            steps.push(init);
        }
        steps.push(step);
    }
    let create = steps
        .iter()
        .find(|s| s.kind == StageKind::RuncCreate)
        .map(|s| s.start_ns);
    for s in steps.iter_mut().filter(|s| s.kind == StageKind::ShimCreate) {
        s.end_ns = create.filter(|c| *c >= s.start_ns);
    }
    steps.sort_by_key(|s| (s.start_ns, s.kind.rank()));
    steps
}

/// A process exec'd longer than this after its fork was not spawned for the exec (a
/// shell or daemon that ran a while first): its fork is not the step's start.
const MAX_SPAWN_NS: u64 = 5_000_000_000;

/// Where a process exec'd at `exec` and forked at `fork` begins its stage: the fork,
/// unless it was too long before the exec to have been for it.
pub fn spawned_at(fork: u64, exec: u64) -> Option<u64> {
    (exec - fork <= MAX_SPAWN_NS).then_some(fork)
}

/// The stage detail saying how long before its exec the process was forked.
pub fn forked_detail(fork: u64, exec: u64) -> String {
    format!(
        "forked {:.3} ms before its exec",
        (exec - fork) as f64 / 1e6
    )
}

/// The first exit of process `pid` at or after `at`: (time, exit code, signal).
pub(super) fn exit_of<'e>(
    events: impl Iterator<Item = &'e KernelEvent>,
    pid: u32,
    at: u64,
) -> Option<(u64, Option<i32>, Option<i32>)> {
    events.into_iter().find_map(|e| match e {
        KernelEvent::Exit {
            meta,
            exit_code,
            signal,
        } if meta.tgid == pid && meta.ktime_ns >= at => Some((meta.ktime_ns, *exit_code, *signal)),
        _ => None,
    })
}

/// `runc init`: the first program `runc create` (process `create`) exec'd, until
/// `runc create` returned, which it does once init has set the container up and waits
/// to be started.
fn init_of<'e>(
    events: impl Iterator<Item = &'e KernelEvent>,
    create: u32,
    at: u64,
    create_end: Option<u64>,
) -> Option<RuntimeStep> {
    let exec = events.into_iter().find_map(|e| match e {
        KernelEvent::Exec { meta, ppid, .. } if *ppid == Some(create) && meta.ktime_ns >= at => {
            Some(meta)
        }
        _ => None,
    })?;
    let end = create_end.filter(|end| *end >= exec.ktime_ns);
    Some(RuntimeStep {
        kind: StageKind::RuncInit,
        start_ns: exec.ktime_ns,
        end_ns: end,
        pid: exec.tgid,
        exit_code: None,
        signal: None,
        detail: "the container's init process, until runc create returned".into(),
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::ebpf::Comm;
    use crate::ebpf::event::{EventMeta, RuntimeExec};

    const ID: &str = "419c0950aa09f5fa62a7e0ecfcc4eb0628914f02addc40fb7dadcf1fa23f790b";
    const OTHER: &str = "7e85e19c36453aa6a6709c25b7cf7aff019c7da0ca64249e8e33a26c033ddad2";

    fn meta(t: u64, pid: u32, comm: &str) -> EventMeta {
        EventMeta {
            ktime_ns: t,
            cpu: 0,
            pid,
            tgid: pid,
            comm: Comm::new(comm),
            cgroup_id: 1,
        }
    }

    fn runtime(t: u64, pid: u32, argv: &str) -> KernelEvent {
        KernelEvent::RuntimeExec(Box::new(RuntimeExec {
            meta: meta(t, pid, "runc"),
            argv: argv.split(' ').map(str::to_string).collect(),
            head_cut: false,
            unreadable: false,
            forked_ns: None,
        }))
    }

    fn exec(t: u64, pid: u32, ppid: u32, filename: &str) -> KernelEvent {
        KernelEvent::Exec {
            meta: meta(t, pid, "exe"),
            filename: filename.into(),
            old_pid: pid,
            ppid: Some(ppid),
        }
    }

    fn exit(t: u64, pid: u32, code: i32) -> KernelEvent {
        KernelEvent::Exit {
            meta: meta(t, pid, "runc"),
            exit_code: Some(code),
            signal: None,
        }
    }

    #[test]
    fn shim_start_and_runc_steps_run_from_exec_to_exit() {
        let events = [
            runtime(
                100,
                10,
                &format!("/usr/bin/containerd-shim-runc-v2 -namespace k8s.io -id {ID} start"),
            ),
            // The daemon the start runs, which serves the sandbox from then on.
            runtime(
                112,
                11,
                &format!(
                    "/usr/bin/containerd-shim-runc-v2 -namespace k8s.io -id {ID} -address /c.sock"
                ),
            ),
            exit(115, 10, 0),
            runtime(
                120,
                20,
                &format!("runc --root /r create --bundle /b/{ID} {ID}"),
            ),
            exec(133, 21, 20, "/proc/self/exe"),
            runtime(134, 21, "runc init"),
            exit(142, 21, 0),
            exit(153, 20, 0),
            // Another container's create in the same pod is not this one's.
            runtime(155, 30, &format!("runc create {OTHER}")),
            runtime(160, 40, &format!("runc start {ID}")),
            exit(168, 40, 1),
        ];
        let steps = runtime_steps(events.iter(), ID);
        let got: Vec<(&str, u64, Option<u64>, u32)> = steps
            .iter()
            .map(|s| (s.kind.as_str(), s.start_ns, s.end_ns, s.pid))
            .collect();
        assert_eq!(
            got,
            vec![
                ("shim_start", 100, Some(115), 10),
                ("shim_create", 112, Some(120), 11),
                ("runc_create", 120, Some(153), 20),
                ("runc_init", 133, Some(153), 21),
                ("runc_start", 160, Some(168), 40),
            ]
        );
        assert_eq!(steps[4].exit_code, Some(1));
        assert_eq!(steps[0].detail, "containerd-shim-runc-v2 start");
    }

    #[test]
    fn a_step_whose_exit_was_not_seen_says_so() {
        let events = [runtime(120, 20, &format!("runc create {ID}"))];
        let steps = runtime_steps(events.iter(), ID);
        assert_eq!(steps.len(), 1);
        assert_eq!(steps[0].end_ns, None);
        assert!(steps[0].detail.ends_with("exit not seen"), "{:?}", steps[0]);
    }

    fn forked(e: KernelEvent, at: u64) -> KernelEvent {
        let KernelEvent::RuntimeExec(mut r) = e else {
            unreachable!()
        };
        r.forked_ns = Some(at);
        KernelEvent::RuntimeExec(r)
    }

    #[test]
    fn a_step_the_runtime_forked_starts_at_the_fork() {
        let events = [
            forked(
                runtime(
                    100_000_000,
                    10,
                    &format!("containerd-shim-runc-v2 -id {ID} start"),
                ),
                96_000_000,
            ),
            // The daemon's fork is inside `shim start`: it stays at its exec.
            forked(
                runtime(
                    112_000_000,
                    11,
                    &format!("containerd-shim-runc-v2 -id {ID}"),
                ),
                111_000_000,
            ),
            exit(115_000_000, 10, 0),
            forked(
                runtime(120_000_000, 20, &format!("runc create {ID}")),
                118_500_000,
            ),
            exit(153_000_000, 20, 0),
            // A process that ran for minutes before it exec'd runc was not spawned for
            // it: its fork is no start.
            forked(runtime(400_000_000_000, 40, &format!("runc start {ID}")), 1),
            exit(400_000_100_000, 40, 0),
        ];
        let steps = runtime_steps(events.iter(), ID);
        let got: Vec<(&str, u64)> = steps
            .iter()
            .map(|s| (s.kind.as_str(), s.start_ns))
            .collect();
        assert_eq!(
            got,
            vec![
                ("shim_start", 96_000_000),
                ("shim_create", 112_000_000),
                ("runc_create", 118_500_000),
                ("runc_start", 400_000_000_000),
            ]
        );
        assert_eq!(
            steps[0].detail,
            "containerd-shim-runc-v2 start, forked 4.000 ms before its exec"
        );
        assert_eq!(
            steps[1].end_ns,
            Some(118_500_000),
            "the daemon runs until it forked runc"
        );
        assert_eq!(steps[3].detail, "runc start");
    }
}
