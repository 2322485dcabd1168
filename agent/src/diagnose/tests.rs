//! Verdicts on hand-built records, one fault at a time, each naming its stage.

use super::*;
use crate::cri::CriCall;
use crate::ebpf::{CniExec, EventMeta, KernelEvent};
use crate::kuberuntime::PodEvent;
use crate::trace::{Header, PodEventRecord, PodOp, PodOpRecord, TraceRecord};
use podlapse_core::record::{
    ContainerReason, ContainerState, ContainerStatusFields, PodSandboxNetwork, PodSandboxState,
    PodSandboxStatusFields, RuntimeCondition, RuntimeConditionType, RuntimeSpan, StatusFields,
};

const UID: &str = "0a1b2c3d-0000-4000-8000-000000000001";
const SANDBOX: &str = "5a5a5a5a5a5a5a5a5a5a5a5a5a5a5a5a5a5a5a5a5a5a5a5a5a5a5a5a5a5a5a5a";
const FAILED_SANDBOX: &str = "6b6b6b6b6b6b6b6b6b6b6b6b6b6b6b6b6b6b6b6b6b6b6b6b6b6b6b6b6b6b6b6b";
const MS: u64 = 1_000_000;

fn meta(t_ms: u64, pid: u32, comm: &str) -> EventMeta {
    EventMeta {
        ktime_ns: t_ms * MS,
        cpu: 0,
        pid,
        tgid: pid,
        comm: comm.into(),
        cgroup_id: 1,
    }
}

fn header(node_ip: &str) -> TraceRecord {
    TraceRecord::Header(Header {
        schema_version: 1,
        podlapse_version: "0.1.0".into(),
        node: "n".into(),
        kernel: "6.18".into(),
        runtime_name: "containerd".into(),
        runtime_version: "1.6".into(),
        config: serde_json::from_value(serde_json::json!({ "node_ip": node_ip })).unwrap(),
        started_wall_ns: 0,
        started_ns: 0,
        observed: None,
        part: None,
    })
}

fn pod_add(host_network: bool) -> TraceRecord {
    let pod = serde_json::from_value(serde_json::json!({
        "metadata": {"name": "web", "namespace": "default", "uid": UID},
        "spec": {"hostNetwork": host_network, "containers": [{"name": "app", "image": "app:1"}]}
    }))
    .unwrap();
    TraceRecord::Pod(PodOpRecord {
        at_ns: 0,
        op: PodOp::Add,
        pod: std::sync::Arc::new(pod),
    })
}

fn call(method: &str, start_ms: u64, end_ms: u64) -> CriCall {
    CriCall::new(method.parse().expect("a CRI method"))
        .with_pod_uid(UID)
        .with_times(start_ms * MS, end_ms * MS)
        .with_code(crate::cri::GrpcCode::Ok)
}

fn failed(mut c: CriCall, code: &str, message: &str) -> CriCall {
    c.code = code.parse().expect("a gRPC code");
    c.message = message.into();
    c
}

fn with(mut c: CriCall, f: impl FnOnce(&mut CriCall)) -> TraceRecord {
    f(&mut c);
    TraceRecord::Cri(c)
}

fn event(t_ms: u64, reason: &str, message: &str, container: Option<&str>) -> TraceRecord {
    TraceRecord::Event(PodEventRecord {
        at_ns: t_ms * MS,
        pod_uid: UID.into(),
        namespace: "default".into(),
        name: "web".into(),
        event: PodEvent::warning(reason, message, container.map(str::to_string)),
    })
}

fn cni(t_ms: u64, pid: u32, command: &str, plugin: &str, sandbox: &str) -> TraceRecord {
    TraceRecord::Kernel(KernelEvent::CniExec(Box::new(CniExec {
        meta: meta(t_ms, pid, "containerd"),
        plugin: plugin.into(),
        filename: format!("/usr/lib/cni/{plugin}"),
        command: command.into(),
        container_id: sandbox.into(),
        netns: "/run/netns/cni-1".into(),
        ifname: "eth0".into(),
        args: format!(
            "IgnoreUnknown=1;K8S_POD_NAMESPACE=default;K8S_POD_NAME=web;K8S_POD_INFRA_CONTAINER_ID={sandbox};K8S_POD_UID={UID}"
        ),
        pod_namespace: Some("default".into()),
        pod_name: Some("web".into()),
        infra_container_id: Some(sandbox.into()),
        env_scanned: 60,
        env_truncated: false,
        forked_ns: None,
    })))
}

