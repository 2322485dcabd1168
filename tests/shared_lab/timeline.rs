//! The per-pod stage timeline on the lab: five pods created at once, each with its own
//! netns, CNI plugins, cgroups and first execs, none mixed up with another's; the live
//! agent serving the same over its API; and a node without BPF privileges, where the run
//! says so once and the timeline keeps its CRI stages.

use std::collections::{BTreeMap, BTreeSet};
use std::path::Path;
use std::process::{Command, Output};
use std::time::Duration;

use podlapse::cri::CriCall;
use podlapse::ebpf::event::cni_args_value;
use podlapse::ebpf::{KernelEvent, NetnsCall};
use podlapse::timeline::{CniReply, PodTimeline, Stage, StageSource, Timeline, build};
use podlapse::trace::{Trace, TraceRecord, read_trace};
use podlapse_tests::agent::{Agent, phase};
use podlapse_tests::ebpf::{require_probes, serial};
use podlapse_tests::{Scratch, lab, pod, podlapse_bin, require_lab, stderr, stdout};
use serde_json::Value;

use xtask::lab::IMAGE_APP as APP;
const PLUGINS: [&str; 4] = ["loopback", "bridge", "host-local", "portmap"];

fn pods_yaml(names: &[String]) -> String {
    names
        .iter()
        .map(|n| {
            format!(
                "apiVersion: v1\nkind: Pod\nmetadata: {{name: {n}, namespace: default}}\nspec:\n  terminationGracePeriodSeconds: 2\n  containers:\n  - {{name: app, image: {APP}, command: [sleep, '3600']}}\n"
            )
        })
        .collect::<Vec<_>>()
        .join("---\n")
}

fn kernel(trace: &Trace) -> impl Iterator<Item = &KernelEvent> {
    trace.records.iter().filter_map(|r| match r {
        TraceRecord::Kernel(e) => Some(e),
        _ => None,
    })
}

fn calls<'t>(trace: &'t Trace, uid: &'t str, method: &'t str) -> Vec<&'t CriCall> {
    trace
        .records
        .iter()
        .filter_map(|r| match r {
            TraceRecord::Cri(c) if c.pod_uid == uid && c.method.as_str() == method => Some(c),
            _ => None,
        })
        .collect()
}

fn recorded_stages(trace: &Trace) -> Vec<Stage> {
    trace
        .records
        .iter()
        .filter_map(|r| match r {
            TraceRecord::Stage(v) => Some(serde_json::from_value(v.clone()).expect("a stage")),
            _ => None,
        })
        .collect()
}

fn stage<'p>(p: &'p PodTimeline, name: &str) -> &'p Stage {
    p.stage(name)
        .unwrap_or_else(|| panic!("{}: no {name} stage\n{}", p.name, waterfall(p)))
}

fn waterfall(p: &PodTimeline) -> String {
    let t0 = p.seen_ns.unwrap_or(0);
    p.stages
        .iter()
        .map(|s| {
            format!(
                "{:>9.3} ms {:>9.3} ms  {:<6} {:<28} {}{}",
                s.start_ns.saturating_sub(t0) as f64 / 1e6,
                s.duration_ns as f64 / 1e6,
                s.source.to_string(),
                s.stage,
                s.exit_code
                    .map(|c| format!("exit {c} "))
                    .unwrap_or_default(),
                s.detail
            )
        })
        .collect::<Vec<_>>()
        .join("\n")
}

fn timeline_cli(args: &[&str]) -> Output {
    Command::new(podlapse_bin())
        .arg("timeline")
        .args(args)
        .output()
        .expect("podlapse timeline")
}

