//! A bounded trace on a node that records for months: `podlapse observe --trace-max-bytes
//! 1MiB` while the suite's CRI client (`cri-pod-client`, not podlapse) creates and
//! removes a few hundred pods, batch after batch, as a busy node's kubelet does.
//!
//! - Every file of the rotation is a whole trace on its own: `timeline`, `report` and
//!   `diagnose` read each alone; each has its header's place in the rotation and its
//!   footer, and none grows much past the bound.
//! - The observer forgets the removed pods (`--deleted-pod-retention`): its live
//!   timeline holds none of them at the end.
//! - All the files given together read as one recording: every pod the client made is
//!   there once, with its whole startup (the kernel's stages, the runtime's, its IP),
//!   also the pods whose records went into two files, which no file alone holds whole.

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};
use std::process::Command;

use podlapse::timeline::{PodTimeline, Timeline};
use podlapse::trace::{part_path, read_trace};
use podlapse_tests::ebpf::{require_probes, serial};
use podlapse_tests::observer::{ClientPodsCleanup, Observer, cri_pod_client};
use podlapse_tests::otlp::reconnect_runtime_exporter;
use podlapse_tests::{Scratch, podlapse, require_lab, runtime_version, stderr};
use serde_json::Value;
use xtask::lab::{IMAGE_APP, RUNTIME_OTLP_ADDR};

const PREFIX: &str = "obs-rotate";
/// 5 batches of 50: a few hundred pods, some tens of them at once.
const BATCHES: usize = 5;
const PER_BATCH: usize = 50;
/// The bound the issue sets: 1 MiB.
const MAX_BYTES: u64 = 1 << 20;
/// More than the recording fills, so that none is removed and all are read together.
const KEEP: u32 = 64;

/// The stages a whole observed startup has.
const WHOLE: [&str; 6] = [
    "netns_created",
    "cni_plugin:bridge",
    "pause_exec",
    "app_first_exec:app",
    "sandbox_ready",
    "running",
];

/// One batch: the client creates `PER_BATCH` pods at once, reports each, removes them all
/// and exits. The pods it reports, by UID.
fn batch(cri: &str, n: usize) -> BTreeMap<String, String> {
    let prefix = format!("{PREFIX}-{n}");
    let out = Command::new(cri_pod_client(env!("CARGO_BIN_EXE_cri-pod-client")))
        .args(["--cri", cri, "run", "--pods"])
        .arg(PER_BATCH.to_string())
        .args([
            "--prefix",
            &prefix,
            "--image",
            IMAGE_APP,
            "--hold-seconds",
            "0",
        ])
        .output()
        .expect("cri-pod-client runs");
    assert!(out.status.success(), "batch {n}: {}", stderr(&out));
    let pods: Vec<Value> = String::from_utf8_lossy(&out.stdout)
        .lines()
        .map(|l| serde_json::from_str(l).unwrap_or_else(|e| panic!("{l:?}: {e}")))
        .collect();
    assert_eq!(pods.len(), PER_BATCH, "batch {n}: {pods:?}");
    pods.iter()
        .map(|p| {
            assert_eq!(p["ok"], true, "batch {n}: {p}");
            (
                p["uid"].as_str().unwrap().to_string(),
                p["name"].as_str().unwrap().to_string(),
            )
        })
        .collect()
}

/// `podlapse timeline FILES -o json`.
fn timeline(files: &[PathBuf]) -> Timeline {
    let mut args = vec!["timeline".to_string()];
    args.extend(files.iter().map(|f| f.display().to_string()));
    args.extend(["-o".into(), "json".into()]);
    let args: Vec<&str> = args.iter().map(String::as_str).collect();
    let out = podlapse(&args);
    assert!(out.status.success(), "podlapse {args:?}: {}", stderr(&out));
    serde_json::from_slice(&out.stdout)
        .unwrap_or_else(|e| panic!("podlapse {args:?} printed no timeline: {e}"))
}

fn lacks(p: &PodTimeline) -> Vec<&'static str> {
    let mut lacks: Vec<&str> = WHOLE
        .into_iter()
        .filter(|s| p.stage(*s).is_none())
        .collect();
    if p.ip.is_none() {
        lacks.push("its IP");
    }
    lacks
}

/// The files of the rotation at `trace`, newest first.
fn files_of(trace: &Path) -> Vec<PathBuf> {
    (0..KEEP)
        .map(|age| part_path(trace, age))
        .take_while(|p| p.exists())
        .collect()
}