fn exec(t_ms: u64, pid: u32, ppid: u32, file: &str) -> TraceRecord {
    TraceRecord::Kernel(KernelEvent::Exec {
        meta: meta(t_ms, pid, file.rsplit('/').next().unwrap()),
        filename: file.into(),
        old_pid: pid,
        ppid: Some(ppid),
    })
}

fn exit(t_ms: u64, pid: u32, code: i32) -> TraceRecord {
    TraceRecord::Kernel(KernelEvent::Exit {
        meta: meta(t_ms, pid, "plugin"),
        exit_code: Some(code),
        signal: None,
    })
}

/// A sandbox that came up with `ip` ("" on the host network), between `at` and `at + 10`.
fn sandbox(at: u64, id: &str, ip: &str) -> Vec<TraceRecord> {
    vec![
        with(call("RunPodSandbox", at, at + 10), |c| {
            c.sandbox_id = id.into()
        }),
        with(call("PodSandboxStatus", at + 11, at + 12), |c| {
            c.sandbox_id = id.into();
            c.response = PodSandboxStatusFields {
                state: Some(PodSandboxState::Ready),
                network: Some(PodSandboxNetwork {
                    ip: (!ip.is_empty()).then(|| ip.parse().expect("an IP")),
                }),
            }
            .into();
        }),
    ]
}

/// Pull, create and start of container `app` (container ID `id`) from `at`.
fn app(at: u64, id: &str, pull: bool) -> Vec<TraceRecord> {
    let mut v = Vec::new();
    if pull {
        v.push(with(call("PullImage", at, at + 5), |c| {
            c.image = "app:1".into()
        }));
    }
    v.push(with(call("CreateContainer", at + 6, at + 8), |c| {
        c.container = "app".into();
        c.sandbox_id = SANDBOX.into();
        c.container_id = id.into();
        c.image = "app:1".into();
    }));
    v.push(with(call("StartContainer", at + 9, at + 12), |c| {
        c.container = "app".into();
        c.container_id = id.into();
    }));
    v
}

fn healthy_run() -> Vec<TraceRecord> {
    let mut r = vec![header("192.0.2.10"), pod_add(false)];
    r.push(with(call("ListPodSandbox", 1, 2), |_| {}));
    r.extend(sandbox(10, SANDBOX, "10.244.77.5"));
    r.extend([cni(12, 100, "ADD", "bridge", SANDBOX), exit(15, 100, 0)]);
    r.extend(app(30, "c1", true));
    r
}

fn one(records: &[TraceRecord]) -> PodDiagnosis {
    let d = diagnose(records, None);
    assert_eq!(d.pods.len(), 1, "{d:#?}");
    d.pods[0].clone()
}

fn has(f: &Finding, text: &str) -> bool {
    f.summary.contains(text) || f.evidence.iter().any(|e| e.contains(text))
}

#[test]
fn a_running_pod_with_an_ip_is_healthy() {
    let p = one(&healthy_run());
    assert_eq!(p.verdict.cause, Cause::Healthy, "{p:#?}");
    assert_eq!(p.verdict.stage.to_string(), "running");
    assert_eq!(p.ip.as_deref(), Some("10.244.77.5"));
    assert!(p.running && p.also.is_empty(), "{p:#?}");
}

#[test]
fn a_host_network_pod_has_no_ip_by_design_and_shows_the_hosts() {
    let mut r = vec![header("192.0.2.10"), pod_add(true)];
    r.extend(sandbox(10, SANDBOX, ""));
    r.extend(app(30, "c1", true));
    let p = one(&r);
    assert_eq!(p.verdict.cause, Cause::HostNetwork, "{p:#?}");
    assert_eq!(p.verdict.stage.to_string(), "sandbox_ready");
    assert!(has(&p.verdict, "192.0.2.10"), "{p:#?}");
    assert!(p.ip.is_none() && p.verdict.cause.is_healthy());
}

