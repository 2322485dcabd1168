//! `podlapse kernel-events`: the eBPF probes watching a real sandbox come up on the lab,
//! unshare/setns (and clone, on request) reporting the netns each task ends up in, from
//! kernel functions where kprobes attach and from syscall tracepoints otherwise, a ring buffer too small
//! for a burst counting what it dropped, and nodes without BPF privileges or tracefs
//! where podlapse says once what is missing and carries on.

use std::process::Command;

use std::time::Duration;

use podlapse::ebpf::event::CniOutput;
use podlapse::ebpf::{KernelEvent, now_ktime_ns};
use podlapse::timeline::CniReply;
use podlapse_tests::ebpf::{Watched, Watcher, require_probes, serial};
use podlapse_tests::{
    Scratch, eventually, pod, podlapse_bin, require_lab, runtime_objects, stderr,
};
use serde_json::Value;
use xtask::lab::IMAGE_APP;

const POD: &str = "kernel-events-pod";
const CNI_PLUGINS: [&str; 4] = ["loopback", "bridge", "host-local", "portmap"];

/// Whether a cgroup event's path is the container's own cgroup: `.../<id>` with the
/// cgroupfs driver, `.../cri-containerd-<id>.scope` with systemd's.
fn is_cgroup_of(e: &Value, id: &str) -> bool {
    let path = e["path"].as_str().unwrap_or_default();
    path.ends_with(&format!("/{id}")) || path.ends_with(&format!("/cri-containerd-{id}.scope"))
}

fn ns(e: &Value, field: &str) -> u64 {
    e[field]
        .as_u64()
        .unwrap_or_else(|| panic!("{field} in {e}"))
}

