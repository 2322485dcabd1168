//! Export to the Chrome JSON trace-event format, which Perfetto's UI and its trace
//! processor import (as do chrome://tracing and speedscope).
//!
//! Each pod is a process (pid) named `namespace/name (trace)`. Its stages are complete
//! (`X`) slices on a thread of that process; a thread's slices must nest properly, so a
//! stage that overlaps another without fitting inside it (loopback running beside
//! bridge) goes on a second stages thread. Kernel events are thread-scoped instant (`i`)
//! events on the pod's `kernel` thread; those tied to no pod go on a `node` process per
//! trace. Everything is on CLOCK_MONOTONIC, the clock the trace records, in microseconds
//! with nanosecond decimals.

use serde_json::{Value, json};

use super::TraceInput;
use super::lanes::lanes;
use crate::ebpf::KernelEvent;
use crate::timeline::{Stage, attribute};
use crate::trace::TraceRecord;

/// Thread IDs are `pid * TIDS + n`: unique across processes, which Perfetto's importer
/// relies on to keep threads of different processes apart.
const TIDS: u64 = 100;
/// The `n` of a process's kernel-event thread.
const KERNEL_THREAD: u64 = TIDS - 1;

fn us(ns: u64) -> f64 {
    ns as f64 / 1000.0
}

/// The trace-event document for `inputs`.
pub fn chrome_trace(inputs: &[TraceInput]) -> Value {
    let mut meta: Vec<Value> = Vec::new();
    let mut events: Vec<(u64, u64, Value)> = Vec::new();
    let mut next_pid: u64 = 1;
    for input in inputs {
        let mut pid_of: Vec<(&str, u64)> = Vec::new();
        for p in &input.timeline.pods {
            let pid = next_pid;
            next_pid += 1;
            pid_of.push((p.uid.as_str(), pid));
            let name = if p.name.is_empty() {
                p.uid.clone()
            } else {
                format!("{}/{}", p.namespace, p.name)
            };
            meta.push(process_name(pid, &format!("{name} ({})", input.name)));
            meta.push(
                json!({"ph": "M", "name": "process_sort_index", "pid": pid, "tid": pid * TIDS,
                "args": {"sort_index": pid}}),
            );
            for (lane, stages) in lanes(&p.stages).into_iter().enumerate() {
                let tid = pid * TIDS + lane as u64;
                let label = if lane == 0 {
                    "stages".to_string()
                } else {
                    format!("stages (overlapping {lane})")
                };
                meta.push(thread_name(pid, tid, &label));
                for s in stages {
                    events.push((s.start_ns, s.duration_ns, slice(s, pid, tid)));
                }
            }
        }
        let node_pid = next_pid;
        next_pid += 1;
        let mut node_used = false;
        let attribution = attribute(&input.records);
        let mut kernel_threads: Vec<u64> = Vec::new();
        for (i, r) in input.records.iter().enumerate() {
            let TraceRecord::Kernel(e) = r else {
                continue;
            };
            let pid = attribution
                .owner(i)
                .and_then(|o| pid_of.iter().find(|(uid, _)| *uid == o.pod_uid))
                .map(|(_, pid)| *pid);
            let pid = pid.unwrap_or_else(|| {
                node_used = true;
                node_pid
            });
            if !kernel_threads.contains(&pid) {
                kernel_threads.push(pid);
            }
            events.push((e.ktime_ns(), 0, instant(e, pid)));
        }
        if node_used {
            meta.push(process_name(node_pid, &format!("node ({})", input.name)));
        }
        kernel_threads.sort_unstable();
        for pid in kernel_threads {
            meta.push(thread_name(pid, pid * TIDS + KERNEL_THREAD, "kernel"));
        }
    }
    // Parents before children: by time, then longest first. The sort is stable, so
    // equal events keep the order they were made in.
    events.sort_by(|a, b| a.0.cmp(&b.0).then(b.1.cmp(&a.1)));
    meta.extend(events.into_iter().map(|(_, _, v)| v));
    json!({
        "traceEvents": meta,
        "displayTimeUnit": "ms",
        "otherData": {
            "producer": concat!("podlapse ", env!("CARGO_PKG_VERSION")),
            "clock": "CLOCK_MONOTONIC",
            "traces": inputs.iter().map(|t| t.name.clone()).collect::<Vec<_>>(),
        },
    })
}

