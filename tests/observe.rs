//! `podtrace observe` beside other CRI clients on the lab: a kubelet-like client built on
//! the official CRI protos (`cri-pod-client`) and a second podtrace each create pods while
//! the observer records. Every pod gets its own kernel stages and the runtime's times,
//! none attributed to another pod, and replay refuses the observed trace.

use std::io::{BufRead, BufReader};
use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::sync::mpsc;
use std::time::Duration;

use podtrace::timeline::{PodTimeline, StageSource, Timeline};
use podtrace::trace::read_trace;
use podtrace_tests::ebpf::{require_probes, serial};
use podtrace_tests::{Scratch, podtrace, podtrace_bin, require_lab, stderr, stdout};
use serde_json::Value;
use xtask::lab::IMAGE_APP;

/// Loading and verifying the probes on a loaded 2-core machine or an emulated guest: the
/// bound only keeps a hung observer from hanging the suite.
const OBSERVER_UP: Duration = Duration::from_secs(300);

/// The observer in the background, started and waited for on its own word.
struct Observer {
    child: Child,
    /// Its stderr lines after the start line.
    lines: mpsc::Receiver<String>,
}

impl Observer {
    fn start(trace: &Path, probes: &Path) -> Observer {
        let mut child = Command::new(podtrace_bin())
            .args(["observe", "--trace"])
            .arg(trace)
            .arg("--probes")
            .arg(probes)
            .arg("--require-ebpf")
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::piped())
            .spawn()
            .expect("podtrace observe starts");
        let (tx, lines) = mpsc::channel();
        let err = child.stderr.take().unwrap();
        std::thread::spawn(move || {
            for line in BufReader::new(err).lines().map_while(Result::ok) {
                eprintln!("observer: {line}");
                if tx.send(line).is_err() {
                    return;
                }
            }
        });
        // Evidence it records: the line it prints once the probes and the runtime's view
        // are both up.
        loop {
            match lines.recv_timeout(OBSERVER_UP) {
                Ok(line) if line.contains("podtrace: observing ") => break,
                Ok(_) => continue,
                Err(e) => panic!("podtrace observe did not say it was observing: {e}"),
            }
        }
        Observer { child, lines }
    }

    /// SIGTERM, then the exit status and what it printed last.
    fn stop(mut self) -> (std::process::ExitStatus, Vec<String>) {
        // SAFETY: kill(2) on our own child's pid.
        unsafe { libc::kill(self.child.id() as i32, libc::SIGTERM) };
        let status = self.child.wait().expect("the observer exits");
        (status, self.lines.try_iter().collect())
    }
}

/// `cri-pod-client run`: pods created as a kubelet creates them, one JSON line each.
fn client_pods(prefix: &str, n: usize) -> Vec<Value> {
    let socket = podtrace_tests::lab().cri_socket();
    // In the modern node's guest the client is staged beside the tests.
    let client = std::env::var_os("PODTRACE_CRI_POD_CLIENT")
        .map(std::path::PathBuf::from)
        .unwrap_or_else(|| env!("CARGO_BIN_EXE_cri-pod-client").into());
    let out = Command::new(client)
        .arg("--cri")
        .arg(format!("unix://{}", socket.display()))
        .args([
            "run",
            "--pods",
            &n.to_string(),
            "--prefix",
            prefix,
            "--image",
        ])
        .arg(IMAGE_APP)
        .args(["--hold-seconds", "1"])
        .output()
        .expect("cri-pod-client runs");
    assert!(
        out.status.success(),
        "cri-pod-client: {}\n{}",
        stdout(&out),
        stderr(&out)
    );
    let pods: Vec<Value> = stdout(&out)
        .lines()
        .map(|l| serde_json::from_str(l).expect("a JSON line per pod"))
        .collect();
    assert_eq!(pods.len(), n, "{}", stdout(&out));
    pods
}

fn waterfall(p: &PodTimeline) -> String {
    p.stages
        .iter()
        .map(|s| {
            format!(
                "{:<28} {:<8} {:?} {}",
                s.stage,
                s.source.to_string(),
                s.sandbox_id,
                s.detail
            )
        })
        .collect::<Vec<_>>()
        .join("\n")
}

