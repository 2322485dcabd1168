//! The builder on a small hand-built run: one pod through sandbox, CNI and one container,
//! a node-level compile that must stay the node's, and another kubelet's pod on the same
//! runtime.

use super::*;
use crate::cri::CriCall;
use crate::ebpf::{Cgroup, CniExec, EventMeta, KernelEvent, NetnsCall};
use crate::kuberuntime::PodEvent;
use crate::trace::{PodEventRecord, PodOp, PodOpRecord, TraceRecord};
use podlapse_core::record::{
    CriResponse, ExecSyncFields, PodSandboxNetwork, PodSandboxState, PodSandboxStatusFields,
};

pub(crate) const UID: &str = "0a1b2c3d-0000-4000-8000-000000000001";
const OTHER_UID: &str = "0a1b2c3d-0000-4000-8000-0000000000ff";
const SANDBOX: &str = "5a5a5a5a5a5a5a5a5a5a5a5a5a5a5a5a5a5a5a5a5a5a5a5a5a5a5a5a5a5a5a5a";
const CONTAINER: &str = "c0c0c0c0c0c0c0c0c0c0c0c0c0c0c0c0c0c0c0c0c0c0c0c0c0c0c0c0c0c0c0c0";
const OTHER_SANDBOX: &str = "0f0f0f0f0f0f0f0f0f0f0f0f0f0f0f0f0f0f0f0f0f0f0f0f0f0f0f0f0f0f0f0f";
const CONTAINERD: u32 = 40;
const HOST_NETNS: u32 = 4026531833;
const POD_NETNS: u32 = 4026532900;
const SANDBOX_CGROUP: u64 = 5000;
const CONTAINER_CGROUP: u64 = 5001;
const MS: u64 = 1_000_000;

fn meta(t_ms: u64, pid: u32, comm: &str, cgroup_id: u64) -> EventMeta {
    EventMeta {
        ktime_ns: t_ms * MS,
        cpu: 0,
        pid,
        tgid: pid,
        comm: comm.into(),
        cgroup_id,
    }
}

fn exec(t: u64, pid: u32, ppid: u32, file: &str, cgroup_id: u64) -> TraceRecord {
    let comm = file.rsplit('/').next().unwrap();
    TraceRecord::Kernel(KernelEvent::Exec {
        meta: meta(t, pid, comm, cgroup_id),
        filename: file.into(),
        old_pid: pid,
        ppid: Some(ppid),
    })
}

fn exit(t: u64, pid: u32, comm: &str, code: i32) -> TraceRecord {
    TraceRecord::Kernel(KernelEvent::Exit {
        meta: meta(t, pid, comm, 1),
        exit_code: Some(code),
        signal: None,
    })
}

fn cni(t: u64, pid: u32, caller: &str, plugin: &str, sandbox: &str, uid: &str) -> TraceRecord {
    TraceRecord::Kernel(KernelEvent::CniExec(Box::new(CniExec {
        meta: meta(t, pid, caller, 1),
        plugin: plugin.into(),
        filename: format!("/usr/lib/cni/{plugin}"),
        command: "ADD".into(),
        container_id: sandbox.into(),
        netns: "/run/netns/cni-1".into(),
        ifname: "eth0".into(),
        args: format!(
            "IgnoreUnknown=1;K8S_POD_NAMESPACE=default;K8S_POD_NAME=x;K8S_POD_INFRA_CONTAINER_ID={sandbox};K8S_POD_UID={uid}"
        ),
        pod_namespace: Some("default".into()),
        pod_name: Some("x".into()),
        infra_container_id: Some(sandbox.into()),
        env_scanned: 60,
        env_truncated: false,
        forked_ns: None,
    })))
}

fn netns(t: u64, pid: u32, tgid: u32, syscall: NetnsCall, inum: u32) -> TraceRecord {
    let mut m = meta(t, pid, "containerd", 1);
    m.tgid = tgid;
    TraceRecord::Kernel(KernelEvent::Netns {
        meta: m,
        syscall,
        start_ns: t * MS - 100_000,
        flags: 0x4000_0000,
        ret: 0,
        netns_inum: Some(inum),
        fd: (syscall == NetnsCall::Setns).then_some(3),
        parent_pid: None,
    })
}

fn mkdir(t: u64, hierarchy: i32, id: u64, path: &str) -> TraceRecord {
    TraceRecord::Kernel(KernelEvent::CgroupMkdir {
        meta: meta(t, 300, "runc", 1),
        cgroup: Cgroup {
            hierarchy,
            level: 4,
            cgroup_id: id,
            path: path.into(),
        },
    })
}

fn call(method: &str, start_ms: u64, end_ms: u64) -> CriCall {
    CriCall::new(method.parse().expect("a CRI method"))
        .with_pod_uid(UID)
        .with_times(start_ms * MS, end_ms * MS)
        .with_code(crate::cri::GrpcCode::Ok)
}

/// A ready sandbox's status answer with `ip`.
fn sandbox_status(ip: &str) -> CriResponse {
    PodSandboxStatusFields {
        state: Some(PodSandboxState::Ready),
        network: Some(PodSandboxNetwork {
            ip: Some(ip.parse().expect("an IP")),
        }),
    }
    .into()
}

fn cri(c: CriCall) -> TraceRecord {
    TraceRecord::Cri(c)
}

fn pod_add() -> TraceRecord {
    let pod = serde_json::from_value(serde_json::json!({
        "metadata": {"name": "web", "namespace": "default", "uid": UID},
        "spec": {"containers": [{"name": "app", "image": "app:1"}]}
    }))
    .unwrap();
    TraceRecord::Pod(PodOpRecord {
        at_ns: 0,
        op: PodOp::Add,
        pod: std::sync::Arc::new(pod),
    })
}

/// Where the node-level exec sits in `run()`'s records.
const COMPILE: usize = 9;
const IPTABLES: usize = 13;

/// A pod whose CNI chain is loopback, bridge (with host-local and iptables under it) and
/// `last`, which exits with `last_code`.
fn run(last: &str, last_code: i32) -> Vec<TraceRecord> {
    let pod_dir = format!("/podlapse/besteffort/pod{UID}");
    let sandbox_dir = format!("{pod_dir}/{SANDBOX}");
    let container_dir = format!("{pod_dir}/{CONTAINER}");
    run_in(last, last_code, [pod_dir, sandbox_dir, container_dir])
}

/// The same pod on a node with the systemd cgroup driver: a pod slice whose name carries
/// the UID with `_` for `-`, and containerd's `cri-containerd-<id>.scope` units in it.
fn run_systemd(last: &str, last_code: i32) -> Vec<TraceRecord> {
    let slice = format!("podlapse-besteffort-pod{}.slice", UID.replace('-', "_"));
    let pod_dir = format!("/podlapse.slice/podlapse-besteffort.slice/{slice}");
    let sandbox_dir = format!("{pod_dir}/cri-containerd-{SANDBOX}.scope");
    let container_dir = format!("{pod_dir}/cri-containerd-{CONTAINER}.scope");
    run_in(last, last_code, [pod_dir, sandbox_dir, container_dir])
}