#[test]
fn a_sandbox_is_seen_from_the_kernel() {
    let _one = serial();
    require_lab();
    let scratch = Scratch::new();
    let manifest = scratch.manifest(
        "pod.yaml",
        &format!(
            "apiVersion: v1\nkind: Pod\nmetadata: {{name: {POD}, namespace: default}}\nspec:\n  terminationGracePeriodSeconds: 2\n  containers:\n  - {{name: c, image: {IMAGE_APP}, command: [sleep, '3600']}}\n"
        ),
    );
    let watcher = Watcher::start(&[]);
    // The write hook that captures CNI plugins' output is attached only while a plugin
    // runs: seen from outside, one perf event more while it is.
    let idle_fds = watcher.perf_event_fds();
    let before = now_ktime_ns();
    let (out, doc) = scratch.run(&[&manifest], &[]);
    assert!(out.status.success(), "{doc:#}\n{}", stderr(&out));
    let uid = pod(&doc, POD)["uid"].as_str().unwrap().to_string();
    let ip = pod(&doc, POD)["ip"]
        .as_str()
        .expect("the pod's IP")
        .to_string();
    let (sandboxes, _) = runtime_objects(&uid);
    assert_eq!(sandboxes.len(), 1, "{sandboxes:?}");
    let sandbox = sandboxes[0].clone();
    let (out, doc) = scratch.run(&[&manifest], &["--cleanup"]);
    assert!(out.status.success(), "{doc:#}\n{}", stderr(&out));
    let after = now_ktime_ns();
    eventually(
        "the write hook to be detached once the pod's plugins are done",
        Duration::from_secs(20),
        Duration::from_millis(100),
        || {
            // Idle twice, longer apart than the linger: not caught between two runs.
            let first = watcher.perf_event_fds();
            std::thread::sleep(Duration::from_millis(1500));
            match (first, watcher.perf_event_fds()) {
                (a, b) if a == idle_fds && b == idle_fds => Ok(()),
                (a, b) => Err(format!("{a} then {b} perf events, {idle_fds} when idle")),
            }
        },
    );
    let w = watcher.stop();
    assert!(w.status.success(), "{}", w.stderr);
    let timeline = Timeline::of(&w, &sandbox);
    eprintln!("{}", timeline.render());

    // The CNI plugins ran for this sandbox and pod, each exited 0.
    let mut adds = Vec::new();
    for plugin in CNI_PLUGINS {
        let add = w
            .of_kind("cni_exec")
            .find(|e| {
                e["plugin"] == plugin && e["command"] == "ADD" && e["container_id"] == sandbox
            })
            .unwrap_or_else(|| {
                panic!(
                    "no CNI ADD of {plugin} for {sandbox}\n{}",
                    timeline.render()
                )
            });
        assert_eq!(
            add["pod_name"],
            podlapse_tests::static_name(POD, doc["node"].as_str().unwrap()).as_str(),
            "{add}"
        );
        assert_eq!(add["pod_namespace"], "default", "{add}");
        assert_eq!(add["infra_container_id"], sandbox.as_str(), "{add}");
        assert!(add["netns"].as_str().unwrap().contains("/netns/"), "{add}");
        let exit = w
            .of_kind("exit")
            .find(|e| e["tgid"] == add["pid"])
            .unwrap_or_else(|| panic!("no exit of {plugin} (pid {})", add["pid"]));
        assert_eq!(exit["exit_code"], 0, "{plugin}: {exit}");
        assert!(ns(exit, "ktime_ns") > ns(add, "ktime_ns"));
        adds.push(add);
    }
    let first_add = adds.iter().map(|e| ns(e, "ktime_ns")).min().unwrap();
    plugins_said_the_pods_ip(&w, &adds, &ip);

    // containerd created the sandbox's netns with unshare(CLONE_NEWNET) before CNI ADD,
    // and the plugins entered that very namespace (same inode).
    let plugin_pids: Vec<&Value> = adds.iter().map(|e| &e["pid"]).collect();
    let entered: Vec<u64> = w
        .of_kind("netns")
        .filter(|e| e["syscall"] == "setns" && plugin_pids.contains(&&e["tgid"]))
        .filter_map(|e| e["netns_inum"].as_u64())
        .collect();
    let unshare = w
        .of_kind("netns")
        .filter(|e| {
            e["syscall"] == "unshare"
                && e["comm"].as_str().unwrap_or("").starts_with("containerd")
                && e["ret"] == 0
                && ns(e, "ktime_ns") < first_add
        })
        .find(|e| e["netns_inum"].as_u64().is_some_and(|i| entered.contains(&i)))
        .unwrap_or_else(|| {
            panic!(
                "no unshare(CLONE_NEWNET) by containerd into the netns the plugins entered ({entered:?})\n{}",
                timeline.render()
            )
        });
    assert!(ns(unshare, "start_ns") <= ns(unshare, "ktime_ns"));

    // runc made the sandbox's cgroup, in every hierarchy; the v2 one names the cgroup the
    // pause process runs in.
    let mkdirs: Vec<&Value> = w
        .of_kind("cgroup_mkdir")
        .filter(|e| is_cgroup_of(e, &sandbox))
        .collect();
    assert!(
        !mkdirs.is_empty(),
        "no cgroup_mkdir for {sandbox}\n{}",
        timeline.render()
    );
    let unified = mkdirs
        .iter()
        .find(|e| e["hierarchy"] == 0)
        .unwrap_or_else(|| panic!("no cgroup v2 mkdir for the sandbox: {mkdirs:?}"));
    // The created cgroup's ID; `cgroup_id` beside it is the creating task's.
    let sandbox_cgroup = &unified["target_cgroup_id"];
    let pause = w
        .of_kind("exec")
        .find(|e| &e["cgroup_id"] == sandbox_cgroup)
        .unwrap_or_else(|| panic!("no exec inside the sandbox's cgroup\n{}", timeline.render()));

    // One clock: the kernel's timestamps fall inside the window the test measured, in
    // the order a sandbox is built.
    let t_unshare = ns(unshare, "ktime_ns");
    let t_mkdir = ns(unified, "ktime_ns");
    let t_pause = ns(pause, "ktime_ns");
    assert!(
        before <= t_unshare && t_pause <= after,
        "{before} {t_unshare} {t_pause} {after}"
    );
    assert!(t_unshare < first_add && first_add < t_mkdir && t_mkdir < t_pause);

    // Teardown is visible too: CNI DEL for the sandbox and its cgroups removed.
    assert!(
        w.of_kind("cni_exec")
            .any(|e| e["command"] == "DEL" && e["container_id"] == sandbox)
    );
    assert!(w.of_kind("cgroup_rmdir").any(|e| is_cgroup_of(e, &sandbox)));
    assert_eq!(w.summary["undecodable"], 0, "{}", w.summary);
    bpf_stats_say_what_the_counters_are(&w.summary);
}