#[expect(
    clippy::too_many_lines,
    reason = "one story on a live lab: five pods, then each pod's stages checked in turn"
)]
#[test]
fn five_pods_at_once_each_get_their_own_kernel_stages_in_runtime_order() {
    let _one = serial();
    require_lab();
    let probes = require_probes();
    let scratch = Scratch::new();
    let names: Vec<String> = (1..=5).map(|i| format!("timeline-{i}")).collect();
    let manifest = scratch.manifest("five.yaml", &pods_yaml(&names));
    let trace_path = scratch.path().join("five.jsonl");
    let (out, doc) = scratch.run(
        &[&manifest],
        &[
            "--cleanup",
            "--trace",
            trace_path.to_str().unwrap(),
            "--probes",
            probes.to_str().unwrap(),
        ],
    );
    assert!(out.status.success(), "{doc:#}\n{}", stderr(&out));
    let trace = read_trace(&trace_path).expect("the trace reads back");
    assert!(trace.footer.as_ref().unwrap().ebpf, "{:?}", trace.footer);
    assert_eq!(
        trace.footer.as_ref().unwrap().lost_events,
        0,
        "{:?}",
        trace.footer
    );

    // The stages the run wrote are what the records rebuild to.
    let timeline = build(&trace.records);
    let recorded = recorded_stages(&trace);
    assert_eq!(
        recorded,
        timeline.stages().cloned().collect::<Vec<_>>(),
        "the recorded stages differ from a rebuild of the same records"
    );

    // Static pods run as `<name>-<node>`.
    let node = doc["node"].as_str().unwrap();
    let mut sandbox_of: BTreeMap<String, String> = BTreeMap::new();
    let mut containers_of: BTreeMap<String, BTreeSet<String>> = BTreeMap::new();
    for name in &names {
        let uid = pod(&doc, name)["uid"].as_str().unwrap().to_string();
        let runs = calls(&trace, &uid, "RunPodSandbox");
        assert_eq!(runs.len(), 1, "{name}: {runs:?}");
        assert!(runs[0].ok(), "{runs:?}");
        sandbox_of.insert(uid.clone(), runs[0].sandbox_id.clone());
        containers_of.insert(
            uid.clone(),
            calls(&trace, &uid, "CreateContainer")
                .iter()
                .map(|c| c.container_id.clone())
                .collect(),
        );
    }
    let sandbox_cgroups: BTreeMap<&str, u64> = kernel(&trace)
        .filter_map(|e| match e {
            KernelEvent::CgroupMkdir { cgroup, .. } if cgroup.hierarchy == 0 => {
                // `<id>` with the cgroupfs driver, `cri-containerd-<id>.scope` with systemd.
                let leaf = cgroup.path.rsplit('/').next().unwrap();
                let id = leaf
                    .strip_prefix("cri-containerd-")
                    .and_then(|l| l.strip_suffix(".scope"))
                    .unwrap_or(leaf);
                Some((id, cgroup.cgroup_id))
            }
            _ => None,
        })
        .collect();

    for name in &names {
        let p = timeline
            .pods
            .iter()
            .find(|p| p.name == podlapse_tests::static_name(name, node))
            .unwrap_or_else(|| panic!("no timeline for {name}"));
        let sandbox = &sandbox_of[&p.uid];
        let mine = &containers_of[&p.uid];

        // Nothing on this pod's timeline names another pod's sandbox or container.
        for s in &p.stages {
            if let Some(id) = &s.sandbox_id {
                assert_eq!(id, sandbox, "{name}: {s:?}");
            }
            if let Some(id) = &s.container_id {
                assert!(mine.contains(id), "{name}: {s:?}");
            }
        }
        assert_eq!(p.sandbox_ids, std::slice::from_ref(sandbox), "{name}");

        // Every plugin of the conflist ran for this sandbox and exited 0; the kernel's
        // own record of each run names this sandbox and pod.
        for plugin in PLUGINS {
            let s = stage(p, &format!("cni_plugin:{plugin}"));
            assert_eq!(s.exit_code, Some(0), "{name}: {s:?}");
            assert_eq!(s.source, StageSource::Kernel);
            let exec = kernel(&trace)
                .find(|e| {
                    matches!(e, KernelEvent::CniExec(c) if c.command == "ADD")
                        && Some(e.meta().tgid) == s.pid
                })
                .unwrap_or_else(|| panic!("{name}: no CNI exec for {s:?}"));
            let KernelEvent::CniExec(c) = exec else {
                unreachable!()
            };
            assert_eq!(&c.container_id, sandbox, "{name} {plugin}");
            // The run starts at the plugin's fork, after the netns it is given.
            let forked = c
                .forked_ns
                .unwrap_or_else(|| panic!("{name}: {c:?} has no fork"));
            assert_eq!(s.start_ns, forked, "{name}: {s:?}");
            assert!(forked <= c.meta.ktime_ns, "{name}: {c:?}");
            assert!(
                stage(p, "netns_created").start_ns <= forked,
                "{name}: {plugin} forked before the netns\n{}",
                waterfall(p)
            );
            assert_eq!(
                cni_args_value(&c.args, "K8S_POD_UID").as_deref(),
                Some(p.uid.as_str())
            );
        }
        assert!(
            stage(p, "cni_plugin:host-local")
                .detail
                .contains("delegated by bridge")
        );

        // The netns created is the one this pod's plugins entered.
        let netns = stage(p, "netns_created");
        let plugin_pids: BTreeSet<u32> = p
            .stages
            .iter()
            .filter(|s| s.kind().as_str() == "cni_plugin")
            .filter_map(|s| s.pid)
            .collect();
        let entered: BTreeSet<u32> = kernel(&trace)
            .filter_map(|e| match e {
                KernelEvent::Netns {
                    syscall: NetnsCall::Setns,
                    netns_inum: Some(i),
                    meta,
                    ..
                } if plugin_pids.contains(&meta.tgid) => Some(*i),
                _ => None,
            })
            .collect();
        assert!(
            netns.netns_inum.is_some_and(|i| entered.contains(&i)),
            "{name}: {netns:?} not among {entered:?}"
        );

        // The sandbox's cgroup, and pause and the app running in their own cgroups.
        let cgroup = stage(p, "sandbox_cgroup");
        assert_eq!(cgroup.cgroup_id, Some(sandbox_cgroups[sandbox.as_str()]));
        // `pod<uid>` with cgroupfs; systemd's slice names escape the UID's dashes.
        assert!(
            cgroup.detail.contains(&format!("pod{}", p.uid))
                || cgroup
                    .detail
                    .contains(&format!("pod{}.slice", p.uid.replace('-', "_"))),
            "{cgroup:?}"
        );
        let pause = stage(p, "pause_exec");
        assert_eq!(pause.cgroup_id, cgroup.cgroup_id, "{name}");
        let app = stage(p, "app_first_exec:app");
        let container = app.container_id.as_deref().unwrap();
        assert_eq!(app.cgroup_id, Some(sandbox_cgroups[container]), "{name}");

        // The order the runtime performs them in.
        let before = |a: &str, b: &str| {
            let (a, b) = (stage(p, a), stage(p, b));
            assert!(
                a.start_ns <= b.start_ns,
                "{name}: {} after {}\n{}",
                a.stage,
                b.stage,
                waterfall(p)
            );
        };
        let ends_before = |a: &str, b: &str| {
            let (a, b) = (stage(p, a), stage(p, b));
            assert!(
                a.end_ns <= b.start_ns,
                "{name}: {} ends after {} starts\n{}",
                a.stage,
                b.stage,
                waterfall(p)
            );
        };
        for (a, b) in [
            ("pod_seen", "admitted"),
            ("admitted", "pod_cgroup_created"),
            ("pod_cgroup_created", "sandbox_requested"),
            ("sandbox_requested", "netns_created"),
            ("sandbox_cgroup", "pause_exec"),
            ("container_start:app", "container_cgroup:app"),
            ("container_cgroup:app", "app_first_exec:app"),
        ] {
            before(a, b);
        }
        for (a, b) in [
            ("netns_created", "cni_add"),
            ("cni_add", "sandbox_cgroup"),
            ("sandbox_requested", "sandbox_ready"),
            ("sandbox_ready", "container_create:app"),
            ("container_create:app", "container_start:app"),
            ("container_start:app", "running"),
        ] {
            ends_before(a, b);
        }
        let add = stage(p, "cni_add");
        for plugin in PLUGINS {
            let s = stage(p, &format!("cni_plugin:{plugin}"));
            assert!(
                add.start_ns <= s.start_ns && s.end_ns <= add.end_ns,
                "{s:?} {add:?}"
            );
        }
        runtime_steps_are_this_pods(&trace, p, sandbox, container);
        assert_eq!(p.ip.as_deref(), pod(&doc, name)["ip"].as_str(), "{name}");
        plugins_replied_with_the_pods_ip(p);
    }

    // No runtime process is on two pods' timelines.
    let mut owners: BTreeMap<u32, &str> = BTreeMap::new();
    for p in &timeline.pods {
        for s in p
            .stages
            .iter()
            .filter(|s| RUNTIME_STEPS.contains(&s.kind().as_str()))
        {
            let pid = s.pid.unwrap();
            if let Some(other) = owners.insert(pid, &p.name) {
                assert_eq!(other, p.name, "process {pid} ({}) on two pods", s.stage);
            }
        }
    }

    // What the command prints for one pod.
    let third = podlapse_tests::static_name(&names[2], node);
    let out = timeline_cli(&[trace_path.to_str().unwrap(), "--pod", &third]);
    assert!(out.status.success(), "{}", stderr(&out));
    let text = stdout(&out);
    eprintln!("{text}");
    assert!(text.starts_with(&format!("default/{third}")), "{text}");
    for plugin in PLUGINS {
        assert!(text.contains(&format!("cni_plugin:{plugin}")), "{text}");
    }
    let out = timeline_cli(&[trace_path.to_str().unwrap(), "-o", "json"]);
    let json: Timeline = serde_json::from_slice(&out.stdout).expect("timeline JSON");
    assert_eq!(json, timeline);
}