/// `run` with the pod's, sandbox's and container's cgroup paths given.
fn run_in(last: &str, last_code: i32, dirs: [String; 3]) -> Vec<TraceRecord> {
    let [pod_dir, sandbox_dir, container_dir] = dirs;
    let mut run_sandbox = call("RunPodSandbox", 5, 150);
    run_sandbox.sandbox_id = SANDBOX.into();
    let mut status = call("PodSandboxStatus", 152, 153);
    status.sandbox_id = SANDBOX.into();
    status.response = sandbox_status("10.244.77.9");
    let mut create = call("CreateContainer", 160, 170);
    create.sandbox_id = SANDBOX.into();
    create.container = "app".into();
    create.container_id = CONTAINER.into();
    create.image = "app:1".into();
    let mut start = create.clone();
    start.method = crate::cri::CriMethod::StartContainer;
    start.image.clear();
    start.start_ns = 171 * MS;
    start.end_ns = 240 * MS;
    let mut foreign = call("ListPodSandbox", 1, 2);
    foreign.pod_uid.clear();
    vec![
        pod_add(),
        cri(call("ListPodSandbox", 1, 2)),
        mkdir(3, 0, 4000, &pod_dir),
        mkdir(3, 1, 4100, &pod_dir),
        netns(
            10,
            CONTAINERD + 1,
            CONTAINERD,
            NetnsCall::Unshare,
            POD_NETNS,
        ),
        netns(10, CONTAINERD + 1, CONTAINERD, NetnsCall::Setns, HOST_NETNS),
        cni(12, 100, "containerd", "loopback", SANDBOX, UID),
        exec(13, 100, CONTAINERD, "/usr/lib/cni/loopback", 1),
        netns(14, 111, 100, NetnsCall::Setns, POD_NETNS),
        // A compiler starts on the node in the middle of the pod's CNI ADD: no identity.
        exec(15, 900, 1, "/usr/bin/cc", 1),
        cni(16, 101, "containerd", "bridge", SANDBOX, UID),
        exec(17, 101, CONTAINERD, "/usr/lib/cni/bridge", 1),
        cni(20, 102, "bridge", "host-local", SANDBOX, UID),
        exec(21, 103, 101, "/usr/sbin/iptables", 1),
        exec(21, 102, 101, "/usr/lib/cni/host-local", 1),
        exit(25, 102, "host-local", 0),
        exit(26, 103, "iptables", 0),
        exit(27, 100, "loopback", 0),
        exit(30, 900, "cc", 0),
        exit(40, 101, "bridge", 0),
        cni(41, 104, "containerd", last, SANDBOX, UID),
        exec(42, 104, CONTAINERD, &format!("/usr/lib/cni/{last}"), 1),
        exit(45, 104, last, last_code),
        // Another kubelet's pod on the same runtime.
        cni(46, 500, "containerd", "bridge", OTHER_SANDBOX, OTHER_UID),
        mkdir(90, 1, 5100, &sandbox_dir),
        mkdir(91, 0, SANDBOX_CGROUP, &sandbox_dir),
        exec(100, 301, 300, "/dev/fd/6", SANDBOX_CGROUP),
        exec(140, 302, 300, "/bin/sh", SANDBOX_CGROUP),
        cri(run_sandbox),
        cri(status),
        cri(create),
        mkdir(200, 0, CONTAINER_CGROUP, &container_dir),
        exec(230, 310, 300, "/proc/self/exe", CONTAINER_CGROUP),
        exec(235, 311, 300, "/bin/sleep", CONTAINER_CGROUP),
        cri(start),
        TraceRecord::Event(PodEventRecord {
            at_ns: 241 * MS,
            pod_uid: UID.into(),
            namespace: "default".into(),
            name: "web".into(),
            event: PodEvent::normal("Started", "Started container app", Some("app".into())),
        }),
        cri(foreign),
    ]
}

#[test]
fn kernel_events_are_attributed_by_identity_and_the_rest_stay_on_the_node() {
    let records = run("portmap", 0);
    assert!(matches!(
        &records[COMPILE],
        TraceRecord::Kernel(KernelEvent::Exec { filename, .. }) if filename == "/usr/bin/cc"
    ));
    let a = attribute(&records);
    assert_eq!(a.owner(COMPILE), None, "a node-level exec got an owner");
    let owner = |i: usize| {
        a.owner(i)
            .unwrap_or_else(|| panic!("record {i} has no owner"))
    };
    let of_pod = |i: usize, rule: Rule| {
        let o = owner(i);
        assert_eq!((o.pod_uid.as_str(), o.rule), (UID, rule), "record {i}");
        o
    };
    // The pod cgroup by `pod<uid>`, the unshare by the inode a plugin entered, the
    // plugins by their sandbox ID, iptables by its parent, pause by its cgroup.
    assert_eq!(of_pod(2, Rule::CgroupPath).sandbox_id, None);
    assert_eq!(of_pod(4, Rule::Netns).sandbox_id.as_deref(), Some(SANDBOX));
    assert_eq!(a.owner(5), None, "containerd returning to the host netns");
    of_pod(6, Rule::CniContainerId);
    of_pod(8, Rule::Ancestry);
    assert_eq!(
        of_pod(IPTABLES, Rule::Ancestry).sandbox_id.as_deref(),
        Some(SANDBOX)
    );
    of_pod(16, Rule::Ancestry);
    let other = owner(23);
    assert_eq!(
        (other.pod_uid.as_str(), other.rule),
        (OTHER_UID, Rule::CniPodUid)
    );
    of_pod(27, Rule::CgroupId);
    let app = of_pod(33, Rule::CgroupId);
    assert_eq!(app.container_id.as_deref(), Some(CONTAINER));
}

#[test]
fn the_stages_come_in_the_order_the_runtime_performs_them() {
    let t = build(&run("portmap", 0));
    assert_eq!(t.pods.len(), 1, "{t:#?}");
    let p = &t.pods[0];
    let names: Vec<String> = p.stages.iter().map(|s| s.stage.to_string()).collect();
    assert_eq!(
        names,
        [
            "pod_seen",
            "admitted",
            "pod_cgroup_created",
            "sandbox_requested",
            "netns_created",
            "cni_add",
            "cni_plugin:loopback",
            "cni_plugin:bridge",
            "cni_plugin:host-local",
            "cni_plugin:portmap",
            "sandbox_cgroup",
            "pause_exec",
            "sandbox_ready",
            "container_create:app",
            "container_start:app",
            "container_cgroup:app",
            "app_first_exec:app",
            "running",
            "ready",
        ]
    );
    assert!(p.failures().next().is_none(), "{:#?}", p.stages);
    let stage = |n: &str| p.stage(n).unwrap();
    assert_eq!(stage("netns_created").netns_inum, Some(POD_NETNS));
    let bridge = stage("cni_plugin:bridge");
    assert_eq!((bridge.start_ns, bridge.end_ns), (16 * MS, 40 * MS));
    assert_eq!(bridge.exit_code, Some(0));
    assert!(
        stage("cni_plugin:host-local")
            .detail
            .contains("delegated by bridge")
    );
    assert_eq!(
        stage("cni_add").detail,
        "loopback, bridge, host-local, portmap"
    );
    assert_eq!(stage("sandbox_cgroup").cgroup_id, Some(SANDBOX_CGROUP));
    assert_eq!(stage("pause_exec").detail, "/bin/sh");
    assert_eq!(stage("app_first_exec:app").detail, "/bin/sleep");
    assert_eq!(stage("sandbox_ready").detail, "ip 10.244.77.9");
    assert_eq!(p.ip.as_deref(), Some("10.244.77.9"));
    for s in p
        .stages
        .iter()
        .filter(|s| s.kind().as_str() == "cni_plugin")
    {
        assert_eq!(s.sandbox_id.as_deref(), Some(SANDBOX), "{s:?}");
    }
    // The compile and its exit stay on the node; the other pod's plugin is not ours.
    assert_eq!(t.node_events, 3, "{t:#?}");
    assert_eq!(t.other_pod_events, 1);
}

