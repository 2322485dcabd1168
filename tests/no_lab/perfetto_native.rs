//! `podlapse report -o perfetto`: the native Perfetto trace of each recorded fixture in
//! traces/, read back with Perfetto's own generated Python definitions (the `perfetto`
//! package from PyPI, which `cargo xtask setup` installs), and held to the timeline the
//! same trace gives: every stage a slice with the same start and duration to the
//! nanosecond, on its pod's process track or its container's thread track; flows from
//! each CRI call to the kernel stages that began inside it; every kernel event an
//! instant; counters that add up. Needs no lab.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::process::Command;

use podlapse::timeline::{PodTimeline, Stage, StageSource, Timeline};
use podlapse::trace::{TraceRecord, read_trace};
use podlapse_tests::{fixtures, podlapse_bin, stderr, workspace_root};
use serde_json::Value;

fn file_name(p: &Path) -> String {
    p.file_name().unwrap().to_string_lossy().into_owned()
}

/// `report -o perfetto` of `trace`, written to a file as a user would.
fn pftrace(trace: &Path, dir: &Path) -> PathBuf {
    let out_path = dir.join(format!("{}.pftrace", file_name(trace)));
    let file = std::fs::File::create(&out_path).unwrap();
    let status = Command::new(podlapse_bin())
        .args(["report", "-o", "perfetto"])
        .arg(trace)
        .stdout(file)
        .status()
        .unwrap();
    assert!(status.success(), "report -o perfetto {}", trace.display());
    out_path
}

fn timeline(trace: &Path) -> Timeline {
    let out = Command::new(podlapse_bin())
        .arg("timeline")
        .arg(trace)
        .args(["-o", "json"])
        .output()
        .unwrap();
    assert!(out.status.success(), "{}", stderr(&out));
    serde_json::from_slice(&out.stdout).expect("timeline JSON")
}

/// The file as Perfetto's own definitions read it (tests/perfetto/read_pftrace.py).
fn read(pftrace: &Path) -> Value {
    let python_path = workspace_root().join(xtask::PERFETTO_PYTHON_DIR);
    let out = Command::new("python3")
        .arg(workspace_root().join("tests/perfetto/read_pftrace.py"))
        .arg(pftrace)
        .env("PYTHONPATH", &python_path)
        .output()
        .expect("python3");
    assert!(
        out.status.success(),
        "reading {} with Perfetto's definitions from {} failed (cargo xtask setup \
         installs them):\n{}",
        pftrace.display(),
        python_path.display(),
        stderr(&out)
    );
    let doc: Value = serde_json::from_slice(&out.stdout).expect("the reader prints JSON");
    assert_eq!(
        doc["problems"],
        Value::Array(vec![]),
        "{}",
        pftrace.display()
    );
    doc
}

/// Where a track belongs: the process or thread track it is, or is under.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord)]
enum Home {
    Process(String),
    Thread { process: String, thread: String },
    Other(String),
}

struct Tracks(BTreeMap<u64, Value>);

impl Tracks {
    fn new(doc: &Value) -> Tracks {
        Tracks(
            doc["tracks"]
                .as_array()
                .unwrap()
                .iter()
                .map(|t| (t["uuid"].as_u64().unwrap(), t.clone()))
                .collect(),
        )
    }

    fn process_name(&self, pid: u64) -> String {
        self.0
            .values()
            .find(|t| t["process"]["pid"].as_u64() == Some(pid))
            .map(|t| t["process"]["name"].as_str().unwrap().to_string())
            .unwrap_or_else(|| panic!("no process track with pid {pid}"))
    }

    fn home(&self, uuid: u64) -> Home {
        let mut t = &self.0[&uuid];
        loop {
            if let Some(name) = t["process"]["name"].as_str() {
                return Home::Process(name.to_string());
            }
            if t["thread"].is_object() {
                return Home::Thread {
                    process: self.process_name(t["thread"]["pid"].as_u64().unwrap()),
                    thread: t["thread"]["name"].as_str().unwrap().to_string(),
                };
            }
            match t["parent"].as_u64() {
                Some(p) => t = &self.0[&p],
                None => return Home::Other(t["name"].as_str().unwrap().to_string()),
            }
        }
    }

