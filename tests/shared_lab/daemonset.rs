//! The DaemonSet's own pod, run for real: deploy/daemonset.yaml's pod template (read from
//! the file, with only its "SET:" values given this node's) runs through `podlapse run`,
//! as a kubelet runs a DaemonSet's pod, in the lab's containerd, from podlapse's image
//! (`cargo xtask image`'s build, pushed to the lab's registry), with the mounts and
//! privileges the manifest gives. Inside that container the observer records the pods
//! the test's CRI client creates; a real Prometheus scrapes it and a PromQL query returns
//! the pods' stage histograms; then the pod's end (SIGTERM within its grace period) ends
//! the trace with its footer and leaves none of its programs or links in the kernel.

use std::collections::BTreeSet;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::Duration;

use podlapse_tests::agent::{Agent, container, container_pids, phase};
use podlapse_tests::cni_conf::runtime_network;
use podlapse_tests::observer::{ClientPodsCleanup, ClientRun};
use podlapse_tests::{deploy_dir, eventually, podlapse_bin, require_lab};
use serde_json::{Value, json};
use xtask::lab::{IMAGE_APP, LabPaths, REGISTRY_ADDR, build_agent_image, push_agent_image};

/// The image the modern node's suite pushed for this test, when it did.
const IMAGE_ENV: &str = "PODLAPSE_AGENT_IMAGE";
/// The static pod's name in its manifest.
const POD: &str = "podlapse";
const PODS: usize = 5;
/// The test client's pods are named after this.
const PREFIX: &str = "ds-obs";
/// Bounds that only keep a broken run from hanging the suite: each wait ends on evidence.
const POD_RUNS: Duration = Duration::from_secs(600);
const SCRAPED: Duration = Duration::from_secs(600);
/// Prometheus scrapes this often, and gives a scrape as long: the emulated modern node can
/// take more than a second to answer, and a timed-out scrape leaves no series at all.
const SCRAPE_EVERY: &str = "5s";

/// podlapse's image in the lab's registry: the one the suite pushed, else built here
/// from the binary under test, twice, to show one binary gives one digest.
fn agent_image(work: &Path) -> String {
    if let Ok(image) = std::env::var(IMAGE_ENV) {
        return image;
    }
    let bin = podlapse_bin();
    let a = build_agent_image(&bin, &work.join("a"), "lab", 1).unwrap_or_else(|e| panic!("{e}"));
    let b = build_agent_image(&bin, &work.join("b"), "lab", 1).unwrap_or_else(|e| panic!("{e}"));
    assert_eq!(a.digest, b.digest, "one binary, two image digests");
    let reference = format!("{REGISTRY_ADDR}/podlapse/podlapse:lab");
    push_agent_image(&a, &reference).unwrap_or_else(|e| panic!("{e}"));
    reference
}

/// This node's values for the manifest's "SET:" lines, from the runtime: its socket (a
/// link resolved: the lab profile of the modern node links the system socket), its CNI
/// configuration directory, and the store of the host-local IPAM of the network it uses.
struct NodeValues {
    socket: PathBuf,
    cni_conf: PathBuf,
    ipam_store: PathBuf,
}

fn node_values(lab: &LabPaths) -> NodeValues {
    let socket = std::fs::canonicalize(lab.cri_socket()).unwrap();
    let cni_conf = runtime_network().conf_dir;
    let mut files: Vec<PathBuf> = std::fs::read_dir(&cni_conf)
        .unwrap()
        .flatten()
        .map(|e| e.path())
        .filter(|p| {
            p.extension()
                .is_some_and(|e| e == "conflist" || e == "conf")
        })
        .collect();
    files.sort();
    let used: Value =
        serde_json::from_str(&std::fs::read_to_string(files.first().expect("a CNI conf")).unwrap())
            .unwrap();
    let ipam_store = used["plugins"]
        .as_array()
        .into_iter()
        .flatten()
        .chain(std::iter::once(&used))
        .find_map(|p| p["ipam"]["dataDir"].as_str())
        .unwrap_or("/var/lib/cni/networks")
        .into();
    NodeValues {
        socket,
        cni_conf,
        ipam_store,
    }
}