#[test]
fn a_cni_plugin_the_runtime_forked_runs_from_its_fork() {
    let mut records = run("portmap", 0);
    for r in &mut records {
        if let TraceRecord::Kernel(KernelEvent::CniExec(c)) = r
            && c.plugin == "bridge"
        {
            c.forked_ns = Some(c.meta.ktime_ns - 3 * MS);
        }
    }
    let t = build(&records);
    let p = &t.pods[0];
    let bridge = p.stage("cni_plugin:bridge").unwrap();
    assert_eq!((bridge.start_ns, bridge.end_ns), (13 * MS, 40 * MS));
    assert_eq!(bridge.detail, "ADD, forked 3.000 ms before its exec");
    // cni_add begins with its first plugin run, loopback's exec at 12 ms.
    assert_eq!(p.stage("cni_add").unwrap().start_ns, 12 * MS);
    let loopback = p.stage("cni_plugin:loopback").unwrap();
    assert_eq!(loopback.detail, "ADD", "no fork time, no change");
}

#[test]
fn slices_and_scopes_of_the_systemd_driver_give_the_same_stages_and_owners() {
    let (fs, sd) = (run("portmap", 0), run_systemd("portmap", 0));
    let (a_fs, a_sd) = (attribute(&fs), attribute(&sd));
    for (i, record) in sd.iter().enumerate() {
        assert_eq!(a_fs.owner(i), a_sd.owner(i), "record {i}: {record:?}");
    }
    let t = build(&sd);
    let stages = |t: &Timeline| {
        t.pods[0]
            .stages
            .iter()
            .map(|s| (s.stage.clone(), s.start_ns, s.end_ns, s.cgroup_id))
            .collect::<Vec<_>>()
    };
    assert_eq!(stages(&t), stages(&build(&fs)));
    assert!(t.pods[0].stage("pod_cgroup_created").is_some(), "{t:#?}");
}

#[test]
fn a_failed_plugin_shows_with_its_exit_code() {
    let t = build(&run("tuning", 1));
    let p = &t.pods[0];
    let tuning = p.stage("cni_plugin:tuning").unwrap();
    assert_eq!((tuning.ok, tuning.exit_code), (false, Some(1)));
    let add = p.stage("cni_add").unwrap();
    assert_eq!((add.ok, add.exit_code), (false, Some(1)));
    assert_eq!(add.detail, "tuning failed with exit code 1");
    let failed: Vec<String> = p.failures().map(|s| s.stage.to_string()).collect();
    assert_eq!(failed, ["cni_add", "cni_plugin:tuning"]);
}

/// A plugin still running when the timeline is built (its exit not read yet: on a slow
/// node bridge's ADD takes seconds) leaves the ADD pending, not failed: the pod has no
/// settled failure, so the metrics do not count its startup as over before its IP.
#[test]
fn a_plugin_whose_exit_has_not_come_leaves_the_add_pending_not_failed() {
    let mut records = run("tuning", 0);
    let at = records
        .iter()
        .position(|r| matches!(r, TraceRecord::Kernel(KernelEvent::Exit { meta, .. }) if meta.tgid == 101))
        .unwrap();
    records.remove(at);
    let t = build(&records);
    let p = &t.pods[0];
    let bridge = p.stage("cni_plugin:bridge").unwrap();
    assert!(bridge.outcome_pending(), "{bridge:?}");
    let add = p.stage("cni_add").unwrap();
    assert!(!add.ok && add.outcome_pending(), "{add:?}");
    assert_eq!(add.detail, "bridge: exit not seen");
    assert_eq!(p.settled_failures().count(), 0);
    // One plugin failed for good beside the pending one: that failure is the ADD's.
    let mut records = run("tuning", 1);
    records.remove(at);
    let p = &build(&records).pods[0];
    let add = p.stage("cni_add").unwrap();
    assert_eq!((add.ok, add.exit_code), (false, Some(1)));
    assert_eq!(add.detail, "tuning failed with exit code 1");
}

#[test]
fn the_agents_bounded_records_give_the_same_timeline() {
    let mut records = run("portmap", 0);
    // A long-running agent polls: many more status reads than the builder looks at.
    for i in 0..50 {
        let mut poll = call("ContainerStatus", 300 + i, 301 + i);
        poll.container = "app".into();
        poll.container_id = CONTAINER.into();
        poll.sandbox_id = SANDBOX.into();
        records.push(cri(poll));
    }
    let collector = Collector::new();
    for r in &records {
        collector.push(r);
    }
    assert!(collector.records().len() < records.len());
    assert_eq!(collector.timeline(), build(&records));
}

#[test]
fn the_agent_keeps_no_spec_of_a_removed_pod_and_builds_the_same_timeline() {
    let mut records = run("portmap", 0);
    let TraceRecord::Pod(add) = &records[0] else {
        panic!("run() starts with the pod's ADD");
    };
    records.push(TraceRecord::Pod(PodOpRecord {
        at_ns: 900 * MS,
        op: PodOp::Remove,
        pod: add.pod.clone(),
    }));
    let collector = Collector::new();
    for r in &records {
        collector.push(r);
    }
    assert_eq!(collector.timeline(), build(&records));
    let kept = collector.records();
    let ops: Vec<(PodOp, bool)> = kept
        .iter()
        .filter_map(|r| match r {
            TraceRecord::Pod(p) => Some((p.op, p.pod.spec.is_some())),
            _ => None,
        })
        .collect();
    assert_eq!(ops, [(PodOp::Add, true), (PodOp::Remove, false)]);
    assert_eq!(
        crate::diagnose::diagnose(&kept, None),
        crate::diagnose::diagnose(&records, None)
    );
}

#[test]
fn a_polled_timeline_is_built_again_only_after_a_record_was_kept() {
    let records = run("portmap", 0);
    let collector = Collector::new();
    let seen = std::sync::atomic::AtomicU64::new(0);
    let all = |_: &str| true;
    assert_eq!(collector.timeline_if_changed(&seen, all), None);
    for r in &records {
        collector.push(r);
    }
    assert_eq!(
        collector.timeline_if_changed(&seen, all),
        Some(build(&records))
    );
    assert_eq!(collector.timeline_if_changed(&seen, all), None);
    // A status poll beyond the first few is not kept: nothing changed.
    let mut poll = call("ContainerStatus", 400, 401);
    poll.container_id = CONTAINER.into();
    for _ in 0..10 {
        collector.push(&cri(poll.clone()));
    }
    let _ = collector.timeline_if_changed(&seen, all);
    collector.push(&cri(poll));
    assert_eq!(collector.timeline_if_changed(&seen, all), None);
    collector.push(&records[0]);
    // Only the pods asked for are built; the run's counts stay.
    let none = collector.timeline_if_changed(&seen, |_| false).unwrap();
    let full = build(&records);
    assert!(none.pods.is_empty());
    assert_eq!(
        (none.kernel_events, none.node_events, none.other_pod_events),
        (full.kernel_events, full.node_events, full.other_pod_events)
    );
}