#[test]
fn network_not_ready_names_the_sandbox_that_was_never_requested() {
    let mut status = call("Status", 3, 4);
    status.pod_uid.clear();
    status.response = StatusFields::new([
        RuntimeCondition::new(RuntimeConditionType::RuntimeReady, true),
        RuntimeCondition {
            reason: Some("NetworkPluginNotReady".into()),
            message: Some("Network plugin returns error: cni plugin not initialized".into()),
            ..RuntimeCondition::new(RuntimeConditionType::NetworkReady, false)
        },
    ])
    .into();
    let msg = "network is not ready: NetworkPluginNotReady: Network plugin returns error: cni plugin not initialized";
    let r = vec![
        pod_add(false),
        with(call("ListPodSandbox", 1, 2), |_| {}),
        TraceRecord::Cri(status),
        event(5, "NetworkNotReady", msg, None),
        event(1005, "NetworkNotReady", msg, None),
        // Another node-level event, so the kernel's silence about this pod means something.
        exec(6, 900, 1, "/usr/bin/true"),
    ];
    let p = one(&r);
    assert_eq!(p.verdict.cause, Cause::NetworkNotReady, "{p:#?}");
    assert_eq!(p.verdict.stage.to_string(), "sandbox_requested");
    assert!(
        has(
            &p.verdict,
            "NetworkReady=false (NetworkPluginNotReady: Network plugin returns error: cni plugin not initialized)"
        ),
        "{p:#?}"
    );
    assert!(has(&p.verdict, "2 times"), "{p:#?}");
    assert!(!p.running && p.ip.is_none());
}

/// A failed RunPodSandbox whose chain is bridge (with host-local under it) then `last`.
fn failed_sandbox(message: &str, ipam_code: i32, last: Option<(&str, i32)>) -> Vec<TraceRecord> {
    let mut r = vec![header("192.0.2.10"), pod_add(false)];
    r.push(TraceRecord::Cri(failed(
        call("RunPodSandbox", 10, 100),
        "Unknown",
        message,
    )));
    r.extend([
        cni(20, 100, "ADD", "bridge", FAILED_SANDBOX),
        cni(22, 101, "ADD", "host-local", FAILED_SANDBOX),
        exec(22, 101, 100, "/usr/lib/cni/host-local"),
        exit(25, 101, ipam_code),
        exit(40, 100, if ipam_code == 0 { 0 } else { 1 }),
    ]);
    if let Some((plugin, code)) = last {
        r.extend([
            cni(50, 102, "ADD", plugin, FAILED_SANDBOX),
            exit(55, 102, code),
        ]);
    }
    r.extend([
        cni(60, 110, "DEL", "bridge", FAILED_SANDBOX),
        exit(65, 110, 0),
        event(
            101,
            "FailedCreatePodSandBox",
            &format!("Failed to create pod sandbox: {message}"),
            None,
        ),
    ]);
    r
}

#[test]
fn a_cni_plugin_that_exits_non_zero_is_named_with_its_exit_code_and_the_runtimes_text() {
    let msg = "failed to setup network for sandbox \"6b6b\": plugin type=\"tuning\" failed (add): invalid net sysctl key: \"kernel.podlapse_lab_fail\"";
    let p = one(&failed_sandbox(msg, 0, Some(("tuning", 1))));
    assert_eq!(p.verdict.cause, Cause::CniPluginFailed, "{p:#?}");
    assert_eq!(p.verdict.stage.to_string(), "cni_plugin:tuning");
    assert!(p.verdict.summary.contains("exited with code 1"), "{p:#?}");
    assert!(has(&p.verdict, "invalid net sysctl key"), "{p:#?}");
    assert!(
        has(
            &p.verdict,
            "cni_plugin:tuning ADD exited with code 1 (kernel, pid 102)"
        ),
        "{p:#?}"
    );
    // Its sandbox was DEL'd by the runtime: no leak.
    assert!(p.also.is_empty(), "{p:#?}");
}

#[test]
fn without_kernel_events_the_plugin_comes_from_the_runtimes_text() {
    let msg = "plugin type=\"tuning\" failed (add): invalid net sysctl key";
    let r = vec![
        pod_add(false),
        TraceRecord::Cri(failed(call("RunPodSandbox", 10, 100), "Unknown", msg)),
    ];
    let d = diagnose(&r, None);
    let p = &d.pods[0];
    assert_eq!(
        (p.verdict.cause, p.verdict.stage.to_string().as_str()),
        (Cause::CniPluginFailed, "cni_plugin:tuning"),
        "{p:#?}"
    );
    assert!(d.notes[0].contains("no kernel events"), "{d:#?}");
}