/// The programs' run times and counts come with whether the kernel counted them: zeros
/// the kernel did not count say why, naming the sysctl.
fn bpf_stats_say_what_the_counters_are(summary: &Value) {
    let moved = summary["programs"]
        .as_array()
        .into_iter()
        .flatten()
        .any(|p| p["run_count"].as_u64() > Some(0));
    let stats = &summary["bpf_stats"];
    if moved {
        assert_eq!(stats["state"], "counted", "{summary}");
    } else {
        assert_eq!(stats["state"], "not_counted", "{summary}");
        let why = stats["why"].as_str().unwrap_or_default();
        assert!(why.contains("bpf_stats_enabled"), "{summary}");
    }
}

/// What each plugin of the sandbox printed, as the watcher (which makes no CRI call: it
/// attaches the write hook when it reads the namespace's creation or a plugin's exec)
/// captured it: bridge and host-local answered with the pod's IP. Loopback runs for a
/// millisecond or two and may finish before the hook is attached: it is reported, not
/// required. The hook was attached, then detached.
fn plugins_said_the_pods_ip(w: &Watched, adds: &[&Value], ip: &str) {
    let hooks: Vec<&Value> = w.of_kind("cni_write_hook").collect();
    assert!(
        hooks.iter().any(|h| h["change"] == "attached"),
        "{hooks:?}\n{}",
        w.stderr
    );
    assert_eq!(hooks.last().unwrap()["change"], "detached", "{hooks:?}");
    assert_eq!(w.summary["cni_output"]["attached"], false, "{}", w.summary);
    assert!(w.summary["cni_output"]["attaches"].as_u64() >= Some(1));
    let attached_at = hooks
        .iter()
        .filter(|h| h["change"] == "attached")
        .map(|h| ns(h, "ktime_ns"))
        .collect::<Vec<_>>();
    for add in adds {
        let plugin = add["plugin"].as_str().unwrap();
        let mut chunks: Vec<CniOutput> = w
            .of_kind("cni_output")
            .filter(|o| o["tgid"] == add["pid"] && o["end"] != true)
            .map(|o| match serde_json::from_value(o.clone()) {
                Ok(KernelEvent::CniOutput(c)) => *c,
                other => panic!("{o}: {other:?}"),
            })
            .collect();
        chunks.sort_by_key(|c| c.offset);
        let bytes: Vec<u8> = chunks.iter().flat_map(|c| c.bytes()).collect();
        let exec = ns(add, "ktime_ns");
        let lead = attached_at
            .iter()
            .filter(|t| **t <= exec + 1_000_000_000)
            .map(|t| (*t as i64 - exec as i64) as f64 / 1e6)
            .next_back();
        eprintln!(
            "{plugin}: {} bytes captured; write hook attached {lead:?} ms after its exec",
            bytes.len()
        );
        if plugin == "loopback" {
            continue;
        }
        let reply = CniReply::parse(&bytes, false);
        if plugin == "bridge" || plugin == "host-local" {
            let addrs: Vec<&str> = reply.addresses().collect();
            assert!(
                addrs.iter().any(|a| a.split('/').next() == Some(ip)),
                "{plugin} said {reply:?}, the pod's IP is {ip}"
            );
        } else {
            assert!(
                matches!(reply, CniReply::Result { .. }),
                "{plugin}: {reply:?}"
            );
        }
    }
}