#[test]
fn the_kernel_filter_keeps_every_attributable_event() {
    let records = run("portmap", 0);
    let mut filter = KernelFilter::new();
    let mut kept = Vec::new();
    for r in &records {
        if let TraceRecord::Kernel(e) = r {
            filter.offer(e.clone(), &mut kept);
        }
    }
    let attributed: Vec<&KernelEvent> = attribute(&records)
        .iter()
        .map(|(i, _)| match &records[i] {
            TraceRecord::Kernel(e) => e,
            other => panic!("{other:?}"),
        })
        .collect();
    for e in attributed {
        assert!(kept.contains(e), "dropped {e:?}");
    }
}

#[test]
fn node_level_execs_away_from_pod_work_are_not_kept() {
    let mut filter = KernelFilter::new();
    let mut kept = Vec::new();
    let quiet = |t: u64, pid: u32| match exec(t, pid, 1, "/usr/bin/cc", 1) {
        TraceRecord::Kernel(e) => e,
        _ => unreachable!(),
    };
    // Long before any pod work: not kept.
    filter.offer(quiet(1_000, 900), &mut kept);
    assert!(kept.is_empty());
    // Just before pod work starts, and during it: kept, the earlier one first.
    filter.offer(quiet(9_800, 901), &mut kept);
    let TraceRecord::Kernel(unshare) = netns(10_000, 41, 40, NetnsCall::Unshare, POD_NETNS) else {
        unreachable!()
    };
    filter.offer(unshare, &mut kept);
    filter.offer(quiet(10_500, 902), &mut kept);
    let pids: Vec<u32> = kept.iter().map(|e| e.meta().pid).collect();
    assert_eq!(pids, [901, 41, 902]);
    // Long after: not kept.
    filter.offer(quiet(60_000, 903), &mut kept);
    assert_eq!(kept.len(), 3);
    assert_eq!(filter.dropped(), 2);
}

#[test]
fn stages_round_trip_through_stage_records() {
    let t = build(&run("portmap", 0));
    let values: Vec<serde_json::Value> = t
        .stages()
        .map(|s| serde_json::to_value(s).unwrap())
        .collect();
    let back = Timeline::from_stages(
        values
            .into_iter()
            .map(|v| serde_json::from_value::<Stage>(v).unwrap()),
    );
    assert_eq!(back.pods[0].stages, t.pods[0].stages);
    assert_eq!(back.pods[0].sandbox_ids, [SANDBOX]);
}

#[test]
fn an_exec_hook_and_an_exec_readiness_probe_are_read_from_their_exec_syncs() {
    let mut records = run("portmap", 0);
    let pod = serde_json::from_value(serde_json::json!({
        "metadata": {"name": "web", "namespace": "default", "uid": UID},
        "spec": {"containers": [{
            "name": "app",
            "image": "app:1",
            "lifecycle": {"postStart": {"exec": {"command": ["true"]}}},
            "readinessProbe": {"exec": {"command": ["true"]}}
        }]}
    }))
    .unwrap();
    records[0] = TraceRecord::Pod(PodOpRecord {
        at_ns: 0,
        op: PodOp::Add,
        pod: std::sync::Arc::new(pod),
    });
    for (start, code) in [(242, 0), (300, 1), (400, 0), (500, 0)] {
        let mut x = call("ExecSync", start, start + 5);
        x.container = "app".into();
        x.container_id = CONTAINER.into();
        x.sandbox_id = SANDBOX.into();
        x.response = ExecSyncFields {
            exit_code: Some(code),
        }
        .into();
        records.push(cri(x));
    }
    let t = build(&records);
    let p = &t.pods[0];
    let hook = p.stage("post_start:app").unwrap();
    assert_eq!((hook.start_ns, hook.exit_code), (242 * MS, Some(0)));
    let ready = p.stage("ready").unwrap();
    assert_eq!(ready.start_ns, 405 * MS, "{ready:?}");
    assert!(p.stage("running").unwrap().start_ns < ready.start_ns);
}

fn status_record(t_ms: u64, state: &str) -> TraceRecord {
    use k8s_openapi::api::core::v1::{
        ContainerState, ContainerStateRunning, ContainerStateTerminated, ContainerStatus, PodStatus,
    };
    let state = match state {
        "running" => ContainerState {
            running: Some(ContainerStateRunning::default()),
            ..Default::default()
        },
        "terminated" => ContainerState {
            terminated: Some(ContainerStateTerminated::default()),
            ..Default::default()
        },
        _ => ContainerState::default(),
    };
    // Back-off after the exit: waiting now, the exit as the last state.
    let (state, last_state) = if state.running.is_none() && state.terminated.is_none() {
        let last = ContainerState {
            terminated: Some(ContainerStateTerminated {
                container_id: Some(format!("containerd://{CONTAINER}")),
                ..Default::default()
            }),
            ..Default::default()
        };
        (state, (t_ms > 260).then_some(last))
    } else {
        (state, None)
    };
    TraceRecord::Status(crate::trace::PodStatusRecord {
        at_ns: t_ms * MS,
        pod_uid: UID.into(),
        namespace: "default".into(),
        name: "web".into(),
        status: Box::new(PodStatus {
            container_statuses: Some(vec![ContainerStatus {
                name: "app".into(),
                container_id: Some(format!("containerd://{CONTAINER}")),
                state: Some(state),
                last_state,
                ..Default::default()
            }]),
            ..Default::default()
        }),
    })
}

#[test]
fn the_time_to_see_a_container_start_and_exit_runs_from_the_kernel_event_to_the_status() {
    let mut records = run("portmap", 0);
    records.push(status_record(239, "waiting"));
    records.push(status_record(242, "running"));
    records.push(status_record(250, "running"));
    // The main process (not the runtime's re-exec, pid 310) exits; a thread-group
    // leader of another process in the cgroup exiting first does not count.
    records.push(TraceRecord::Kernel(KernelEvent::Exit {
        meta: meta(290, 312, "sh", CONTAINER_CGROUP),
        exit_code: Some(0),
        signal: None,
    }));
    records.push(TraceRecord::Kernel(KernelEvent::Exit {
        meta: meta(300, 311, "sleep", CONTAINER_CGROUP),
        exit_code: Some(3),
        signal: None,
    }));
    records.push(status_record(304, "terminated"));
    let seeing = seen_latencies(&records);
    assert!(seeing.unseen.is_empty(), "{seeing:?}");
    let got: Vec<(Change, u64, u64)> = seeing
        .samples
        .iter()
        .map(|s| (s.change, s.kernel_ns / MS, s.seen_ns / MS))
        .collect();
    assert_eq!(
        got,
        vec![(Change::Started, 235, 242), (Change::Exited, 300, 304)]
    );
    assert_eq!(seeing.samples[1].latency_ns(), 4 * MS as i64);
    assert_eq!(seeing.samples[0].container_id, CONTAINER);
    // The runtime said it started the container when StartContainer returned.
    assert_eq!(seeing.samples[0].runtime_done_ns, Some(240 * MS));
    assert_eq!(seeing.samples[1].runtime_done_ns, None);

    // A run cut short before the exit was published: the exit is unseen, not dropped.
    records.pop();
    let seeing = seen_latencies(&records);
    assert_eq!(seeing.samples.len(), 1);
    assert_eq!(seeing.unseen.len(), 1);
    assert_eq!(seeing.unseen[0].change, Change::Exited);

    // A container that restarts shows its exit only as its last state.
    records.push(status_record(307, "waiting"));
    let seeing = seen_latencies(&records);
    assert!(seeing.unseen.is_empty(), "{seeing:?}");
    assert_eq!(seeing.samples[1].seen_ns, 307 * MS);
}