#[test]
fn ipam_exhaustion_names_the_ipam_plugin() {
    let msg = "plugin type=\"bridge\" name=\"podlapse-lab\" failed (add): failed to allocate for range 0: no IP addresses available in range set: 10.244.77.2-10.244.77.3";
    let p = one(&failed_sandbox(msg, 1, None));
    assert_eq!(p.verdict.cause, Cause::IpamExhausted, "{p:#?}");
    assert_eq!(p.verdict.stage.to_string(), "cni_plugin:host-local");
    assert!(has(&p.verdict, "no IP addresses available"), "{p:#?}");
    assert!(
        has(&p.verdict, "host-local ADD exited with code 1"),
        "{p:#?}"
    );
    assert!(has(&p.verdict, "delegated by bridge"), "{p:#?}");
}

#[test]
fn a_sandbox_that_failed_before_any_netns_names_netns_created() {
    let r = vec![
        pod_add(false),
        TraceRecord::Cri(failed(
            call("RunPodSandbox", 10, 100),
            "Unknown",
            "failed to get sandbox image \"pause:3.10\": not found",
        )),
        exec(50, 900, 1, "/usr/bin/true"),
    ];
    let p = one(&r);
    assert_eq!(
        (p.verdict.cause, p.verdict.stage.to_string().as_str()),
        (Cause::NetnsNotCreated, "netns_created"),
        "{p:#?}"
    );
    assert!(has(&p.verdict, "failed to get sandbox image"), "{p:#?}");
}

#[test]
fn an_image_that_cannot_be_pulled_names_its_pull() {
    let mut r = vec![pod_add(false)];
    r.extend(sandbox(10, SANDBOX, "10.244.77.5"));
    r.push(with(
        failed(
            call("PullImage", 30, 35),
            "NotFound",
            "failed to pull and unpack image \"app:1\": not found",
        ),
        |c| c.image = "app:1".into(),
    ));
    r.push(event(
        36,
        "BackOff",
        "Back-off pulling image \"app:1\"",
        Some("app"),
    ));
    let p = one(&r);
    assert_eq!(
        (p.verdict.cause, p.verdict.stage.to_string().as_str()),
        (Cause::ImagePullFailed, "image_pull:app"),
        "{p:#?}"
    );
    assert!(has(&p.verdict, "NotFound"), "{p:#?}");
    assert!(has(&p.verdict, "Back-off pulling image"), "{p:#?}");
}

#[test]
fn a_container_that_keeps_exiting_is_a_crash_loop_on_its_start() {
    let mut r = healthy_run();
    r.push(with(call("ContainerStatus", 50, 51), |c| {
        c.container = "app".into();
        c.container_id = "c1".into();
        c.response = ContainerStatusFields {
            state: Some(ContainerState::Exited),
            exit_code: Some(1),
            reason: Some(ContainerReason::Error),
        }
        .into();
    }));
    r.push(event(
        52,
        "BackOff",
        "back-off 10s restarting failed container=app pod=web",
        Some("app"),
    ));
    r.extend(app(70, "c2", false));
    let p = one(&r);
    assert_eq!(
        (p.verdict.cause, p.verdict.stage.to_string().as_str()),
        (Cause::CrashLoop, "container_start:app"),
        "{p:#?}"
    );
    assert!(p.verdict.summary.contains("exit code 1"), "{p:#?}");
    assert!(
        has(&p.verdict, "StartContainer succeeded 2 times"),
        "{p:#?}"
    );
}

#[test]
fn an_add_without_a_del_after_the_sandbox_stopped_is_a_leaked_ip() {
    let mut r = healthy_run();
    r.push(with(call("StopPodSandbox", 200, 210), |c| {
        c.sandbox_id = SANDBOX.into()
    }));
    let p = one(&r);
    assert_eq!(
        (p.verdict.cause, p.verdict.stage.to_string().as_str()),
        (Cause::LeakedIp, "cni_add"),
        "{p:#?}"
    );
    assert!(has(&p.verdict, "IP 10.244.77.5"), "{p:#?}");
    assert!(has(&p.verdict, "StopPodSandbox returned"), "{p:#?}");

    r.extend([cni(205, 120, "DEL", "bridge", SANDBOX), exit(206, 120, 0)]);
    assert_eq!(one(&r).verdict.cause, Cause::Healthy);
}