#[test]
fn a_tiny_ring_buffer_counts_what_it_drops() {
    let _one = serial();
    require_probes();
    let page = 4096.to_string();
    // One page holds about a dozen exec events; a few hundred processes started from
    // many threads at once outrun the reader.
    const THREADS: usize = 8;
    const PER_THREAD: usize = 100;
    let mut attempts = Vec::new();
    for _ in 0..3 {
        let watcher = Watcher::start(&["--ringbuf-bytes", &page]);
        let storm: Vec<_> = (0..THREADS)
            .map(|_| {
                std::thread::spawn(|| {
                    for _ in 0..PER_THREAD {
                        let s = Command::new("/bin/true").status().expect("/bin/true");
                        assert!(s.success());
                    }
                })
            })
            .collect();
        for t in storm {
            t.join().unwrap();
        }
        let w = watcher.stop();
        assert!(w.status.success(), "{}", w.stderr);
        let lost = w.summary["lost"].as_u64().unwrap();
        let seen = w
            .of_kind("exec")
            .filter(|e| e["filename"] == "/bin/true")
            .count() as u64;
        let lost_execs = w.summary["lost_by_kind"]["exec"].as_u64().unwrap_or(0);
        eprintln!(
            "ring buffer {page} bytes: {} events read, {lost} lost ({}); /bin/true execs: {seen} read + {lost_execs} exec events lost, {} started",
            w.summary["events"],
            w.summary["lost_by_kind"],
            THREADS * PER_THREAD
        );
        // Nothing vanished silently: every exec the storm made was read or counted.
        assert!(
            seen + lost_execs >= (THREADS * PER_THREAD) as u64,
            "{seen} + {lost_execs} < {}",
            THREADS * PER_THREAD
        );
        if lost > 0 {
            assert_eq!(
                w.summary["lost_by_kind"]
                    .as_object()
                    .unwrap()
                    .values()
                    .map(|v| v.as_u64().unwrap())
                    .sum::<u64>(),
                lost
            );
            assert!(
                w.stderr
                    .contains(&format!("podlapse: {lost} kernel events lost")),
                "the loss is not reported on stderr:\n{}",
                w.stderr
            );
            return;
        }
        attempts.push(w.summary);
    }
    panic!("three storms and no event lost: {attempts:?}");
}

/// The netns inode `readlink /proc/self/ns/net` printed (`net:[4026532326]`).
fn printed_inode(out: &std::process::Output) -> u64 {
    let text = String::from_utf8_lossy(&out.stdout);
    text.trim()
        .strip_prefix("net:[")
        .and_then(|t| t.strip_suffix(']'))
        .and_then(|t| t.parse().ok())
        .unwrap_or_else(|| panic!("not a netns link: {text:?} ({})", stderr(out)))
}

/// clone(CLONE_NEWNET | SIGCHLD) through perl's raw syscall (56 on x86_64): the child
/// execs readlink inside the new namespace.
fn clone_into_new_netns() -> std::process::Output {
    Command::new("perl")
        .args([
            "-e",
            r#"my $r = syscall(56, 0x40000011, 0, 0, 0, 0); if ($r == 0) { exec "readlink", "/proc/self/ns/net" } waitpid($r, 0);"#,
        ])
        .output()
        .expect("perl")
}

fn find_netns(w: &Watched, syscall: &str, comm: &str, inode: u64) -> Option<Value> {
    w.of_kind("netns")
        .find(|e| {
            e["syscall"] == syscall && e["comm"] == comm && e["netns_inum"].as_u64() == Some(inode)
        })
        .cloned()
}