/// `records` as another pod of the same shape would leave them `offset_ms` later: its
/// own UID, sandbox, container, processes, cgroups and namespaces.
fn shifted(records: &[TraceRecord], offset_ms: u64) -> Vec<TraceRecord> {
    fn walk(v: &mut serde_json::Value, key: &str, offset_ns: u64) {
        use serde_json::Value;
        let add = |v: &mut Value, by: u64| {
            if let Some(n) = v.as_u64() {
                *v = Value::from(n + by);
            }
        };
        match v {
            Value::Object(map) => {
                for (k, child) in map.iter_mut() {
                    walk(child, k, offset_ns);
                }
            }
            Value::Array(items) => items.iter_mut().for_each(|c| walk(c, key, offset_ns)),
            Value::String(s) => {
                *s = s
                    .replace(UID, "0a1b2c3d-0000-4000-8000-00000000000b")
                    .replace(SANDBOX, &"5b".repeat(32))
                    .replace(CONTAINER, &"cb".repeat(32));
            }
            _ if key.ends_with("_ns") => add(v, offset_ns),
            _ if ["pid", "tgid", "ppid", "old_pid", "parent_pid"].contains(&key) => add(v, 10_000),
            _ if key == "cgroup_id" => add(v, 100_000),
            _ if key == "netns_inum" => add(v, 1_000),
            _ => {}
        }
    }
    records
        .iter()
        .map(|r| {
            let mut v = serde_json::to_value(r).unwrap();
            walk(&mut v, "", offset_ms * MS);
            serde_json::from_value(v).unwrap()
        })
        .collect()
}

fn removal(records: &[TraceRecord], at_ms: u64) -> TraceRecord {
    let TraceRecord::Pod(add) = &records[0] else {
        panic!("a run starts with the pod's ADD");
    };
    TraceRecord::Pod(PodOpRecord {
        at_ns: at_ms * MS,
        op: PodOp::Remove,
        pod: add.pod.clone(),
    })
}

#[test]
fn a_deleted_pod_is_forgotten_after_the_retention_and_the_others_stay_as_they_were() {
    let mut gone = run("portmap", 0);
    gone.push(removal(&gone, 900));
    let stays = shifted(&run("portmap", 0), 100_000);
    assert_ne!(build(&stays).pods[0].uid, UID);
    let collector = Collector::new();
    for r in gone.iter().chain(&stays) {
        collector.push(r);
    }
    let everything = [gone.clone(), stays.clone()].concat();
    // Within the retention (60 s after its last record) nothing goes.
    let retention = 60_000 * MS;
    assert!(
        collector
            .forget_deleted(50_000 * MS, retention)
            .uids
            .is_empty()
    );
    assert_eq!(collector.timeline(), build(&everything));
    assert_eq!(collector.pods_kept(), (2, 1));

    let forgotten = collector.forget_deleted(101_000 * MS, retention);
    assert_eq!(forgotten.uids, [UID]);
    assert_eq!(
        forgotten.timeline.pods,
        build(&gone).pods,
        "its stages, for the trace"
    );
    // What remains is what the remaining pod's own run gives: the node's events around
    // the forgotten pod's work and the other kubelet's pod then went too.
    assert_eq!(collector.timeline(), build(&stays));
    assert_eq!(collector.pods_kept(), (1, 0));
    let left = collector.records().len();
    assert!(
        collector
            .forget_deleted(200_000 * MS, retention)
            .uids
            .is_empty()
    );

    // Its teardown reported late is not kept...
    let mut late = call("RemovePodSandbox", 101_500, 101_600);
    late.pod_uid.clear();
    late.sandbox_id = SANDBOX.into();
    collector.push(&cri(late));
    collector.push(&removal(&gone, 101_700));
    assert_eq!(collector.records().len(), left);
    // ... but the same pod put back is a pod again.
    collector.push(&gone[0]);
    assert_eq!(collector.records().len(), left + 1);
    assert_eq!(collector.pods_kept(), (2, 0));
}

#[test]
fn at_most_so_many_deleted_pods_are_kept_whatever_the_retention() {
    use super::collector::MAX_DELETED_KEPT;
    let collector = Collector::new();
    let total = MAX_DELETED_KEPT + 3;
    for i in 0..total as u64 {
        for (op, at) in [(PodOp::Add, i), (PodOp::Remove, i + 1)] {
            let pod = serde_json::from_value(serde_json::json!({
                "metadata": {"name": format!("p{i}"), "uid": format!("uid-{i:04}")},
            }))
            .unwrap();
            collector.push(&TraceRecord::Pod(PodOpRecord {
                at_ns: at * MS,
                op,
                pod: std::sync::Arc::new(pod),
            }));
        }
    }
    assert_eq!(collector.pods_kept(), (total, total));
    let forgotten = collector.forget_deleted(total as u64 * MS, u64::MAX);
    assert_eq!(
        forgotten.uids,
        ["uid-0000", "uid-0001", "uid-0002"],
        "the longest gone"
    );
    let stats = collector.stats();
    assert_eq!((stats.forgotten_pods, stats.forgotten_early), (3, 3));
    assert_eq!(collector.pods_kept(), (MAX_DELETED_KEPT, MAX_DELETED_KEPT));
}

/// `run`'s pod, whose image was pulled after queueing behind another pod's pull.
fn run_with_queued_pull() -> Vec<TraceRecord> {
    let mut records = run("portmap", 0);
    records.push(TraceRecord::Wait(crate::trace::PodWaitRecord {
        start_ns: 153 * MS + MS / 2,
        end_ns: 156 * MS,
        pod_uid: UID.into(),
        namespace: "default".into(),
        name: "web".into(),
        wait: crate::kuberuntime::event::PodWait {
            wait: crate::kuberuntime::event::WaitKind::ImagePuller,
            container: Some("app".into()),
            behind: vec!["default/big".into()],
            detail: "serialized image pulls".into(),
        },
    }));
    let mut pull = call("PullImage", 156, 159);
    pull.image = "app:1".into();
    records.push(cri(pull));
    records
}