#[test]
fn a_sandbox_recreated_again_and_again_with_new_ips_is_named() {
    let mut r = vec![pod_add(false)];
    r.extend(sandbox(10, "s1", "10.244.77.5"));
    r.extend(sandbox(100, "s2", "10.244.77.6"));
    r.extend(sandbox(200, "s3", "10.244.77.7"));
    r.extend(app(300, "c1", true));
    let p = one(&r);
    assert_eq!(
        (p.verdict.cause, p.verdict.stage.to_string().as_str()),
        (Cause::SandboxRecreated, "sandbox_requested"),
        "{p:#?}"
    );
    assert!(p.verdict.summary.contains("created 3 times"), "{p:#?}");
    assert!(has(&p.verdict, "10.244.77.6"), "{p:#?}");
}

#[test]
fn a_pod_admission_turned_away_is_not_admitted() {
    let r = vec![
        pod_add(false),
        event(1, "OutOfcpu", "Node didn't have enough resource: cpu", None),
    ];
    let p = one(&r);
    assert_eq!(
        (p.verdict.cause, p.verdict.stage.to_string().as_str()),
        (Cause::NotAdmitted, "admitted"),
        "{p:#?}"
    );
}

#[test]
fn the_same_records_give_the_same_text() {
    let r = failed_sandbox(
        "plugin type=\"tuning\" failed (add)",
        0,
        Some(("tuning", 1)),
    );
    assert_eq!(render(&diagnose(&r, None)), render(&diagnose(&r, None)));
    let text = render(&diagnose(&r, None));
    assert!(text.starts_with("default/web  uid "), "{text}");
    assert!(
        text.contains("cni_plugin_failed  stage cni_plugin:tuning"),
        "{text}"
    );
    assert!(
        text.ends_with("1 pod, 0 healthy, 1 with a problem\n"),
        "{text}"
    );
}

/// What `podlapse observe` records of another client's pod whose every RunPodSandbox
/// fails in its `tuning` plugin: only the kernel's view, two attempts (the client retried
/// with a new sandbox each time), no CRI call and no sandbox the runtime kept.
fn observed_failing(attempts: &[&str]) -> Vec<TraceRecord> {
    let mut h = header("192.0.2.10");
    if let TraceRecord::Header(h) = &mut h {
        h.observed = Some(crate::trace::ObservedHeader {
            sources: vec!["kernel".into(), "cri:events".into()],
            poll_ms: None,
        });
    }
    let mut r = vec![h];
    for (i, id) in attempts.iter().enumerate() {
        let t = 100 * i as u64;
        let pid = 200 + 10 * i as u32;
        r.extend([
            cni(t + 20, pid, "ADD", "bridge", id),
            exit(t + 40, pid, 0),
            cni(t + 50, pid + 1, "ADD", "tuning", id),
            exit(t + 55, pid + 1, 1),
            cni(t + 60, pid + 2, "DEL", "bridge", id),
            exit(t + 65, pid + 2, 0),
        ]);
    }
    r
}

#[test]
fn another_clients_pod_whose_sandboxes_keep_failing_is_named_from_the_kernels_view() {
    let first = "a1".repeat(32);
    let second = "b2".repeat(32);
    let p = one(&observed_failing(&[&first, &second]));
    assert_eq!(
        (p.namespace.as_str(), p.name.as_str()),
        ("default", "web"),
        "named by its CNI arguments"
    );
    assert_eq!(p.verdict.cause, Cause::CniPluginFailed, "{p:#?}");
    assert_eq!(p.verdict.stage.to_string(), "cni_plugin:tuning");
    assert!(p.verdict.summary.contains("exited with code 1"), "{p:#?}");
    assert!(
        has(&p.verdict, "2 sandbox attempts the kernel saw"),
        "{p:#?}"
    );
    for id in [&first, &second] {
        assert!(has(&p.verdict, &format!("sandbox {}", &id[..12])), "{p:#?}");
    }
    // In a trace of podlapse's own pods, another client's pod stays out.
    let mut own = observed_failing(&[&first]);
    if let TraceRecord::Header(h) = &mut own[0] {
        h.observed = None;
    }
    assert!(diagnose(&own, None).pods.is_empty());
}