fn process_name(pid: u64, name: &str) -> Value {
    json!({"ph": "M", "name": "process_name", "pid": pid, "tid": pid * TIDS, "args": {"name": name}})
}

fn thread_name(pid: u64, tid: u64, name: &str) -> Value {
    json!({"ph": "M", "name": "thread_name", "pid": pid, "tid": tid, "args": {"name": name}})
}

/// A stage's details, as the arguments of its slice (in both trace formats).
pub(super) fn stage_args(s: &Stage) -> Value {
    let mut args = json!({"ok": s.ok, "source": s.source.to_string()});
    let fields = [
        ("exit_code", s.exit_code.map(Value::from)),
        ("signal", s.signal.map(Value::from)),
        ("code", s.code.map(|c| Value::from(c.as_str()))),
        ("sandbox_id", s.sandbox_id.clone().map(Value::from)),
        ("container", s.container.clone().map(Value::from)),
        ("container_id", s.container_id.clone().map(Value::from)),
        ("pid", s.pid.map(Value::from)),
        ("netns_inum", s.netns_inum.map(Value::from)),
        ("cgroup_id", s.cgroup_id.map(Value::from)),
        (
            "detail",
            (!s.detail.is_empty()).then(|| Value::from(s.detail.clone())),
        ),
    ];
    for (k, v) in fields {
        if let Some(v) = v {
            args[k] = v;
        }
    }
    args
}

fn slice(s: &Stage, pid: u64, tid: u64) -> Value {
    let args = stage_args(s);
    json!({
        "ph": "X",
        "name": s.stage,
        "cat": s.source.to_string(),
        "ts": us(s.start_ns),
        "dur": us(s.duration_ns),
        "pid": pid,
        "tid": tid,
        "args": args,
    })
}

fn instant(e: &KernelEvent, pid: u64) -> Value {
    json!({
        "ph": "i",
        "s": "t",
        "name": kernel_name(e),
        "cat": "kernel",
        "ts": us(e.ktime_ns()),
        "pid": pid,
        "tid": pid * TIDS + KERNEL_THREAD,
        "args": serde_json::to_value(e).unwrap_or(Value::Null),
    })
}

/// How a kernel event is named where it shows as an instant.
pub(super) fn kernel_name(e: &KernelEvent) -> String {
    match e {
        KernelEvent::Exec { filename, .. } => format!("exec {filename}"),
        KernelEvent::Exit {
            exit_code, signal, ..
        } => match (exit_code, signal) {
            (_, Some(sig)) => format!("exit by signal {sig}"),
            (Some(code), None) => format!("exit {code}"),
            (None, None) => "exit".into(),
        },
        KernelEvent::CgroupMkdir { .. } => "cgroup_mkdir".into(),
        KernelEvent::CgroupRmdir { .. } => "cgroup_rmdir".into(),
        KernelEvent::CgroupAttach { target_comm, .. } => format!("cgroup_attach {target_comm}"),
        KernelEvent::Netns { syscall, .. } => format!("netns {syscall}"),
        KernelEvent::CniExec(c) => format!("cni {} {}", c.command, c.plugin),
        KernelEvent::RuntimeExec(r) => {
            let name = r
                .argv
                .first()
                .map_or("", |a| a.rsplit('/').next().unwrap_or(a));
            format!("runtime exec {name}")
        }
        KernelEvent::CniOutput(o) if o.end => format!("cni output end {}", o.offset),
        KernelEvent::CniOutput(o) => format!("cni output {}+{}", o.offset, o.len),
        KernelEvent::CniWriteHook(h) => format!("cni write hook {:?}", h.change),
    }
}