/// Whether this kernel lets kprobes attach through perf, as the loader attaches them.
fn kernel_has_kprobes() -> bool {
    podlapse::ebpf::kprobes_present().is_ok()
}

/// unshare and setns (nsenter) report the namespace the task ends up in, from the
/// kernel functions where the kernel allows kprobes and from the syscall tracepoints
/// otherwise or on request; clone is left out unless asked for.
#[test]
fn namespace_creation_and_entry_report_the_netns_from_kernel_functions_or_tracepoints() {
    let _one = serial();
    // The modern node's Debian kernel has kprobes: there they must be what attached.
    let modern_node = std::env::var_os("PODLAPSE_NODE_RUNTIME").is_some();
    let preferred = if modern_node || kernel_has_kprobes() {
        "kprobes"
    } else {
        "tracepoints"
    };
    for (args, hooks) in [
        (&[][..], preferred),
        (&["--netns-hooks", "tracepoints"][..], "tracepoints"),
    ] {
        let watcher = Watcher::start(args);
        let unshared = Command::new("unshare")
            .args(["--net", "readlink", "/proc/self/ns/net"])
            .output()
            .expect("unshare");
        let cloned = clone_into_new_netns();
        let entered = Command::new("nsenter")
            .args(["--net=/proc/self/ns/net", "readlink", "/proc/self/ns/net"])
            .output()
            .expect("nsenter");
        let w = watcher.stop();
        assert!(w.status.success(), "{}", w.stderr);
        assert_eq!(w.summary["netns_hooks"], hooks, "{args:?}: {}", w.stderr);
        assert!(
            w.stderr
                .contains(&format!("network namespace events from {hooks} on ")),
            "{args:?}: {}",
            w.stderr
        );
        let find = |syscall: &str, comm: &str, inode: u64| {
            find_netns(&w, syscall, comm, inode).unwrap_or_else(|| {
                let seen: Vec<&Value> = w.of_kind("netns").collect();
                panic!("{hooks}: no {syscall} by {comm} into netns {inode}: {seen:#?}")
            })
        };
        let u = find("unshare", "unshare", printed_inode(&unshared));
        assert_eq!(u["ret"], 0, "{u}");
        assert_eq!(u["flags"].as_u64().unwrap() & 0x4000_0000, 0x4000_0000);
        let s = find("setns", "nsenter", printed_inode(&entered));
        assert_eq!(s["ret"], 0, "{s}");
        // The syscall sees the fd; the kernel function only the namespace.
        if hooks == "tracepoints" {
            assert!(s["fd"].as_i64().is_some_and(|fd| fd >= 0), "{s}");
        } else {
            assert!(s["fd"].is_null(), "{s}");
        }
        for e in [&u, &s] {
            assert!(ns(e, "start_ns") <= ns(e, "ktime_ns"), "{e}");
        }
        // clone is opt-in: without --clone-netns its tracepoints stay off.
        assert_eq!(
            find_netns(&w, "clone", "perl", printed_inode(&cloned)),
            None,
            "{hooks}: clone reported without --clone-netns"
        );
    }
    if !kernel_has_kprobes() {
        // Asked for kprobes where there are none: refused by name, nothing watched.
        let out = Command::new(podlapse_bin())
            .args(["kernel-events", "--duration", "1", "--summary-only"])
            .args(["--netns-hooks", "kprobes", "--probes"])
            .arg(require_probes())
            .output()
            .expect("podlapse kernel-events");
        assert!(!out.status.success(), "{}", stderr(&out));
        assert!(
            stderr(&out)
                .contains("kernel-function hooks did not attach (this kernel has no kprobes"),
            "{}",
            stderr(&out)
        );
    }
}