#[test]
fn a_pull_queued_at_the_image_puller_is_a_stage_naming_whose_pull_went_first() {
    let records = run_with_queued_pull();
    let t = build(&records);
    let p = &t.pods[0];
    let names: Vec<String> = p.stages.iter().map(|s| s.stage.to_string()).collect();
    let wait = names.iter().position(|n| *n == "image_puller_wait:app");
    let pull = names.iter().position(|n| *n == "image_pull:app");
    assert!(
        matches!((wait, pull), (Some(w), Some(p)) if w < p),
        "{names:?}"
    );
    let s = p.stage("image_puller_wait:app").unwrap();
    assert_eq!(s.duration_ns, 2_500_000);
    assert_eq!(s.source, StageSource::Agent);
    assert_eq!(s.detail, "behind default/big; serialized image pulls");
    // The report counts the wait as a part of its own, not as unexplained time.
    let b = crate::report::breakdown(p).unwrap();
    let part = b
        .parts
        .iter()
        .find(|x| x.part == "image_puller_wait:app")
        .unwrap();
    assert_eq!(part.ns, 2_500_000);
    assert!(part.what.contains("behind default/big"), "{}", part.what);
    // The agent's bounded records keep waits and give the same timeline.
    let collector = Collector::new();
    for r in &records {
        collector.push(r);
    }
    assert_eq!(collector.timeline(), t);
}

/// A pod with sidecar `side` (a startup probe when `probed`) before container `app`:
/// the sidecar starts at 170 ms, the app's creation begins at 400 ms.
fn sidecar_pod(probed: bool) -> Vec<TraceRecord> {
    let probe = if probed {
        serde_json::json!({"exec": {"command": ["true"]}})
    } else {
        serde_json::Value::Null
    };
    let pod = serde_json::from_value(serde_json::json!({
        "metadata": {"name": "web", "namespace": "default", "uid": UID},
        "spec": {
            "initContainers": [{"name": "side", "image": "app:1", "restartPolicy": "Always",
                                "startupProbe": probe}],
            "containers": [{"name": "app", "image": "app:1"}]
        }
    }))
    .unwrap();
    let mut records = vec![TraceRecord::Pod(PodOpRecord {
        at_ns: 0,
        op: PodOp::Add,
        pod: std::sync::Arc::new(pod),
    })];
    let mut run = call("RunPodSandbox", 5, 150);
    run.sandbox_id = SANDBOX.into();
    records.push(cri(run));
    for (name, id, at) in [("side", "5e5e", 160), ("app", "a0a0", 400)] {
        let mut create = call("CreateContainer", at, at + 5);
        create.container = name.into();
        create.container_id = id.into();
        create.sandbox_id = SANDBOX.into();
        create.image = "app:1".into();
        let mut start = call("StartContainer", at + 5, at + 10);
        start.container = name.into();
        start.container_id = id.into();
        start.sandbox_id = SANDBOX.into();
        records.push(cri(create));
        records.push(cri(start));
    }
    records
}

#[test]
fn the_time_the_app_waits_for_its_sidecar_is_a_stage_saying_what_it_waited_for() {
    let t = build(&sidecar_pod(false));
    let p = &t.pods[0];
    let names: Vec<String> = p.stages.iter().map(|s| s.stage.to_string()).collect();
    let s = p
        .stage("sidecar_wait:app")
        .unwrap_or_else(|| panic!("{names:?}"));
    assert_eq!((s.start_ns, s.end_ns), (170 * MS, 400 * MS));
    assert_eq!(s.detail, "until a sync saw sidecar side running");
    assert_eq!(s.container.as_deref(), Some("app"));
    let probed = build(&sidecar_pod(true));
    assert_eq!(
        probed.pods[0].stage("sidecar_wait:app").unwrap().detail,
        "until a sync saw sidecar side running and its startup probe passed"
    );
    // Without a sidecar nothing waits for one.
    assert!(
        !build(&run("portmap", 0)).pods[0]
            .stages
            .iter()
            .any(|s| s.kind().as_str() == "sidecar_wait")
    );
}

#[test]
fn waits_of_the_whole_pod_and_of_one_container_are_stages_by_kind() {
    let mut records = run("portmap", 0);
    let wait = |start: u64, end: u64, kind, container: Option<&str>, detail: &str| {
        TraceRecord::Wait(crate::trace::PodWaitRecord {
            start_ns: start * MS,
            end_ns: end * MS,
            pod_uid: UID.into(),
            namespace: "default".into(),
            name: "web".into(),
            wait: crate::kuberuntime::event::PodWait {
                wait: kind,
                container: container.map(str::to_string),
                behind: Vec::new(),
                detail: detail.into(),
            },
        })
    };
    use crate::kuberuntime::event::WaitKind;
    records.push(wait(1, 2, WaitKind::Network, None, "not ready"));
    records.push(wait(
        3,
        4,
        WaitKind::PodWorker,
        None,
        "a probe result, held",
    ));
    records.push(wait(
        150,
        153,
        WaitKind::BackOff,
        Some("app"),
        "app: CrashLoopBackOff",
    ));
    let t = build(&records);
    let p = &t.pods[0];
    let network = p.stage("network_wait").expect("network_wait");
    assert_eq!((network.start_ns, network.end_ns), (MS, 2 * MS));
    assert_eq!(network.detail, "not ready");
    assert_eq!(network.container, None);
    assert!(p.stage("pod_worker_wait").is_some());
    let back_off = p.stage("back_off_wait:app").expect("back_off_wait:app");
    assert_eq!(back_off.container.as_deref(), Some("app"));
    assert_eq!(back_off.duration_ns, 3 * MS);
}

fn runtime_exec(t: u64, pid: u32, comm: &str, argv: &str) -> TraceRecord {
    TraceRecord::Kernel(KernelEvent::RuntimeExec(Box::new(
        crate::ebpf::event::RuntimeExec {
            meta: meta(t, pid, comm, 1),
            argv: argv.split(' ').map(str::to_string).collect(),
            head_cut: false,
            unreadable: false,
            forked_ns: None,
        },
    )))
}

#[test]
fn runtime_programs_are_attributed_by_the_ids_in_their_arguments_and_runc_init_by_its_parent() {
    let mut records = run("portmap", 0);
    let first = records.len();
    // The sandbox's shim and runc, a container's runc create with runc init under it,
    // and a runc run for another kubelet's sandbox: none attributed by time.
    records.extend([
        runtime_exec(
            50,
            600,
            "containerd-shim",
            &format!("/usr/bin/containerd-shim-runc-v2 -namespace k8s.io -id {SANDBOX} start"),
        ),
        exec(50, 600, CONTAINERD, "/usr/bin/containerd-shim-runc-v2", 1),
        exit(60, 600, "containerd-shim", 0),
        runtime_exec(
            61,
            610,
            "runc",
            &format!("runc --root /r create --bundle /b/{CONTAINER} {CONTAINER}"),
        ),
        exec(61, 610, 601, "/usr/sbin/runc", 1),
        exec(62, 611, 610, "/proc/self/exe", 1),
        runtime_exec(63, 611, "runc", "runc init"),
        exec(63, 611, 610, "/dev/fd/6", 1),
        exit(70, 610, "runc", 0),
        runtime_exec(71, 620, "runc", &format!("runc start {OTHER_SANDBOX}")),
        exec(71, 620, 601, "/usr/sbin/runc", 1),
    ]);
    let a = attribute(&records);
    let owner = |i: usize| a.owner(first + i);
    let shim = owner(0).expect("the shim's start");
    assert_eq!(
        (shim.pod_uid.as_str(), shim.sandbox_id.as_deref(), shim.rule),
        (UID, Some(SANDBOX), Rule::RuntimeArgs)
    );
    assert_eq!(owner(1).map(|o| o.rule), Some(Rule::Ancestry), "its exec");
    assert_eq!(owner(2).map(|o| o.rule), Some(Rule::Ancestry), "its exit");
    let create = owner(3).expect("runc create");
    assert_eq!(create.container_id.as_deref(), Some(CONTAINER));
    assert_eq!(create.rule, Rule::RuntimeArgs);
    for i in [5, 6, 7] {
        let o = owner(i).unwrap_or_else(|| panic!("runc init record {i}"));
        assert_eq!(o.container_id.as_deref(), Some(CONTAINER), "record {i}");
    }
    assert_eq!(
        owner(8).map(|o| o.rule),
        Some(Rule::Ancestry),
        "runc create's exit"
    );
    assert_eq!(owner(9), None, "a sandbox CRI never named for this agent");
    assert_eq!(owner(10), None);
    // The steps on the timeline, inside StartContainer's container.
    let t = build(&records);
    let p = &t.pods[0];
    let create = p.stage("runc_create:app").expect("runc_create:app");
    assert_eq!((create.start_ns, create.end_ns), (61 * MS, 70 * MS));
    let init = p.stage("runc_init:app").expect("runc_init:app");
    assert_eq!(
        (init.start_ns, init.end_ns, init.pid),
        (62 * MS, 70 * MS, Some(611))
    );
    assert_eq!(p.stage("shim_start").map(|s| s.duration_ns), Some(10 * MS));
}

