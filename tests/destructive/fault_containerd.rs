//! containerd SIGKILLed while ten pods are being created, then started again: every pod
//! ends Running with exactly one sandbox, and no IPAM reservation or network namespace is
//! left of the sandboxes the crash cut short.

use std::collections::BTreeSet;
use std::time::Duration;

use podlapse_tests::agent::{Agent, phase};
use podlapse_tests::{eventually, require_lab, runtime_objects};
use serde_json::Value;
use xtask::lab::{self, LabState};

use xtask::lab::IMAGE_APP as APP;

/// Between two looks at the runtime.
const LOOK: Duration = Duration::from_millis(100);
const PODS: usize = 10;

fn names() -> Vec<String> {
    (0..PODS).map(|i| format!("ctd-fault-{i}")).collect()
}

fn entries(dir: &std::path::Path, keep: impl Fn(&str) -> bool) -> BTreeSet<String> {
    std::fs::read_dir(dir)
        .map(|d| {
            d.flatten()
                .map(|e| e.file_name().to_string_lossy().into_owned())
                .filter(|n| keep(n))
                .collect()
        })
        .unwrap_or_default()
}

#[test]
fn containerd_killed_while_ten_pods_are_created_recovers_each_pod_once() {
    let lab_paths = require_lab();
    let state: LabState =
        serde_json::from_str(&std::fs::read_to_string(lab_paths.state_file()).unwrap()).unwrap();
    let agent = Agent::start(
        "ctdfault",
        &["--backoff-initial", "1s", "--backoff-max", "4s"],
    );
    for n in names() {
        agent.write(
            &format!("{n}.yaml"),
            &format!(
                "apiVersion: v1\nkind: Pod\nmetadata: {{name: {n}, namespace: default}}\nspec:\n  terminationGracePeriodSeconds: 2\n  containers:\n  - {{name: c, image: {APP}, command: [sleep, '3600']}}\n"
            ),
        );
    }
    // Kill containerd in the middle of the creations: once the first sandbox exists.
    eventually("a first sandbox", Duration::from_secs(60), LOOK, || {
        let made = names()
            .iter()
            .filter(|n| {
                !podlapse_tests::runtime_objects_labelled("io.kubernetes.pod.name", &agent.name(n))
                    .0
                    .is_empty()
            })
            .count();
        if made > 0 { Ok(()) } else { Err("none yet") }
    });
    // SAFETY: kill(2) on the lab's containerd, whose pid lab.json records.
    unsafe { libc::kill(state.containerd_pid as i32, libc::SIGKILL) };
    eventually("containerd to die", Duration::from_secs(10), LOOK, || {
        if std::path::Path::new(&format!("/proc/{}", state.containerd_pid)).exists()
            && !std::fs::read_to_string(format!("/proc/{}/stat", state.containerd_pid))
                .unwrap_or_default()
                .contains(") Z")
        {
            Err("still running")
        } else {
            Ok(())
        }
    });
    lab::restart_containerd(&lab_paths).expect("containerd starts again");

    let running = |pods: &[Value]| {
        names().iter().all(|n| {
            pods.iter()
                .any(|p| p["name"] == agent.name(n).as_str() && phase(p) == "Running")
        })
    };
    agent.wait_for("all ten pods Running", Duration::from_secs(180), |pods| {
        running(pods)
    });
    let pods = agent.pods();
    let uids: Vec<String> = pods
        .iter()
        .map(|p| p["uid"].as_str().unwrap().to_string())
        .collect();
    let ips: BTreeSet<String> = pods
        .iter()
        .filter_map(|p| p["status"]["podIP"].as_str().map(str::to_string))
        .collect();
    assert_eq!(uids.len(), PODS, "no pod duplicated");
    assert_eq!(ips.len(), PODS, "ten distinct pod IPs: {ips:?}");
    // Sandboxes the crash left behind are removed: one sandbox per pod, and only the
    // running pods' IPs and namespaces are held.
    let ipam = lab_paths.ipam_dir().join(&state.cni_network);
    let netns = lab_paths.netns_dir();
    // containerd 2.x records a sandbox only after its network is set up: a sandbox whose
    // RunPodSandbox the kill cut between CNI ADD and that record is forgotten, and its
    // IP and netns stay held with nothing left to release them (1.6 recorded it first,
    // and its StopPodSandbox released them). Those leaks are the runtime's, at most one
    // per RunPodSandbox in flight at the kill; podlapse's part is that no pod is made
    // twice and that no sandbox it knows of is left.
    let forgets = lab::containerd_version(&lab_paths).is_some_and(|(_, major)| major >= 2);
    let leaked = std::sync::Mutex::new((BTreeSet::new(), 0usize));
    eventually(
        "one sandbox per pod and nothing else held",
        Duration::from_secs(120),
        LOOK,
        || {
            for uid in &uids {
                let (sandboxes, _) = runtime_objects(uid);
                if sandboxes.len() != 1 {
                    return Err(format!("{uid}: {sandboxes:?}"));
                }
            }
            let held = entries(&ipam, |n| n.parse::<std::net::Ipv4Addr>().is_ok());
            let extra: BTreeSet<String> = held.difference(&ips).cloned().collect();
            if !ips.is_subset(&held) || (!extra.is_empty() && !forgets) {
                return Err(format!("IPAM holds {held:?}, the pods have {ips:?}"));
            }
            let spaces = entries(&netns, |_| true);
            if spaces.len() != PODS + extra.len() {
                return Err(format!(
                    "{} netns for {PODS} pods and {} forgotten sandboxes: {spaces:?}",
                    spaces.len(),
                    extra.len()
                ));
            }
            *leaked.lock().unwrap() = (extra, spaces.len() - PODS);
            Ok(())
        },
    );
    let (leaked, leaked_netns) = leaked.into_inner().unwrap();
    if !leaked.is_empty() {
        eprintln!("containerd forgot sandboxes cut by the kill: IPs {leaked:?} stay held");
    }
    drop(agent);
    assert_eq!(
        entries(&ipam, |n| n.parse::<std::net::Ipv4Addr>().is_ok()),
        leaked,
        "IPAM reservations left after the pods were deleted"
    );
    assert_eq!(entries(&netns, |_| true).len(), leaked_netns, "netns left");
}