    fn named(&self, name: &str) -> Vec<u64> {
        self.0
            .iter()
            .filter(|(_, t)| t["name"] == name)
            .map(|(u, _)| *u)
            .collect()
    }
}

fn process_of(p: &PodTimeline, trace: &str) -> String {
    let name = if p.name.is_empty() {
        p.uid.clone()
    } else {
        format!("{}/{}", p.namespace, p.name)
    };
    format!("{name} ({trace})")
}

fn home_of(p: &PodTimeline, s: &Stage, trace: &str) -> Home {
    match &s.container {
        None => Home::Process(process_of(p, trace)),
        Some(c) => Home::Thread {
            process: process_of(p, trace),
            thread: c.clone(),
        },
    }
}

#[test]
fn every_stage_is_a_slice_on_its_pods_or_containers_track_to_the_nanosecond() {
    let dir = tempfile::tempdir().unwrap();
    for trace in fixtures() {
        let name = file_name(&trace);
        let file = pftrace(&trace, dir.path());
        let doc = read(&file);
        // CLOCK_MONOTONIC (3), the clock the trace records, is declared the trace's clock,
        // and every event says it is on it.
        assert_eq!(doc["clock"]["primary_trace_clock"], 3, "{name}");
        assert_eq!(doc["clock"]["clocks"], serde_json::json!([3]), "{name}");
        assert_eq!(doc["event_clocks"], serde_json::json!([3]), "{name}");
        let tracks = Tracks::new(&doc);
        let timeline = timeline(&trace);
        let mut want: Vec<(Home, String, u64, u64)> = timeline
            .pods
            .iter()
            .flat_map(|p| {
                p.stages.iter().map(|s| {
                    (
                        home_of(p, s, &name),
                        s.stage.to_string(),
                        s.start_ns,
                        s.duration_ns,
                    )
                })
            })
            .collect();
        let mut got: Vec<(Home, String, u64, u64)> = doc["slices"]
            .as_array()
            .unwrap()
            .iter()
            .map(|s| {
                (
                    tracks.home(s["track"].as_u64().unwrap()),
                    s["name"].as_str().unwrap().to_string(),
                    s["ts"].as_u64().unwrap(),
                    s["dur"].as_u64().unwrap(),
                )
            })
            .collect();
        want.sort();
        got.sort();
        assert!(!want.is_empty(), "{name}");
        assert_eq!(got, want, "{name}: slices against the timeline's stages");
        // The same trace always gives the same bytes.
        let again_dir = dir.path().join("again");
        std::fs::create_dir_all(&again_dir).unwrap();
        let again = pftrace(&trace, &again_dir);
        assert_eq!(
            std::fs::read(&file).unwrap(),
            std::fs::read(&again).unwrap()
        );
    }
}