/// bridge and host-local (its IPAM) answered with the address the runtime reports for the
/// pod, captured whole: `run` attaches the write hook before RunPodSandbox goes out.
fn plugins_replied_with_the_pods_ip(p: &PodTimeline) {
    let ip = p.ip.as_deref().expect("the pod's IP");
    for plugin in ["bridge", "host-local"] {
        let s = stage(p, &format!("cni_plugin:{plugin}"));
        let reply = s
            .reply
            .as_ref()
            .unwrap_or_else(|| panic!("no reply on {s:?}"));
        assert!(
            matches!(reply, CniReply::Result { .. }),
            "{plugin}: {reply:?}"
        );
        let addrs: Vec<&str> = reply.addresses().collect();
        assert!(
            addrs.iter().any(|a| a.split('/').next() == Some(ip)),
            "{plugin} said {addrs:?}, the runtime {ip}"
        );
        let capture = s.capture.as_ref().expect("capture facts");
        assert!(
            !capture.cut && capture.written == capture.captured && capture.written > 0,
            "{capture:?}"
        );
        assert!(!capture.hook.is_empty(), "{capture:?}");
    }
}

/// The runtime's own steps, timed by the kernel inside the CRI calls.
const RUNTIME_STEPS: [&str; 4] = ["shim_start", "runc_create", "runc_init", "runc_start"];