/// The DaemonSet's pod template as a static pod, its "SET:" values this node's: the
/// image, the CRI socket, the CNI configuration and host-local's store, and host
/// directories of the test's own for the traces and the API socket.
fn daemon_set_pod(image: &str, node: &NodeValues, traces: &Path, run: &Path) -> Value {
    let path = deploy_dir().join("daemonset.yaml");
    let ds: Value = serde_yaml::from_str(&std::fs::read_to_string(&path).unwrap()).unwrap();
    let template = &ds["spec"]["template"];
    let mut spec = template["spec"].clone();
    let socket_dir = node.socket.parent().unwrap().display().to_string();
    let host_dirs = [
        ("cri", socket_dir),
        ("cni-conf", node.cni_conf.display().to_string()),
        ("cni-ipam", node.ipam_store.display().to_string()),
        ("traces", traces.display().to_string()),
        ("run", run.display().to_string()),
    ];
    for v in spec["volumes"].as_array_mut().unwrap() {
        if let Some((_, dir)) = host_dirs.iter().find(|(n, _)| v["name"] == *n) {
            v["hostPath"]["path"] = json!(dir);
        }
    }
    let c = &mut spec["containers"][0];
    c["image"] = json!(image);
    // The socket, the CNI files and the store where the runtime names them.
    for m in c["volumeMounts"].as_array_mut().unwrap() {
        if let Some((_, dir)) = host_dirs[..3].iter().find(|(n, _)| m["name"] == *n) {
            m["mountPath"] = json!(dir);
        }
    }
    for a in c["args"].as_array_mut().unwrap() {
        if a.as_str().is_some_and(|s| s.starts_with("--cri=")) {
            *a = json!(format!("--cri=unix://{}", node.socket.display()));
        }
    }
    json!({
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": POD, "namespace": "podlapse", "labels": template["metadata"]["labels"]},
        "spec": spec,
    })
}

/// A Prometheus server of the test's own on 127.0.0.1, scraping `target` every second.
struct Prometheus {
    child: Child,
    addr: String,
    _dir: tempfile::TempDir,
}

impl Prometheus {
    fn start(target: &str) -> Prometheus {
        let dir = tempfile::tempdir().unwrap();
        let config = dir.path().join("prometheus.yml");
        std::fs::write(
            &config,
            format!(
                "global:\n  scrape_interval: {SCRAPE_EVERY}\n  scrape_timeout: {SCRAPE_EVERY}\n\
                 scrape_configs:\n  - job_name: podlapse\n    static_configs:\n      - targets: ['{target}']\n"
            ),
        )
        .unwrap();
        let check = Command::new("promtool")
            .args(["check", "config"])
            .arg(&config)
            .output()
            .expect("promtool runs (cargo xtask setup installs it)");
        assert!(
            check.status.success(),
            "promtool check config:\n{}{}",
            String::from_utf8_lossy(&check.stdout),
            String::from_utf8_lossy(&check.stderr)
        );
        let addr = podlapse_tests::agent::free_loopback_addr();
        let child = Command::new("prometheus")
            .arg(format!("--config.file={}", config.display()))
            .arg(format!(
                "--storage.tsdb.path={}",
                dir.path().join("data").display()
            ))
            .arg(format!("--web.listen-address={addr}"))
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .expect("prometheus starts (cargo xtask setup installs it)");
        let p = Prometheus {
            child,
            addr,
            _dir: dir,
        };
        eventually(
            "Prometheus ready",
            SCRAPED,
            Duration::from_millis(200),
            || http_get(&p.addr, "/-/ready").map(drop),
        );
        p
    }