/// What `podlapse observe` records of the same pod: the kernel's events, and instead of
/// the client's config change and CRI calls, the runtime's reports of the sandbox and
/// container (its event stream's times).
pub(crate) fn observed_run() -> Vec<TraceRecord> {
    use crate::trace::{Observation, ObservedRecord, ObservedVia};
    let mut records: Vec<TraceRecord> = run("portmap", 0)
        .into_iter()
        .filter(|r| matches!(r, TraceRecord::Kernel(_)))
        .collect();
    let report = |at_ms: u64, what, container_id: &str| ObservedRecord {
        at_ns: (at_ms + 1) * MS,
        runtime_ns: Some(at_ms * MS),
        what,
        via: ObservedVia::Events,
        pod_uid: UID.into(),
        namespace: "default".into(),
        name: "web".into(),
        sandbox_id: SANDBOX.into(),
        attempt: 0,
        container_id: container_id.into(),
        container: if container_id.is_empty() { "" } else { "app" }.into(),
        ip: if container_id.is_empty() {
            "10.244.77.9"
        } else {
            ""
        }
        .into(),
        host_network: false,
        exit_code: None,
        before_start: false,
        stream_missed: false,
        note: String::new(),
    };
    records.push(TraceRecord::Observed(report(
        150,
        Observation::SandboxReady,
        "",
    )));
    records.push(TraceRecord::Observed(report(
        170,
        Observation::ContainerCreated,
        CONTAINER,
    )));
    records.push(TraceRecord::Observed(report(
        240,
        Observation::ContainerStarted,
        CONTAINER,
    )));
    records
}

#[test]
fn an_observed_pod_gets_its_kernel_stages_and_the_runtimes_times_and_nothing_guessed() {
    let t = build(&observed_run());
    assert_eq!(t.pods.len(), 1, "{t:#?}");
    let p = &t.pods[0];
    assert_eq!((p.name.as_str(), p.uid.as_str()), ("web", UID));
    assert_eq!(p.ip.as_deref(), Some("10.244.77.9"));
    let names: Vec<String> = p.stages.iter().map(|s| s.stage.to_string()).collect();
    for kernel in [
        "pod_cgroup_created",
        "netns_created",
        "cni_plugin:loopback",
        "cni_plugin:bridge",
        "cni_plugin:host-local",
        "cni_plugin:portmap",
        "sandbox_cgroup",
        "pause_exec",
        "container_cgroup:app",
        "app_first_exec:app",
    ] {
        let s = p
            .stage(kernel)
            .unwrap_or_else(|| panic!("no {kernel}: {names:?}"));
        assert_eq!(s.source, StageSource::Kernel, "{kernel}");
    }
    // Only the client knows when it admitted the pod or asked for the sandbox.
    for absent in ["admitted", "sandbox_requested", "container_create:app"] {
        assert!(p.stage(absent).is_none(), "{absent} was guessed: {names:?}");
    }
    let seen = p.stage("pod_seen").unwrap();
    assert_eq!((seen.start_ns, seen.source), (3 * MS, StageSource::Kernel));
    let ready = p.stage("sandbox_ready").unwrap();
    assert_eq!(
        (ready.start_ns, ready.source),
        (150 * MS, StageSource::Runtime)
    );
    assert!(
        ready.detail.starts_with("ip 10.244.77.9"),
        "{}",
        ready.detail
    );
    assert_eq!(p.stage("container_created:app").unwrap().start_ns, 170 * MS);
    let running = p.stage("running").unwrap();
    assert_eq!(running.start_ns, 240 * MS);
    assert_eq!(p.containers.get(CONTAINER).map(String::as_str), Some("app"));
    assert_eq!(
        names.last().map(String::as_str),
        Some("running"),
        "the runtime's start of the last container ends the startup: {names:?}"
    );
}

#[test]
fn an_observed_sandbox_without_kubelets_labels_is_its_own_pod_by_its_id() {
    use crate::trace::{Observation, ObservedRecord, ObservedVia};
    let mut records = observed_run();
    let unlabelled = |sandbox: &str| {
        TraceRecord::Observed(ObservedRecord {
            at_ns: 300 * MS,
            runtime_ns: None,
            what: Observation::SandboxReady,
            via: ObservedVia::Polling,
            pod_uid: String::new(),
            namespace: "default".into(),
            name: "web".into(),
            sandbox_id: sandbox.into(),
            attempt: 0,
            container_id: String::new(),
            container: String::new(),
            ip: String::new(),
            host_network: false,
            exit_code: None,
            before_start: false,
            stream_missed: false,
            note: "no io.kubernetes.pod.uid label: shown by its sandbox ID".into(),
        })
    };
    records.push(unlabelled(OTHER_SANDBOX));
    records.push(unlabelled(&"e".repeat(64)));
    let t = build(&records);
    let uids: Vec<&str> = t.pods.iter().map(|p| p.uid.as_str()).collect();
    assert_eq!(t.pods.len(), 3, "{uids:?}");
    assert!(
        uids.contains(&UID) && uids.contains(&OTHER_SANDBOX),
        "{uids:?}"
    );
    let labelled = t.pods.iter().find(|p| p.uid == UID).unwrap();
    assert!(
        labelled
            .stage("sandbox_ready")
            .unwrap()
            .sandbox_id
            .as_deref()
            == Some(SANDBOX),
        "the labelled pod took another sandbox"
    );
}

#[test]
fn a_pod_already_there_when_the_observer_started_has_no_made_up_startup() {
    let mut records = observed_run();
    for r in &mut records {
        if let TraceRecord::Observed(o) = r {
            o.before_start = o.what == crate::trace::Observation::SandboxReady;
        }
    }
    let t = build(&records);
    let p = &t.pods[0];
    assert!(p.stage("running").is_none() && p.stage("pod_seen").is_none());
    assert!(
        p.notes.iter().any(|n| n.contains("not observed")),
        "{:?}",
        p.notes
    );
    assert!(
        p.stage("container_started:app").is_some(),
        "what was seen stays"
    );
}