/// The shim's start and runc's create, init and start of the pod's sandbox lie inside
/// its RunPodSandbox, before the pause exec; those of its container inside StartContainer,
/// before the app's exec. Each is a process whose own arguments (or, for `runc init`,
/// whose parent's) name this pod's sandbox or container.
/// The fork and exec times the kernel recorded for runtime process `pid`.
fn fork_of(trace: &Trace, pid: u32) -> (Option<u64>, u64) {
    kernel(trace)
        .find_map(|e| match e {
            KernelEvent::RuntimeExec(r) if r.meta.tgid == pid => {
                Some((r.forked_ns, r.meta.ktime_ns))
            }
            _ => None,
        })
        .unwrap_or_else(|| panic!("no runtime exec of process {pid}"))
}

fn runtime_steps_are_this_pods(trace: &Trace, p: &PodTimeline, sandbox: &str, container: &str) {
    let name = &p.name;
    let args_of = |pid: u32| -> Vec<String> {
        kernel(trace)
            .find_map(|e| match e {
                KernelEvent::RuntimeExec(r) if r.meta.tgid == pid => Some(r.argv.clone()),
                _ => None,
            })
            .unwrap_or_else(|| panic!("{name}: no runtime exec of process {pid}"))
    };
    // containerd 1.x ran `containerd-shim-runc-v2 start` for every container, which found
    // its sandbox's shim and exited; 2.x starts no shim process for a container at all
    // and reaches the sandbox's shim itself, so only the sandbox has a shim_start there.
    let shim_per_container = trace.header.runtime_version.starts_with("1.");
    for (suffix, id, call, first_exec) in [
        ("", sandbox, "sandbox_requested", "pause_exec"),
        (
            ":app",
            container,
            "container_start:app",
            "app_first_exec:app",
        ),
    ] {
        let call = stage(p, call);
        let exec = stage(p, first_exec);
        let shim = suffix.is_empty() || shim_per_container;
        if !shim {
            assert!(
                p.stage(format!("shim_start{suffix}").as_str()).is_none(),
                "{name}: a shim start for a container on containerd {}\n{}",
                trace.header.runtime_version,
                waterfall(p)
            );
        }
        for kind in RUNTIME_STEPS
            .into_iter()
            .filter(|k| shim || *k != "shim_start")
        {
            let s = stage(p, &format!("{kind}{suffix}"));
            assert_eq!(s.source, StageSource::Kernel, "{name}: {s:?}");
            assert!(
                call.start_ns <= s.start_ns && s.end_ns <= call.end_ns,
                "{name}: {} outside {}\n{}",
                s.stage,
                call.stage,
                waterfall(p)
            );
            assert!(s.start_ns <= exec.start_ns, "{name}: {s:?} after {exec:?}");
            let pid = s.pid.unwrap();
            if kind == "runc_init" {
                let create = stage(p, &format!("runc_create{suffix}")).pid;
                let parent = kernel(trace).find_map(|e| match e {
                    KernelEvent::Exec { meta, ppid, .. } if meta.tgid == pid => *ppid,
                    _ => None,
                });
                assert_eq!(parent, create, "{name}: {s:?}");
            } else {
                assert!(s.ok && s.exit_code == Some(0), "{name}: {s:?}");
                // Forked for the step, by containerd or the shim: the step starts at
                // the fork the kernel recorded, inside the call, before the exec.
                if kind != "shim_create" {
                    let (forked, exec_at) = fork_of(trace, pid);
                    assert_eq!(Some(s.start_ns), forked, "{name}: {s:?}");
                    assert!(s.start_ns <= exec_at, "{name}: {s:?}");
                    assert!(s.detail.contains("before its exec"), "{name}: {s:?}");
                }
                let args = args_of(pid);
                assert!(
                    args.iter().any(|a| a == id),
                    "{name}: {} ran with {args:?}",
                    s.stage
                );
            }
        }
        let at = |kind: &str| stage(p, &format!("{kind}{suffix}")).start_ns;
        assert!(
            (!shim || at("shim_start") <= at("runc_create"))
                && at("runc_create") <= at("runc_init")
                && at("runc_init") <= at("runc_start"),
            "{name}: runtime steps out of order\n{}",
            waterfall(p)
        );
    }
}