    /// How Prometheus last found the target: its health, last error and scrape duration
    /// (what a failed wait shows).
    fn target_health(&self) -> String {
        match http_get(&self.addr, "/api/v1/targets") {
            Ok(body) => serde_json::from_str::<Value>(&body)
                .ok()
                .and_then(|d| d["data"]["activeTargets"].as_array().cloned())
                .map(|ts| {
                    ts.iter()
                        .map(|t| {
                            format!(
                                "{} {} (last error {:?}, last scrape {} s)",
                                t["scrapeUrl"],
                                t["health"],
                                t["lastError"],
                                t["lastScrapeDuration"]
                            )
                        })
                        .collect::<Vec<_>>()
                        .join("; ")
                })
                .unwrap_or(body),
            Err(e) => format!("its targets unreadable: {e}"),
        }
    }

    /// A PromQL instant query's result vector.
    fn query(&self, promql: &str) -> Result<Vec<Value>, String> {
        let q: String = promql
            .bytes()
            .map(|b| match b {
                b'a'..=b'z' | b'A'..=b'Z' | b'0'..=b'9' | b'-' | b'_' | b'.' => {
                    (b as char).to_string()
                }
                _ => format!("%{b:02X}"),
            })
            .collect();
        let body = http_get(&self.addr, &format!("/api/v1/query?query={q}"))?;
        let doc: Value = serde_json::from_str(&body).map_err(|e| format!("{e}: {body}"))?;
        if doc["status"] != "success" {
            return Err(body);
        }
        Ok(doc["data"]["result"]
            .as_array()
            .cloned()
            .unwrap_or_default())
    }
}