#[test]
fn a_rotated_observed_trace_reads_file_by_file_and_together_gives_every_pod_once() {
    let _one = serial();
    require_lab();
    if runtime_version().0 >= 2 {
        reconnect_runtime_exporter();
    }
    let scratch = Scratch::new();
    let trace = scratch.path().join("observed.jsonl");
    let cri = format!("unix://{}", podlapse_tests::lab().cri_socket().display());
    let max = MAX_BYTES.to_string();
    let keep = KEEP.to_string();
    let observer = Observer::start(
        &trace,
        &require_probes(),
        &cri,
        &[
            "--trace-max-bytes",
            &max,
            "--trace-keep",
            &keep,
            "--deleted-pod-retention",
            "2s",
            // The runtime's spans too, as a node's observer takes them (and the lab's
            // containerd, which exports to this address, keeps its connection: after
            // a minute and more with nothing there, gRPC waits up to 2 minutes between
            // attempts, and the next test's receiver would miss its batches).
            "--runtime-otlp-listen",
            RUNTIME_OTLP_ADDR,
        ],
    );
    let _cleanup = ClientPodsCleanup::new(env!("CARGO_BIN_EXE_cri-pod-client"), &cri, PREFIX);
    let mut pods = BTreeMap::new();
    for n in 0..BATCHES {
        pods.extend(batch(&cri, n));
    }
    assert_eq!(pods.len(), BATCHES * PER_BATCH, "a UID twice");
    // Every pod's removal recorded before the observer ends.
    observer.wait_api(&["pods"], "the client's pods removed", |l| {
        !l["items"].as_array().into_iter().flatten().any(|i| {
            i["metadata"]["name"]
                .as_str()
                .is_some_and(|n| n.starts_with(PREFIX))
        })
    });
    // The observer forgets what the runtime removed (its memory does not grow with every
    // pod), while the trace keeps them all (below).
    observer.wait_api(&["timeline", "--live"], "the removed pods forgotten", |t| {
        let t: Timeline = serde_json::from_value(t.clone()).unwrap_or_default();
        !t.pods.iter().any(|p| p.name.starts_with(PREFIX))
    });
    let (status, last) = observer.stop();
    assert!(status.success(), "the observer exited {status}: {last:?}");

    let files = files_of(&trace);
    assert!(
        files.len() >= 2,
        "{} pods made {} file(s) of at most {MAX_BYTES} bytes",
        pods.len(),
        files.len()
    );
    let wanted = |p: &&PodTimeline| pods.contains_key(&p.uid);
    // Each file alone.
    let mut in_files: BTreeMap<String, usize> = BTreeMap::new();
    for (age, f) in files.iter().enumerate() {
        let size = std::fs::metadata(f).unwrap().len();
        // A file ends at the first record past the bound; a record is at most a pod's
        // spec and its status, well under 256 KiB.
        assert!(
            size < MAX_BYTES + 256 * 1024,
            "{}: {size} bytes",
            f.display()
        );
        let t = read_trace(f).unwrap_or_else(|e| panic!("{}: {e}", f.display()));
        let part = t
            .header
            .part
            .as_ref()
            .expect("a rotated file says its place");
        assert_eq!(
            part.index as usize,
            files.len() - 1 - age,
            "{}",
            f.display()
        );
        let footer = t.footer.as_ref().expect("every file has its footer");
        assert_eq!(footer.continued, age != 0, "{}", f.display());
        for p in timeline(std::slice::from_ref(f)).pods.iter().filter(wanted) {
            *in_files.entry(p.uid.clone()).or_default() += 1;
        }
        for cmd in ["report", "diagnose"] {
            let out = Command::new(podlapse_tests::podlapse_bin())
                .arg(cmd)
                .arg(f)
                .output()
                .expect("podlapse runs");
            // diagnose exits 1 when it found something wrong, 2 on a trace it cannot read.
            assert!(
                out.status.code().is_some_and(|c| c < 2),
                "podlapse {cmd} {}: {}\n{}",
                f.display(),
                out.status,
                stderr(&out)
            );
        }
    }
    // Some pod's records went into two files: the join below is tested on it.
    let straddling: Vec<&String> = in_files
        .iter()
        .filter(|(_, n)| **n > 1)
        .map(|(u, _)| u)
        .collect();
    eprintln!(
        "{} pods in {} files; {} pods' records in two",
        pods.len(),
        files.len(),
        straddling.len()
    );
    assert!(
        !straddling.is_empty(),
        "no pod in two of the {} files",
        files.len()
    );

    // Together, oldest last as a shell's glob gives them: one recording.
    let joined = timeline(&files);
    let mut seen = BTreeSet::new();
    for p in joined.pods.iter().filter(wanted) {
        assert!(seen.insert(p.uid.clone()), "{} ({}) twice", p.name, p.uid);
        let lacks = lacks(p);
        assert!(
            lacks.is_empty(),
            "{} ({}, in {} files) lacks {}",
            p.name,
            p.uid,
            in_files.get(&p.uid).copied().unwrap_or(0),
            lacks.join(", ")
        );
    }
    assert_eq!(
        seen.len(),
        pods.len(),
        "pods missing from the joined files: {:?}",
        pods.iter()
            .filter(|(u, _)| !seen.contains(*u))
            .map(|(_, n)| n)
            .collect::<Vec<_>>()
    );
}