#[test]
fn the_live_agent_serves_its_timelines() {
    let _one = serial();
    require_lab();
    let probes = require_probes();
    let agent = Agent::start("timeline", &["--probes", probes.to_str().unwrap()]);
    agent.write("live.yaml", &pods_yaml(&["timeline-live".to_string()]));
    agent.wait_pod("timeline-live", "Running", Duration::from_secs(120), |p| {
        phase(p) == "Running"
    });
    let socket = agent.socket.to_str().unwrap().to_string();
    let out = timeline_cli(&[
        "--api-socket",
        &socket,
        "--pod",
        &agent.name("timeline-live"),
        "-o",
        "json",
    ]);
    assert!(out.status.success(), "{}", stderr(&out));
    let t: Timeline = serde_json::from_slice(&out.stdout).expect("timeline JSON");
    let p = &t.pods[0];
    for name in [
        "pod_seen",
        "sandbox_requested",
        "netns_created",
        "cni_plugin:bridge",
        "pause_exec",
        "container_start:app",
        "app_first_exec:app",
        "running",
    ] {
        stage(p, name);
    }
    let table = timeline_cli(&["--api-socket", &socket]);
    assert!(
        stdout(&table).contains("timeline-live"),
        "{}",
        stdout(&table)
    );
}

/// `podlapse run` with the capabilities BPF needs dropped from the bounding set.
fn run_without_bpf(scratch: &Scratch, manifest: &Path, extra: &[&str]) -> Output {
    let mut cmd = Command::new("capsh");
    cmd.args([
        "--drop=cap_sys_admin,cap_bpf,cap_perfmon",
        "--",
        "-c",
        "exec \"$0\" \"$@\"",
    ])
    .arg(podlapse_bin())
    .args(["run", "--until-ready", "--cleanup", "--json", "--probes"])
    .arg(require_probes())
    .arg("--root-dir")
    .arg(scratch.root_dir())
    .arg("--pod-logs-dir")
    .arg(scratch.logs_dir())
    .args(extra)
    .arg("--manifests")
    .arg(manifest)
    .env("PODLAPSE_LAB_DIR", lab().root)
    .env_remove("PODLAPSE_CRI");
    cmd.output().expect("capsh (package libcap2-bin)")
}