#[test]
fn an_attempt_under_way_leaves_the_verdict_on_the_last_one_that_failed() {
    let first = "a1".repeat(32);
    let second = "b2".repeat(32);
    let mut r = observed_failing(&[&first]);
    // The client's next attempt: bridge has started and not exited yet (the diagnosis is
    // asked while the client retries, or the recording stopped during the attempt).
    r.push(cni(300, 400, "ADD", "bridge", &second));
    let p = one(&r);
    assert_eq!(
        (p.verdict.cause, p.verdict.stage.to_string().as_str()),
        (Cause::CniPluginFailed, "cni_plugin:tuning"),
        "{p:#?}"
    );
    assert!(p.verdict.summary.contains("exited with code 1"), "{p:#?}");
    assert!(
        has(&p.verdict, &format!("sandbox {}", &second[..12]))
            && has(&p.verdict, "did not exit while recorded"),
        "the attempt under way is shown as such: {p:#?}"
    );
    // A plugin that never exits in any attempt is the cause itself.
    let mut hung = vec![r[0].clone()];
    hung.push(cni(20, 500, "ADD", "bridge", &first));
    let p = one(&hung);
    assert_eq!(p.verdict.stage.to_string(), "cni_plugin:bridge", "{p:#?}");
    assert!(
        p.verdict.summary.contains("did not exit while recorded"),
        "{p:#?}"
    );
}

/// The observer's look at a node whose used network is `lab` (bridge, host-local under
/// it, then portmap), at `t_ms`.
fn network(t_ms: u64, f: impl FnOnce(&mut crate::trace::NodeNetworkRecord)) -> TraceRecord {
    let mut n: crate::trace::NodeNetworkRecord = serde_json::from_value(serde_json::json!({
        "at_ns": t_ms * MS,
        "ready": {"status": true},
        "conf_dir": "/etc/cni/net.d",
        "bin_dirs": ["/opt/cni/bin"],
        "files": [{"file": "10-lab.conflist", "network": "lab", "plugins": ["bridge", "portmap"]}],
        "used": "10-lab.conflist",
        "ipam": {"network": "lab", "dir": "/var/lib/cni/networks/lab",
                 "sets": [{"set": 0, "ranges": "10.0.0.2-10.0.0.3", "capacity": 2, "held": 1}],
                 "held": 1}
    }))
    .unwrap();
    f(&mut n);
    TraceRecord::Network(Box::new(n))
}

fn observed_header() -> TraceRecord {
    let mut h = header("192.0.2.10");
    if let TraceRecord::Header(h) = &mut h {
        h.observed = Some(crate::trace::ObservedHeader {
            sources: vec!["kernel".into(), "cri:events".into()],
            poll_ms: None,
        });
    }
    h
}

#[test]
fn an_observed_pod_failing_on_a_used_up_pool_names_the_range_its_holders_and_the_leak() {
    let id = "c3".repeat(32);
    let leaked = "d4".repeat(32);
    let r = vec![
        observed_header(),
        network(10, |n| {
            let ipam = n.ipam.as_mut().unwrap();
            ipam.sets[0].held = 2;
            ipam.held = 2;
            ipam.leaked = 1;
            ipam.holders = serde_json::from_value(serde_json::json!([
                {"ip": "10.0.0.2", "sandbox_id": leaked, "leaked": true},
                {"ip": "10.0.0.3", "sandbox_id": SANDBOX}
            ]))
            .unwrap();
        }),
        cni(20, 300, "ADD", "bridge", &id),
        cni(22, 301, "ADD", "host-local", &id),
        exec(22, 301, 300, "/opt/cni/bin/host-local"),
        exit(25, 301, 1),
        exit(40, 300, 1),
        cni(60, 310, "DEL", "bridge", &id),
        exit(65, 310, 0),
    ];
    let d = diagnose(&r, None);
    let p = &d.pods[0];
    assert_eq!(p.verdict.cause, Cause::IpamExhausted, "{p:#?}");
    assert_eq!(p.verdict.stage.to_string(), "cni_plugin:host-local");
    assert!(
        p.verdict
            .summary
            .contains("(1 held by sandboxes that no longer exist)"),
        "{p:#?}"
    );
    assert!(
        has(
            &p.verdict,
            "range set 0 (10.0.0.2-10.0.0.3) has 2 of 2 addresses held: none free"
        ),
        "{p:#?}"
    );
    assert!(
        has(
            &p.verdict,
            &format!(
                "leaked: 1 reservation of sandboxes the runtime does not know: 10.0.0.2 ({leaked}); the leaks are why the range is full"
            )
        ),
        "{p:#?}"
    );
    // The node says so too, whatever pod asks.
    assert_eq!(d.node[0].cause, Cause::IpamExhausted, "{d:#?}");
    assert!(!d.all_healthy());
}