#[test]
fn on_demand_namespace_probes_stay_detached_until_held() {
    let _one = serial();
    let watcher = Watcher::start(&["--netns-on-demand"]);
    let unshared = Command::new("unshare")
        .args(["--net", "readlink", "/proc/self/ns/net"])
        .output()
        .expect("unshare");
    let w = watcher.stop();
    assert!(w.status.success(), "{}", w.stderr);
    assert!(
        w.stderr
            .contains("on demand, not attached: sys_enter_unshare, sys_exit_unshare"),
        "{}",
        w.stderr
    );
    // Loaded (the verifier accepted them) but never attached: nobody held the gate.
    assert_eq!(
        find_netns(&w, "unshare", "unshare", printed_inode(&unshared)),
        None
    );
}

/// Between pod work (nobody holds the gate) the probes drop the node's own execs and
/// exits in the kernel, and still report a CNI plugin's, and what it runs, with exits.
#[test]
fn between_pod_work_the_nodes_own_processes_are_dropped_in_the_kernel() {
    use std::os::unix::fs::PermissionsExt;
    let _one = serial();
    let dir = Scratch::new();
    let plugin = dir.path().join("fake-plugin");
    std::fs::write(&plugin, "#!/bin/sh\n/bin/true run-by-the-plugin\n").unwrap();
    std::fs::set_permissions(&plugin, std::fs::Permissions::from_mode(0o755)).unwrap();
    let cni_dir = dir.path().to_str().expect("utf-8 temp dir");
    let watcher = Watcher::start(&["--netns-on-demand", "--cni-bin-dir", cni_dir]);
    let mut node = Command::new("/bin/true")
        .arg("the-nodes-own")
        .spawn()
        .expect("/bin/true");
    let node_pid = u64::from(node.id());
    assert!(node.wait().expect("/bin/true").success());
    let mut run = Command::new(&plugin)
        .env("CNI_COMMAND", "VERSION")
        .env("CNI_CONTAINERID", "between-pod-work")
        .spawn()
        .expect("the fake plugin");
    let plugin_pid = u64::from(run.id());
    assert!(run.wait().expect("the fake plugin").success());
    let w = watcher.stop();
    assert!(w.status.success(), "{}", w.stderr);

    let pid = |e: &Value| e["pid"].as_u64();
    let seen = || format!("{:#?}", w.events);
    assert!(
        w.of_kind("cni_exec")
            .any(|e| pid(e) == Some(plugin_pid) && e["container_id"] == "between-pod-work"),
        "the plugin's CNI event: {}",
        seen()
    );
    assert!(
        w.of_kind("exec").any(|e| pid(e) == Some(plugin_pid)),
        "the plugin's exec: {}",
        seen()
    );
    assert!(
        w.of_kind("exit").any(|e| pid(e) == Some(plugin_pid)),
        "the plugin's exit: {}",
        seen()
    );
    let child = w
        .of_kind("exec")
        .find(|e| e["filename"] == "/bin/true" && e["ppid"].as_u64() == Some(plugin_pid))
        .unwrap_or_else(|| panic!("what the plugin ran: {}", seen()));
    assert!(
        w.of_kind("exit").any(|e| pid(e) == pid(child)),
        "the exit of what the plugin ran: {}",
        seen()
    );
    assert!(
        !w.events.iter().any(|e| pid(e) == Some(node_pid)),
        "the node's own process was reported between pod work: {}",
        seen()
    );
}

#[test]
fn clone_with_a_new_netns_is_reported_on_request() {
    let _one = serial();
    let watcher = Watcher::start(&["--clone-netns"]);
    let cloned = clone_into_new_netns();
    let w = watcher.stop();
    assert!(w.status.success(), "{}", w.stderr);
    let inode = printed_inode(&cloned);
    let c = find_netns(&w, "clone", "perl", inode).unwrap_or_else(|| {
        let seen: Vec<&Value> = w.of_kind("netns").collect();
        panic!("no clone by perl into netns {inode}: {seen:#?}")
    });
    assert_eq!(c["ret"], 0, "the child reports the clone");
    assert!(c["parent_pid"].as_u64().is_some_and(|p| p > 0), "{c}");
    assert!(ns(&c, "start_ns") <= ns(&c, "ktime_ns"), "{c}");
}