/// The pod's kernel stages and the runtime's times are all there, on its own sandbox.
fn assert_observed(t: &Timeline, uid: &str, sandbox: &str, container: &str) {
    let p = t
        .pods
        .iter()
        .find(|p| p.uid == uid)
        .unwrap_or_else(|| panic!("pod {uid} is not in the observed timeline"));
    for name in [
        "netns_created",
        "cni_add",
        "cni_plugin:bridge",
        "pause_exec",
        "app_first_exec:app",
    ] {
        let s = p
            .stage(name)
            .unwrap_or_else(|| panic!("{}: no {name}\n{}", p.name, waterfall(p)));
        assert_eq!(s.source, StageSource::Kernel, "{name}");
    }
    for name in ["sandbox_ready", "container_started:app", "running"] {
        let s = p
            .stage(name)
            .unwrap_or_else(|| panic!("{}: no {name}\n{}", p.name, waterfall(p)));
        assert_eq!(s.source, StageSource::Runtime, "{name}");
    }
    assert!(p.ip.is_some(), "{}: no IP\n{}", p.name, waterfall(p));
    // Nothing of another pod's: every stage naming a sandbox or container names this
    // pod's.
    for s in &p.stages {
        if let Some(id) = &s.sandbox_id {
            assert_eq!(
                id,
                sandbox,
                "{}: {} on another sandbox\n{}",
                p.name,
                s.stage,
                waterfall(p)
            );
        }
        if let Some(id) = &s.container_id {
            assert!(
                container.ends_with(id.as_str()),
                "{}: {} of container {id}, not {container}",
                p.name,
                s.stage
            );
        }
    }
    // What only the client knows is absent, not guessed.
    assert!(p.stage("admitted").is_none() && p.stage("sandbox_requested").is_none());
}

#[test]
fn the_observer_times_the_pods_of_two_other_clients_each_on_its_own_and_changes_nothing() {
    let _one = serial();
    require_lab();
    let probes = require_probes();
    let scratch = Scratch::new();
    let trace = scratch.path().join("observed.jsonl");
    let observer = Observer::start(&trace, &probes);

    // A second podtrace as one client, the CRI-protos client as the other, at once.
    let manifest = scratch.manifest(
        "pt.yaml",
        &format!(
            "apiVersion: v1\nkind: Pod\nmetadata: {{name: observed-by-podtrace}}\nspec:\n  terminationGracePeriodSeconds: 2\n  containers:\n  - {{name: app, image: {IMAGE_APP}, command: [sleep, '3600']}}\n"
        ),
    );
    let run = {
        let scratch = &scratch;
        let manifest = manifest.clone();
        std::thread::scope(|s| {
            let run = s.spawn(move || scratch.run(&[&manifest], &["--cleanup", "--no-ebpf"]));
            let pods = client_pods("observed", 5);
            (run.join().unwrap(), pods)
        })
    };
    let ((out, doc), client) = run;
    assert!(out.status.success(), "{doc:#}\n{}", stderr(&out));
    let (status, last) = observer.stop();
    assert!(status.success(), "the observer exited {status}: {last:?}");

    // Every line is a record the published schema allows.
    let schema: Value = serde_json::from_str(
        &std::fs::read_to_string(
            podtrace_tests::workspace_root().join("docs/trace-format.schema.json"),
        )
        .unwrap(),
    )
    .unwrap();
    let validator = jsonschema::validator_for(&schema).expect("the schema compiles");
    for (n, line) in std::fs::read_to_string(&trace).unwrap().lines().enumerate() {
        let record: Value = serde_json::from_str(line).expect("a JSON line");
        if let Err(e) = validator.validate(&record) {
            panic!("line {}: {e}\n{line}", n + 1);
        }
    }
    let read = read_trace(&trace).expect("the observed trace reads back");
    let observed = read
        .header
        .observed
        .as_ref()
        .expect("the header says observed");
    assert!(
        observed.sources.iter().any(|s| s == "kernel"),
        "{observed:?}"
    );
    if read
        .header
        .runtime_version
        .trim_start_matches('v')
        .starts_with('2')
    {
        assert!(
            observed.sources.iter().any(|s| s == "cri:events"),
            "{observed:?}"
        );
    }
    assert!(read.footer.is_some(), "the trace was closed");
    let t = podtrace::timeline::build(&read.records);

    for p in &client {
        assert_observed(
            &t,
            p["uid"].as_str().unwrap(),
            p["sandbox_id"].as_str().unwrap(),
            p["container_id"].as_str().unwrap(),
        );
    }
    let mine = &doc["pods"][0];
    let uid = mine["uid"].as_str().unwrap();
    let p = t
        .pods
        .iter()
        .find(|p| p.uid == uid)
        .expect("podtrace's pod was observed");
    let sandbox = p.sandbox_ids.last().expect("a sandbox").clone();
    let container = p.containers.keys().next().expect("a container").clone();
    assert_observed(&t, uid, &sandbox, &container);
    assert_eq!(
        p.ip.as_deref(),
        mine["ip"].as_str(),
        "the IP the client got"
    );

    // Every pod's sandbox is its own: no two pods share one.
    let mut sandboxes: Vec<&String> = t.pods.iter().flat_map(|p| &p.sandbox_ids).collect();
    let n = sandboxes.len();
    sandboxes.sort();
    sandboxes.dedup();
    assert_eq!(sandboxes.len(), n, "a sandbox in two pods");

    // The views read it; replay refuses it with its reason.
    let trace_arg = trace.to_str().unwrap();
    let report = podtrace(&["report", trace_arg]);
    assert!(report.status.success(), "{}", stderr(&report));
    let replay = podtrace(&["replay", trace_arg]);
    assert_eq!(replay.status.code(), Some(2), "{}", stderr(&replay));
    assert!(
        stderr(&replay).contains("observed trace"),
        "{}",
        stderr(&replay)
    );
}