#[test]
fn an_observed_chain_that_stops_before_a_plugin_not_installed_is_cni_plugin_missing() {
    let id = "e5".repeat(32);
    let r = vec![
        observed_header(),
        network(10, |n| {
            n.files[0].plugins = vec!["flannel".into()];
            n.missing_plugins = vec!["flannel".into()];
        }),
        // The runtime's own loopback network runs; the pod network's plugin never does.
        cni(20, 300, "ADD", "loopback", &id),
        exit(25, 300, 0),
        cni(30, 310, "DEL", "loopback", &id),
        exit(35, 310, 0),
    ];
    let d = diagnose(&r, None);
    let p = &d.pods[0];
    assert_eq!(p.verdict.cause, Cause::CniPluginMissing, "{p:#?}");
    assert_eq!(p.verdict.stage.to_string(), "cni_plugin:flannel");
    assert!(p.verdict.summary.contains("[/opt/cni/bin]"), "{p:#?}");
    assert!(
        has(
            &p.verdict,
            "the kernel saw the chain stop before flannel: loopback (exit 0) ran, flannel never exec'd"
        ),
        "{p:#?}"
    );
    assert_eq!(d.node[0].cause, Cause::CniPluginMissing, "{d:#?}");
}

#[test]
fn run_pods_take_the_runtimes_words_for_a_missing_plugin_and_a_result_without_an_address() {
    let msg = "failed to setup network for sandbox \"6b6b\": plugin type=\"flannel\" failed (add): failed to find plugin \"flannel\" in path [/opt/cni/bin]";
    let mut r = vec![header("192.0.2.10"), pod_add(false)];
    r.push(TraceRecord::Cri(failed(
        call("RunPodSandbox", 10, 100),
        "Unknown",
        msg,
    )));
    r.extend([
        cni(20, 100, "ADD", "loopback", FAILED_SANDBOX),
        exit(22, 100, 0),
    ]);
    let p = one(&r);
    assert_eq!(p.verdict.cause, Cause::CniPluginMissing, "{p:#?}");
    assert_eq!(p.verdict.stage.to_string(), "cni_plugin:flannel");
    assert!(
        p.verdict
            .summary
            .contains("no executable for it in [/opt/cni/bin]"),
        "{p:#?}"
    );
    let msg = "failed to setup network for sandbox \"6b6b\": failed to find network info for sandbox \"6b6b\"";
    let p = one(&failed_sandbox(msg, 0, Some(("portmap", 0))));
    assert_eq!(p.verdict.cause, Cause::CniNoAddress, "{p:#?}");
    assert!(
        has(
            &p.verdict,
            "the kernel saw the chain run: bridge (exit 0), host-local (exit 0), portmap (exit 0)"
        ),
        "{p:#?}"
    );
    let msg = "failed to setup network for sandbox \"6b6b\": cni plugin not initialized";
    let mut r = vec![header("192.0.2.10"), pod_add(false)];
    r.push(TraceRecord::Cri(failed(
        call("RunPodSandbox", 10, 100),
        "Unknown",
        msg,
    )));
    r.push(network(20, |n| {
        n.ready = Some(crate::trace::NetworkCondition {
            status: false,
            reason: "NetworkPluginNotReady".into(),
            message: "Network plugin returns error: cni plugin not initialized".into(),
        });
        n.files.clear();
        n.used.clear();
    }));
    let d = diagnose(&r, None);
    let p = &d.pods[0];
    assert_eq!(p.verdict.cause, Cause::NetworkNotReady, "{p:#?}");
    assert!(
        has(&p.verdict, "/etc/cni/net.d holds no network configuration"),
        "{p:#?}"
    );
    assert!(
        d.node[0]
            .summary
            .contains("no network configuration in /etc/cni/net.d"),
        "{d:#?}"
    );
}