fn without_caps(args: &[&str]) -> std::process::Output {
    // capsh drops the capabilities from the bounding set; the shell it starts (and the
    // podlapse it execs) cannot get them back even as root.
    let mut cmd = Command::new("capsh");
    cmd.args([
        "--drop=cap_sys_admin,cap_bpf,cap_perfmon",
        "--",
        "-c",
        "exec \"$0\" \"$@\"",
    ])
    .arg(podlapse_bin())
    .arg("kernel-events")
    .arg("--probes")
    .arg(require_probes())
    .args(args);
    cmd.output().expect("capsh (package libcap2-bin)")
}

#[test]
fn without_bpf_privileges_it_says_so_once_and_carries_on() {
    let _one = serial();
    let out = without_caps(&["--duration", "1"]);
    let err = stderr(&out);
    assert_eq!(out.status.code(), Some(0), "{err}");
    let said: Vec<&str> = err
        .lines()
        .filter(|l| l.contains("kernel events unavailable"))
        .collect();
    assert_eq!(said.len(), 1, "{err}");
    assert!(
        said[0].contains("denied") && said[0].contains("CAP_BPF"),
        "does not name what is missing: {}",
        said[0]
    );
    assert_eq!(err.lines().count(), 1, "more than one message:\n{err}");
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert_eq!(stdout.trim(), "kernel events: unavailable");

    let out = without_caps(&["--duration", "1", "--json"]);
    let summary: Value = serde_json::from_slice(&out.stdout).expect("a JSON summary");
    assert_eq!(summary["ebpf"], false);

    let out = without_caps(&["--duration", "1", "--require-ebpf"]);
    assert_ne!(out.status.code(), Some(0));
    assert!(stderr(&out).contains("--require-ebpf"), "{}", stderr(&out));
}

#[test]
fn without_tracefs_it_names_what_is_missing() {
    let _one = serial();
    // A private mount namespace where tracefs is covered by an empty tmpfs.
    let out = Command::new("unshare")
        .args(["--mount", "--propagation", "private", "sh", "-c"])
        .arg(format!(
            "mount -t tmpfs none /sys/kernel/tracing && exec {} kernel-events --duration 1 --probes {}",
            podlapse_bin().display(),
            require_probes().display()
        ))
        .output()
        .expect("unshare");
    let err = stderr(&out);
    assert_eq!(out.status.code(), Some(0), "{err}");
    assert!(err.contains("tracefs is not mounted"), "{err}");
    assert!(err.contains("/sys/kernel/tracing"), "{err}");
}

/// The events of one sandbox, relative to containerd's unshare, for failure messages and
/// the record of what a run saw.
struct Timeline {
    lines: Vec<(u64, String)>,
}