impl Drop for Prometheus {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// `GET path` on `addr`: the body of a 200, else what came back.
fn http_get(addr: &str, path: &str) -> Result<String, String> {
    use std::io::{Read, Write};
    let mut s = std::net::TcpStream::connect(addr).map_err(|e| format!("{addr}: {e}"))?;
    s.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
    write!(
        s,
        "GET {path} HTTP/1.1\r\nhost: {addr}\r\nconnection: close\r\n\r\n"
    )
    .map_err(|e| e.to_string())?;
    let mut text = String::new();
    s.read_to_string(&mut text).map_err(|e| e.to_string())?;
    let (head, body) = text.split_once("\r\n\r\n").unwrap_or((&text, ""));
    if !head.starts_with("HTTP/1.1 200") {
        return Err(head.to_string());
    }
    // Prometheus's API answers in one piece or chunked; the JSON is the chunk's.
    if head
        .to_ascii_lowercase()
        .contains("transfer-encoding: chunked")
    {
        let mut out = String::new();
        let mut rest = body;
        while let Some((size, tail)) = rest.split_once("\r\n") {
            let n = usize::from_str_radix(size.trim(), 16).unwrap_or(0);
            if n == 0 || tail.len() < n {
                break;
            }
            out.push_str(&tail[..n]);
            rest = tail[n..].trim_start_matches("\r\n");
        }
        return Ok(out);
    }
    Ok(body.to_string())
}

/// The BPF programs and links a process holds open, by the IDs its fdinfo names.
fn bpf_objects_of(pid: i32) -> (BTreeSet<u32>, BTreeSet<u32>) {
    let (mut progs, mut links) = (BTreeSet::new(), BTreeSet::new());
    let fdinfo = PathBuf::from(format!("/proc/{pid}/fdinfo"));
    for entry in std::fs::read_dir(&fdinfo).into_iter().flatten().flatten() {
        let Ok(text) = std::fs::read_to_string(entry.path()) else {
            continue;
        };
        for line in text.lines() {
            if let Some(id) = line.strip_prefix("prog_id:") {
                progs.extend(id.trim().parse::<u32>().ok());
            } else if let Some(id) = line.strip_prefix("link_id:") {
                links.extend(id.trim().parse::<u32>().ok());
            }
        }
    }
    (progs, links)
}

/// The IDs of every BPF program and link the kernel has loaded, from its own listing.
fn kernel_bpf_objects() -> (BTreeSet<u32>, BTreeSet<u32>) {
    let progs = aya::programs::loaded_programs()
        .filter_map(Result::ok)
        .map(|p| p.id())
        .collect();
    let links = aya::programs::loaded_links()
        .filter_map(Result::ok)
        .map(|l| l.id)
        .collect();
    (progs, links)
}

#[test]
fn the_daemon_sets_pod_observes_the_nodes_pods_for_prometheus_and_leaves_nothing_on_sigterm() {
    let lab = require_lab();
    let work = tempfile::tempdir().unwrap();
    let traces = work.path().join("traces");
    let run = work.path().join("run");
    let image = agent_image(&work.path().join("image"));
    let node = node_values(&lab);
    let pod = daemon_set_pod(&image, &node, &traces, &run);
    // Dropped before `work`: a failed run keeps the observer's trace.
    let _kept = KeptOnFailure(traces.join("trace.jsonl"));

    let mut agent = Agent::start("ds-node", &[]);
    agent.write("podlapse.yaml", &serde_yaml::to_string(&pod).unwrap());
    let logs = agent.scratch.logs_dir();
    let running = agent.wait_pod(POD, "its container running", POD_RUNS, |p| {
        let c = container(p, POD);
        assert!(
            c["restartCount"].as_u64().unwrap_or(0) == 0,
            "the observer's container restarted: {p:#}\n{}",
            pod_log(&logs)
        );
        phase(p) == "Running" && c["state"]["running"].is_object()
    });
    // On the host's network: the pod's IP is the node's.
    let node_ip = running["status"]["podIP"].as_str().unwrap().to_string();
    let target = format!("{node_ip}:9465");
    // Evidence it observes: its own line, in its container's log.
    eventually(
        "the observer's log says it observes",
        POD_RUNS,
        Duration::from_millis(200),
        || {
            let log = pod_log(&logs);
            if log.contains("podlapse: observing ") {
                Ok(())
            } else {
                Err(log)
            }
        },
    );
    let container_id = container(&running, POD)["containerID"]
        .as_str()
        .unwrap()
        .to_string();
    let pids = container_pids(&container_id);
    assert!(!pids.is_empty(), "no process in {container_id}");
    let (progs, links) =
        pids.iter()
            .fold((BTreeSet::new(), BTreeSet::new()), |(mut p, mut l), pid| {
                let (pp, ll) = bpf_objects_of(*pid);
                p.extend(pp);
                l.extend(ll);
                (p, l)
            });
    assert!(
        !progs.is_empty(),
        "the observer holds no BPF program: it runs without its probes\n{}",
        pod_log(&logs)
    );

    let prometheus = Prometheus::start(&target);
    let cri = format!("unix://{}", node.socket.display());
    // A failed run leaves no pod to the next (the client holds its pods 900 s): a rerun
    // on the same node would count them too.
    let _cleanup = ClientPodsCleanup::new(env!("CARGO_BIN_EXE_cri-pod-client"), &cri, PREFIX);
    let client = ClientRun::spawn(
        env!("CARGO_BIN_EXE_cri-pod-client"),
        &cri,
        &[
            "--pods",
            &PODS.to_string(),
            "--prefix",
            PREFIX,
            "--image",
            IMAGE_APP,
            "--hold-seconds",
            "900",
        ],
    );
    for p in client.pods(PODS) {
        assert_eq!(p["ok"], true, "{p}");
    }
    // The five pods' stages, from the kernel (the app's exec, the CNI plugin) and the
    // runtime, as Prometheus has them from its scrapes.
    for (what, promql) in [
        (
            "the app's first exec (kernel)",
            "sum(podlapse_stage_duration_seconds_count{stage=\"app_first_exec\"})",
        ),
        (
            "running",
            "sum(podlapse_stage_duration_seconds_count{stage=\"running\"})",
        ),
        (
            "the bridge plugin's runs (kernel)",
            "sum(podlapse_cni_plugin_duration_seconds_count{plugin=\"bridge\",exit_code=\"0\"})",
        ),
    ] {
        eventually(what, SCRAPED, Duration::from_millis(500), || {
            let r = prometheus.query(promql)?;
            let n = r
                .first()
                .and_then(|s| s["value"][1].as_str())
                .and_then(|v| v.parse::<f64>().ok());
            if n == Some(PODS as f64) {
                Ok(())
            } else {
                Err(format!(
                    "{promql}: {r:?}; every series of its family: {}; the target: {}; the \
                     observer's log ends:\n{}",
                    family_series(&prometheus, promql),
                    prometheus.target_health(),
                    tail(&pod_log(&logs), 30)
                ))
            }
        });
    }
    let loaded = prometheus.query("podlapse_ebpf_probes_loaded").unwrap();
    assert_eq!(
        loaded.first().and_then(|s| s["value"][1].as_str()),
        Some("1"),
        "the probes are loaded: {loaded:?}"
    );
    let buckets = prometheus
        .query("sum by (le) (podlapse_stage_duration_seconds_bucket{stage=\"app_first_exec\"})")
        .unwrap();
    assert!(buckets.len() > 2, "a histogram of buckets: {buckets:?}");
    client.stop();

    // The pod's end: the kubelet's SIGTERM, within the grace period.
    agent.remove("podlapse.yaml");
    eventually(
        "the observer's pod gone",
        POD_RUNS,
        Duration::from_millis(200),
        || match agent.pod(POD) {
            None => Ok(()),
            Some(p) => Err(p.to_string()),
        },
    );
    // The footer is written on SIGTERM; a SIGKILL after the grace period leaves none.
    let trace = traces.join("trace.jsonl");
    let text = std::fs::read_to_string(&trace).unwrap();
    let last = text.lines().last().unwrap_or_default();
    assert!(
        last.contains("\"type\":\"footer\""),
        "{} ends without its footer: {last}",
        trace.display()
    );
    let (kernel_progs, kernel_links) = kernel_bpf_objects();
    let left: Vec<_> = progs.intersection(&kernel_progs).collect();
    assert!(left.is_empty(), "programs left in the kernel: {left:?}");
    let left: Vec<_> = links.intersection(&kernel_links).collect();
    assert!(left.is_empty(), "links left in the kernel: {left:?}");
    agent.stop();
}

/// Where a failed run leaves the observer's trace (the test's own directory goes with it):
/// the modern node's suite brings `/tmp/podlapse-failed-*` back with the guest's logs.
const KEPT_TRACE: &str = "/tmp/podlapse-failed-daemonset-trace.jsonl";

/// Copies the observer's trace to [`KEPT_TRACE`] when the test fails.
struct KeptOnFailure(PathBuf);

impl Drop for KeptOnFailure {
    fn drop(&mut self) {
        if std::thread::panicking() {
            match std::fs::copy(&self.0, KEPT_TRACE) {
                Ok(_) => eprintln!("the observer's trace is kept in {KEPT_TRACE}"),
                Err(e) => eprintln!("the observer's trace {}: {e}", self.0.display()),
            }
        }
    }
}

/// Every series of the family `promql` sums over (its labels and values), for a failed
/// wait to show what the observer did report.
fn family_series(prometheus: &Prometheus, promql: &str) -> String {
    let family: String = promql
        .trim_start_matches("sum(")
        .chars()
        .take_while(|c| c.is_ascii_alphanumeric() || *c == '_')
        .collect();
    match prometheus.query(&family) {
        Ok(series) => series
            .iter()
            .map(|s| format!("{} {}", s["metric"], s["value"][1]))
            .collect::<Vec<_>>()
            .join("; "),
        Err(e) => format!("{family}: {e}"),
    }
}

/// The last `n` lines of `text`.
fn tail(text: &str, n: usize) -> String {
    let lines: Vec<&str> = text.lines().collect();
    lines[lines.len().saturating_sub(n)..].join("\n")
}

/// The observer container's log, as the agent keeps pod logs (every file under the pod's
/// directory).
fn pod_log(logs: &Path) -> String {
    let mut out = String::new();
    let mut stack = vec![logs.to_path_buf()];
    while let Some(dir) = stack.pop() {
        for entry in std::fs::read_dir(&dir).into_iter().flatten().flatten() {
            let path = entry.path();
            if path.is_dir() {
                stack.push(path);
            } else if path.to_string_lossy().contains(POD) {
                out.push_str(&std::fs::read_to_string(&path).unwrap_or_default());
            }
        }
    }
    out
}