#[test]
fn an_observed_sandbox_on_the_hosts_network_is_host_network_by_its_sandbox() {
    let r = vec![
        observed_header(),
        TraceRecord::Observed(
            serde_json::from_value(serde_json::json!({
                "at_ns": 10 * MS, "what": "sandbox_ready", "via": "events",
                "pod_uid": UID, "namespace": "default", "name": "web",
                "sandbox_id": SANDBOX, "host_network": true
            }))
            .unwrap(),
        ),
        TraceRecord::Observed(
            serde_json::from_value(serde_json::json!({
                "at_ns": 20 * MS, "what": "container_started", "via": "events",
                "pod_uid": UID, "namespace": "default", "name": "web",
                "sandbox_id": SANDBOX, "container_id": "c".repeat(64), "container": "app"
            }))
            .unwrap(),
        ),
    ];
    let p = one(&r);
    assert_eq!(p.verdict.cause, Cause::HostNetwork, "{p:#?}");
    assert!(p.running, "{p:#?}");
}

/// A kubelet's span of `name` (`kind`) of pod UID, from `start_ms` to `end_ms`.
fn kubelet_span(
    id: &str,
    parent: &str,
    name: &str,
    kind: &str,
    start_ms: u64,
    end_ms: u64,
) -> RuntimeSpan {
    let mut attributes = podlapse_core::record::Attributes::new();
    if name == "syncPod" {
        attributes.insert("k8s.pod.uid".into(), UID.into());
        attributes.insert("k8s.pod.update_type".into(), "create".into());
    }
    RuntimeSpan {
        pod_uid: UID.into(),
        trace_id: "7".repeat(32),
        span_id: id.repeat(16),
        parent_span_id: parent.repeat(16),
        name: name.into(),
        kind: kind.into(),
        start_ns: start_ms * MS,
        end_ns: end_ms * MS,
        attributes,
        events: Vec::new(),
        status: "unset".into(),
        status_message: String::new(),
        scope: String::new(),
        scope_version: String::new(),
        resource: podlapse_core::record::Attributes::from([(
            "service.name".to_string(),
            "kubelet".into(),
        )]),
    }
}

#[test]
fn an_observed_pods_verdict_quotes_the_kubelets_error_when_its_spans_came() {
    let id = "a1".repeat(32);
    let words = "rpc error: code = Unknown desc = failed to setup network for sandbox: \
                 plugin type=\"tuning\" failed (add): sysctl net.ipv4.conf.eth0.bogus: no such file";
    let mut r = observed_failing(&[&id]);
    // Without the kubelet's spans the error went to the client, unseen.
    let p = one(&r);
    assert!(
        has(&p.verdict, "its error went to the client that asked"),
        "{p:#?}"
    );
    let mut sync = kubelet_span("1", "", "syncPod", "internal", 5, 90);
    sync.status = "error".into();
    sync.status_message = words.into();
    let mut call = kubelet_span(
        "2",
        "1",
        "runtime.v1.RuntimeService/RunPodSandbox",
        "client",
        10,
        80,
    );
    call.status = "error".into();
    call.status_message = words.into();
    call.attributes
        .insert("rpc.grpc.status_code".into(), 2.into());
    r.push(TraceRecord::RuntimeSpan(Box::new(sync)));
    r.push(TraceRecord::RuntimeSpan(Box::new(call)));
    let p = one(&r);
    assert_eq!(
        (p.verdict.cause, p.verdict.stage.to_string().as_str()),
        (Cause::CniPluginFailed, "cni_plugin:tuning"),
        "{p:#?}"
    );
    assert!(
        has(
            &p.verdict,
            &format!("RunPodSandbox failed for the kubelet (Unknown): {words}")
        ),
        "the kubelet's own words: {p:#?}"
    );
    assert!(
        !has(&p.verdict, "its error went to the client that asked"),
        "{p:#?}"
    );
}