#[test]
fn each_kernel_stage_is_reached_by_a_flow_from_the_cri_call_it_began_inside() {
    let dir = tempfile::tempdir().unwrap();
    let mut flows_seen = 0;
    for trace in fixtures() {
        let name = file_name(&trace);
        let doc = read(&pftrace(&trace, dir.path()));
        let tracks = Tracks::new(&doc);
        let slices = doc["slices"].as_array().unwrap();
        let find = |home: &Home, stage: &Stage| -> &Value {
            slices
                .iter()
                .find(|s| {
                    s["name"] == stage.stage.to_string().as_str()
                        && s["ts"] == stage.start_ns
                        && tracks.home(s["track"].as_u64().unwrap()) == *home
                })
                .unwrap_or_else(|| panic!("{name}: no slice for {}", stage.stage))
        };
        for p in &timeline(&trace).pods {
            for k in p.stages.iter().filter(|s| s.source == StageSource::Kernel) {
                let slice = find(&home_of(p, k, &name), k);
                let ending: Vec<u64> = slice["terminating_flow_ids"]
                    .as_array()
                    .unwrap()
                    .iter()
                    .map(|v| v.as_u64().unwrap())
                    .collect();
                // The innermost call of the same container under way when it began.
                let call = p
                    .stages
                    .iter()
                    .filter(|c| {
                        c.source == StageSource::Cri
                            && c.duration_ns > 0
                            && c.container == k.container
                            && c.start_ns <= k.start_ns
                            && k.start_ns <= c.end_ns
                    })
                    .min_by_key(|c| c.duration_ns);
                let Some(call) = call else {
                    assert!(ending.is_empty(), "{name}: {} has a flow", k.stage);
                    continue;
                };
                assert_eq!(ending.len(), 1, "{name}: {} has one flow in", k.stage);
                let from = find(&home_of(p, call, &name), call);
                assert!(
                    from["flow_ids"]
                        .as_array()
                        .unwrap()
                        .contains(&Value::from(ending[0])),
                    "{name}: {}'s flow does not start at {}",
                    k.stage,
                    call.stage
                );
                flows_seen += 1;
            }
        }
    }
    // RunPodSandbox's netns, CNI plugins and pause exec; StartContainer's cgroup and exec.
    assert!(flows_seen >= 20, "only {flows_seen} flows");
}

#[test]
fn kernel_events_are_instants_of_their_pod_and_the_counters_add_up() {
    let dir = tempfile::tempdir().unwrap();
    for trace in fixtures() {
        let name = file_name(&trace);
        let doc = read(&pftrace(&trace, dir.path()));
        let tracks = Tracks::new(&doc);
        let records = read_trace(&trace).expect("a fixture reads").records;
        let kernel = records
            .iter()
            .filter(|r| matches!(r, TraceRecord::Kernel(_)))
            .count();
        let instants = doc["instants"].as_array().unwrap();
        assert_eq!(
            instants.len(),
            kernel,
            "{name}: an instant per kernel event"
        );
        // Each pod's kernel track holds the events the timeline attributes to it.
        for p in &timeline(&trace).pods {
            let attributed: u64 = p.kernel_events.values().sum();
            let on_pod = instants
                .iter()
                .filter(|i| {
                    let t = i["track"].as_u64().unwrap();
                    tracks.0[&t]["name"] == "kernel"
                        && tracks.home(t) == Home::Process(process_of(p, &name))
                })
                .count() as u64;
            assert_eq!(on_pod, attributed, "{name}: {}'s kernel events", p.name);
        }
        // Counters: CRI calls in flight rise to at least one and end at zero; as many
        // pods start as the trace has, and those still starting at the end never ran.
        let values = |counter: &str| -> Vec<i64> {
            let ids = tracks.named(counter);
            assert_eq!(ids.len(), 1, "{name}: counter {counter}");
            doc["counters"]
                .as_array()
                .unwrap()
                .iter()
                .filter(|c| c["track"].as_u64() == Some(ids[0]))
                .map(|c| c["value"].as_i64().unwrap())
                .collect()
        };
        let calls = values("CRI calls in flight");
        assert_eq!(calls.first(), Some(&0), "{name}");
        assert_eq!(calls.last(), Some(&0), "{name}");
        assert!(calls.iter().max() >= Some(&1), "{name}");
        let timeline = timeline(&trace);
        let starting = values("pods starting");
        let never_ran = timeline
            .pods
            .iter()
            .filter(|p| p.seen_ns.is_some() && p.stage("running").is_none())
            .count() as i64;
        assert_eq!(starting.last(), Some(&never_ran), "{name}");
        let footer_lost = records.iter().find_map(|r| match r {
            TraceRecord::Footer(f) => Some(f.lost_events as i64),
            _ => None,
        });
        if let Some(lost) = footer_lost {
            assert_eq!(values("kernel events lost").last(), Some(&lost), "{name}");
        }
    }
}