#[test]
fn without_bpf_privileges_a_traced_run_says_so_once_and_keeps_cri_stages() {
    require_lab();
    let scratch = Scratch::new();
    let manifest = scratch.manifest("nobpf.yaml", &pods_yaml(&["timeline-nobpf".to_string()]));
    let trace_path = scratch.path().join("nobpf.jsonl");
    let out = run_without_bpf(
        &scratch,
        &manifest,
        &["--trace", trace_path.to_str().unwrap()],
    );
    let err = stderr(&out);
    assert!(out.status.success(), "{err}\n{}", stdout(&out));
    let said: Vec<&str> = err
        .lines()
        .filter(|l| l.contains("kernel events unavailable"))
        .collect();
    assert_eq!(said.len(), 1, "{err}");
    assert!(
        said[0].contains("CAP_BPF"),
        "does not name what is missing: {}",
        said[0]
    );
    let doc: Value = serde_json::from_slice(&out.stdout).expect("run --json");
    assert_eq!(pod(&doc, "timeline-nobpf")["phase"], "Running", "{doc:#}");

    let trace = read_trace(&trace_path).expect("the trace reads back");
    assert!(!trace.footer.as_ref().unwrap().ebpf, "{:?}", trace.footer);
    assert_eq!(kernel(&trace).count(), 0);
    let t = Timeline::from_stages(recorded_stages(&trace));
    let p = &t.pods[0];
    for name in [
        "pod_seen",
        "admitted",
        "sandbox_requested",
        "sandbox_ready",
        "image_pull:app",
        "container_create:app",
        "container_start:app",
        "running",
        "ready",
    ] {
        assert!(stage(p, name).source != StageSource::Kernel);
    }
    assert!(
        p.stages.iter().all(|s| s.source != StageSource::Kernel),
        "{}",
        waterfall(p)
    );
    let rebuilt = build(&trace.records);
    assert!(
        rebuilt.pods[0]
            .notes
            .iter()
            .any(|n| n.contains("CRI timing only"))
    );

    // --require-ebpf makes the missing probes fatal, before any pod is made.
    let out = run_without_bpf(&scratch, &manifest, &["--require-ebpf"]);
    assert!(!out.status.success(), "{}", stdout(&out));
    assert!(stderr(&out).contains("--require-ebpf"), "{}", stderr(&out));
}