/// The runtime's spans of an observed pod: no call of podlapse's above them, so the
/// runtime's server span of each call stands for it.
#[test]
fn an_observed_pods_runtime_spans_hang_inside_the_runtimes_server_spans() {
    use podlapse_core::record::RuntimeSpan;
    use podlapse_core::record::RuntimeSpanEvent;
    let span = |id: &str, parent: &str, name: &str, kind: &str, start: u64, end: u64| RuntimeSpan {
        pod_uid: UID.into(),
        trace_id: "ab".repeat(16),
        span_id: id.repeat(8),
        parent_span_id: parent.repeat(8),
        name: name.into(),
        kind: kind.into(),
        start_ns: start * MS,
        end_ns: end * MS,
        attributes: Default::default(),
        events: Vec::new(),
        status: "unset".into(),
        status_message: String::new(),
        scope: String::new(),
        scope_version: String::new(),
        resource: Default::default(),
    };
    let mut run_sandbox = span(
        "01",
        "ee",
        "runtime.v1.RuntimeService/RunPodSandbox",
        "server",
        20,
        148,
    );
    run_sandbox
        .attributes
        .insert("sandbox.id".into(), SANDBOX.into());
    run_sandbox.events.push(RuntimeSpanEvent {
        name: "setup pod network".into(),
        at_ns: 60 * MS,
        attributes: Default::default(),
    });
    let mut start = span(
        "02",
        "ee",
        "runtime.v1.RuntimeService/StartContainer",
        "server",
        180,
        238,
    );
    start
        .attributes
        .insert("container.id".into(), CONTAINER.into());
    let spans = [
        run_sandbox,
        span("03", "01", "metadata.sandbox.Create", "internal", 90, 92),
        span("04", "01", "metadata.sandbox.Update", "internal", 120, 122),
        start,
        span("05", "02", "task.Start", "internal", 200, 230),
        // Under a span no one sent: not a stage.
        span("06", "0f", "task.Start", "internal", 300, 310),
    ];
    let mut records = observed_run();
    records.extend(
        spans
            .into_iter()
            .map(|s| TraceRecord::RuntimeSpan(Box::new(s))),
    );
    let t = build(&records);
    let p = &t.pods[0];
    let net = p.stage("runtime:network_setup").expect("network setup");
    assert_eq!((net.start_ns, net.end_ns), (60 * MS, 122 * MS));
    assert_eq!(net.sandbox_id.as_deref(), Some(SANDBOX));
    assert_eq!(net.source, StageSource::Runtime);
    // The container's name comes from what the observer recorded of its ID.
    let task = p.stage("runtime:task_start:app").expect("task start");
    assert_eq!((task.start_ns, task.end_ns), (200 * MS, 230 * MS));
    assert_eq!(
        p.stages
            .iter()
            .filter(|s| s.stage.runtime_step() == Some("task_start"))
            .count(),
        1
    );
}

#[test]
fn changes_the_event_stream_missed_and_lost_kernel_events_are_said_on_the_pod() {
    let mut records = observed_run();
    for r in &mut records {
        if let TraceRecord::Observed(o) = r
            && o.what == crate::trace::Observation::ContainerStarted
        {
            o.stream_missed = true;
        }
    }
    records.push(TraceRecord::Footer(crate::trace::Footer {
        lost_events: 7,
        ..Default::default()
    }));
    let t = from_records(&records);
    let notes = &t.pods[0].notes;
    assert!(
        notes
            .iter()
            .any(|n| n.contains("event stream missed 1 of its changes")),
        "{notes:?}"
    );
    assert!(
        notes.iter().any(|n| n.contains("lost 7 kernel events")),
        "{notes:?}"
    );
}

/// The observer's live API builds its timeline from a collector: it keeps observed
/// records and the observed header, and gives the same timeline as the trace.
#[test]
fn the_collector_keeps_an_observers_records_for_the_live_timeline() {
    let mut records = observed_run();
    let header = TraceRecord::Header(crate::trace::Header {
        schema_version: crate::trace::SCHEMA_VERSION,
        podlapse_version: "0".into(),
        node: "n".into(),
        kernel: "k".into(),
        runtime_name: "containerd".into(),
        runtime_version: "2.1.0".into(),
        config: crate::trace::TraceConfig::empty(),
        started_wall_ns: 0,
        started_ns: 0,
        observed: Some(crate::trace::ObservedHeader {
            sources: vec!["kernel".into(), "cri:events".into()],
            poll_ms: None,
        }),
        part: None,
    });
    records.insert(0, header);
    let c = Collector::new();
    for r in &records {
        c.push(r);
    }
    assert_eq!(c.timeline(), build(&records));
    let kept = c.records();
    assert!(
        matches!(&kept[0], TraceRecord::Header(h) if h.observed.is_some()),
        "the observed header comes first"
    );
    assert_eq!(
        kept.iter()
            .filter(|r| matches!(r, TraceRecord::Observed(_)))
            .count(),
        3
    );
}

#[test]
fn an_observed_pod_is_forgotten_once_its_last_sandbox_went_not_when_an_old_one_did() {
    use crate::trace::Observation;
    let collector = Collector::new();
    let records = observed_run();
    for r in &records {
        collector.push(r);
    }
    // The runtime shows a second sandbox of the pod, then removes the first (the kubelet
    // made a new one and its GC took the old): the pod runs on.
    let observed = |at_ms: u64, what, sandbox: &str| {
        let mut o = records
            .iter()
            .find_map(|r| match r {
                TraceRecord::Observed(o) if o.what == Observation::SandboxReady => Some(o.clone()),
                _ => None,
            })
            .unwrap();
        o.what = what;
        o.sandbox_id = sandbox.into();
        o.at_ns = at_ms * MS;
        o.runtime_ns = Some(at_ms * MS);
        TraceRecord::Observed(o)
    };
    let second = "7c".repeat(32);
    collector.push(&observed(1_000, Observation::SandboxReady, &second));
    collector.push(&observed(1_100, Observation::SandboxRemoved, SANDBOX));
    let retention = 10_000 * MS;
    assert!(
        collector
            .forget_deleted(100_000 * MS, retention)
            .uids
            .is_empty()
    );
    assert_eq!(collector.pods_kept(), (1, 0));
    // Its last sandbox goes: forgotten after the retention, not before.
    collector.push(&observed(200_000, Observation::SandboxRemoved, &second));
    assert_eq!(collector.pods_kept(), (1, 1));
    assert!(
        collector
            .forget_deleted(205_000 * MS, retention)
            .uids
            .is_empty()
    );
    let forgotten = collector.forget_deleted(211_000 * MS, retention);
    assert_eq!(forgotten.uids, [UID]);
    assert!(forgotten.timeline.pods[0].stage("running").is_some());
    assert!(collector.timeline().pods.is_empty());
    // A late record of it is refused.
    collector.push(&observed(212_000, Observation::ContainerExited, &second));
    assert!(collector.timeline().pods.is_empty());
}