impl Timeline {
    fn of(w: &Watched, sandbox: &str) -> Timeline {
        let cni_pids: Vec<(Value, String)> = w
            .of_kind("cni_exec")
            .filter(|e| e["container_id"] == sandbox)
            .map(|e| {
                (
                    e["pid"].clone(),
                    format!(
                        "{} {}",
                        e["plugin"].as_str().unwrap(),
                        e["command"].as_str().unwrap()
                    ),
                )
            })
            .collect();
        let cgroup = w
            .of_kind("cgroup_mkdir")
            .find(|e| e["hierarchy"] == 0 && e["path"].as_str().unwrap().ends_with(sandbox))
            .map(|e| e["target_cgroup_id"].clone());
        let mut lines = Vec::new();
        for e in &w.events {
            let t = ns(e, "ktime_ns");
            let comm = e["comm"].as_str().unwrap_or("");
            let line = match e["kind"].as_str().unwrap() {
                "netns"
                    if e["comm"]
                        .as_str()
                        .is_some_and(|c| c.starts_with("containerd"))
                        || cni_pids.iter().any(|(p, _)| *p == e["tgid"]) =>
                {
                    Some(format!(
                        "{comm}: {}(CLONE_NEWNET) = {} netns {} ({} us)",
                        e["syscall"].as_str().unwrap(),
                        e["ret"],
                        e["netns_inum"],
                        (t - ns(e, "start_ns")) / 1000
                    ))
                }
                "cni_exec" if e["container_id"] == sandbox => Some(format!(
                    "exec CNI {} {} (pod {}/{})",
                    e["plugin"].as_str().unwrap(),
                    e["command"].as_str().unwrap(),
                    e["pod_namespace"].as_str().unwrap_or("?"),
                    e["pod_name"].as_str().unwrap_or("?")
                )),
                "exit" => cni_pids
                    .iter()
                    .find(|(p, _)| *p == e["tgid"])
                    .map(|(_, what)| format!("{what} exits {}", e["exit_code"])),
                "cgroup_mkdir" | "cgroup_rmdir" | "cgroup_attach"
                    if e["path"].as_str().unwrap().ends_with(sandbox) =>
                {
                    Some(format!(
                        "{} hierarchy {} by {comm}",
                        e["kind"].as_str().unwrap(),
                        e["hierarchy"]
                    ))
                }
                "exec" if cgroup.as_ref().is_some_and(|c| *c == e["cgroup_id"]) => Some(format!(
                    "exec {} in the sandbox cgroup (pid {})",
                    e["filename"].as_str().unwrap(),
                    e["pid"]
                )),
                _ => None,
            };
            if let Some(line) = line {
                lines.push((t, line));
            }
        }
        Timeline { lines }
    }

    fn render(&self) -> String {
        let Some(t0) = self.lines.first().map(|(t, _)| *t) else {
            return "(no event of the sandbox)".to_string();
        };
        self.lines
            .iter()
            .map(|(t, l)| format!("{:+9.1} ms  {l}", (*t as f64 - t0 as f64) / 1e6))
            .collect::<Vec<_>>()
            .join("\n")
    }
}

/// `cargo build` embeds the probes: the binary copied alone into an empty directory, with
/// neither --probes nor $PODLAPSE_PROBES, attaches them and sees a program run.
#[test]
fn the_binary_copied_alone_loads_its_embedded_probes() {
    use std::io::{BufRead, BufReader};
    let _one = serial();
    let dir = tempfile::tempdir().unwrap();
    let alone = dir.path().join("podlapse");
    std::fs::copy(podlapse_bin(), &alone).unwrap();
    let marker = dir.path().join("podlapse-alone-marker");
    std::fs::copy("/bin/true", &marker).unwrap();
    let mut child = Command::new(&alone)
        .args([
            "kernel-events",
            "--require-ebpf",
            "--json",
            "--duration",
            "4",
        ])
        .current_dir(dir.path())
        .env_remove("PODLAPSE_PROBES")
        .env_remove("PODLAPSE_LAB_DIR")
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    let mut err = BufReader::new(child.stderr.take().unwrap());
    let mut said = String::new();
    loop {
        let mut line = String::new();
        if err.read_line(&mut line).unwrap() == 0 {
            break;
        }
        said.push_str(&line);
        if line.contains("watching kernel events") {
            break;
        }
    }
    assert!(
        said.contains("embedded in the podlapse binary"),
        "did not load the embedded probes:\n{said}"
    );
    assert!(Command::new(&marker).status().unwrap().success());
    let out = child.wait_with_output().unwrap();
    assert!(out.status.success(), "{said}");
    let text = String::from_utf8_lossy(&out.stdout);
    let marker = marker.display().to_string();
    assert!(
        text.lines()
            .filter_map(|l| serde_json::from_str::<Value>(l).ok())
            .any(|e| e["kind"] == "exec" && e["filename"] == marker.as_str()),
        "no exec event for {marker}"
    );
}
